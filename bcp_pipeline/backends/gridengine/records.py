"""A Grid Engine job's own record of its start and end, read before its accounting.

`qacct` has a job only once qmaster's accounting is flushed: at once on the test cell, minutes later on a busy
site. A job that left `qstat` and has no accounting yet cannot tell "finished" from "deleted while pending" by
Grid Engine's answers alone. So each job script (each array task; a parallel job's batch script, not its hosts'
`--node` parts) writes, into the run's log folder (never the workspace, so no stage output sits beside them):

    logs/ID/task-N.started   when it starts: `host=H time=EPOCH tasks=T` (T: the job's array tasks)
    logs/ID/task-N.exit      when its script exits: the exit status (an EXIT trap; none after a SIGKILL:
                             h_rt, or `qdel` of a running job, for which accounting is the only witness)

each written to a temporary name and renamed (atomic: a reader sees all of it or none). `SCRIPT` renders the
lines (pure; records.sh); `read_evidence` and `Evidence` read them back for the backend's poll.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from bcp_pipeline.backends.contract import JobState, JobStatus
from bcp_pipeline.backends.gridengine.states import Accounting
from bcp_pipeline.backends.shared import templates

SCRIPT = templates.load(__package__, "records.sh")  # shell text, after `logs=` is set


def script(tasks: int) -> list[str]:
    """The record lines of a job of `tasks` array tasks (1: a plain or parallel job)."""
    return templates.fill(SCRIPT, TASKS=str(tasks)).splitlines()


@dataclass(frozen=True)
class Evidence:
    """What a job's records say: the tasks it has, which started, and the exit status of those that ended."""

    tasks: int | None  # from any start record; None: no task started
    started: frozenset[int] = field(default_factory=frozenset)
    exits: dict[int, int] = field(default_factory=dict)

    def ended(self) -> bool:
        """Every task of the job wrote its exit status."""
        return self.tasks is not None and all(task in self.exits for task in range(1, self.tasks + 1))

    def status(self, job_id: str) -> JobStatus | None:
        """The job's end as its own records say it (the worst task), None until every task has one."""
        if not self.ended():
            return None
        failed = {task: code for task, code in sorted(self.exits.items()) if code}
        said = "from the job's own exit record (Grid Engine's accounting has no record of it yet)"
        if not failed:
            return JobStatus(job_id=job_id, state=JobState.SUCCEEDED, native="done", exit_code=0, detail=said)
        task, code = next(iter(failed.items()))
        where = f"task {task}: " if self.tasks and self.tasks > 1 else ""
        return JobStatus(
            job_id=job_id,
            state=JobState.FAILED,
            native="exited",
            exit_code=code,
            detail=f"{where}exit status {code}, {said}",
        )

    def worst_exit(self) -> int | None:
        """The highest exit status the tasks recorded (None: none recorded one)."""
        return max(self.exits.values(), default=None)


def read_evidence(folder: Path) -> Evidence:
    """The records under logs/ID (a missing folder: no evidence). A half-written file never exists (renamed
    into place); an unreadable one counts as absent, so accounting decides."""
    tasks: int | None = None
    started: set[int] = set()
    exits: dict[int, int] = {}
    if not folder.is_dir():
        return Evidence(tasks=None)
    for path in folder.glob("task-*.started"):
        found = re.search(r"\btasks=(\d+)\b", _read(path))
        if found and (task := _task(path)) is not None:
            started.add(task)
            tasks = max(tasks or 0, int(found.group(1)))
    for path in folder.glob("task-*.exit"):
        text = _read(path).strip()
        if text.isdigit() and (task := _task(path)) is not None:
            exits[task] = int(text)
    return Evidence(tasks=tasks, started=frozenset(started), exits=exits)


def _task(path: Path) -> int | None:
    number = path.name.split(".")[0].removeprefix("task-")
    return int(number) if number.isdigit() else None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# The native states of a job that left qstat after it started, with no exit record and no accounting yet.
PENDING = "finished, accounting pending"
PENDING_SLOW = "finished, accounting slow"


def confirmed(accounted: JobStatus, evidence: Evidence) -> JobStatus:
    """Accounting's verdict, which decides where it differs from the job's own exit records (it sees what the
    script cannot: a kill after its last line, an epilog's failure); the difference is named in the detail."""
    own = evidence.worst_exit()
    if own is None or own == accounted.exit_code:
        return accounted
    said = f"the job's own exit record said {own}; Grid Engine's accounting decides"
    return replace(accounted, detail=f"{accounted.detail}; {said}" if accounted.detail else said)


def covers(records: list[Accounting], evidence: Evidence) -> bool:
    """Accounting has a record of every task that started (a busy site flushes an array job's tasks one by one:
    task 1's record alone must not finish a job whose task 2 ran too)."""
    accounted = {int(r.task) if r.task.isdigit() and r.task != "0" else 1 for r in records}
    return evidence.started <= accounted
