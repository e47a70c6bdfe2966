"""The Slurm backend without a cluster: golden batch scripts, shell quoting run through bash, the state map, and
poll/find_active/submit/logs against fakes of squeue, sacct, sbatch, scancel and scontrol (routed by argv[0])."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support.golden_files import REPO, assert_golden, normalize
from support.pipeline_fixtures import make_stages_dir

from bcp_pipeline.backends.contract import JobRequest, JobState, JobStatus
from bcp_pipeline.backends.shared.batch import job_name
from bcp_pipeline.backends.slurm.backend import SlurmBackend, launcher_failure
from bcp_pipeline.backends.slurm.render import nemo_launcher_script, slurm_time
from bcp_pipeline.backends.slurm.states import STATE_MAP, decode_exit, failed_tasks
from bcp_pipeline.cli.main import main
from bcp_pipeline.config.load import load_config
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.errors import CommandError, ConfigError, SubmissionError

LABEL = 'it\'s a "test"; rm -rf / #'
TRICKY = """\
version: 1
stages_dir: stages
backends:
  slurm: {workspace_dir: "ws dir/it's;here", python: "PYTHON", partition: batch, account: proj-a}
pipelines:
  tricky:
    workspace: {name: main}
    vars: {label: 'LABEL'}
    verification:
      slurm: {time: 10m}
    stages:
      odd:
        program: items.py
        args: [--out, "${workspace}/out dir", --count, "3", --name, "${label}"]
        bcp: {replicas: 2, processes: 4, total_runtime: 1D2h}
        slurm:
          cpus_per_task: 6
          gpus_per_node: 8
          mem: 64G
          container_image: "nvcr.io#nvidia/nemo:24.05"
          container_mounts: ["/lustre/data:/data:ro"]
          extra_args: [--exclusive, "--constraint=a100&ib"]
          srun_args: [--mpi=pmix, "--cpu-bind=map_cpu:0,1"]
          env: {GREETING: "hello 'world'; $HOME `id`", NCCL_DEBUG: INFO}
        verify:
          - {glob: "${workspace}/out dir/item-*.txt", expect: 3}
"""
FAKE_PROGRAM = """#!{python}
import json, os, sys
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_PORT", "GREETING",
        "BCP_PIPELINE_RUN_ID", "BCP_PIPELINE_STAGE"]
