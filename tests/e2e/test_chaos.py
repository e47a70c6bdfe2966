"""The chaos run (tests/support/chaos_run.py, tests/chaos): a short seeded one on the local backend, and its checks
failing when what they look for is there.

The short run takes the demo pipeline without its pretrain stage (about 10 s clean on 2 cores) and makes one kill
of every kind: a stage rank, a verification job's rank, a job's supervisor and the orchestrator, with the HTTP
source faulting a third of its answers. Long runs are in README.md (Chaos).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

from support.chaos_backends import LocalChaos, children_of
from support.chaos_checks import check_one_live_job, check_outputs
from support.chaos_monkey import Monkey, Target
from support.chaos_run import ChaosOptions, chaos_run, table
from support.pipeline_fixtures import REPO, wait_for, write_chain_project

from bcp_pipeline.procs import process_start_ticks

DEMO_WITHOUT_PRETRAIN = ["sample", "bpe", "download", "extract", "concat", "tokenize-preprocess"]


def test_a_short_seeded_chaos_run_of_the_demo_ends_with_the_clean_run_s_bytes(tmp_path):
    options = ChaosOptions(
        pipeline="demo",
        backend="local",
        seed=3,
        kills=4,
        only=DEMO_WITHOUT_PRETRAIN,
        fault_rate=0.35,
        gap=(0.3, 1.0),
        workdir=tmp_path,
        timeout=240,
        echo=False,
    )
    report = chaos_run(options)
    text = table(report)
    print(text)
    assert report.ok, text
    assert report.chaos.kills == {"rank": 1, "verify": 1, "supervisor": 1, "orchestrator": 1}, text
    assert report.chaos.resumes >= 1 and report.chaos.http_requests > 8, text
    assert sum(report.chaos.faults.values()) >= 1, text
    assert "result                                                         PASS" in text


def test_a_seeded_chaos_run_of_the_streamed_demo_ends_with_the_clean_run_s_bytes(tmp_path):
    """demo-fast: the tokenize stage takes the download's shards as they land (a streamed edge); kills of every
    kind while both run, the HTTP source faulting, end with the bytes of a clean run."""
    options = ChaosOptions(
        pipeline="demo-fast",
        backend="local",
        seed=11,
        kills=4,
        fault_rate=0.35,
        gap=(0.3, 1.0),
        workdir=tmp_path,
        timeout=240,
        echo=False,
    )
    report = chaos_run(options)
    text = table(report)
    print(text)
    assert report.ok, text
    assert report.chaos.kills == {"rank": 1, "verify": 1, "supervisor": 1, "orchestrator": 1}, text
    assert report.chaos.resumes >= 1, text


def test_the_monkey_hits_every_kind_once_per_round_in_a_seeded_order():
    hit = []

    def targets(kind):
        return [Target(kind, f"{kind}-{i}", lambda kind=kind, i=i: hit.append(f"{kind}-{i}")) for i in range(3)]

    orders = []
    for _ in range(2):
        hit.clear()
        monkey = Monkey(rng=random.Random(7), kinds=["a", "b", "c"], total=6, gap=(0.0, 0.0))
        while not monkey.done:
            monkey.tick(targets)
        orders.append(list(hit))
    assert orders[0] == orders[1]  # the seed fixes the choices
    kinds = [name.split("-")[0] for name in orders[0]]
    assert sorted(kinds[:3]) == ["a", "b", "c"] and sorted(kinds[3:]) == ["a", "b", "c"]


def test_output_check_fails_on_a_torn_file_under_a_final_name_and_ignores_temporaries(tmp_path):
    clean, chaos = tmp_path / "clean", tmp_path / "chaos"
    for root in (clean, chaos):
        (root / "data").mkdir(parents=True)
        (root / "data" / "a.bin").write_bytes(b"0123456789")
        (root / "data" / "a.idx").write_bytes(b"index")
    (chaos / "data" / ".a.bin.tmp-host-1").write_bytes(b"01234")  # a killed writer's temporary: allowed
    bin_idx, finals = check_outputs(clean, chaos, [])
    assert bin_idx.ok and finals.ok and "1 hidden temporaries left" in finals.detail
    (chaos / "data" / "a.bin").write_bytes(b"01234")  # torn, under its final name
    (chaos / "data" / "b.jsonl").write_text("{}\n")
    bin_idx, finals = check_outputs(clean, chaos, [])
    assert not bin_idx.ok and bin_idx.problems == ["differs or missing: data/a.bin"]
    assert not finals.ok and finals.problems == ["differs: data/a.bin", "not in the clean run: data/b.jsonl"]


def test_one_live_job_check_fails_on_overlapping_jobs_of_one_stage():
    spans = [("s", "s.1", 0.0, 2.0), ("s", "s.verify.1", 2.1, 3.0), ("t", "t.1", 1.0, 5.0)]
    assert check_one_live_job(10, [], spans).ok
    overlapping = check_one_live_job(10, [], [*spans, ("s", "s.2", 2.5, 4.0)])
    assert not overlapping.ok and overlapping.problems == ["s: s.2 started 0.500 s before s.verify.1 ended"]
    assert not check_one_live_job(10, ["s: jobs s.1, s.2 alive at once"], spans).ok


def test_a_job_whose_supervisor_was_killed_is_lost_and_never_runs_beside_the_next_one(tmp_path):
    """Found by tests/chaos: a SIGKILLed local supervisor left its ranks running, the job was reported lost at
    once, and the stage's next job ran beside them (two pretrain jobs writing one checkpoint folder)."""
    config = write_chain_project(tmp_path)
    stall = config.parent / "ws/main/first/STALL"
    stall.parent.mkdir(parents=True)
    stall.touch()
    backend = LocalChaos(config.parent, "chain")
    first = subprocess.Popen(
        [sys.executable, "-m", "bcp_pipeline", "--config", str(config), "run", "chain"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    wait_for(lambda: len(backend.job_targets("rank")) == 2, what="the ranks of first.1")
    first.kill()  # no orchestrator polls while the supervisor dies
    first.wait()
    [supervisor] = backend.job_targets("supervisor")
    supervisor.kill()
    wait_for(lambda: backend.live_jobs() == {}, timeout=5, what="the ranks to die with their supervisor")
    seen = []

    def resume() -> int:
        process = subprocess.Popen(
            [sys.executable, "-m", "bcp_pipeline", "--config", str(config), "resume"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        while process.poll() is None:
            seen.append(backend.live_jobs())
            time.sleep(0.02)
        return process.returncode

    assert resume() == 1  # the lost job fails its stage
    stall.unlink()
    assert resume() == 0
    assert all(len(jobs) <= 1 for sample in seen for jobs in sample.values()), seen
    assert backend.live_jobs() == {}


def test_processes_a_dead_supervisor_left_behind_are_stopped_before_its_job_counts_as_ended(tmp_path):
    """The local backend's second line: a recorded rank still alive after its supervisor died (one started before
    ranks died with their supervisor, say) is killed with the supervisor's process group; until it is gone the
    job is still running, so nothing is submitted beside it."""
    from bcp_pipeline.backends.contract import JobState
    from bcp_pipeline.backends.local.backend import LocalBackend
    from bcp_pipeline.config.resources import LocalOptions

    leader = subprocess.Popen(
        ["bash", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    rank = int(leader.stdout.readline())
    leader.kill()  # the "supervisor" dies; its child lives on in its process group
    leader.wait()
    job_dir = tmp_path / "run" / "jobs" / "first.1"
    job_dir.mkdir(parents=True)
    (job_dir / "spec.json").write_text(json.dumps({"labels": {"run": "r", "stage": "first", "kind": "stage"}}))
    (job_dir / "status.json").write_text(
        json.dumps(
            {
                "pid": leader.pid,
                "start_ticks": 1,
                "state": "running",
                "started_at": 0.0,
                "ranks": [{"pid": rank, "start_ticks": process_start_ticks(rank)}],
            }
        )
    )
    backend = LocalBackend(
        LocalOptions(), config_dir=tmp_path, stages_dir=tmp_path, run_dir=tmp_path / "run", workspace_name="main"
    )
    assert backend.poll(["first.1"])["first.1"].state is JobState.RUNNING
    wait_for(lambda: process_start_ticks(rank) is None, timeout=5, what="the left-behind rank to be killed")
    assert backend.poll(["first.1"])["first.1"].state is JobState.LOST


def test_a_completion_record_half_written_by_a_killed_rank_leaves_no_temporary_after_the_rerun(tmp_path):
    """Found by tests/chaos on Slurm: a rank killed while writing its completion record left the record's
    hidden temporary behind for good (the rerun wrote the record, not the temporary's cleanup)."""
    from _completion import completion_path, write_completion

    record = completion_path(tmp_path, "download", 1, 4)
    record.parent.mkdir(parents=True)
    stale = record.with_name(f".{record.name}.tmp-otherhost-4242")
    stale.write_text('{"stage": "downl')
    other_rank = completion_path(tmp_path, "download", 2, 4)
    other_stale = other_rank.with_name(f".{other_rank.name}.tmp-otherhost-4243")  # another rank's: not ours
    other_stale.write_text("{")
    write_completion(tmp_path, "download", 1, 4, {"items": 2})
    assert not stale.exists() and other_stale.exists()
    assert json.loads(record.read_text())["items"] == 2


def test_a_command_the_orchestrator_runs_dies_with_it(tmp_path):
    """Found by tests/chaos on the emulated BCP: an orchestrator SIGKILLed while `ngc job run` was on its way left
    the call running; it created its job after the resumed orchestrator had looked for one by label, and the stage
    had two live jobs. Commands run through procs.run_command now die with the orchestrator."""
    marker = tmp_path / "created-after-the-caller-died"
    caller = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from bcp_pipeline.procs import run_command; "
            "run_command(['sh', '-c', 'sleep 1.5; touch ' + sys.argv[1]])",
            str(marker),
        ]
    )
    wait_for(lambda: children_of(caller.pid), what="the command to start")
    [command] = children_of(caller.pid)
    caller.kill()
    caller.wait()
    wait_for(lambda: process_start_ticks(command) is None, timeout=5, what="the command to die with its caller")
    time.sleep(2.0)
    assert not marker.exists()


def test_the_ranks_of_a_local_job_die_with_its_supervisor(tmp_path):
    """Found by tests/chaos: a supervisor killed before it had recorded its ranks' pids left ranks no record
    named, and a download rank wrote a shard back after extract had consumed it. Ranks now die with it."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    spec = {
        "argv": [sys.executable, "-c", "import time; time.sleep(60)"],
        "env": {},
        "replicas": 1,
        "processes": 2,
        "cwd": str(tmp_path),
        "log_dir": str(tmp_path / "logs"),
        "master_port": 29999,
    }
    (job_dir / "spec.json").write_text(json.dumps(spec))
    supervisor = subprocess.Popen([sys.executable, "-m", "bcp_pipeline.backends.local.supervisor", str(job_dir)])
    ranks = wait_for(lambda: len(children_of(supervisor.pid)) == 2 and children_of(supervisor.pid), what="2 ranks")
    supervisor.kill()
    supervisor.wait()
    wait_for(lambda: all(process_start_ticks(pid) is None for pid in ranks), timeout=5, what="the ranks to die")


# Rank 0 stands in for a download rank SIGKILLed before it recorded the output digest: it never records it. Rank 1
# runs the stages' real wait for that record (stages/_completion.py); rank 2, whose folder is settled, ends at once.
DIGEST_WAITER = """
import os, pathlib, sys, time
sys.path.insert(0, {stages!r})
import _completion
rank = int(os.environ["RANK"])
if rank == 0:
    time.sleep(600)
out = pathlib.Path({out!r} if rank == 1 else {settled!r})
out.mkdir(exist_ok=True)
(out / f"waiting-{{rank}}").touch()
_completion.claim_outputs(out, "download", [], rank)
"""


def read_record(path):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def test_ranks_left_waiting_for_a_killed_rank_are_stopped_and_the_job_fails(tmp_path):
    """Found by tests/chaos (CI, under load): a download rank 0 SIGKILLed before it recorded the output digest
    left ranks 1-3 waiting for that record for 30 minutes, so download.2 stayed running and the run timed out.
    A rank killed by a signal now gets the others stopped after a grace, and the job fails, to be run again."""
    from bcp_pipeline.backends.contract import JobState
    from bcp_pipeline.backends.local.backend import LocalBackend
    from bcp_pipeline.config.resources import LocalOptions

    settled = tmp_path / "settled"
    (settled / ".completions").mkdir(parents=True)
    (settled / ".completions" / "download.digest").write_text('{"digest": "d1"}')
    job_dir = tmp_path / "run" / "jobs" / "download.1"
    job_dir.mkdir(parents=True)
    program = DIGEST_WAITER.format(stages=str(REPO / "stages"), out=str(tmp_path / "out"), settled=str(settled))
    spec = {
        "argv": [sys.executable, "-c", program],
        "env": {"BCP_PIPELINE_OUTPUT_DIGEST": "d1"},
        "replicas": 1,
        "processes": 3,
        "cwd": str(tmp_path),
        "log_dir": str(tmp_path / "run" / "logs" / "download.1"),
        "master_port": 29999,
        "lost_rank_grace_seconds": 0.5,
        "labels": {"run": "r", "stage": "download", "kind": "stage"},
    }
    (job_dir / "spec.json").write_text(json.dumps(spec))
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "bcp_pipeline.backends.local.supervisor", str(job_dir)], start_new_session=True
    )
    try:
        record = wait_for(lambda: (r := read_record(job_dir / "status.json")).get("ranks") and r, what="the ranks")
        wait_for(lambda: (tmp_path / "out" / "waiting-1").exists(), what="rank 1 to wait for rank 0's digest")
        os.kill(record["ranks"][0]["pid"], signal.SIGKILL)
        assert supervisor.wait(timeout=15) == 0, "the supervisor did not end after its rank 0 was killed"
    finally:
        supervisor.kill()
    backend = LocalBackend(
        LocalOptions(), config_dir=tmp_path, stages_dir=tmp_path, run_dir=tmp_path / "run", workspace_name="main"
    )
    status = backend.poll(["download.1"])["download.1"]
    assert status.state is JobState.FAILED
    assert status.detail == (
        "rank 0 was killed by SIGKILL; the supervisor stopped rank(s) 1 after 0.5 s, as they "
        "may wait for it for ever; rank 0 exited -9; rank 1 exited -15"
    ), status.detail
    assert all(process_start_ticks(rank["pid"]) is None for rank in record["ranks"])
    assert "rank 0 exited -9; last lines of" in backend.failure_detail("download.1", status)
