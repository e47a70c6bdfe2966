"""Slurm job states (squeue and sacct names) mapped to JobState, and what a row of theirs says about a job:
its state, the reason it waits, its exit code or signal, the tasks srun reported as failed."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from bcp_pipeline.backends.contract import JobState, JobStatus, map_native_state

# Every Slurm job state (squeue/sacct names). Unlisted ones map to UNKNOWN: "not finished", never "failed".
STATE_MAP: dict[str, JobState] = {
    "PENDING": JobState.QUEUED,
    "CONFIGURING": JobState.QUEUED,  # nodes allocated, still booting
    "REQUEUED": JobState.QUEUED,
    "REQUEUE_HOLD": JobState.QUEUED,
    "REQUEUE_FED": JobState.QUEUED,
    "RESV_DEL_HOLD": JobState.QUEUED,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,  # tasks ended, the final state follows
    "RESIZING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,  # Slurm resumes it by itself (PreemptMode=SUSPEND); requeueing would lose work
    "STOPPED": JobState.RUNNING,  # SIGSTOPped, still holds its nodes
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,  # burst buffer stage-out after the tasks
    "PREEMPTED": JobState.PREEMPTED,  # resume() requeues it under the same id
    "COMPLETED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,  # held in a special state by an epilog: needs a person
    "CANCELLED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMED_OUT,
    "DEADLINE": JobState.TIMED_OUT,
    "NODE_FAIL": JobState.LOST,
    "BOOT_FAIL": JobState.LOST,
    "REVOKED": JobState.LOST,  # federation: a sibling cluster runs it
}
# Reasons a PENDING job can never leave: Slurm would keep it queued forever, so it is cancelled and reported.
NEVER_STARTS: dict[str, str] = {
    "PartitionNodeLimit": "it asks for more nodes than the partition has",  # only when it does: see poll()
    "PartitionConfig": "it asks for more than the partition has (nodes x tasks x cpus, GPUs or memory)",
    "PartitionTimeLimit": "its --time is above the partition's MaxTime",
    "BadConstraints": "its constraints cannot be met by any node",
    "InvalidAccount": "its --account is not valid",
    "InvalidQOS": "its QOS is not valid",
    "AccountNotAllowed": "its account may not use this partition",
    "DependencyNeverSatisfied": "a job it depends on failed",
}
TASK_FAILURE = re.compile(r"^srun: error: \S+: tasks? ([\d,-]+): (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Row:
    """One line of squeue (or sacct) output."""

    job_id: str
    state: str
    exit_status: str  # squeue: a raw wait status ("768"); sacct: "CODE:SIGNAL"
    reason: str
    nodes: str = ""
    partition: str = ""
    name: str = ""


def status_of(row: Row, too_big: bool = False) -> JobStatus:
    """A squeue/sacct row as a JobStatus: state, Slurm's reason, the exit code or signal."""
    state, native = map_native_state(row.state, STATE_MAP), row.state
    exit_code, exit_text = decode_exit(row.exit_status)
    details = []
    if row.state == "PENDING" and (too_big or (row.reason in NEVER_STARTS and row.reason != "PartitionNodeLimit")):
        state, native, exit_code = JobState.FAILED, f"PENDING({row.reason})", None
        details.append(
            f"can never start: {NEVER_STARTS[row.reason]}, so it was cancelled; size the stage's slurm: "
            "section to the cluster (`sinfo -o '%P %D %c %G %m %l'` shows what it has)"
        )
    elif row.reason and row.reason != "None":
        details.append(f"Slurm reason {row.reason}")
    if state.finished and exit_text and exit_code:
        details.append(exit_text)
    return JobStatus(
        job_id=row.job_id,
        state=state,
        native=native,
        detail="; ".join(details),
        exit_code=exit_code if state.finished else None,
    )


def decode_exit(text: str) -> tuple[int | None, str]:
    """squeue's raw wait status (768 = exit 3, 15 = SIGTERM) or sacct's `CODE:SIGNAL` -> (code, words)."""
    try:
        if ":" in text:
            code, sig = (int(part) for part in text.split(":", 1))
        else:
            value = int(text)
            code, sig = value >> 8, value & 0x7F
    except ValueError:
        return None, ""
    if sig:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return 128 + sig, f"killed by {name}"
    return code, f"exit code {code}"


def failed_tasks(batch_log: str) -> dict[int, str]:
    """Ranks srun reported as failed: `srun: error: node: tasks 0,2-3: Exited with exit code 1`."""
    failed: dict[int, str] = {}
    for ranks, why in TASK_FAILURE.findall(batch_log):
        match = re.fullmatch(r"Exited with exit code (\d+)", why.strip())
        text = f"exited {match.group(1)}" if match else why.strip()
        for part in ranks.split(","):
            first, _, last = part.partition("-")
            for rank in range(int(first), int(last or first) + 1):
                failed[rank] = text
    return dict(sorted(failed.items()))
