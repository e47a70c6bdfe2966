"""Grid Engine: every stage a `qsub` job (an array job, or one over a parallel environment), tracked with
`qstat -xml` while Grid Engine lists it and `qacct -j` once it has finished.

Rendering is pure (gridengine_render.py): `plan` prints the exact job script. Jobs are named `RUN.STAGE` or
`RUN.STAGE.verify`, so `find_active` finds them again with one `qstat` call after the orchestrator died between
`qsub` and recording the id. One `qstat -u USER -xml` call per poll cycle covers every listed job (parsed by tag
names: Altair Grid Engine's XML may differ from Son of Grid Engine's); a job qstat no longer lists is read from
`qacct -j` once, and its result kept. A job that left qstat with no accounting record after
`accounting_grace_seconds` (the cell's accounting flush) was deleted while it was pending or held: CANCELLED.
A job in `Eqw` (Grid Engine could not start it, e.g. its log path cannot be opened) stays so for ever: it is
FAILED with the reason `qstat -j` gives, and deleted.
"""

from __future__ import annotations

import getpass
import re
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from bcp_pipeline.config.resources import GridEngineOptions
from bcp_pipeline.errors import CommandError, SubmissionError
from bcp_pipeline.procs import run_command
from bcp_pipeline.backends.common import (job_name, joined_logs, last_lines, outage_seconds, paths_for,
    progress_from_logs, read_tail)
from bcp_pipeline.backends.contract import (Backend, JobProgress, JobRequest, JobState, JobStatus, Submission,
    map_native_state)
from bcp_pipeline.backends.gridengine_render import job_rendezvous, job_script, shape

HINT = ("is the Grid Engine cell reachable from here? try `qstat`; its clients need SGE_ROOT, SGE_CELL (and a "
        "private cell's SGE_QMASTER_PORT) in the environment")
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


