"""How a Grid Engine job over several hosts starts each host's part: `gridengine.start_hosts: qrsh | mpirun` and
`master_addr_command` (backends/gridengine/training.py's fan_out_to_hosts). The rendered script (golden), its keys'
errors, and the mpirun path run through Open MPI's real mpirun on this one host; the two-host cell's runs (DDP
equal to one process, `qdel` ending every host's part) are tests/e2e/test_gridengine_e2e.py's."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.golden_files import REPO, assert_golden, normalize

from bcp_pipeline.cli.main import main
from bcp_pipeline.config.load import load_config
from bcp_pipeline.errors import ConfigError

SECRET = "s3cr3t-value-never-on-a-command-line"  # a plain env value (a credential in env: is refused at load)
ADDR_COMMAND = "printf '%s\\n' 10.0.0.7 other  # the fast interface's address"


def scripts_of(text: str) -> dict[str, str]:
    """`plan`'s job scripts by stage name."""
    return {
        block.split(", stage ", 1)[1].split(":", 1)[0]: "#!/bin/bash" + block.split("\n\n\n")[0] + "\n"
        for block in text.split("#!/bin/bash")[1:]
        if ", stage " in block
    }


def plan(capsys, config: Path, pipeline: str, *sets: str) -> str:
    capsys.readouterr()
    args = [arg for value in sets for arg in ("--set", value)]
    assert main(["--config", str(config), "plan", pipeline, "--backend", "gridengine", *args]) == 0
    return capsys.readouterr().out


MPIRUN_SETS = (
    "pretrain.gridengine.distributed=true",
    "pretrain.gridengine.nodes=2",
    "pretrain.gridengine.processes_per_node=2",
    "pretrain.gridengine.parallel_environment=pe_node",
    "pretrain.gridengine.start_hosts=mpirun",
    f"pretrain.gridengine.env={{STAGE_NOTE: {SECRET}}}",
    f"pretrain.gridengine.master_addr_command={ADDR_COMMAND}",
)


def test_an_mpirun_started_stage_golden_one_launcher_a_host_and_no_secret_on_its_command_line(capsys, tmp_path):
    script = scripts_of(plan(capsys, REPO / "pipelines.yaml", "demo", *MPIRUN_SETS))["pretrain"]
    assert_golden("gridengine/mpirun-pe-stage.sh", normalize(script, tmp_path))
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    mpirun = next(line for line in script.splitlines() if line.startswith("mpirun "))
    assert mpirun.startswith('mpirun -np "$nodes" -npernode 1 -hostfile "$logs/$JOB_ID/hostfile" --bind-to none')
    assert 'qrsh" -inherit' not in script  # Open MPI starts the other hosts itself
    # The secret is exported inside the script (which every host runs again), never on mpirun's command line.
    assert f"export STAGE_NOTE={SECRET}" in script
    assert all(SECRET not in line for line in script.splitlines() if "mpirun" in line or "-x" in line.split())
    # The exit-record trap of the batch script is still the only EXIT trap, not replaced by the mpirun part.
    assert script.count("trap ") == 1 and "trap 'bcp_record exit \"$?\"' EXIT" in script


def test_qrsh_stays_the_default_and_the_backend_s_default_applies_where_a_stage_says_nothing(capsys, tmp_path):
    out = scripts_of(plan(capsys, REPO / "pipelines.yaml", "demo", *MPIRUN_SETS[:4]))["pretrain"]
    assert '"$qrsh" -inherit -nostdin "${hosts[node]}"' in out and "\nmpirun " not in out
    assert 'master_addr="${hosts[0]}"' in out and "master_addr_command" not in out
    out = scripts_of(
        plan(capsys, REPO / "pipelines.yaml", "demo", *MPIRUN_SETS[:4], "backends.gridengine.start_hosts=mpirun")
    )["pretrain"]
    assert "\nmpirun -np" in out  # the backend's default, where the stage says nothing


def test_a_training_over_hosts_starts_its_torchruns_with_mpirun_too(tmp_path):
    """slimpajama-126m's NeMo pretrain on two hosts (as tests/backends/gridengine/test_nemo.py renders it), with the
    backend's start_hosts: mpirun: each host's torchrun is started by mpirun, its part checked as the ranks' is."""
    from bcp_pipeline.backends.contract import JobRequest
    from bcp_pipeline.backends.gridengine.backend import GridEngineBackend

    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    raw["stages_dir"] = str(REPO / "stages")
    raw["backends"]["gridengine"] = {
        "container": "apptainer",
        "parallel_environment": "pe_node",
        "start_hosts": "mpirun",
    }
    config_file = tmp_path / "pipelines.yaml"
    config_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    config = load_config(
        config_file,
        ["pretrain.gridengine.container_image=/images/nemo 24.05.sif", "pretrain.gridengine.nodes=2"],
        pipeline="slimpajama-126m",
    )
    pipeline = config.pipelines["slimpajama-126m"]
    stage = pipeline.stages["pretrain"]
    backend = GridEngineBackend(
        config.options["gridengine"],
        config_dir=tmp_path,
        stages_dir=REPO / "stages",
        run_dir=tmp_path / "runs/RUN",
        workspace_name=pipeline.workspace.name,
    )
    script = backend.render(
        JobRequest(
            run_id="RUN", pipeline=pipeline, stage=stage, kind="stage", program=stage.program, args=tuple(stage.args)
        )
    ).printable
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    start = script.index('if [ "${1:-}" = --node ]')
    part = script[start : script.index("\nfi\n", start)]
    assert "OMPI_COMM_WORLD_RANK" in part and 'train_host "$3" "$4"' in part
    assert "\nmpirun -np" in script and "torchrun --nnodes" in script and '"$qrsh" -inherit' not in script


