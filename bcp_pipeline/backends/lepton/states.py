"""Lepton job states -> JobState (one explicit map), and a job record of the SDK (`LeptonJob`, as a dict) -> JobStatus.

The native states are the SDK's `LeptonJobState` (leptonai.api.v2.types.job). A state missing from the map is
UNKNOWN: not finished yet, never failed. A stopped or deleted job was cancelled (by a user, or by `cancel`); a job
the service no longer lists at all is left out of a poll, which the engine reads as lost.
"""

from __future__ import annotations

from typing import Any

from bcp_pipeline.backends.contract import JobState, JobStatus, map_native_state

STATE_MAP: dict[str, JobState] = {
    "QUEUEING": JobState.QUEUED,
    "AWAITING": JobState.QUEUED,  # waiting for capacity of its node group
    "STARTING": JobState.QUEUED,  # workers being placed, images pulled
    "RUNNING": JobState.RUNNING,
    "RESTARTING": JobState.RUNNING,  # a failed worker restarted by the service (max_failure_retry)
    "PENDINGRETRY": JobState.RUNNING,  # ... waiting to be
    "COMPLETED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "STOPPING": JobState.RUNNING,  # still has live workers: not finished until Stopped
    "STOPPED": JobState.CANCELLED,
    "DELETING": JobState.RUNNING,
    "DELETED": JobState.CANCELLED,
    "TERMINATING": JobState.RUNNING,
    "ARCHIVED": JobState.UNKNOWN,  # the record kept after its TTL: its outcome is in its last state (status_of)
    "UNK": JobState.UNKNOWN,
}


def status_of(job: dict[str, Any]) -> JobStatus:
    """A job record (the SDK's LeptonJob dumped by alias) -> JobStatus; `detail` its workers' counts (the service's
    reason comes from its events: backend.failure_detail)."""
    status = job.get("status") or {}
    native = str(status.get("state") or "UNK")
    state = map_native_state(native, STATE_MAP)
    if native.upper() == "ARCHIVED":  # archived after it ended: the last state of its history says how
        history = [h for h in status.get("job_history") or [] if str(h.get("state")).upper() != "ARCHIVED"]
        if history:
            state = map_native_state(str(history[-1].get("state") or "UNK"), STATE_MAP)
    if (job.get("spec") or {}).get("stopped") and state is JobState.FAILED:
        state = JobState.CANCELLED  # stopped by a user while a worker was failing: cancelled, as Stopped is
    counts = {key: int(status.get(key) or 0) for key in ("active", "ready", "succeeded", "failed")}
    detail = ", ".join(f"{count} {key}" for key, count in counts.items() if count)
    detail = f"workers: {detail}" if detail else ""
    return JobStatus(job_id=str(job["metadata"]["id"]), state=state, native=native, detail=detail)
