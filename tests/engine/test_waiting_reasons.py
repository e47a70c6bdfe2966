"""Why a job waits (its backend's detail: the scheduler's message, Kueue's reason) is kept in the run's state file
as it changes, while the job's state stays queued; on the local backend, its `poll` made to answer so."""

from __future__ import annotations

from support.cli import cli
from support.pipeline_fixtures import CHAIN_CONFIG, stall_stage, write_chain_project

from bcp_pipeline.backends.contract import JobState, JobStatus
from bcp_pipeline.backends.local.backend import LocalBackend
from bcp_pipeline.engine.state import RunStore


def test_a_queued_jobs_new_reason_reaches_the_state_file_while_its_state_stays(tmp_path, monkeypatch):
    """The backend gives a waiting job one reason, then another, its state QUEUED throughout: each reaches the run's
    state file (read back at the next poll), not only the next change of state."""
    config = write_chain_project(tmp_path, CHAIN_CONFIG)
    stall = stall_stage(tmp_path / "ws/main", "second")
    real_poll, store = LocalBackend.poll, RunStore(tmp_path / ".bcp-pipeline")
    reasons = ["waiting for a node: 0/2 nodes have free GPUs", "waiting for Kueue admission in queue team-a"]
    saw: list[str] = []

    def poll(self, job_ids):
        statuses = real_poll(self, job_ids)
        if "second.1" in statuses and len(saw) < 2 * len(reasons):
            record = next(j for j in store.latest().stages["second"].jobs if j.job_id == "second.1")
            saw.append(record.detail)
            reason = reasons[min(len(saw) // 2, len(reasons) - 1)]
            statuses["second.1"] = JobStatus(job_id="second.1", state=JobState.QUEUED, native="PENDING", detail=reason)
            if len(saw) == 2 * len(reasons):
                stall.unlink()  # then the real status again: it runs and ends
        return statuses

    monkeypatch.setattr(LocalBackend, "poll", poll)
    assert cli(config, "run", "chain") == 0
    assert reasons[0] in saw and reasons[1] in saw[saw.index(reasons[0]) :], saw  # each saved in its turn
