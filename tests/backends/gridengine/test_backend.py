"""The Grid Engine backend without a cell: golden job scripts (plan), the rendered Apptainer lines against
Apptainer's documented grammar, the state map from qstat codes and qacct records, h_rt. The real cell: tests/e2e/
test_gridengine_e2e.py."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.apptainer import STAND_IN, container_backend, documented_exec, load_stand_in
from support.fake_sif import write_fake_sif
from support.golden_files import REPO, assert_golden, normalize

from bcp_pipeline.backends.contract import JobRequest, JobState, map_native_state
from bcp_pipeline.backends.gridengine.render import h_rt
from bcp_pipeline.backends.gridengine.states import STATE_MAP, accounting_status, parse_qacct
from bcp_pipeline.cli.main import main
from bcp_pipeline.config.load import load_config
from bcp_pipeline.errors import ConfigError, SubmissionError


def plan(capsys, config: Path, pipeline: str, *sets: str) -> str:
    capsys.readouterr()
    args = [arg for value in sets for arg in ("--set", value)]
    assert main(["--config", str(config), "plan", pipeline, "--backend", "gridengine", *args]) == 0
    return capsys.readouterr().out.replace(sys.executable, "<PYTHON>")


def test_plan_demo_golden(capsys):
    text = normalize(plan(capsys, REPO / "pipelines.yaml", "demo"))
    assert_golden("gridengine/plan-demo.txt", text)
    assert "#$ -N demo-RUN.download" in text and "#$ -l h_rt=1:00:00" in text


def apptainer_lines(script: str) -> list[list[str]]:
    """The argv of every `apptainer` call in a job script (the function that runs each rank)."""
    found = []
    for line in script.splitlines():
        if "apptainer " in line and line.startswith("run_rank()"):
            body = line[len("run_rank() { exec ") : -len("; }")]
            found.append(shlex.split(body))
    return found


def test_a_container_stage_over_a_parallel_environment_golden_and_in_apptainer_s_grammar(tmp_path):
    backend, request = container_backend(tmp_path)
    script = backend.render(request).printable
    assert_golden("gridengine/container-pe-stage.sh", normalize(script, tmp_path))
    assert "#$ -pe pe_node 2" in script and "#$ -l node_f=1" in script and "#$ -P tga-lab" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    [argv] = apptainer_lines(script)
    call = documented_exec(argv)  # Apptainer's documented grammar (not the stand-in's parser)
    assert "--nv" in call.flags() and call.container == "/images/nemo framework 24.05.sif"
    workspace = str((tmp_path / ".bcp-pipeline/workspaces/demo").resolve())
    assert call.binds()[0] == (workspace, "/mount_workspace", "rw") and call.binds()[-1] == ("/data", "/data", "ro")
    assert call.command[:2] == ["bash", f"{REPO / 'stages'}/bootstrap.sh"]
    assert "/mount_workspace/" in " ".join(call.command)  # ${workspace} as the container sees it


@pytest.mark.parametrize(
    "argv, words",
    [
        (["exec", "--nv", "--bind", "/a::/b", "x.sif", "true"], "invalid bind path"),
        (["exec", "--bind", "/a:/b:z", "x.sif", "true"], "invalid bind option"),
        (["exec", "--gpus", "x.sif", "true"], "unknown flag"),
        (["exec", "x.sif"], "requires at least 2 arg"),
    ],
)
def test_the_stand_in_refuses_what_apptainer_refuses(argv, words):
    stand_in = load_stand_in()
    with pytest.raises(stand_in.Refused, match=words):
        stand_in.parse(argv)


def test_the_stand_in_fails_as_apptainer_does_on_a_missing_image_and_binds_otherwise(tmp_path):
    missing = subprocess.run(
        [sys.executable, str(STAND_IN), "exec", "--nv", str(tmp_path / "no.sif"), "true"],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 255 and missing.stderr.startswith("FATAL:   could not open image"), missing.stderr
    image = write_fake_sif(tmp_path / "image.sif")  # a valid SIF header: the stand-in refuses an empty file
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "seen").write_text("x")
    inside = tmp_path / "inside"
    res = subprocess.run(
        [
            sys.executable,
            str(STAND_IN),
            "exec",
            "--bind",
            f"{tmp_path / 'data'}:{inside}:ro",
            str(image),
            "ls",
            str(inside),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0 and res.stdout.split() == ["seen"], res.stderr
    assert not (inside / "seen").exists()  # the bind lived in the command's own mount namespace only


def test_a_path_a_directive_cannot_carry_is_refused(tmp_path):
    spaced = tmp_path / "with space"
    spaced.mkdir()
    backend, request = container_backend(spaced)
    with pytest.raises(SubmissionError, match="holds a space"):
        backend.render(request)


QACCT = """==============================================================
qname        all.q
hostname     node2
jobnumber    12
taskid       1
failed       0
exit_status  0
==============================================================
qname        all.q
hostname     vm
jobnumber    12
taskid       2
failed       {failed}
exit_status  {exit}
"""


@pytest.mark.parametrize(
    "failed, exit_status, state",
    [
        ("0", "0", JobState.SUCCEEDED),
        ("0", "3", JobState.FAILED),
        ("100 : assumedly after job", "137", JobState.CANCELLED),
        ("37  : qmaster enforced h_rt, h_cpu, or h_vmem limit", "137", JobState.TIMED_OUT),
        ("26  : opening input/output file", "0", JobState.FAILED),
    ],
)
def test_an_array_job_s_accounting_gives_its_worst_task(failed, exit_status, state):
    records = parse_qacct(QACCT.format(failed=failed, exit=exit_status))
    assert [(r.task, r.failed) for r in records] == [("1", 0), ("2", int(failed.split()[0]))]
    status = accounting_status("12", records)
    assert status.state is state
    if state is not JobState.SUCCEEDED:
        assert status.detail.startswith("task 2: ")


def test_qstat_state_codes_map_explicitly_and_an_unknown_one_is_not_finished():
    assert map_native_state("qw", STATE_MAP) is JobState.QUEUED
    assert map_native_state("hqw", STATE_MAP) is JobState.QUEUED
    assert map_native_state("r", STATE_MAP) is JobState.RUNNING
    assert map_native_state("dr", STATE_MAP) is JobState.RUNNING
    assert map_native_state("Eqw", STATE_MAP) is JobState.FAILED
    assert map_native_state("zz", STATE_MAP) is JobState.UNKNOWN and not JobState.UNKNOWN.finished


def test_h_rt_is_hours_minutes_seconds():
    assert h_rt("1h30m") == "1:30:00" and h_rt("2D") == "48:00:00" and h_rt("90s") == "0:01:30"


def test_a_stage_of_no_nodes_is_refused_naming_the_stage_and_the_keys(tmp_path):
    backend, request = container_backend(tmp_path, "pretrain.gridengine.processes_per_node=0")
    with pytest.raises(ConfigError, match=r"stage pretrain: gridengine nodes and processes_per_node must be >= 1"):
        backend.render(request)


def test_slurm_offers_apptainer_beside_pyxis_in_apptainer_s_grammar(tmp_path):
    from bcp_pipeline.backends.slurm.backend import SlurmBackend

    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    raw["stages_dir"] = str(REPO / "stages")
    raw.setdefault("backends", {})["slurm"] = {"container": "apptainer"}
    config_file = tmp_path / "pipelines.yaml"
    config_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    config = load_config(
        config_file,
        [
            "download.slurm.container_image=docker://nvcr.io/nvidia/nemo:24.05",
            "download.slurm.container_mounts=[/data:/data:ro]",
        ],
        pipeline="demo",
    )
    pipeline = config.pipelines["demo"]
    stage = pipeline.stages["download"]
    backend = SlurmBackend(
        config.options["slurm"],
        config_dir=tmp_path,
        stages_dir=REPO / "stages",
        run_dir=tmp_path / "runs/demo-RUN",
        workspace_name="demo",
    )
    script = backend.render(
        JobRequest(
            run_id="demo-RUN",
            pipeline=pipeline,
            stage=stage,
            kind="stage",
            program=stage.program,
            args=tuple(stage.args),
        )
    ).printable
    assert "--container-image" not in script  # not Pyxis
    [line] = [line for line in script.splitlines() if line.lstrip().startswith("apptainer ")]  # srun's command
    call = documented_exec(shlex.split(line))  # Apptainer's documented grammar (not the stand-in's parser)
    workspace = str((tmp_path / ".bcp-pipeline/workspaces/demo").resolve())
    assert call.container == "docker://nvcr.io/nvidia/nemo:24.05" and "--nv" in call.flags()
    assert call.binds()[0] == (workspace, workspace, "rw") and call.binds()[-1] == ("/data", "/data", "ro")
    assert call.command[0] == "bash" and call.command[1].endswith("/bootstrap.sh")


def test_an_image_without_a_container_runtime_is_refused_not_ignored(tmp_path, capsys):
    capsys.readouterr()
    code = main(
        [
            "--config",
            str(REPO / "pipelines.yaml"),
            "plan",
            "demo",
            "--backend",
            "gridengine",
            "--set",
            "download.gridengine.container_image=/images/x.sif",
            "--set",
            "backends.gridengine.container=none",
        ]
    )  # the bundled file runs images with apptainer
    err = capsys.readouterr().err
    assert code == 2 and "stage download: gridengine.container_image is '/images/x.sif'" in err, err
    # The value came from the --set (which made the stage's gridengine section): the error names it (issue 38).
    assert "--set download.gridengine.container_image=/images/x.sif: " in err
    assert "backends.gridengine.container is none; set it to apptainer" in err


def test_submit_args_go_on_qsubs_command_line_and_plan_shows_them(tmp_path, capsys):
    """TSUBAME4 takes the group only as `qsub -g GROUP`: backends.gridengine.submit_args, never a `#$` line."""
    from bcp_pipeline.cli.main import main

    config = REPO / "pipelines.yaml"
    assert (
        main(
            [
                "--config",
                str(config),
                "--state-dir",
                str(tmp_path),
                "plan",
                "demo",
                "--backend",
                "gridengine",
                "--set",
                "backends.gridengine.submit_args=[-g, tga-mygroup]",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("# submitted with: qsub -terse -g tga-mygroup < the script below") == out.count("#!/bin/bash")
    assert "#$ -g" not in out
    assert main(["--config", str(config), "--state-dir", str(tmp_path), "plan", "demo", "--backend", "gridengine"]) == 0
    assert "# submitted with:" not in capsys.readouterr().out  # plain `qsub -terse`: nothing to say


def test_scheduling_options_and_site_set_up_render_as_tsubame_users_write_them(tmp_path, capsys):
    config = REPO / "pipelines.yaml"
    out = plan(
        capsys,
        config,
        "demo",
        "download.gridengine.reserve=true",
        "download.gridengine.priority=-10",
        "download.gridengine.advance_reservation='42'",
        "download.gridengine.array_concurrency=1",
        "download.gridengine.nodes=2",
        "sample.gridengine.array_concurrency=4",
        "download.gridengine.setup=[source /etc/profile.d/modules.sh, module load cuda/12.8.0]",
    )
    scripts = {
        block.split(", stage ", 1)[1].split(":", 1)[0]: block
        for block in out.split("#!/bin/bash")[1:]
        if ", stage " in block
    }
    download = scripts["download"]
    for directive in ("#$ -p -10", "#$ -R y", "#$ -ar 42", "#$ -t 1-2", "#$ -tc 1"):
        assert f"\n{directive}\n" in download, directive
    setup = download.index("# The site's set-up (gridengine.setup), on every host:")
    assert download.index("module load cuda/12.8.0") > setup > download.index("export BCP_PIPELINE_RUN_ID")
    assert setup < download.index("launch_node() {") or setup < download.index("run_rank()")
    assert "-tc" not in scripts["sample"] and "module load" not in scripts["sample"]  # one task: no array to limit
    capsys.readouterr()
    assert (
        main(
            [
                "--config",
                str(config),
                "plan",
                "demo",
                "--backend",
                "gridengine",
                "--set",
                "sample.gridengine.priority=2000",
            ]
        )
        != 0
    )
    assert (
        "--set sample.gridengine.priority=2000: pipelines.demo.stages.sample.gridengine: stage sample: "
        "gridengine.priority 2000 is outside Grid Engine's -1023..1024"
    ) in capsys.readouterr().err


def test_node_scratch_exports_the_job_s_tmpdir_and_a_job_without_one_stops_with_the_reason(tmp_path, capsys):
    out = plan(capsys, REPO / "pipelines.yaml", "demo", "tokenize-preprocess.gridengine.node_scratch=true")
    scripts = {
        block.split(", stage ", 1)[1].split(":", 1)[0]: block
        for block in out.split("#!/bin/bash")[1:]
        if ", stage " in block
    }
    preprocess = scripts["tokenize-preprocess"]
    assert 'export BCP_PIPELINE_SCRATCH="$scratch" TMPDIR="$scratch"' in preprocess
    assert "APPTAINER_BIND" not in preprocess
    assert "BCP_PIPELINE_SCRATCH" not in scripts["download"]  # only where a stage asks for it
    # The rendered lines under bash: a job whose $TMPDIR is missing stops with the key named, before any rank.
    start = preprocess.index("# Node-local scratch")
    lines = (
        preprocess[start : preprocess.index("\n", preprocess.index("export BCP_PIPELINE_SCRATCH"))]
        + '\necho "scratch $BCP_PIPELINE_SCRATCH"\n'
    )
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}
    ran = subprocess.run(["bash", "-c", lines], env=env, capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout == f"scratch {tmp_path}\n", ran
    # TMP where TMPDIR was dropped (a loader in secure-execution mode drops it, as on the test cell)
    ran = subprocess.run(
        ["bash", "-c", lines], env={"PATH": "/usr/bin:/bin", "TMP": str(tmp_path)}, capture_output=True, text=True
    )
    assert ran.returncode == 0 and ran.stdout == f"scratch {tmp_path}\n", ran
    ran = subprocess.run(
        ["bash", "-c", lines], env={**env, "TMPDIR": str(tmp_path / "gone")}, capture_output=True, text=True
    )
    assert ran.returncode == 1 and "gridengine.node_scratch: this job has no writable $TMPDIR" in ran.stderr, ran
    contained = plan(
        capsys,
        REPO / "pipelines.yaml",
        "demo",
        "tokenize-preprocess.gridengine.node_scratch=true",
        "backends.gridengine.container=apptainer",
        "tokenize-preprocess.gridengine.container_image=/images/stages.sif",
    )
    assert 'export APPTAINER_BIND="$scratch${APPTAINER_BIND:+,$APPTAINER_BIND}"' in contained
