"""NVIDIA's ngc CLI code (tests/fakes/ngc) against the NGC API EMULATOR (tests/fakes/ngc_api.py), and the bcprun
stand-in: NVIDIA's parser, HTTP client, gRPC upload and printers end to end; local job runs; the test controls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ngc_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
import ngc_control  # noqa: E402
from ngc_control import FakeNgc  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not ngc_parser.available(), reason="job run needs ngcsdk==4.19.1 and argcomplete"),
    pytest.mark.both_transports,
]  # the emulator must answer each of NVIDIA's clients

BCPRUN = ngc_control.FAKES_DIR / "bcprun"
CANARY_KEY = "canary-api-key-3f9d"  # must never show up in any output, log or state file
IMAGE = "nvcr.io/nvaie/nemo-framework-training:23.11"


@pytest.fixture()
def fake(tmp_path: Path, ngc_tls_dir: Path) -> Iterator[FakeNgc]:
    fake = FakeNgc(tmp_path / "ngc-home", api_key=CANARY_KEY, tls_dir=ngc_tls_dir).start()
    fake.create_workspace("ws")
    yield fake
    fake.shutdown()


def env_for(fake: FakeNgc) -> dict[str, str]:
    return fake.env()


def ngc(fake: FakeNgc, *args: str) -> subprocess.CompletedProcess:
    return fake.ngc(*args, env=env_for(fake))


def ngc_json(fake: FakeNgc, *args: str) -> Any:
    result = ngc(fake, *args, "--format_type", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def run_argv(
    command: str, *extra: str, name: str = "stage", replicas: int = 1, array_type: str = "PYTORCH"
) -> list[str]:
    """``base-command job run`` arguments as the orchestrator would render them."""
    multi = ["--replicas", str(replicas), "--array-type", array_type, "--total-runtime", "1h"] if replicas > 1 else []
    return ["base-command", "job", "run", "--name", name, "--image", IMAGE, "--instance", "dgxa100.80g.8.norm",
            "--result", "/results", "--workspace", "ws:/mount_ws:RW", "--commandline", command, *multi, *extra,
            "--format_type", "json"]  # fmt: skip


def ngc_parallel(fake: FakeNgc, *argvs: list[str]) -> list[subprocess.CompletedProcess]:
    """Several invocations at once (each spends ~1 s importing ngcsdk; 2 cores share that)."""
    procs = [subprocess.Popen([sys.executable, str(ngc_control.NGC_EMULATOR), *argv], env=env_for(fake),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for argv in argvs]  # fmt: skip
    results = []
    for argv, proc in zip(argvs, procs):
        out, err = proc.communicate(timeout=60)
        results.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    return results


def job_id_of(result: subprocess.CompletedProcess) -> int:
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["jobStatusHistory"] == [] and out["job"]["jobStatus"]["status"] == "CREATED"
    return out["job"]["id"]


def submit(
    fake: FakeNgc, command: str, *extra: str, name: str = "stage", replicas: int = 1, array_type: str = "PYTORCH"
) -> int:
    """Submit one job; returns its id."""
    return job_id_of(ngc(fake, *run_argv(command, *extra, name=name, replicas=replicas, array_type=array_type)))


def wait_status(
    fake: FakeNgc, job_id: int, goal: set[str] | frozenset[str] = ngc_control.TERMINAL_STATES, timeout: float = 20
) -> dict[str, Any]:
    """Poll with ``job info`` (the CLI, as an orchestrator does) until the status is in ``goal``."""
    deadline = time.monotonic() + timeout
    while True:
        info = ngc_json(fake, "base-command", "job", "info", str(job_id))
        if info["job"]["jobStatus"]["status"] in goal:
            return info
        assert time.monotonic() < deadline, info["job"]["jobStatus"]
        time.sleep(0.1)


def test_two_replica_job_with_bcprun(fake: FakeNgc) -> None:
    per_rank = "echo $RANK $WORLD_SIZE $LOCAL_RANK $NGC_ARRAY_INDEX > /mount_ws/rank_$RANK.txt; echo hello rank $RANK"
    command = f"bcprun --nnodes 2 --npernode 2 -no_redirect --cmd '{per_rank}'"
    job_id = submit(fake, command, "--label", "bcpp_run_abc", "--label", "stage_dl", replicas=2)
    info = wait_status(fake, job_id)
    assert info["job"]["jobStatus"]["status"] == "FINISHED_SUCCESS"
    history = [h["status"] for h in info["jobStatusHistory"]]
    assert history == ["CREATED", "QUEUED", "STARTING", "RUNNING", "FINISHED_SUCCESS"]
    ranks = sorted(p.read_text().split() for p in fake.workspace_path("ws").glob("rank_*.txt"))
    assert ranks == [["0", "4", "0", "0"], ["1", "4", "1", "0"], ["2", "4", "0", "1"], ["3", "4", "1", "1"]]
    definition = info["job"]["jobDefinition"]
    assert (definition["replicaCount"], definition["arrayType"], definition["command"]) == (2, "PYTORCH", command)
    assert definition["workspaceMounts"][0]["containerMountPoint"] == "/mount_ws"
    # logs: per replica; like the real CLI, nothing is printed with --format_type json
    log = ngc(fake, "base-command", "job", "log", f"{job_id}:1")
    assert sorted(log.stdout.split("\n")) == ["", "hello rank 2", "hello rank 3"]
    assert ngc(fake, "base-command", "job", "log", str(job_id), "--format_type", "json").stdout == ""
    assert ngc(fake, "batch", "log", str(job_id), "--tail", "--lines", "1").stdout.startswith("hello rank")
    # found again by label, with wildcards
    assert [j["id"] for j in ngc_json(fake, "base-command", "job", "list", "--label", "bcpp_run_*")] == [job_id]
    assert ngc_json(fake, "base-command", "job", "list", "--label", "other_*") == []
    # the shapes survive NVIDIA's own model classes unchanged (no unknown or mistyped field)
    ngc_parser.parse_args(["batch", "list"])  # loads ngcsdk with the offline set-up before any ngcsdk import
    from basecommand.data.api.JobResponse import JobResponse  # pylint: disable=import-outside-toplevel

    assert JobResponse(info).toDict() == info


def test_rejected_like_the_real_cli_and_nothing_submitted(fake: FakeNgc) -> None:
    base = ["base-command", "job", "run", "--name", "xx", "--image", IMAGE, "--instance", "dgxa100.80g.1.norm",
            "--result", "/results", "--commandline", "true", "--format_type", "json"]  # fmt: skip
    lowercase, env_var, unknown_ws = ngc_parallel(
        fake, base + ["--workspace", "ws:/m:rw"], base + ["--env-var", "A=b"], base + ["--workspace", "nope:/m"]
    )
    assert lowercase.returncode == 2 and "usage:" in lowercase.stderr and "<RW|RO>" in lowercase.stderr
    assert env_var.returncode == 1 and "Key-value must match" in json.loads(env_var.stderr)["error"]
    assert unknown_ws.returncode == 1 and "not found" in json.loads(unknown_ws.stderr)["error"]
    assert fake.jobs() == {}


def test_the_key_is_exchanged_for_a_token_and_a_wrong_key_is_refused(fake: FakeNgc) -> None:
    assert ngc(fake, "base-command", "job", "list", "--format_type", "json").returncode == 0
    token_requests = fake.requests("GET", "/token")
    assert token_requests and all(r["status"] == 200 for r in token_requests)
    wrong = fake.ngc(
        "base-command",
        "job",
        "list",
        "--format_type",
        "json",
        env=fake.env(NGC_CLI_API_KEY="not-the-key", NGC_CLI_HOME=str(fake.home / "other-cli-home")),
    )
    assert wrong.returncode == 1 and json.loads(wrong.stderr)["error"] == "Error: Invalid apikey"  # NVIDIA's words
    assert fake.requests("GET", "/token")[-1]["status"] == 401
    assert fake.calls("job list")[-1]["exit"] == 1


def test_kill_stops_the_processes(fake: FakeNgc) -> None:
    job_id = submit(fake, "echo $$ > /results/pid; exec sleep 60")
    wait_status(fake, job_id, {"RUNNING"})
    pid_file = fake.home / "jobs" / str(job_id) / "results" / "0" / "pid"
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    kill = ngc(fake, "base-command", "job", "kill", str(job_id), "--format_type", "json")
    assert (kill.returncode, kill.stdout) == (0, "")
    info = wait_status(fake, job_id)
    assert info["job"]["jobStatus"]["status"] == "KILLED_BY_USER"
    fake.shutdown()  # waits for the supervisor, which reaps the killed process group
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # as the real CLI: a failed kill is reported on stderr, exit code 0
    again = ngc(fake, "base-command", "job", "kill", str(job_id), "--format_type", "json")
    assert again.returncode == 0 and "failed" in json.loads(again.stderr)["error"]


def test_preempted_job_waits_for_resume_and_reruns(fake: FakeNgc) -> None:
    fake.inject("PREEMPTED", label="stage_train")
    job_id = submit(fake, "echo attempt >> /mount_ws/attempts.txt", "--label", "stage_train")
    assert wait_status(fake, job_id, {"PREEMPTED"})["job"]["jobStatus"]["status"] == "PREEMPTED"
    time.sleep(0.3)
    assert fake.status(job_id) == "PREEMPTED", "a preempted job waits for resume or kill"
    resume = ngc(fake, "base-command", "job", "resume", str(job_id), "--format_type", "json")
    assert resume.returncode == 0, resume.stderr
    info = wait_status(fake, job_id)
    assert info["job"]["jobStatus"]["status"] == "FINISHED_SUCCESS"
    assert (fake.workspace_path("ws") / "attempts.txt").read_text() == "attempt\nattempt\n"
    history = [h["status"] for h in info["jobStatusHistory"]]
    assert history[-5:] == ["PREEMPTED", "QUEUED", "STARTING", "RUNNING", "FINISHED_SUCCESS"]
    not_preempted = ngc(fake, "base-command", "job", "resume", str(job_id), "--format_type", "json")
    assert not_preempted.returncode == 1 and "only a PREEMPTED job" in json.loads(not_preempted.stderr)["error"]


def test_preempt_by_the_user_then_kill(fake: FakeNgc) -> None:
    job_id = submit(fake, "exec sleep 60")
    wait_status(fake, job_id, {"RUNNING"})
    preempt = ngc(fake, "base-command", "job", "preempt", str(job_id), "--format_type", "json")
    assert preempt.returncode == 0, preempt.stderr
    assert wait_status(fake, job_id, {"PREEMPTED"})["job"]["jobStatus"]["statusDetails"] == "Preempted by user"
    assert len(fake.requests("PATCH", f"/v2/org/*/jobs/{job_id}/preempt")) == 1
    assert ngc(fake, "base-command", "job", "kill", str(job_id), "--format_type", "json").returncode == 0
    assert wait_status(fake, job_id)["job"]["jobStatus"]["status"] == "KILLED_BY_USER"


def test_injected_and_real_failures(fake: FakeNgc) -> None:
    fake.inject("FAILED", name="never_*", after_seconds=0, details="disk on fire")
    fake.inject("FAILED_RUN_LIMIT_EXCEEDED", name="long_*", after_seconds=0.3)
    never, long, exit3, partial = map(job_id_of, ngc_parallel(
        fake,
        run_argv("touch /mount_ws/never_ran", name="never_runs"),
        run_argv("sleep 60", name="long_train"),
        run_argv("echo about to fail; exit 3", name="exits_3"),
        # two replicas: replica 1 fails at once; replica 0 would sleep, so it is stopped with the job
        run_argv('if [ "$NGC_ARRAY_INDEX" = 1 ]; then exit 5; fi; sleep 60', name="partial", replicas=2),
    ))  # fmt: skip
    outcomes = {job_id: wait_status(fake, job_id)["job"]["jobStatus"] for job_id in (never, long, exit3, partial)}
    assert (outcomes[never]["status"], outcomes[never]["statusDetails"]) == ("FAILED", "disk on fire")
    assert not (fake.workspace_path("ws") / "never_ran").exists()
    assert outcomes[long]["status"] == "FAILED_RUN_LIMIT_EXCEEDED"
    assert (outcomes[exit3]["status"], outcomes[exit3]["statusType"]) == ("FAILED", "APPLICATION_ERROR")
    assert "code 3" in outcomes[exit3]["statusDetails"]
    assert (outcomes[partial]["status"], "Replica 1" in outcomes[partial]["statusDetails"]) == ("FAILED", True)
    assert ngc(fake, "batch", "log", str(exit3)).stdout == "about to fail\n"
    failed = ngc_json(fake, "base-command", "job", "list", "--status", "FAILED")
    assert sorted(j["id"] for j in failed) == sorted([never, exit3, partial])


def test_held_queued_until_released(fake: FakeNgc) -> None:
    fake.hold_queued(name="held")
    job_id = submit(fake, "echo ran", name="held")
    wait_status(fake, job_id, {"QUEUED"})
    time.sleep(0.3)
    assert fake.status(job_id) == "QUEUED"
    early = ngc(fake, "base-command", "job", "log", str(job_id), "--format_type", "json")
    assert early.returncode == 1 and "not yet started" in json.loads(early.stderr)["error"]
    fake.release(job_id)
    assert wait_status(fake, job_id)["job"]["jobStatus"]["status"] == "FINISHED_SUCCESS"


def test_transient_api_failures_and_the_logs(fake: FakeNgc) -> None:
    fake.fail_requests(2, method="GET", path="/v2/org/*/jobs", status=503, message="Service Unavailable")
    first, second = (ngc(fake, "base-command", "job", "list", "--format_type", "json") for _ in range(2))
    assert (first.returncode, second.returncode) == (1, 1)
    assert "503 Response: Service Unavailable" in json.loads(first.stderr)["error"] and first.stdout == ""
    assert ngc_json(fake, "base-command", "job", "list") == []
    assert ngc(fake, "workspace", "info", "ws").returncode == 0, "other requests are not affected"
    assert [c["exit"] for c in fake.calls("job list")] == [1, 1, 0]
    assert [r["status"] for r in fake.requests("GET", "/v2/org/*/jobs")] == [503, 503, 200]


def test_secrets_env_vars_and_api_key_stay_private(fake: FakeNgc) -> None:
    fake.set_secret("hf", {"token": "hf-secret-value", "other": "x"})
    command = 'echo "$HF_TOKEN|$DATA|${NGC_CLI_API_KEY:-no key}" > /results/seen; env > /results/env.txt'
    job_id = submit(fake, command, "--secret", "hf:token:HF_TOKEN", "--env-var", "DATA:/mount_ws/data")
    info = wait_status(fake, job_id)
    assert info["job"]["jobStatus"]["status"] == "FINISHED_SUCCESS", info["job"]["jobStatus"]
    results = fake.home / "jobs" / str(job_id) / "results" / "0"
    assert (results / "seen").read_text() == f"hf-secret-value|{fake.workspace_path('ws')}/data|no key\n"
    assert "hf-secret-value" not in json.dumps(info) and "hf-secret-value" not in (fake.home / "state.json").read_text()
    missing = ngc(fake, "base-command", "job", "run", "--name", "xx", "--image", IMAGE, "--instance", "dgx",
                  "--result", "/r", "--commandline", "true", "--secret", "nope", "--format_type", "json")  # fmt: skip
    assert missing.returncode == 1 and "Secret 'nope' not found" in missing.stderr
    for path in fake.home.rglob("*"):
        if path.is_file():
            assert CANARY_KEY not in path.read_text(errors="replace"), path


def test_workspace_upload_goes_through_nvidias_grpc_client(fake: FakeNgc, tmp_path: Path) -> None:
    source = tmp_path / "stages"
    (source / "pkg").mkdir(parents=True)
    (source / "a.py").write_text("print('a')\n")
    (source / "pkg" / "b.py").write_text("b\n")
    (source / "pkg" / "b.pyc").write_text("compiled\n")
    upload = ngc(fake, "base-command", "workspace", "upload", "ws", "--source", str(source),
                 "--destination", "/code/v1", "--exclude", "*.pyc", "--format_type", "json")  # fmt: skip
    assert upload.returncode == 0, upload.stderr
    assert json.loads(upload.stdout)["files_uploaded"] == 2  # NVIDIA's transfer summary
    code = fake.workspace_path("ws") / "code" / "v1"
    assert sorted(p.relative_to(code).as_posix() for p in code.rglob("*") if p.is_file()) == ["a.py", "pkg/b.py"]
    assert len(fake.requests("GRPC", "DataSetService/Put")) == 2
    assert ngc(fake, "workspace", "upload", "missing", "--source", str(source)).returncode == 1
    job_id = submit(fake, "python3 /mount_ws/code/v1/a.py", replicas=1)
    wait_status(fake, job_id)
    assert ngc(fake, "base-command", "job", "log", str(job_id)).stdout == "a\n"


def test_job_list_time_window_and_waitend(fake: FakeNgc) -> None:
    out = ngc(fake, "base-command", "job", "run", "--name", "old", "--image", IMAGE, "--instance", "dgx",
              "--result", "/results", "--commandline", "exit 1", "--waitend", "--format_type", "json")  # fmt: skip
    assert out.returncode == 0, "--waitend exits 0 even when the job FAILED"
    documents = json.loads("[" + out.stdout.replace("}\n{", "},\n{") + "]")
    assert "job" in documents[0] and documents[-1]["jobStatus"]["status"] == "FAILED"
    job_id = documents[0]["job"]["id"]
    fake.backdate(job_id, days=10)
    assert ngc_json(fake, "base-command", "job", "list") == [], "default window: last 7 days"
    assert [j["id"] for j in ngc_json(fake, "base-command", "job", "list", "--duration", "30D")] == [job_id]
    bad = ngc(fake, "base-command", "job", "list", "--status", "DONE")
    assert bad.returncode == 2


def test_bcprun_stand_in(tmp_path: Path) -> None:
    def bcprun(*args: str, **env: str) -> subprocess.CompletedProcess:
        full_env = {**os.environ, "NGC_ARRAY_SIZE": "2", "NGC_ARRAY_INDEX": "1", "NGC_RESULT_DIR": str(tmp_path), **env}
        return subprocess.run([sys.executable, str(BCPRUN), *args], env=full_env, capture_output=True, text=True,
                              timeout=30, check=False)  # fmt: skip

    mismatch = bcprun("--nnodes", "3", "--cmd", "true")
    assert mismatch.returncode == 1 and "NGC_ARRAY_SIZE=2" in mismatch.stderr
    ranks = bcprun(
        "-n", "2", "-p", "3", "-no_redirect", "-e", "X=1", "-c", "echo $RANK/$WORLD_SIZE/$LOCAL_RANK/$NODE_RANK/$X"
    )
    assert sorted(ranks.stdout.split()) == ["3/6/0/1/1", "4/6/1/1/1", "5/6/2/1/1"]
    assert bcprun("--cmd", "echo $RANK $MASTER_ADDR", NGC_NTASKS_PER_NODE="2").returncode == 0
    assert sorted(p.name for p in tmp_path.glob("bcprun_rank*.log")) == ["bcprun_rank2.log", "bcprun_rank3.log"]
    assert (tmp_path / "bcprun_rank3.log").read_text() == "3 127.0.0.1\n"
    failing = bcprun("--nnodes=2", "--npernode=2", "-no_redirect", "--cmd", '[ "$LOCAL_RANK" = 1 ] && exit 7; sleep 30')
    assert failing.returncode == 7, "first failing rank's code; the others are stopped"
    # Exactly NVIDIA's spellings: one-dash -no_redirect; no two-dash form, no abbreviation.
    for loose in (["--no_redirect"], ["--nnode", "2"], ["-no_redirec"]):
        refused = bcprun(*loose, "--cmd", "true")
        assert refused.returncode == 2 and "usage: bcprun" in refused.stderr, loose
    # NVIDIA's launcher runs one-off steps as `bcprun --nnodes 1 --npernode 1` inside multi-node jobs: on node 0
    # only, whichever node's commandline calls it (per-replica model).
    once = [
        bcprun(
            "--nnodes",
            "1",
            "--npernode",
            "1",
            "-no_redirect",
            "--launcher",
            "x",
            "--env",
            "Y=2",
            "--cmd",
            "echo $RANK/$WORLD_SIZE/$Y",
            NGC_ARRAY_INDEX=str(node),
        )
        for node in (0, 1)
    ]
    assert [(r.returncode, r.stdout) for r in once] == [(0, "0/1/2\n"), (0, "")]


def test_concurrent_submissions_get_distinct_increasing_ids(fake: FakeNgc) -> None:
    argv = ["--format_type", "json", "batch", "run", "--name", "parallel", "--image", IMAGE, "--instance", "dgx",
            "--result", "/r", "--commandline", "true"]  # fmt: skip
    ids = sorted(map(job_id_of, ngc_parallel(fake, argv, argv, argv)))
    assert ids == [ngc_control.FIRST_JOB_ID + i for i in range(3)]
    for job_id in ids:
        assert fake.wait_for(job_id) == "FINISHED_SUCCESS"


# -- variants of the service (tests/fakes/README.md "Variants") ----------------------------------------------------

RANKS = (
    "bcprun --nnodes 2 --npernode 2 -no_redirect "
    "--cmd 'echo $RANK/$WORLD_SIZE/$NGC_ARRAY_INDEX >> /mount_ws/ranks_$NGC_JOB_ID'"
)
SHOW_ENV = (
    'echo "node $NGC_ARRAY_INDEX $NGC_ARRAY_TYPE $NGC_MASTER_ADDR $NGC_GPUS_PER_NODE" >> /mount_ws/cmd_$NGC_JOB_ID'
)


def test_commandline_per_replica_or_once_on_the_launcher_node(fake: FakeNgc) -> None:
    ws = fake.workspace_path("ws")
    per_replica = submit(fake, f"{SHOW_ENV}; {RANKS}", replicas=2)
    assert fake.wait_for(per_replica) == "FINISHED_SUCCESS"
    fake.set_variants(commandline="launcher")
    once = submit(fake, f"{SHOW_ENV}; {RANKS}", replicas=2)
    assert fake.wait_for(once) == "FINISHED_SUCCESS"
    # Per replica: each node runs the commandline and its bcprun starts that node's ranks. Once: replica 0 runs
    # it and bcprun fans out to both nodes. The ranks are the same; the commandline ran twice, or once.
    for job_id in (per_replica, once):
        assert sorted((ws / f"ranks_{job_id}").read_text().split()) == ["0/4/0", "1/4/0", "2/4/1", "3/4/1"]
    assert sorted((ws / f"cmd_{per_replica}").read_text().splitlines()) == [
        f"node 0 PyTorchJob launcher-svc-{per_replica} 8",
        f"node 1 PyTorchJob launcher-svc-{per_replica} 8",
    ]
    assert (ws / f"cmd_{once}").read_text() == f"node 0 PyTorchJob launcher-svc-{once} 8\n"
    assert ngc(fake, "base-command", "job", "log", f"{once}:1").stdout == "", "replica 1 ran no commandline"
    # An MPIJob: its bcprun ranks get Open MPI's variables only (the stand-in's guess for an mpirun launch).
    mpi = submit(
        fake,
        "bcprun --nnodes 2 --npernode 1 -no_redirect --cmd 'echo ${RANK:-no RANK} $OMPI_COMM_WORLD_RANK "
        "$NGC_ARRAY_TYPE >> /mount_ws/mpi'",
        array_type="MPI",
        replicas=2,
    )
    assert fake.wait_for(mpi) == "FINISHED_SUCCESS"
    assert sorted((ws / "mpi").read_text().splitlines()) == ["no RANK 0 MPIJob", "no RANK 1 MPIJob"]


def test_bcprun_absent_from_single_replica_jobs(fake: FakeNgc) -> None:
    probe = "command -v bcprun >/dev/null && echo has bcprun || echo no bcprun"
    fake.set_variants(bcprun_in_single_replica_jobs=False)
    single, multi = map(job_id_of, ngc_parallel(fake, run_argv(probe), run_argv(probe, replicas=2)))
    for job_id in (single, multi):
        assert fake.wait_for(job_id) == "FINISHED_SUCCESS"
    log = fake.home / "jobs" / str(single) / "results" / "0" / "joblog.log"
    assert log.read_text() == "no bcprun\n"
    assert (fake.home / "jobs" / str(multi) / "results" / "1" / "joblog.log").read_text() == "has bcprun\n"


def test_job_list_lag_and_server_clock_skew(fake: FakeNgc) -> None:
    fake.set_variants(list_lag_calls=2)
    job_id = submit(fake, "true")
    listed = [[j["id"] for j in ngc_json(fake, "base-command", "job", "list")] for _ in range(3)]
    assert listed == [[], [], [job_id]], "hidden from the first two list calls that would show it"
    assert ngc_json(fake, "base-command", "job", "info", str(job_id))["job"]["id"] == job_id, "info finds it at once"
    # A lag several times what one `ngc` call takes on a loaded 2-core machine, so the first list is within it.
    fake.set_variants(list_lag_calls=0, list_lag_seconds=5)
    young = submit(fake, "true")
    assert young not in [j["id"] for j in ngc_json(fake, "base-command", "job", "list")]
    time.sleep(5)
    assert young in [j["id"] for j in ngc_json(fake, "base-command", "job", "list")]
    # A server clock 10 minutes ahead stamps dates in the client's future: the client's list window (up to its own
    # clock) leaves the new job out.
    fake.set_variants(list_lag_seconds=0, clock_skew_seconds=600)
    ahead = submit(fake, "true")
    created = ngc_control.parse_iso(fake.jobs()[ahead]["job"]["createdDate"])
    assert 590 < created - time.time() < 610
    assert ahead not in [j["id"] for j in ngc_json(fake, "base-command", "job", "list")]


def test_ace_limits_are_served_and_enforced(fake: FakeNgc) -> None:
    fake.set_variants(
        ace={
            "maxRuntimeSeconds": 7200,
            "maxAllowedReplicas": 2,
            "maxActiveJobsPerUser": 1,
            "terminationGracePeriodSeconds": 2,
            "multiNodeSupportedArrayTypes": ["PYTORCH"],
        }
    )
    ace = ngc_json(fake, "base-command", "ace", "info", fake.ace)
    ngc_parser.parse_args(["batch", "list"])  # ngcsdk loaded the offline way before its data classes are imported
    from basecommand.data.api.Ace import Ace  # pylint: disable=import-outside-toplevel

    parsed = Ace(ace)  # NVIDIA's data class reads the shape
    assert (
        parsed.maxRuntimeSeconds,
        parsed.maxAllowedReplicas,
        parsed.maxActiveJobsPerUser,
        parsed.terminationGracePeriodSeconds,
    ) == (7200, 2, 1, 2)
    assert parsed.instances[0].multiNodeSupportedArrayTypes == ["PYTORCH"] and parsed.instances[0].allowMultinode
    too_long, too_many, mpi = ngc_parallel(
        fake,
        run_argv("true", "--total-runtime", "3h"),
        run_argv("true", replicas=3),
        run_argv("true", array_type="MPI", replicas=2),
    )
    assert "Total Runtime Seconds exceeds ACE maximum." in too_long.stderr  # NVIDIA's client checks this one
    assert too_many.returncode == 1 and "exceeds the ACE maximum of 2" in too_many.stderr
    assert mpi.returncode == 1 and "Array type 'MPI' is not supported" in mpi.stderr
    assert fake.jobs() == {}
    # One active job per user: the second waits QUEUED until the first has ended.
    first, second = (submit(fake, "exec sleep 60") for _ in range(2))
    fake.wait_for(first, {"RUNNING"})
    time.sleep(0.5)
    assert fake.status(second) == "QUEUED"
    # A kill passes through PENDING_TERMINATION for the ACE's grace period.
    assert ngc(fake, "base-command", "job", "kill", str(first), "--format_type", "json").returncode == 0
    assert fake.status(first) == "PENDING_TERMINATION" and fake.status(second) == "QUEUED"
    killed_at = time.monotonic()
    assert fake.wait_for(first, timeout=10) == "KILLED_BY_USER"
    assert time.monotonic() - killed_at > 1.5
    assert fake.wait_for(second, {"RUNNING"}) == "RUNNING"
    fake.set_variants(ace={"allowMultinode": False})
    refused = ngc(fake, *run_argv("true", replicas=2))
    assert refused.returncode == 1 and "does not allow multinode" in refused.stderr


def test_runonce_preemption_refused_or_not_resumable(fake: FakeNgc) -> None:
    """Only RUNONCE jobs are refused (their preempt class as `job run --preempt` sent it); a RESUMABLE job is
    preempted and resumed under every value. The default, `resumable`, is the preemption tests above."""
    fake.set_variants(runonce_preemption="refused")
    runonce, resumable = map(
        job_id_of,
        ngc_parallel(
            fake, run_argv("exec sleep 60", "--preempt", "RUNONCE"), run_argv("exec sleep 60", "--preempt", "RESUMABLE")
        ),
    )
    assert fake.jobs()[runonce]["job"]["jobDefinition"]["runPolicy"]["preemptClass"] == "RUNONCE"
    for job_id in (runonce, resumable):
        fake.wait_for(job_id, {"RUNNING"})
    refused, accepted = ngc_parallel(
        fake,
        *(["base-command", "job", "preempt", str(job_id), "--format_type", "json"] for job_id in (runonce, resumable)),
    )
    # As NVIDIA's CLI reports any failed preempt: an error document on stderr, exit 1.
    assert refused.returncode == 1 and "cannot be preempted" in json.loads(refused.stderr)["error"]
    assert "400" in refused.stderr and "real wording is unknown" in refused.stderr
    assert accepted.returncode == 0, accepted.stderr
    assert fake.status(runonce) == "RUNNING" and fake.wait_for(resumable, {"PREEMPTED"}) == "PREEMPTED"
    fake.set_variants(runonce_preemption="not_resumable")
    assert ngc(fake, "base-command", "job", "preempt", str(runonce), "--format_type", "json").returncode == 0
    assert fake.wait_for(runonce, {"PREEMPTED"}) == "PREEMPTED"
    not_resumed, resumed = ngc_parallel(
        fake,
        *(["base-command", "job", "resume", str(job_id), "--format_type", "json"] for job_id in (runonce, resumable)),
    )
    assert not_resumed.returncode == 1 and "cannot be resumed" in json.loads(not_resumed.stderr)["error"]
    assert resumed.returncode == 0, resumed.stderr
    assert fake.status(runonce) == "PREEMPTED" and fake.wait_for(resumable, {"RUNNING"}) == "RUNNING"


@pytest.mark.parametrize("key_type", ["PERSONAL_KEY", "SERVICE_KEY"])
def test_nvapi_keys_are_the_bearer_and_their_org_must_match(tmp_path: Path, ngc_tls_dir: Path, key_type: str) -> None:
    key = "nvapi-emulated-key-not-a-secret"
    with FakeNgc(tmp_path / "ngc-home", api_key=key, tls_dir=ngc_tls_dir, variants={"key_type": key_type}) as fake:
        fake.create_workspace("ws")
        job_id = submit(fake, "echo hi")
        assert fake.wait_for(job_id) == "FINISHED_SUCCESS"
        assert ngc(fake, "base-command", "job", "log", str(job_id)).stdout == "hi\n"
        assert fake.requests("POST", "/v3/keys/get-caller-info") and not fake.requests("GET", "/token")
        fake.set_variants(key_org="another-org")
        wrong = ngc(fake, "base-command", "job", "list", "--format_type", "json")
        assert wrong.returncode != 0, wrong.stdout
        assert "another-org" in wrong.stderr or "403" in wrong.stderr, wrong.stderr
