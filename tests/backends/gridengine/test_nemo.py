"""A NeMo pretrain stage's Grid Engine job script (backends/gridengine/nemo.py), without a cell: the golden script,
and the script RUN by bash with recording stand-ins for `apptainer` and `qrsh` (so what is asserted is what each
host executes: the launcher's debug mode and its overrides, then one torchrun a host), each `apptainer` call
checked against the grammar Apptainer's manual documents (support/apptainer.py, documented_exec). The real cell:
tests/e2e/test_gridengine_e2e.py."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import yaml
from support.apptainer import documented_exec
from support.golden_files import REPO, assert_golden, normalize

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.gridengine.backend import GridEngineBackend
from bcp_pipeline.cli.main import main
from bcp_pipeline.config.load import load_config

IMAGE = "/images/nemo 24.05.sif"  # a .sif path: no release tag, so the launcher's folder is bcp.image's (23.11)


SETS = (
    f"pretrain.gridengine.container_image={IMAGE}",
    "pretrain.gridengine.nodes=2",
    "pretrain.gridengine.processes_per_node=4",
    "pretrain.gridengine.h_rt=4h",
    "pretrain.gridengine.resources=[node_f=1]",
    "pretrain.gridengine.env={NCCL_DEBUG: WARN}",
)


def nemo_backend(tmp_path: Path, *sets: str, run_id: str = "RUN") -> tuple[GridEngineBackend, JobRequest]:
    """slimpajama-126m's pretrain (gpt3/126m through NVIDIA's launcher) on two hosts of 4 GPUs, in an image."""
    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    raw["stages_dir"] = str(REPO / "stages")
    raw.setdefault("backends", {})["gridengine"] = {"container": "apptainer", "parallel_environment": "pe_node"}
    config_file = tmp_path / "pipelines.yaml"
    config_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    sets = (*SETS, *sets)
    config = load_config(config_file, list(sets), pipeline="slimpajama-126m")
    pipeline = config.pipelines["slimpajama-126m"]
    stage = pipeline.stages["pretrain"]
    backend = GridEngineBackend(
        config.options["gridengine"],
        config_dir=tmp_path,
        stages_dir=REPO / "stages",
        run_dir=tmp_path / ".bcp-pipeline/runs" / run_id,
        workspace_name=pipeline.workspace.name,
    )
    return backend, JobRequest(
        run_id=run_id, pipeline=pipeline, stage=stage, kind="stage", program=stage.program, args=tuple(stage.args)
    )


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_script(script: str, tmp_path: Path, hosts: list[str], *, crash: bool = False) -> list[dict]:
    """The job script run by bash as Grid Engine would run it on the first host, with recording stand-ins:
    `apptainer` (logs its argv and environment; as the launcher, writes the config file it is asked for), `qrsh`
    (runs `-inherit -nostdin HOST CMD...` here, HOST in the environment) and `hostname`. Returns the calls."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    executable(
        bin_dir / "apptainer",
        f"""#!/usr/bin/env python3
import json, os, pathlib, subprocess, sys
argv = sys.argv[1:]
command = argv[argv.index("--bind") + 3:]  # exec --nv --bind BINDS IMAGE COMMAND...
if command[0] in ("rm", "test"):  # on a file the container sees under /mount_workspace
    sys.exit(subprocess.run([w.replace("/mount_workspace", {str(tmp_path / "ws")!r}) for w in command]).returncode)
with open({str(calls)!r}, "a") as out:
    out.write(json.dumps({{"argv": argv, "host": os.environ.get("FAKE_HOST", "host1"),
                          "debug": os.environ.get("NEMO_LAUNCHER_DEBUG"),
                          "nccl": os.environ.get("NCCL_DEBUG")}}) + "\\n")
for word in command:
    if word.startswith("base_results_dir="):  # the launcher in its debug mode: the composed config, and no run
        run = [w for w in command if w.startswith("training.run.name=")][0].split("=", 1)[1]
        folder = pathlib.Path(word.split("=", 1)[1].replace("/mount_workspace", {str(tmp_path / "ws")!r})) / run
        folder.mkdir(parents=True, exist_ok=True)
        (folder / (run + "_hydra.yaml")).write_text("trainer: {{}}\\n")
if command[0] == "torchrun":  # as torchrun: its worker command, with RANK; NeMo's script replaced by a stand-in
    worker = command[command.index("--no-python") + 1:]
    trainer = "raise RuntimeError('boom')" if os.environ.get("FAKE_CRASH") else "print('trained')"
    worker = worker[:worker.index("python3")] + ["python3", "-c", trainer]
    node = int(os.environ.get("FAKE_HOST", "host1")[-1]) - 1
    per_node = int(command[command.index("--nproc_per_node") + 1])
    codes = [subprocess.run(worker, env={{**os.environ, "RANK": str(node * per_node + local)}}).returncode
             for local in range(per_node)]
    sys.exit(1 if any(codes) else 0)  # torchrun's status when a worker failed
if command[1].endswith("data_list.py"):
    pathlib.Path(command[command.index("--out") + 1]).write_text(
        "training.model.data.data_prefix=[1.0,/mount_workspace/x_text_document]")
""",
    )
    # qrsh where a cell keeps it, $SGE_ROOT/bin/ARCH (util/arch says ARCH), and not on PATH: the script finds it so.
    sge_root = tmp_path / "sge-root"
    (sge_root / "bin" / "lx-amd64").mkdir(parents=True)
    (sge_root / "util").mkdir()
    executable(sge_root / "util" / "arch", "#!/bin/sh\necho lx-amd64\n")
    executable(
        sge_root / "bin" / "lx-amd64" / "qrsh",
        '#!/bin/bash\n[ "$1 $2" = "-inherit -nostdin" ] || exit 9\nhost=$3; shift 3\nFAKE_HOST=$host exec "$@"\n',
    )
    executable(bin_dir / "hostname", '#!/bin/bash\necho "${FAKE_HOST:-host1}"\n')
    (tmp_path / "pe_hostfile").write_text("".join(f"{h} 1 all.q@{h} UNDEFINED\n" for h in hosts))
    job = tmp_path / "job.sh"
    job.write_text(script)
    executable(bin_dir / "qrsh", "#!/bin/sh\necho 'the qrsh on PATH was used' >&2; exit 97\n")  # must not be
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SGE_ROOT": str(sge_root),
        "JOB_ID": "4242",
        "SGE_TASK_ID": "undefined",
        "PE_HOSTFILE": str(tmp_path / "pe_hostfile"),
        **({"FAKE_CRASH": "1"} if crash else {}),
    }
    done = subprocess.run(["bash", str(job)], env=env, capture_output=True, text=True, timeout=60)
    if crash:  # the training's status fails the job; each failed rank named where failure_detail reads it
        assert done.returncode == 1, done.stderr
        assert "bcp-pipeline: rank 0 on " in done.stderr and " exited 1" in done.stderr, done.stderr
    else:
        assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in calls.read_text().splitlines()]


