"""`logs --follow`: the lines a running job writes, as it writes them, until it ends, on the local backend (its rank
logs are files here, as on Slurm and Grid Engine: shared/logs.py follow_files); a backend that cannot follow says so.
On Kubernetes (pods/log follow=true): tests/e2e/test_kubernetes_e2e.py."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.cli import cli, latest
from support.pipeline_fixtures import stall_stage, start_orchestrator, wait_for, write_chain_project

from bcp_pipeline.backends.shared.logs import follow_files


def follow(config: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bcp_pipeline", "--config", str(config), "logs", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def progress(lines: list[str]) -> list[dict]:
    return [json.loads(line.split("progress ", 1)[1]) for line in lines if "##bcp-pipeline progress " in line]


def test_logs_follow_prints_a_running_jobs_lines_as_they_come_and_ends_with_the_job(tmp_path: Path) -> None:
    config = write_chain_project(tmp_path)
    held = stall_stage(tmp_path / "ws" / "main", "first")  # its ranks start, then wait before their items
    run = start_orchestrator(config, "run", "chain", "--only", "first")
    try:
        job = wait_for(
            lambda: (state := latest(config)) and state.stages["first"].jobs and state.stages["first"].jobs[0],
            timeout=60,
            what="the first stage's job",
        )
        run_id = latest(config).run_id
        logs_dir = config.parent / ".bcp-pipeline" / "runs" / run_id / "logs" / job.job_id
        wait_for(lambda: len(list(logs_dir.glob("rank-*.log"))) == 2, what="both ranks' logs")
        every, one = follow(config, run_id, "first", "--follow"), follow(config, run_id, "first", "-f", "--rank", "1")
        time.sleep(1.5)
        assert every.poll() is None and one.poll() is None  # the job runs: both wait for more
        held.unlink()  # the items are written now, each with a progress line
        out, err = every.communicate(timeout=60)
        assert every.returncode == 0, err
        lines = out.splitlines()
        assert {line.split("] ", 1)[0] for line in lines} == {"[rank-00000.log", "[rank-00001.log"}  # whose line
        assert {(p["rank"], p["done"]) for p in progress(lines)} >= {(0, 3), (1, 3)}  # written after it started
        out, err = one.communicate(timeout=60)
        assert one.returncode == 0, err
        assert progress(out.splitlines())[-1] == {**progress(out.splitlines())[-1], "rank": 1, "done": 3}
        assert all(p["rank"] == 1 for p in progress(out.splitlines())) and "[rank-" not in out
    finally:
        run.wait(timeout=120)
    assert run.returncode == 0, run.stdout.read()


def test_follow_files_starts_at_the_tail_reads_new_files_and_the_last_line_without_its_newline(tmp_path: Path) -> None:
    first, second = tmp_path / "rank-00000.log", tmp_path / "rank-00001.log"
    first.write_text("old 1\nold 2\nold 3\n")
    running = threading.Event()
    running.set()

    def write_later() -> None:
        time.sleep(0.3)
        with open(first, "a") as handle:
            handle.write("new 1\nhalf")
        second.write_text("other\n")
        time.sleep(0.3)
        running.clear()

    writer = threading.Thread(target=write_later)
    writer.start()
    lines = list(follow_files(lambda: sorted(tmp_path.glob("rank-*.log")), running.is_set, tail=1, interval=0.05))
    writer.join()
    assert lines[0] == "old 3"  # the tail of what was there, then what came
    assert sorted(lines[1:]) == sorted(["[rank-00000.log] new 1", "[rank-00000.log] half", "[rank-00001.log] other"])


def test_a_backend_that_cannot_follow_its_logs_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from bcp_pipeline.backends.bcp.backend import BcpBackend

    with pytest.raises(Exception, match="`logs --follow` is not available on the bcp backend"):
        next(iter(BcpBackend.follow_logs(BcpBackend.__new__(BcpBackend), "123")))
    config = write_chain_project(tmp_path)
    assert cli(config, "run", "chain", "--only", "first") == 0
    capsys.readouterr()
    run_id = latest(config).run_id
    assert cli(config, "logs", run_id, "first", "-f", "--tail", "1") == 0  # ended: what is there, then done
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line.startswith("[rank-0000") for line in out)


def test_slurm_and_grid_engine_follow_their_rank_log_files_until_squeue_says_the_job_ended(tmp_path: Path) -> None:
    """The batch backends' follow (shared/batch.py) over their `logs/JOB/rank-NNNNN.log` files. The scheduler is
    a STAND-IN here, a poll that says RUNNING twice and then COMPLETED (the real one, squeue or qstat, is what the
    cluster tests drive); the files are written as the job would, between polls."""
    from bcp_pipeline.backends.contract import JobState, JobStatus
    from bcp_pipeline.backends.slurm.backend import SlurmBackend
    from bcp_pipeline.config.resources import SlurmOptions

    logs = tmp_path / "run" / "logs" / "42"
    logs.mkdir(parents=True)
    (logs / "rank-00000.log").write_text("r0 a\n")
    (logs / "rank-00001.log").write_text("r1 a\n")
    answers = iter([JobState.RUNNING, JobState.RUNNING, JobState.SUCCEEDED])

    class PolledStandIn(SlurmBackend):
        def poll(self, job_ids: list[str]) -> dict[str, JobStatus]:
            state = next(answers)
            with open(logs / "rank-00001.log", "a") as handle:  # written while the job runs
                handle.write(f"r1 {state.value}\n")
            return {"42": JobStatus(job_id="42", state=state)}

    backend = PolledStandIn(
        SlurmOptions(poll_seconds=0.01, poll_max_seconds=0.01),
        config_dir=tmp_path,
        stages_dir=tmp_path,
        run_dir=tmp_path / "run",
        workspace_name="main",
    )
    assert list(backend.follow_logs("42", rank=1)) == ["r1 a", "r1 running", "r1 running", "r1 succeeded"]
    answers = iter([JobState.SUCCEEDED])
    assert sorted(backend.follow_logs("42", tail=1)) == ["[rank-00000.log] r0 a", "[rank-00001.log] r1 succeeded"]