with open(os.environ["FAKE_OUT"], "w") as out:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": {{k: os.environ.get(k) for k in keys}}}}, out)
"""
FAKE_SRUN = """#!{python}
import json, os, sys
args = sys.argv[1:]
split = args.index("bash")
json.dump(args[:split], open(os.environ["FAKE_OUT"] + ".srun", "w"))
lost = {{int(r) for r in os.environ.get("FAKE_SRUN_LOST", "").split(",") if r}}  # tasks of a lost node: never run
for rank in (0, 1, 2, 3, 4, 6, 7, 5):  # the 2 x 4 tasks; rank 5 last: its FAKE_OUT is the one the test reads
    if rank in lost:
        continue
    env = {{**os.environ, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "8", "SLURM_LOCALID": str(rank % 4),
           "SLURM_NTASKS_PER_NODE": "4", "SLURM_NODEID": str(rank // 4)}}
    code = os.spawnvpe(os.P_WAIT, args[split], args[split:], env)
    if code:
        sys.exit(code)
sys.exit(0)  # srun's answer even where a node was lost
"""
FAKE_CLI = """#!{python}
import json, os, sys
from pathlib import Path
root = Path(os.environ["FAKE_SLURM"])
name = Path(sys.argv[0]).name
with open(root / "calls.jsonl", "a") as log:
    log.write(json.dumps([name, *sys.argv[1:], sys.stdin.read() if name == "sbatch" else ""]) + "\\n")
answer = json.loads((root / f"{{name}}.json").read_text()) if (root / f"{{name}}.json").exists() else {{}}
sys.stdout.write(answer.get("stdout", ""))
sys.stderr.write(answer.get("stderr", ""))
sys.exit(answer.get("rc", 0))
"""


def tricky_config(tmp_path: Path, *overrides: str):
    make_stages_dir(tmp_path)
    config = tmp_path / "pipelines.yaml"
    text = TRICKY.replace("PYTHON", str(tmp_path / "bin" / "fake-python"))
    config.write_text(text.replace("LABEL", LABEL.replace("'", "''")))  # a single-quoted YAML scalar
    return load_config(config, overrides=list(overrides), pipeline="tricky")


def backend_and_request(tmp_path: Path, *overrides: str, kind: str = "stage"):
    config = tricky_config(tmp_path, *overrides)
    pipeline = config.pipeline("tricky")
    stage = pipeline.stages["odd"]
    backend = SlurmBackend(
        config.options["slurm"],
        config_dir=tmp_path,
        stages_dir=config.stages_dir,
        run_dir=tmp_path / ".bcp-pipeline/runs/tricky-RUN",
        workspace_name="main",
    )
    args = ("--check", "x=3") if kind == "verify" else tuple(stage.args)
    request = JobRequest(
        run_id="tricky-RUN",
        pipeline=pipeline,
        stage=stage,
        kind=kind,
        program="verify.py" if kind == "verify" else stage.program,
        args=args,
    )
    return backend, request


def plan(capsys, config: Path, pipeline: str) -> str:
    capsys.readouterr()
    assert main(["--config", str(config), "plan", pipeline, "--backend", "slurm"]) == 0
    return capsys.readouterr().out.replace(sys.executable, "<PYTHON>")


def test_plan_demo_golden(capsys):
    assert_golden("slurm/plan-demo.txt", normalize(plan(capsys, REPO / "pipelines.yaml", "demo")))


def test_plan_slimpajama_126m_renders_the_nemo_launcher_for_bcm(capsys):
    text = normalize(plan(capsys, REPO / "pipelines.yaml", "slimpajama-126m"))
    assert_golden("slurm/plan-slimpajama-126m.txt", text)
    assert "main.py cluster_type=bcm" in text and "cluster.job_name_prefix=slimpajama-126m-RUN.pretrain.nemo." in text


def test_nemo_launcher_command_with_a_data_list_golden(tmp_path):
    import data_list

    overrides = ["pretrain.slurm.partition=batch", "pretrain.slurm.container_image=nvcr.io#nvidia/nemo:24.05"]
    config = load_and_check(REPO / "pipelines.yaml", overrides=overrides, pipeline="slimpajama-126m")
    pipeline = config.pipeline("slimpajama-126m")
    backend = SlurmBackend(
        config.options["slurm"],
        config_dir=Path("/proj"),
        stages_dir=Path("/proj/stages"),
        run_dir=Path("/proj/.bcp-pipeline/runs/RUN"),
        workspace_name="nemo-framework",
    )
    stage = pipeline.stages["pretrain"]
    request = JobRequest(
        run_id="RUN", pipeline=pipeline, stage=stage, kind="stage", program=stage.program, args=tuple(stage.args)
    )
    prefix = "/proj/.bcp-pipeline/workspaces/nemo-framework/data/slimpajama/preprocessed/train_chunk_"
    blend = [0.6, f"{prefix}0.jsonl_text_document", 0.4, f"{prefix}1.jsonl_text_document"]
    listed = data_list.render_hydra(blend, key="training.model.data.data_prefix")
    script = nemo_launcher_script(request, backend.options, backend.paths, data_prefix=listed)
    assert_golden("slurm/nemo-launcher-bcm.sh", script)
    words = shlex.split(script.splitlines()[-1])
    assert words[:3] == ["python3", "/opt/NeMo-Megatron-Launcher/launcher_scripts/main.py", "cluster_type=bcm"]
    assert listed in words and "training.trainer.num_nodes=4" in words and "cluster.partition=batch" in words


def run_tricky_script(tmp_path: Path, script: str, **env_extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The batch script run by bash with a fake `srun` (2 x 4 tasks, one after another) and a fake program."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("fake-python", FAKE_PROGRAM), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "seen.json"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "FAKE_OUT": str(out),
        "RANK": "99",
        **env_extra,
    }
    workspace = tmp_path / "ws dir/it's;here/main"
    workspace.mkdir(parents=True)
    return subprocess.run(["bash", "-c", script], cwd=workspace, env=env, capture_output=True, text=True), out


def test_tricky_stage_golden_and_every_value_survives_the_shell(tmp_path):
    backend, request = backend_and_request(tmp_path, "odd.slurm.container_image=null")
    script = backend.render(request).printable
    assert_golden("slurm/tricky-stage.sbatch", normalize(script, tmp_path))
    result, out = run_tricky_script(tmp_path, script)
    workspace = tmp_path / "ws dir/it's;here/main"
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    assert seen["argv"] == [
        str(tmp_path / "stages/items.py"),
        "--out",
        f"{workspace}/out dir",
        "--count",
        "3",
        "--name",
        LABEL,
    ]
    assert seen["env"] == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "NODE_RANK": "1",
        "MASTER_PORT": str(20000 + 4242),
        "GREETING": "hello 'world'; $HOME `id`",
        "BCP_PIPELINE_RUN_ID": "tricky-RUN",
        "BCP_PIPELINE_STAGE": "odd",
    }
    srun_flags = json.loads(Path(f"{out}.srun").read_text())
    logs = tmp_path / ".bcp-pipeline/runs/tricky-RUN/logs"
    assert srun_flags == [
        "--kill-on-bad-exit=0",
        "--open-mode=append",
        f"--output={logs}/%j/rank-%5t.log",
        f"--error={logs}/%j/rank-%5t.log",
        "--mpi=pmix",
        "--cpu-bind=map_cpu:0,1",
    ]
    assert (logs / "4242").is_dir() and (logs / "slurm-4242.exit").read_text() == "0\n"


def test_container_stage_golden(tmp_path):
    backend, request = backend_and_request(tmp_path)
    script = backend.render(request).printable
    assert_golden("slurm/container-stage.sbatch", normalize(script, tmp_path))
    srun = script[script.index("\nsrun ") :]
    assert "--container-image='nvcr.io#nvidia/nemo:24.05'" in srun and "bootstrap.sh" in srun
    assert "#SBATCH --time=1-02:00:00" in script and "#SBATCH --nodes=2" in script  # derived from the BCP section
    assert backend.sharding(request) == {"replicas": 2, "processes": 4}


def test_verification_job_uses_the_pipeline_verification_section(tmp_path):
    backend, request = backend_and_request(tmp_path, kind="verify")
    script = backend.render(request).printable
    assert "#SBATCH --time=10:00" not in script and "#SBATCH --time=00:10:00" in script
    assert f"#SBATCH --job-name={job_name('tricky-RUN', 'odd', 'verify')}" in script
    assert backend.sharding(request) == {"replicas": 1, "processes": 1}


def test_bad_env_name_and_sizes_are_refused(tmp_path):
    backend, request = backend_and_request(tmp_path, "odd.slurm.env={'A-B': x}")
    with pytest.raises(SubmissionError, match="'A-B' is not a shell variable name"):
        backend.render(request)
    # a count below 1 is refused with the config itself, naming the --set, before any rendering
    with pytest.raises(ConfigError, match=r"^--set odd\.slurm\.nodes=0: .*slurm\.nodes: must be >= 1, got 0$"):
        backend_and_request(tmp_path, "odd.slurm.nodes=0")


def test_small_pure_pieces():
    assert [slurm_time(d) for d in ("1h", "5D", "1h30m", "90s", "1D2h3m4s")] == [
        "01:00:00",
        "5-00:00:00",
        "01:30:00",
        "00:01:30",
        "1-02:03:04",
    ]
    assert job_name("my pipe,x-20240101", "stage-1", "verify") == "my_pipe_x-20240101.stage-1.verify"
    assert decode_exit("768") == (3, "exit code 3") and decode_exit("15") == (143, "killed by SIGTERM")
    assert decode_exit("3:0") == (3, "exit code 3") and decode_exit("0:9") == (137, "killed by SIGKILL")
    assert decode_exit("") == (None, "")
    log = "srun: error: n1: tasks 0,2-3: Exited with exit code 1\nsrun: error: n2: task 5: Killed\nother\n"
    assert failed_tasks(log) == {0: "exited 1", 2: "exited 1", 3: "exited 1", 5: "Killed"}


def test_a_task_that_recorded_no_exit_fails_the_job_although_srun_said_0(tmp_path):
    """What a lost node leaves (NODE_FAIL): srun can exit 0 while that node's tasks never finished. The batch script
    holds every rank to its own exit record, so the job's record (what `_forgotten` reads once Slurm has forgotten
    the job) says it failed."""
    backend, request = backend_and_request(tmp_path, "odd.slurm.container_image=null")
    result, _ = run_tricky_script(tmp_path, backend.render(request).printable, FAKE_SRUN_LOST="4,6")
    assert result.returncode == 1
    assert "srun exited 0, but task 4 recorded exit none (a lost node?)" in result.stderr
    assert "task 6 recorded exit none" in result.stderr and "task 5 recorded" not in result.stderr
    logs = tmp_path / ".bcp-pipeline/runs/tricky-RUN/logs"
    assert (logs / "4242" / "rank-5.exit").read_text() == "0\n"
    assert (logs / "slurm-4242.exit").read_text() == "1\n"
    backend._sacct_enabled = False  # a cluster without accounting: the record is all there is
    status = backend._forgotten(["4242"])["4242"]
    assert status.state is JobState.FAILED and status.exit_code == 1


def test_state_map_is_explicit_and_unknown_is_not_finished():
    expected = {
        "PENDING": JobState.QUEUED,
        "RUNNING": JobState.RUNNING,
        "COMPLETING": JobState.RUNNING,
        "COMPLETED": JobState.SUCCEEDED,
        "FAILED": JobState.FAILED,
        "CANCELLED": JobState.CANCELLED,
        "TIMEOUT": JobState.TIMED_OUT,
        "NODE_FAIL": JobState.LOST,
        "PREEMPTED": JobState.PREEMPTED,
        "OUT_OF_MEMORY": JobState.FAILED,
        "BOOT_FAIL": JobState.LOST,
        "DEADLINE": JobState.TIMED_OUT,
    }
    assert {k: STATE_MAP[k] for k in expected} == expected
    for name in (
        "REQUEUED",
        "SUSPENDED",
        "CONFIGURING",
        "RESIZING",
        "SPECIAL_EXIT",
        "STOPPED",
        "SIGNALING",
        "STAGE_OUT",
        "REVOKED",
        "REQUEUE_HOLD",
    ):
        assert name in STATE_MAP
    assert not STATE_MAP["SUSPENDED"].finished and not STATE_MAP["REQUEUED"].finished


# -- transport against fake CLIs ------------------------------------------------------------------------------
@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    root = tmp_path / "fake"
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("squeue", "sacct", "sbatch", "scancel", "scontrol"):
        (bin_dir / name).write_text(FAKE_CLI.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(root))

    class Fake:
        def answer(self, name: str, stdout: str = "", stderr: str = "", rc: int = 0) -> None:
            (root / f"{name}.json").write_text(json.dumps({"stdout": stdout, "stderr": stderr, "rc": rc}))

        def calls(self) -> list[list[str]]:
            path = root / "calls.jsonl"
            return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    return Fake()


def squeue_lines(*rows: tuple[str, ...]) -> str:
    return "".join("|".join([*row, ""]) + "\n" for row in rows)


def test_poll_is_one_squeue_call_with_sacct_and_exit_record_fallbacks(tmp_path, fake_slurm):
    backend, _ = backend_and_request(tmp_path)
    fake_slurm.answer(
        "squeue",
        squeue_lines(
            ("11", "RUNNING", "0", "None", "1", "batch", "n"),
            ("12", "FAILED", "768", "NonZeroExitCode", "1", "batch", "n"),
            ("13", "CANCELLED", "15", "None", "1", "batch", "n"),
            ("14", "SOMETHING_NEW", "0", "None", "1", "batch", "n"),
        ),
    )
    fake_slurm.answer("sacct", stderr="Slurm accounting storage is disabled\n", rc=1)
    backend.logs_dir.mkdir(parents=True)
    (backend.logs_dir / "slurm-15.exit").write_text("0\n")
    (backend.logs_dir / "slurm-16.exit").write_text("2\n")
    statuses = backend.poll(["11", "12", "13", "14", "15", "16", "17"])
    got = {job_id: (s.state, s.exit_code) for job_id, s in statuses.items()}
    assert got == {
        "11": (JobState.RUNNING, None),
        "12": (JobState.FAILED, 3),
        "13": (JobState.CANCELLED, 143),
        "14": (JobState.UNKNOWN, None),
        "15": (JobState.SUCCEEDED, 0),
        "16": (JobState.FAILED, 2),
        "17": (JobState.LOST, None),
    }
    assert statuses["12"].detail == "Slurm reason NonZeroExitCode; exit code 3"
    assert "no exit record" in statuses["17"].detail
    calls = fake_slurm.calls()
    assert [c[0] for c in calls] == ["squeue", "sacct"]
    assert "--jobs=11,12,13,14,15,16,17" in calls[0]
    backend.poll(["15"])
    assert [c[0] for c in fake_slurm.calls()[2:]] == ["squeue"]  # accounting is off: sacct is not asked again


def test_sacct_answers_for_forgotten_jobs_when_accounting_is_on(tmp_path, fake_slurm):
    backend, _ = backend_and_request(tmp_path)
    fake_slurm.answer("squeue", stderr="slurm_load_jobs error: Invalid job id specified\n", rc=1)
    fake_slurm.answer("sacct", "21|CANCELLED by 0|0:15\n")
    status = backend.poll(["21"])["21"]
    assert (status.state, status.native, status.exit_code) == (JobState.CANCELLED, "CANCELLED", 143)


def test_a_failing_squeue_is_an_error_for_the_orchestrator_to_retry(tmp_path, fake_slurm):
    backend, _ = backend_and_request(tmp_path)
    fake_slurm.answer("squeue", stderr="slurm_load_jobs error: Unable to contact slurm controller\n", rc=1)
    with pytest.raises(CommandError, match="Unable to contact"):
        backend.poll(["1"])


def test_a_job_that_can_never_start_is_failed_and_cancelled(tmp_path, fake_slurm):
    backend, _ = backend_and_request(tmp_path)
    fake_slurm.answer(
        "squeue",
        squeue_lines(
            ("31", "PENDING", "0", "PartitionConfig", "1", "batch", "n"),
            ("32", "PENDING", "0", "PartitionNodeLimit", "4", "batch", "n"),
            ("33", "PENDING", "0", "PartitionNodeLimit", "2", "batch", "n"),
            ("34", "PENDING", "0", "Priority", "1", "batch", "n"),
        ),
    )
    fake_slurm.answer("scontrol", "PartitionName=batch AllowGroups=ALL MaxNodes=UNLIMITED TotalNodes=2 State=UP\n")
    statuses = backend.poll(["31", "32", "33", "34"])
    assert {k: s.state for k, s in statuses.items()} == {
        "31": JobState.FAILED,
        "32": JobState.FAILED,
        "33": JobState.QUEUED,
        "34": JobState.QUEUED,
    }
    assert statuses["31"].native == "PENDING(PartitionConfig)" and "can never start" in statuses["31"].detail
    assert statuses["34"].detail == "Slurm reason Priority"
    assert fake_slurm.calls()[-1][:3] == ["scancel", "31", "32"]


def test_find_active_matches_name_and_unfinished_state(tmp_path, fake_slurm):
    backend, _ = backend_and_request(tmp_path)
    fake_slurm.answer(
        "squeue",
        squeue_lines(
            ("1", "COMPLETED", "0", "None", "1", "b", "R.odd"),
            ("2", "RUNNING", "0", "None", "1", "b", "R.odd"),
            ("3", "PENDING", "0", "Priority", "1", "b", "R.odd.verify"),
            ("4", "RUNNING", "0", "None", "1", "b", "R.odd.nemo.gpt_126m"),
            ("5", "RUNNING", "0", "None", "1", "b", "R.odd-other"),
        ),
    )
    assert backend.find_active("R", "odd", "stage") == ["2", "4"]
    assert backend.find_active("R", "odd", "verify") == ["3"]
    assert f"--user={os.getuid()}" in fake_slurm.calls()[0]


def test_submit_pipes_the_script_to_sbatch_parsable(tmp_path, fake_slurm):
    backend, request = backend_and_request(tmp_path)
    submission = backend.render(request)
    fake_slurm.answer("sbatch", "4711;cluster\n")
    assert backend.submit(submission) == "4711"
    name, *args, stdin = fake_slurm.calls()[0]
    assert (name, args, stdin) == ("sbatch", ["--parsable"], submission.printable)
    assert backend.logs_dir.is_dir() and Path(backend.paths.workspace).is_dir()
    fake_slurm.answer("sbatch", "sbatch: error: Batch job submission failed: Invalid account\n", rc=1)
    with pytest.raises(CommandError, match="Invalid account"):
        backend.submit(submission)


def test_logs_progress_and_failure_detail_read_the_task_files(tmp_path):
    backend, _ = backend_and_request(tmp_path)
    job = backend.logs_dir / "77"
    job.mkdir(parents=True)
    (backend.logs_dir / "slurm-77.log").write_text("srun: error: n1: task 1: Exited with exit code 1\n")
    (job / "rank-00000.log").write_text('##bcp-pipeline progress {"done": 2, "total": 2, "unit": "files"}\n')
    (job / "rank-00001.log").write_text(
        '##bcp-pipeline progress {"done": 1, "total": 2, "unit": "files"}\nitem-0003.txt: told to fail\n'
    )
    assert backend.logs("77", rank=1, tail=1) == "item-0003.txt: told to fail"
    assert "==> rank-00000.log <==" in backend.logs("77") and "==> slurm-77.log <==" in backend.logs("77")
    progress = backend.progress("77")
    assert (progress.done, progress.total, progress.unit) == (3, 4, "files")
    detail = backend.failure_detail(
        "77",
        JobStatus(
            job_id="77", state=JobState.FAILED, native="FAILED", detail="Slurm reason NonZeroExitCode; exit code 1"
        ),
    )
    assert detail.splitlines()[:2] == ["Slurm reason NonZeroExitCode; exit code 1", "rank 1 exited 1"]
    assert "item-0003.txt: told to fail" in detail
    with pytest.raises(SubmissionError, match="no log for rank 5"):
        backend.logs("77", rank=5)


def test_preempted_jobs_are_requeued_and_sacct_outages_are_not_fatal(tmp_path, fake_slurm):
    backend, _ = backend_and_request(tmp_path)
    fake_slurm.answer("squeue", squeue_lines(("41", "PREEMPTED", "0", "None", "1", "batch", "n")))
    status = backend.poll(["41", "42"])["41"]
    assert status.state is JobState.PREEMPTED and not status.state.finished
    assert backend.resume("41") is True
    assert ["scontrol", "requeue", "41", ""] in fake_slurm.calls()
    fake_slurm.answer("scontrol", stderr="Requested operation is presently disabled\n", rc=1)
    assert backend.resume("41") is False
    assert backend._sacct_enabled  # sacct answered nothing (no canned reply) but did not say accounting is off
    fake_slurm.answer("sacct", stderr="sacct: error: slurmdbd: Connection refused\n", rc=1)
    assert backend.poll(["42"]) == {} and backend._sacct_enabled  # asked again next cycle, not declared lost


# -- the NeMo launcher's step: a failure of its own is permanent, sbatch not reaching the controller is not --------
LAUNCHER_ARGV = ["bash", "-c", "python3 /opt/NeMo-Megatron-Launcher/launcher_scripts/main.py ..."]


@pytest.mark.parametrize(
    "code, output",
    [
        (
            1,
            'Traceback (most recent call last):\n  File "main.py", line '
            "1\nModuleNotFoundError: No module named 'hydra'",
        ),
        (2, "python3: can't open file '/opt/NeMo-Megatron-Launcher/launcher_scripts/main.py': [Errno 2] No such file"),
        (1, "Could not override 'training.trainer.max_steps'.\nKey 'max_stepz' is not in struct"),
        (127, "bash: python3: command not found"),
    ],
)
def test_a_launcher_failure_of_its_own_is_permanent_and_fails_the_stage_at_once(code, output):
    failure = launcher_failure(CommandError(LAUNCHER_ARGV, code, output))
    assert isinstance(failure, SubmissionError)  # the submitter fails the stage on it, with no retry
    assert str(failure).startswith("the NeMo launcher failed on this machine, as it would again: `bash` exited")
    assert output.splitlines()[-1].split(":")[0] in str(failure)


@pytest.mark.parametrize(
    "code, output",
    [
        (1, "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"),
        (1, "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"),
        (1, "sbatch: error: Batch job submission failed: Resource temporarily unavailable"),
        (124, "timed out after 1800 s: "),
    ],
)
def test_a_launcher_whose_sbatch_did_not_reach_the_controller_is_tried_again(code, output):
    error = CommandError(LAUNCHER_ARGV, code, output)
    assert launcher_failure(error) is error  # a BackendCallError: the submitter retries it
