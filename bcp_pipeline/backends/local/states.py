"""The local job states (what the supervisor writes in a job's record) mapped to JobState."""

from __future__ import annotations

from bcp_pipeline.backends.contract import JobState

STATE_MAP = {
    "queued": JobState.QUEUED,
    "starting": JobState.RUNNING,  # its supervisor is starting its ranks (supervisor.py start_ranks)
    "running": JobState.RUNNING,
    "succeeded": JobState.SUCCEEDED,
    "failed": JobState.FAILED,
    "cancelled": JobState.CANCELLED,
    "lost": JobState.LOST,  # its supervisor died (backend.py says so from its record)
}
