"""The local job states (what the supervisor writes in a job's record) mapped to JobState."""

from __future__ import annotations

from bcp_pipeline.backends.contract import JobState


STATE_MAP = {
    "queued": JobState.QUEUED,
    "running": JobState.RUNNING,
    "succeeded": JobState.SUCCEEDED,
    "failed": JobState.FAILED,
    "cancelled": JobState.CANCELLED,
}