def test_the_nemo_job_script_golden(tmp_path):
    backend, request = nemo_backend(tmp_path)
    script = backend.render(request).printable
    assert_golden("gridengine/nemo-pretrain.sh", normalize(script, tmp_path))
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "#$ -pe pe_node 2" in script and "#$ -l node_f=1" in script and "#$ -l h_rt=4:00:00" in script
    assert "#$ -t" not in script  # one training over both hosts, never an array of independent ones


def test_each_host_runs_one_torchrun_of_nemo_s_script_with_the_config_the_launcher_composed(tmp_path):
    backend, request = nemo_backend(tmp_path)
    calls = run_script(backend.render(request).printable, tmp_path, ["host1", "host2"])
    parsed = [documented_exec(["apptainer", *call["argv"]]) for call in calls]  # Apptainer's documented grammar
    workspace = str((tmp_path / ".bcp-pipeline/workspaces/nemo-framework").resolve())
    for call in parsed:
        assert "--nv" in call.flags() and call.container == IMAGE
        assert call.binds()[0] == (workspace, "/mount_workspace", "rw")
    data_list, launcher, *trainings = parsed
    hosts = sorted(call["host"] for call in calls[2:])  # the hosts' torchruns run at once
    assert data_list.command[:2] == ["python3", f"{REPO / 'stages'}/data_list.py"]

    # The launcher, in its debug mode (composes and writes the config, runs nothing), in the image.
    assert calls[1]["debug"] == "1" and launcher.command[:2] == [
        "python3",
        "/opt/NeMo-Megatron-Launcher/launcher_scripts/main.py",
    ]
    overrides = dict(word.split("=", 1) for word in launcher.command[2:])
    assert overrides["cluster_type"] == "bcp" and overrides["stages"] == "[training]"
    assert overrides["training.run.name"] == "gpt_126m-RUN"  # this run's own NeMo run: continuations resume it
    assert overrides["training.trainer.num_nodes"] == "2" and overrides["training.trainer.devices"] == "4"
    # The per-run limit (NeMo's StatelessTimer): h_rt 4h minus the 45m margin; never Lightning's total budget.
    assert overrides["+training.exp_manager.max_time_per_run"] == "0:03:15:00"
    assert not any(key.startswith(("training.trainer.max_time", "training.run.time_limit")) for key in overrides)
    assert overrides["training.model.data.data_prefix"] == "[1.0,/mount_workspace/x_text_document]"

    # One torchrun a host (host 2 through `qrsh -inherit`), rank_layout's 2 x 4, meeting at the first host.
    assert hosts == ["host1", "host2"]
    assert all(call["nccl"] == "WARN" for call in calls)  # the stage's env reaches every host's ranks
    port = None
    for call in trainings:
        words = call.command
        assert words[:5] == ["torchrun", "--nnodes", "2", "--nproc_per_node", "4"]
        options = dict(zip(words[5:11:2], words[6:11:2]))
        assert options["--rdzv-backend"] == "c10d" and options["--rdzv-id"] == "4242"
        host, _, port_now = options["--rdzv-endpoint"].partition(":")
        assert host == "host1" and port_now.isdigit() and port in (None, port_now)
        port = port_now
        assert words[11:14] == ["--no-python", "bash", "-c"]  # each worker logs to its rank's file
        assert words[-5:] == [
            "python3",
            "-u",
            "/opt/NeMo/examples/nlp/language_modeling/megatron_gpt_pretraining.py",
            "--config-path=/mount_workspace/results/gpt_126m-RUN",
            "--config-name=gpt_126m-RUN_hydra.yaml",
        ]
    logs = tmp_path / ".bcp-pipeline/runs/RUN/logs/4242"
    assert sorted(p.name for p in logs.glob("rank-*.log")) == [f"rank-{r:05d}.log" for r in range(8)]
    assert all(p.read_text() == "trained\n" for p in logs.glob("rank-*.log"))