@pytest.mark.parametrize("value", ["ssh", "MPIRUN"])
def test_a_bad_start_hosts_names_the_key_its_line_and_the_choices(tmp_path, value):
    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    raw["stages_dir"] = str(REPO / "stages")
    raw["backends"]["gridengine"] = {"container": "apptainer", "start_hosts": value}
    config_file = tmp_path / "pipelines.yaml"
    text = yaml.safe_dump(raw, sort_keys=False)
    config_file.write_text(text)
    line = 1 + next(i for i, row in enumerate(text.splitlines()) if "start_hosts:" in row)
    with pytest.raises(ConfigError) as info:
        load_config(config_file, [], pipeline="demo")
    message = str(info.value)
    assert f"pipelines.yaml:{line}:" in message and "backends.gridengine.start_hosts" in message, message
    assert f"'{value}' is not one of 'qrsh', 'mpirun'" in message, message
    with pytest.raises(ConfigError, match=r"start_hosts=ssh.*'ssh' is not one of 'qrsh', 'mpirun'"):
        load_config(REPO / "pipelines.yaml", ["pretrain.gridengine.start_hosts=ssh"], pipeline="demo")


def mpirun_or_skip() -> str:
    """Open MPI's mpirun (Debian's openmpi-bin, which scripts/sge-cluster install adds with Grid Engine)."""
    if shutil.which("mpirun") is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run([sys.executable, str(REPO / "scripts/sge-cluster"), "install"], capture_output=True, timeout=900)
    found = shutil.which("mpirun")
    if found is None:
        pytest.skip("Open MPI's mpirun is not installed (Debian: openmpi-bin; scripts/sge-cluster install adds it)")
    return found


PROBE = (
    "import json, os; print('RANKENV ' + json.dumps({k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', "
    "'LOCAL_RANK', 'NODE_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'STAGE_NOTE', 'OMPI_COMM_WORLD_RANK')}))"
)


