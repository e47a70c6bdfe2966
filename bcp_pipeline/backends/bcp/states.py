"""BCP job statuses mapped to JobState, and what a job object (`job info`/`job list`) says: its status, its labels."""

from __future__ import annotations

from typing import Any

from bcp_pipeline.backends.contract import JobState, JobStatus, map_native_state

# All 25 BCP job statuses, as `ngc base-command job info` names them in `.job.jobStatus.status` (ngcsdk 4.19.1).
# PREEMPTED waits for `job resume`; unknown ones are "not finished".
STATE_MAP: dict[str, JobState] = {
    "CREATED": JobState.QUEUED,
    "QUEUED": JobState.QUEUED,
    "PENDING_STORAGE_CREATION": JobState.QUEUED,
    "REQUESTING_RESOURCE": JobState.QUEUED,
    "RESOURCE_CONSUMPTION_REQUEST_IN_PROGRESS": JobState.QUEUED,
    "RESOURCE_GRANTED": JobState.QUEUED,
    "STARTING": JobState.RUNNING,
    "RUNNING": JobState.RUNNING,
    "PENDING_TERMINATION": JobState.RUNNING,
    "PREEMPTED": JobState.PREEMPTED,
    "PREEMPTED_BY_ADMIN": JobState.PREEMPTED,
    "FINISHED_SUCCESS": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "FAILED_RUN_LIMIT_EXCEEDED": JobState.TIMED_OUT,
    "KILLED_BY_USER": JobState.CANCELLED,
    "KILLED_BY_ADMIN": JobState.CANCELLED,
    "CANCELED": JobState.CANCELLED,
    "KILLED_BY_SYSTEM": JobState.LOST,
    "TASK_LOST": JobState.LOST,
    "UNKNOWN": JobState.FAILED,
    "INFINITY_POOL_MISSING": JobState.FAILED,
    "RESOURCE_RELEASED": JobState.FAILED,
    "IM_INTERNAL_ERROR": JobState.FAILED,
    "RESOURCE_GRANT_DENIED": JobState.FAILED,
    "RESOURCE_LIMIT_EXCEEDED": JobState.FAILED,
}


def labels_of(job: dict[str, Any]) -> list[str]:
    labels = job.get("labels") or {}
    user = labels.get("userLabels") if isinstance(labels, dict) else None
    if isinstance(user, dict):
        return list(user.get("values") or [])
    definition = job.get("jobDefinition") or {}
    return list(user or definition.get("userLabels") or [])


def status_of(job: dict[str, Any]) -> JobStatus:
    status = job.get("jobStatus") or {}
    native = str(status.get("status") or "")
    return JobStatus(
        job_id=str(job.get("id")),
        state=map_native_state(native, STATE_MAP),
        native=native,
        detail=str(status.get("statusDetails") or ""),
    )
