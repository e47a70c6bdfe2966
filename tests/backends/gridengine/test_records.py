"""A Grid Engine job's own start and exit records (bcp_pipeline/backends/gridengine/records.py): the rendered lines
run by real bash as a job's script runs them, read back; and the order in which a poll trusts them and accounting.
The real cell, with accounting that lags: tests/e2e/test_gridengine_site_e2e.py."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.pipeline_fixtures import GE_CHAIN, write_chain_project

from bcp_pipeline.backends.contract import JobState
from bcp_pipeline.backends.gridengine import backend as ge_backend
from bcp_pipeline.backends.gridengine.records import PENDING, PENDING_SLOW, Evidence, covers, read_evidence, script
from bcp_pipeline.backends.gridengine.states import Accounting
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.load import load_config


def job_script(logs: Path, tasks: int, body: str, *, strict: bool = False) -> str:
    """A job script as render.py lays one out: `logs=`, the record lines, then the job's own part."""
    return "\n".join(["#!/bin/bash", *(["set -euo pipefail"] * strict), f"logs={logs}", *script(tasks), body, ""])


def run_job(tmp_path: Path, text: str, job_id: str, task: str, *args: str) -> int:
    path = tmp_path / f"job-{job_id}-{task}.sh"
    path.write_text(text)
    env = {**os.environ, "JOB_ID": job_id, "SGE_TASK_ID": task}
    return subprocess.run(["bash", str(path), *args], env=env, capture_output=True, text=True).returncode


def test_each_array_task_records_its_start_and_exit_status_and_the_worst_task_decides(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    # A rank in a background subshell exits 4: a subshell does not run the script's EXIT trap, only the script does.
    body = '(exit 4) & wait $! || true\nexit "$CODE"'
    assert run_job(tmp_path, job_script(logs, 2, body).replace('"$CODE"', "0"), "7", "1") == 0
    evidence = read_evidence(logs / "7")
    assert evidence.tasks == 2 and evidence.started == {1} and evidence.exits == {1: 0}
    assert evidence.status("7") is None  # task 2 has not ended: no verdict from half the job
    assert run_job(tmp_path, job_script(logs, 2, body).replace('"$CODE"', "3"), "7", "2") == 3
    status = read_evidence(logs / "7").status("7")
    assert status.state is JobState.FAILED and status.exit_code == 3 and "task 2: exit status 3" in status.detail
    assert sorted(p.name for p in (logs / "7").iterdir()) == [
        "task-1.exit",
        "task-1.started",
        "task-2.exit",
        "task-2.started",
    ]  # no temporary left behind


def test_a_plain_job_under_set_e_records_task_1_and_a_host_s_node_part_records_nothing(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    assert run_job(tmp_path, job_script(logs, 1, "false", strict=True), "8", "undefined") == 1
    assert read_evidence(logs / "8").status("8").exit_code == 1
    assert run_job(tmp_path, job_script(logs, 1, "exit 0"), "9", "undefined", "--node", "0", "h", "1") == 0
    assert not (logs / "9").exists() or not any((logs / "9").iterdir())


def test_a_job_killed_by_sigkill_has_a_start_record_and_no_exit_record(tmp_path: Path) -> None:
    """h_rt and `qdel` of a running job end it with SIGKILL: no trap runs, so only accounting can tell its end."""
    logs = tmp_path / "logs"
    path = tmp_path / "job.sh"
    path.write_text(job_script(logs, 1, "sleep 30"))
    job = subprocess.Popen(["bash", str(path)], env={**os.environ, "JOB_ID": "10", "SGE_TASK_ID": "undefined"})
    deadline = time.monotonic() + 10
    while not (logs / "10" / "task-1.started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=10)
    evidence = read_evidence(logs / "10")
    assert evidence.started == {1} and not evidence.exits and evidence.status("10") is None


def test_accounting_decides_only_once_it_has_every_task_that_started() -> None:
    evidence = read_evidence(Path("/nonexistent"))
    assert evidence.tasks is None and covers([], evidence)

    def record(task: str) -> Accounting:
        return Accounting(job_id="5", task=task, failed=0, failed_text="", exit_status=0)

    both = Evidence(tasks=2, started=frozenset({1, 2}))
    assert not covers([record("1")], both) and covers([record("1"), record("2")], both)
    assert covers([record("undefined")], Evidence(tasks=1, started=frozenset({1})))


@pytest.fixture
def backend(tmp_path: Path):
    config = write_chain_project(tmp_path / "p", GE_CHAIN)
    loaded = load_config(config)
    return make_backend("gridengine", loaded, loaded.pipelines["chain"], tmp_path / "run")


def records_answer(monkeypatch: pytest.MonkeyPatch, answer) -> None:
    """A STAND-IN for `qacct` inside the backend (this file has no cell): the answer the real one gives for a job
    whose record is not flushed yet ([]), or for one it has. The real qacct, lagging: the e2e test."""
    monkeypatch.setattr(ge_backend, "qacct", lambda job_id: answer)


def test_a_job_that_started_and_left_qstat_without_accounting_is_pending_then_slow_never_cancelled(
    backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    (backend.logs_dir / "11").mkdir(parents=True)
    (backend.logs_dir / "11" / "task-1.started").write_text("host=h time=1 tasks=1\n")
    records_answer(monkeypatch, [])
    first = backend._unlisted_status("11")
    assert first.state is JobState.RUNNING and first.native == PENDING
    backend._unlisted_since["11"] -= backend.accounting_grace_seconds + 1  # the grace is over
    later = backend._unlisted_status("11")
    assert later.state is JobState.RUNNING and later.native == PENDING_SLOW and "accounting is slow" in later.detail
    # Its exit record read at last: finished with that status, from the job's own word.
    (backend.logs_dir / "11" / "task-1.exit").write_text("0\n")
    done = backend._unlisted_status("11")
    assert done.state is JobState.SUCCEEDED and "own exit record" in done.detail


def test_without_a_start_record_the_grace_still_ends_in_cancelled(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    records_answer(monkeypatch, [])
    assert backend._unlisted_status("12") is None
    backend._unlisted_since["12"] -= backend.accounting_grace_seconds + 1
    status = backend._unlisted_status("12")
    assert status.state is JobState.CANCELLED and "no start record" in status.detail


def test_where_accounting_and_the_exit_record_differ_accounting_decides_and_says_so(
    backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    (backend.logs_dir / "13").mkdir(parents=True)
    (backend.logs_dir / "13" / "task-1.started").write_text("host=h time=1 tasks=1\n")
    (backend.logs_dir / "13" / "task-1.exit").write_text("0\n")
    records_answer(
        monkeypatch,
        [Accounting(job_id="13", task="undefined", failed=100, failed_text="assumedly after job", exit_status=137)],
    )
    status = backend._unlisted_status("13")
    assert status.state is JobState.CANCELLED and "own exit record said 0" in status.detail, status