def test_one_host_runs_its_torchrun_itself_without_qrsh(tmp_path):
    backend, request = nemo_backend(tmp_path, "pretrain.gridengine.nodes=1")
    script = backend.render(request).printable
    assert "qrsh" not in script and "#$ -pe" not in script
    calls = run_script(script, tmp_path, ["host1"])
    torchrun = documented_exec(["apptainer", *calls[-1]["argv"]]).command
    assert torchrun[:5] == ["torchrun", "--nnodes", "1", "--nproc_per_node", "4"]
    assert torchrun[torchrun.index("--rdzv-endpoint") + 1].startswith("host1:")


def test_a_crashed_training_fails_the_job_and_its_traceback_is_in_the_rank_s_log(tmp_path):
    backend, request = nemo_backend(tmp_path, "pretrain.gridengine.nodes=1")
    run_script(backend.render(request).printable, tmp_path, ["host1"], crash=True)
    assert "RuntimeError: boom" in (tmp_path / ".bcp-pipeline/runs/RUN/logs/4242/rank-00003.log").read_text()


def test_a_docker_image_s_release_tag_picks_the_launcher_s_folder(tmp_path):
    backend, request = nemo_backend(tmp_path, "pretrain.gridengine.container_image=docker://nvcr.io/nvidia/nemo:24.07")
    script = backend.render(request).printable
    assert "/opt/NeMo-Framework-Launcher/launcher_scripts/main.py" in script
    assert "apptainer exec --nv --bind" in script and "docker://nvcr.io/nvidia/nemo:24.07" in script


def test_a_nemo_stage_without_an_image_is_refused_naming_the_stage_and_the_keys(capsys):
    capsys.readouterr()
    assert main(["--config", str(REPO / "pipelines.yaml"), "plan", "slimpajama-126m", "--backend", "gridengine"]) == 2
    err = capsys.readouterr().err
    assert "stage pretrain: NeMo pretraining on Grid Engine" in err and "gridengine.container_image" in err, err
    assert "backends.gridengine.container: apptainer" in err