class GridEngineBackend(Backend):
    name = "gridengine"

    def __init__(self, options: GridEngineOptions, *, config_dir: Path, stages_dir: Path, run_dir: Path,
                 workspace_name: str) -> None:
        self.options = options
        self.logs_dir = run_dir / "logs"
        self.paths = paths_for(options, config_dir=config_dir, stages_dir=stages_dir, run_dir=run_dir,
                               workspace_name=workspace_name, orchestrator_python=sys.executable)
        self.local_workspace = Path(self.paths.workspace)
        self.poll_min_seconds = options.poll_seconds
        self.status_outage_seconds = outage_seconds(options.status_outage_limit)
        self.poll_max_seconds = max(options.poll_seconds, options.poll_max_seconds)
        self.accounting_grace_seconds = options.accounting_grace_seconds
        self._finished: dict[str, JobStatus] = {}  # from qacct: it never changes once written
        self._unlisted_since: dict[str, float] = {}  # left qstat, no accounting record yet

    # -- rendering (pure) ------------------------------------------------------------------------------
    def sharding(self, request: JobRequest) -> dict[str, int]:
        size = shape(request, self.options)
        return {"replicas": size.nodes, "processes": size.per_node}

    def render(self, request: JobRequest) -> Submission:
        return Submission(request=request, printable=job_script(request, self.options, self.paths), payload={
            "submit_with": "qsub", "job_name": job_name(request.run_id, request.stage.name, request.kind),
            **self.sharding(request)}, rendezvous=job_rendezvous(request, self.options))

    # -- side effects ------------------------------------------------------------------------------------
    def submit(self, submission: Submission) -> str:
        self.logs_dir.mkdir(parents=True, exist_ok=True)  # Grid Engine opens the job's log here
        Path(self.paths.workspace).mkdir(parents=True, exist_ok=True)  # the job's -wd
        output = run_command(["qsub", "-terse"], input_text=submission.printable, hint=HINT).stdout
        # -terse: `ID` or, for an array job, `ID.1-N:1`
        job_id = output.strip().splitlines()[-1].split(".")[0] if output.strip() else ""
        if not job_id.isdigit():
            raise SubmissionError(f"`qsub -terse` printed no job id: {output[:500]!r}")
        return job_id

    def _qstat(self) -> list[Listed]:
        """This user's jobs Grid Engine lists (pending, running, in error), one entry per `<job_list>`."""
        output = run_command(["qstat", "-u", getpass.getuser(), "-xml"], timeout=60, hint=HINT).stdout
        try:
            root = ElementTree.fromstring(output)
        except ElementTree.ParseError as exc:
            raise SubmissionError(f"`qstat -xml` printed no valid XML ({exc}): {output[:300]!r}") from None
        found = []
        for entry in root.iter("job_list"):
            text = {child.tag: (child.text or "").strip() for child in entry}
            if text.get("JB_job_number"):
                found.append(Listed(job_id=text["JB_job_number"], state=text.get("state", ""),
                                    name=text.get("JB_name", ""), tasks=text.get("tasks", "")))
        return found

    def poll(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """One qstat call for all ids; qacct once for each id qstat no longer lists."""
        if not job_ids:
            return {}
        wanted = set(job_ids)
        by_job: dict[str, list[Listed]] = {}
        for entry in self._qstat():
            if entry.job_id in wanted:
                by_job.setdefault(entry.job_id, []).append(entry)
        statuses = {job_id: self._listed_status(job_id, entries) for job_id, entries in by_job.items()}
        stuck = [s.job_id for s in statuses.values() if s.state is JobState.FAILED]
        if stuck:
            self.cancel(stuck)  # an Eqw job stays for ever otherwise
            # Deleted, it leaves no accounting record: what it ended as is kept here for any later poll.
            self._finished.update((job_id, statuses[job_id]) for job_id in stuck)
        for job_id in job_ids:
            if job_id not in statuses and (status := self._unlisted_status(job_id)) is not None:
                statuses[job_id] = status
        return statuses

    def _listed_status(self, job_id: str, entries: list[Listed]) -> JobStatus:
        """The job's state from its qstat entries: an error in any task fails it; any running task runs it."""
        self._unlisted_since.pop(job_id, None)
        states = [(map_native_state(entry.state, STATE_MAP), entry.state) for entry in entries]
        for state, native in states:
            if state is JobState.FAILED:
                return JobStatus(job_id=job_id, state=state, native=native, detail=(
                    f"Grid Engine cannot start it ({native}): {self._error_reason(job_id)}; it was deleted"))
        for wanted in (JobState.RUNNING, JobState.UNKNOWN, JobState.QUEUED):
            for state, native in states:
                if state is wanted:
                    return JobStatus(job_id=job_id, state=state, native=native)
        return JobStatus(job_id=job_id, state=JobState.UNKNOWN, native="")

    def _error_reason(self, job_id: str) -> str:
        try:
            text = run_command(["qstat", "-j", job_id], timeout=30).stdout
        except CommandError as exc:
            return f"`qstat -j {job_id}` failed: {exc.stderr.strip()[:200]}"
        reasons = re.findall(r"^error reason\s+\S*:\s*(.+)$", text, flags=re.MULTILINE)
        return "; ".join(dict.fromkeys(reason.strip() for reason in reasons)) or "qstat -j gives no reason"

    def _unlisted_status(self, job_id: str) -> JobStatus | None:
        """A job qstat no longer lists: its accounting; none yet means "not finished" until the grace is over."""
        if job_id in self._finished:
            return self._finished[job_id]
        records = self._qacct(job_id)
        if records is None:
            return None  # qacct failed this time: ask again next cycle
        if records:
            status = accounting_status(job_id, records)
            self._finished[job_id] = status
            self._unlisted_since.pop(job_id, None)
            return status
        first_missed = self._unlisted_since.setdefault(job_id, time.monotonic())
        if time.monotonic() - first_missed < self.accounting_grace_seconds:
            return None
        status = JobStatus(job_id=job_id, state=JobState.CANCELLED, native="DELETED", detail=(
            f"Grid Engine no longer lists job {job_id} and has no accounting record of it after "
            f"{self.accounting_grace_seconds:.0f} s: it was deleted before it started (`qdel` while pending or held)"))
        self._finished[job_id] = status
        return status

    def _qacct(self, job_id: str) -> list[Accounting] | None:
        """The job's accounting records ([] when it has none), None when qacct failed."""
        try:
            text = run_command(["qacct", "-j", job_id], timeout=60, hint=HINT).stdout
        except CommandError as exc:
            # No record (yet), or no accounting file at all: a fresh cell where no job has ended.
            if re.search(r"job id \S+ not found|/accounting: No such file", exc.stderr):
                return []
            return None
        return parse_qacct(text)

    def find_active(self, run_id: str, stage: str, kind: str) -> list[str]:
        """This user's unfinished jobs named RUN.STAGE[.verify]."""
        name = job_name(run_id, stage, kind)
        return list(dict.fromkeys(entry.job_id for entry in self._qstat() if entry.name == name
                                  and not map_native_state(entry.state, STATE_MAP).finished))

    def _rank_logs(self, job_id: str) -> list[Path]:
        return sorted((self.logs_dir / job_id).glob("rank-*.log"))

    def _job_logs(self, job_id: str) -> list[Path]:
        return sorted(self.logs_dir.glob(f"sge-{job_id}.log")) + sorted(self.logs_dir.glob(f"sge-{job_id}.*.log"))

    def logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> str:
        if rank is not None:
            path = self.logs_dir / job_id / f"rank-{rank:05d}.log"
            if not path.is_file():
                raise SubmissionError(f"job {job_id} has no log for rank {rank} ({path})")
            paths = [path]
        else:
            paths = self._rank_logs(job_id) + [p for p in self._job_logs(job_id) if p.stat().st_size]
            if not paths:
                raise SubmissionError(f"job {job_id} has no logs yet under {self.logs_dir}")
        return joined_logs(paths, tail)

    def progress(self, job_id: str, *, training: bool = False) -> JobProgress | None:
        return progress_from_logs([read_tail(path, 8192) for path in self._rank_logs(job_id)], training=training)

    def failure_detail(self, job_id: str, status: JobStatus) -> str:
        """Grid Engine's account of the end, the failed ranks the launchers named, and the first one's log tail."""
        lines = [status.detail] if status.detail else []
        job_logs = "\n".join(read_tail(path) for path in self._job_logs(job_id))
        failed = sorted({int(rank) for rank in re.findall(r"^bcp-pipeline: rank (\d+) on", job_logs, re.MULTILINE)})
        if failed:
            lines.append("failed ranks: " + ", ".join(map(str, failed)))
            log = self.logs_dir / job_id / f"rank-{failed[0]:05d}.log"
            lines.append(f"last lines of {log}:\n" + _indent(last_lines(read_tail(log), 15) or "(empty)"))
        elif job_logs.strip():
            lines.append("last lines of the job's log:\n" + _indent(last_lines(job_logs, 10)))
        return "\n".join(lines)

    def cancel(self, job_ids: list[str]) -> None:
        if not job_ids:
            return
        try:
            run_command(["qdel", *job_ids], timeout=60, hint=HINT)
        except CommandError as exc:
            if "does not exist" not in exc.stderr:  # finished meanwhile: nothing to stop
                raise


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
        records.append(Accounting(job_id=fields["jobnumber"], task=fields.get("taskid", "undefined"),
                                  failed=int(failed_code.strip() or 0), failed_text=failed_text.strip(),
                                  exit_status=int(fields.get("exit_status", "0").split()[0])))
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
        return JobStatus(job_id=job_id, state=state, native=f"failed {record.failed}", exit_code=record.exit_status,
                         detail=f"{task}Grid Engine: failed {record.failed} ({record.failed_text}), exit status "
                                f"{record.exit_status}")
    if record.exit_status:
        return JobStatus(job_id=job_id, state=JobState.FAILED, native="exited", exit_code=record.exit_status,
                         detail=f"{task}exit status {record.exit_status}")
    return JobStatus(job_id=job_id, state=JobState.SUCCEEDED, native="done", exit_code=0)


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())
