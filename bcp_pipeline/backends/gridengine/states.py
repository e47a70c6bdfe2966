"""Grid Engine job states (qstat codes) and accounting records (qacct) mapped to JobState: an entry of `qstat
-xml`, a `qacct -j` record, and the end they say a job had."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bcp_pipeline.backends.contract import JobState, JobStatus

# Every qstat state code (the letters Grid Engine combines). Unlisted ones map to UNKNOWN: "not finished".
STATE_MAP: dict[str, JobState] = {
    "QW": JobState.QUEUED,  # pending
    "HQW": JobState.QUEUED,  # held (a user or a dependency): waits until released
    "HRWQ": JobState.QUEUED,
    "RQ": JobState.QUEUED,  # rescheduled, pending again
    "HRQ": JobState.QUEUED,
    "T": JobState.RUNNING,  # being transferred to its host ("t"), or suspended by a threshold ("T")
    "R": JobState.RUNNING,
    "RR": JobState.RUNNING,  # restarted after a reschedule
    "RT": JobState.RUNNING,
    "S": JobState.RUNNING,  # suspended ("s" by a user, "S" by its queue): Grid Engine resumes it by itself
    "ST": JobState.RUNNING,
    "DR": JobState.RUNNING,  # being deleted: the accounting record says how it ended
    "DT": JobState.RUNNING,
    "DS": JobState.RUNNING,
    "DQW": JobState.QUEUED,  # deleted while pending: it vanishes without a record
    "DHQW": JobState.QUEUED,
    "EQW": JobState.FAILED,  # Grid Engine could not start it and never will
    "EHQW": JobState.FAILED,
    "EHRQW": JobState.FAILED,
    "ERQ": JobState.FAILED,
}
# qacct's `failed` codes that decide a job's end (0: its exit status does). Others: the job failed.
FAILED_CODES: dict[int, JobState] = {
    100: JobState.CANCELLED,  # "assumedly after job": qdel of a running job (or a kill from outside)
    37: JobState.TIMED_OUT,  # "qmaster enforced h_rt limit"
    19: JobState.LOST,  # "before writing exit_status": the shepherd died (its host went away)
    21: JobState.LOST,  # "in recognizing job": the host did not know the job
    25: JobState.LOST,  # "rescheduling"
}


@dataclass(frozen=True)
class Listed:
    """One `<job_list>` entry of `qstat -xml`: a job, or some tasks of an array job."""

    job_id: str
    state: str
    name: str
    tasks: str = ""


@dataclass(frozen=True)
class Accounting:
    """One `qacct -j` record: a job, or one task of an array job."""

    job_id: str
    task: str
    failed: int
    failed_text: str
    exit_status: int


def parse_qacct(text: str) -> list[Accounting]:
    """`qacct -j` output: `key value` lines, one block per job or array task, blocks separated by `====` lines."""
    records = []
    for block in re.split(r"^=+\s*$", text, flags=re.MULTILINE):
        fields = {}
        for line in block.splitlines():
            key, _, value = line.strip().partition(" ")
            if key:
                fields[key] = value.strip()
        if "jobnumber" not in fields:
            continue
        failed_code, _, failed_text = fields.get("failed", "0").partition(":")
        records.append(
            Accounting(
                job_id=fields["jobnumber"],
                task=fields.get("taskid", "undefined"),
                failed=int(failed_code.strip() or 0),
                failed_text=failed_text.strip(),
                exit_status=int(fields.get("exit_status", "0").split()[0]),
            )
        )
    return records


def accounting_status(job_id: str, records: list[Accounting]) -> JobStatus:
    """A finished job from its accounting: the worst of its tasks (or of its hosts' records)."""
    worst: JobStatus | None = None
    for record in records:
        status = record_status(job_id, record)
        if worst is None or (worst.state is JobState.SUCCEEDED and status.state is not JobState.SUCCEEDED):
            worst = status
    assert worst is not None
    return worst


def record_status(job_id: str, record: Accounting) -> JobStatus:
    task = f"task {record.task}: " if record.task not in ("undefined", "0") else ""
    if record.failed:
        state = FAILED_CODES.get(record.failed, JobState.FAILED)
        return JobStatus(
            job_id=job_id,
            state=state,
            native=f"failed {record.failed}",
            exit_code=record.exit_status,
            detail=f"{task}Grid Engine: failed {record.failed} ({record.failed_text}), exit status "
            f"{record.exit_status}",
        )
    if record.exit_status:
        return JobStatus(
            job_id=job_id,
            state=JobState.FAILED,
            native="exited",
            exit_code=record.exit_status,
            detail=f"{task}exit status {record.exit_status}",
        )
    return JobStatus(job_id=job_id, state=JobState.SUCCEEDED, native="done", exit_code=0)