def test_the_mpirun_path_under_open_mpi_gives_each_rank_its_place_and_the_job_its_records(capsys, tmp_path):
    """The rendered script run as Grid Engine would run it on one host (nodes 1, so mpirun starts it here): Open MPI's
    rank is the node, each rank gets RANK..MASTER_ADDR from master_addr_command, no OMPI_COMM_WORLD_* leaks to the
    ranks, and the job's own start and exit records are written around it; a failing rank fails the job."""
    mpirun_or_skip()
    state = tmp_path / "state"
    sets = [
        *MPIRUN_SETS[:1],
        "pretrain.gridengine.nodes=1",
        *MPIRUN_SETS[2:],
        f'pretrain.gridengine.command=[{sys.executable}, -c, "{PROBE}"]',
    ]
    capsys.readouterr()
    assert (
        main(
            [
                "--config",
                str(REPO / "pipelines.yaml"),
                "--state-dir",
                str(state),
                "plan",
                "demo",
                "--backend",
                "gridengine",
                *[a for s in sets for a in ("--set", s)],
            ]
        )
        == 0
    )
    script = scripts_of(capsys.readouterr().out)["pretrain"]
    logs = Path(next(line for line in script.splitlines() if line.startswith("logs=")).split()[0][5:].strip("'"))
    hostfile = tmp_path / "pe_hostfile"
    hostfile.write_text(f"{socket.gethostname()} 1 all.q@{socket.gethostname()} UNDEFINED\n")
    (tmp_path / "job.sh").write_text(script)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "JOB_ID": "4242",
        "SGE_TASK_ID": "undefined",
        "PE_HOSTFILE": str(hostfile),
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    try:
        done = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        ranks = [
            json.loads(line.split(" ", 1)[1])
            for path in sorted((logs / "4242").glob("rank-*.log"))
            for line in path.read_text().splitlines()
            if line.startswith("RANKENV ")
        ]
        assert [(r["RANK"], r["WORLD_SIZE"], r["LOCAL_RANK"], r["NODE_RANK"]) for r in ranks] == [
            ("0", "2", "0", "0"),
            ("1", "2", "1", "0"),
        ]
        assert {r["MASTER_ADDR"] for r in ranks} == {"10.0.0.7"} and {r["STAGE_NOTE"] for r in ranks} == {SECRET}
        assert {r["OMPI_COMM_WORLD_RANK"] for r in ranks} == {None}
        assert (logs / "4242/hostfile").read_text() == f"{socket.gethostname()} slots=1\n"
        assert (logs / "4242/task-1.started").is_file() and (logs / "4242/task-1.exit").read_text() == "0\n"
        # A rank that fails: mpirun's status is the job's, and the exit record says so.
        (tmp_path / "job.sh").write_text(script.replace(f"{sys.executable} -c", "false", 1))
        failed = subprocess.run(
            ["bash", str(tmp_path / "job.sh")],
            env={**env, "JOB_ID": "4243"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert failed.returncode != 0 and "bcp-pipeline: mpirun over" in failed.stderr, failed.stderr
        assert (logs / "4243/task-1.exit").read_text() == f"{failed.returncode}\n"
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def test_master_addr_command_that_prints_nothing_stops_the_job_with_the_key_named(capsys, tmp_path):
    script = scripts_of(
        plan(capsys, REPO / "pipelines.yaml", "demo", *MPIRUN_SETS[:-1], "pretrain.gridengine.master_addr_command=echo")
    )["pretrain"]
    start = script.index("master_addr_command() {")
    part = script[start : script.index("\nfi\n", start) + 4] + 'echo "addr=$master_addr"\n'
    ran = subprocess.run(["bash", "-c", part], capture_output=True, text=True)
    assert ran.returncode == 1 and "gridengine.master_addr_command gave no address" in ran.stderr, ran
    ok = part.replace("\necho\n", "\necho '  10.1.2.3 ib0'; echo second\n")
    ran = subprocess.run(["bash", "-c", ok], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout == "addr=10.1.2.3\n", ran


def test_check_s_probe_without_a_parallel_environment_asks_what_the_stage_asks_and_starts_hosts_its_way(tmp_path):
    """TSUBAME: no parallel environment, the site's `-l node_f=N` makes the job parallel. The probe then asks for the
    distributed stage's own requests (not its name, log, runtime), expects its nodes, and starts them by mpirun
    after the stage's env and set-up lines, as the stage does; with a parallel environment it stays as it was."""
    from types import SimpleNamespace

    from bcp_pipeline.backends.contract import JobRequest
    from bcp_pipeline.backends.gridengine.backend import GridEngineBackend
    from bcp_pipeline.backends.gridengine.check import probe_script, probe_shape

    def ctx_for(*sets: str) -> SimpleNamespace:
        config = load_config(REPO / "pipelines.yaml", list(sets), pipeline="demo")
        pipeline = config.pipelines["demo"]
        backend = GridEngineBackend(
            config.options["gridengine"],
            config_dir=REPO,
            stages_dir=REPO / "stages",
            run_dir=tmp_path / "runs/RUN",
            workspace_name=pipeline.workspace.name,
        )
        requests = [
            JobRequest(
                run_id="RUN",
                pipeline=pipeline,
                stage=stage,
                kind="stage",
                program=stage.program,
                args=tuple(stage.args),
            )
            for stage in pipeline.stages.values()
        ]
        return SimpleNamespace(
            config=config,
            pipeline=pipeline,
            backend=lambda: backend,
            submissions=lambda: [backend.render(r) for r in requests if r.stage.name != "pretrain"],
        )

    tsubame = (
        "download.gridengine.distributed=true",
        "download.gridengine.nodes=2",
        "download.gridengine.resources=[node_f=1]",
        "download.gridengine.extra_args=[-l gpu=4]",
        "download.gridengine.project=tga-lab",
        "download.gridengine.start_hosts=mpirun",
        "download.gridengine.setup=[module load openmpi/5.0.2]",
        "download.gridengine.env={OMPI_MCA_x: '1'}",
    )
    shape = probe_shape(ctx_for(*tsubame))
    assert shape.requests == ["-P tga-lab", "-l node_f=1", "-l gpu=4"] and shape.hosts == 2
    assert shape.start_hosts == "mpirun" and "module load openmpi/5.0.2" in shape.prelude
    assert "export OMPI_MCA_x=1" in shape.prelude and "no parallel environment" in shape.said
    script = probe_script("probe", tmp_path / "out", tmp_path / "part.sh", tmp_path / "ws/.m", ".m", shape)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "#$ -l node_f=1\n#$ -l gpu=4\n" in script and "#$ -pe" not in script and "-inherit" not in script
    assert script.index("module load openmpi/5.0.2") < script.index('\nmpirun -np "$NHOSTS" -npernode 1')
    hostfile = f"{tmp_path}/part.sh.hostfile"
    assert f'awk \'{{print $1 " slots=1"}}\' "$PE_HOSTFILE" > {hostfile}\n' in script, script
    assert f"-hostfile {hostfile} --bind-to none /bin/bash {tmp_path}/part.sh {tmp_path}/ws/.m\n" in script, script
    # A parallel environment: as before, two of its slots, by qrsh where the stage says nothing.
    shape = probe_shape(ctx_for(*tsubame[:4], "backends.gridengine.parallel_environment=pe_node"))
    assert (shape.requests, shape.hosts, shape.start_hosts, shape.prelude) == (["-pe pe_node 2"], 2, "qrsh", [])
    # No parallel environment and no stage over several hosts: nothing to probe (check says so).
    assert probe_shape(ctx_for()) is None