def test_plan_prints_the_script_exactly_as_submitted(tmp_path, capsys):
    backend, request = nemo_backend(tmp_path, run_id="slimpajama-126m-RUN")  # the run id `plan` renders for
    capsys.readouterr()
    assert (
        main(
            [
                "--config",
                str(tmp_path / "pipelines.yaml"),
                "plan",
                "slimpajama-126m",
                "--backend",
                "gridengine",
                *[word for value in SETS for word in ("--set", value)],
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    submitted = backend.render(request).printable
    assert "torchrun --nnodes" in submitted and submitted in printed


def test_nodes_times_processes_per_node_is_checked_against_the_model_s_parallel_sizes(tmp_path, capsys):
    nemo_backend(tmp_path)  # writes the config
    capsys.readouterr()
    assert (
        main(
            [
                "--config",
                str(tmp_path / "pipelines.yaml"),
                "plan",
                "slimpajama-126m",
                "--backend",
                "gridengine",
                *[word for value in (*SETS, "pretrain.gridengine.nodes=3") for word in ("--set", value)],
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "gpt3/126m on 3 node(s): global batch 256 is not divisible" in err, err
    assert "valid node counts with 4 GPUs per node: 1, 2, 4, 8" in err


def test_torchrun_for_ranks_that_never_meet_is_refused_not_ignored(tmp_path, capsys):
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
            "download.gridengine.launcher=torchrun",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "stage download: gridengine.launcher torchrun starts the ranks of a distributed" in err, err


def test_a_distributed_stage_with_launcher_torchrun_runs_one_torchrun_a_host_in_its_image(tmp_path):
    from support.apptainer import container_backend

    backend, request = container_backend(
        tmp_path, "pretrain.gridengine.launcher=torchrun", "pretrain.gridengine.processes_per_node=4"
    )
    script = backend.render(request).printable
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "run_rank()" not in script  # the script starts no ranks itself
    start = script.index("launch_node() {")
    call = script[start : script.index("\n}", start)].split("\n", 2)[2].replace("\\\n", " ")
    words = shlex.split(
        call.replace('"$nodes"', "2")
        .replace('"$per_node"', "4")
        .replace('"$JOB_ID"', "9")
        .replace('"$MASTER_ADDR:$MASTER_PORT"', "h1:29500")
        .replace('"$logs/$JOB_ID"', "/logs/9")
    )
    apptainer = documented_exec(words)  # Apptainer's documented grammar
    assert apptainer.container == "/images/nemo framework 24.05.sif" and "--nv" in apptainer.flags()
    assert apptainer.command[:13] == [
        "python3",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "4",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "h1:29500",
        "--rdzv-id",
        "9",
    ]
    program = apptainer.command[apptainer.command.index("/logs/9") + 1 :]
    assert program[:2] == ["bash", f"{REPO / 'stages'}/bootstrap.sh"] and program[3].endswith("pretrain_local.py")


def test_the_nemo_job_script_runs_under_the_strict_apptainer_stand_in_without_the_job_s_path(tmp_path):
    """The whole one-host NeMo job script (data list, the launcher's debug mode, torchrun of the training) run by
    bash with the STRICT Apptainer stand-in (tests/fakes/apptainer_bin: Apptainer's environment, no host PATH, a
    read-only image) and no cell: python3 and torchrun are found through the fake image's own PATH only (the job's
    PATH has no Python environment), as in a NeMo image. The same on the real cell: tests/e2e/test_gridengine_e2e.py."""
    from support.ge_nemo import nemo_project  # the project the cell's test runs

    config = nemo_project(tmp_path, nodes=1, steps=12)
    loaded = load_config(config, [], pipeline="nemo")
    pipeline = loaded.pipelines["nemo"]
    stage = pipeline.stages["pretrain"]
    run_dir = tmp_path / ".bcp-pipeline/runs/RUN"
    backend = GridEngineBackend(
        loaded.options["gridengine"],
        config_dir=tmp_path,
        stages_dir=REPO / "stages",
        run_dir=run_dir,
        workspace_name="main",
    )
    script = backend.render(
        JobRequest(
            run_id="RUN", pipeline=pipeline, stage=stage, kind="stage", program=stage.program, args=tuple(stage.args)
        )
    ).printable
    (tmp_path / "job.sh").write_text(script)
    workspace = tmp_path / "ws/main"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PATH": "/usr/local/bin:/usr/bin:/bin", "JOB_ID": "77", "SGE_TASK_ID": "undefined"}
    done = subprocess.run(
        ["bash", str(tmp_path / "job.sh")], cwd=workspace, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    log = (run_dir / "logs/77/rank-00000.log").read_text()
    assert "global_step=11.000" in log and "`Trainer.fit` stopped: at step 12" in log
