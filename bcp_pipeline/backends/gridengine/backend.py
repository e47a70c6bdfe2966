"""Grid Engine: every stage a `qsub` job (an array job, or one over a parallel environment), tracked with
`qstat -xml` while Grid Engine lists it and `qacct -j` once it has finished.

Rendering is pure (render.py): `plan` prints the exact job script. Jobs are named `RUN.STAGE` or
`RUN.STAGE.verify`, so `find_active` finds them again with one `qstat` call after the orchestrator died between
`qsub` and recording the id. One `qstat -u USER -xml` call per poll cycle covers every listed job (parsed by tag
names: Altair Grid Engine's XML may differ from Son of Grid Engine's); a job qstat no longer lists is read from
`qacct -j` once, and its result kept. Accounting lags on a busy site, so each job script also records its own
start and exit status in the run's log folder (records.py): a job that left qstat is finished by its accounting
record, else by its own exit records; with only a start record it is "finished, accounting pending" (not yet
finished); with neither after `accounting_grace_seconds` it was deleted while pending or held: CANCELLED.
A job in `Eqw` (Grid Engine could not start it, e.g. its log path cannot be opened) stays so for ever: it is
FAILED with the reason `qstat -j` gives, and deleted.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.contract import JobRequest, JobState, JobStatus, Submission, map_native_state
from bcp_pipeline.backends.gridengine.client import HINT, qacct, qstat_jobs
from bcp_pipeline.backends.gridengine.records import PENDING, PENDING_SLOW, Evidence, confirmed, covers, read_evidence
from bcp_pipeline.backends.gridengine.render import job_rendezvous, job_script, qsub_argv, shape
from bcp_pipeline.backends.gridengine.states import STATE_MAP, Listed, accounting_status
from bcp_pipeline.backends.shared.batch import BatchBackend, job_name
from bcp_pipeline.backends.shared.logs import indent, last_lines, read_tail
from bcp_pipeline.config.resources import GridEngineOptions
from bcp_pipeline.errors import CommandError, SubmissionError
from bcp_pipeline.procs import run_command


class GridEngineBackend(BatchBackend):
    name = "gridengine"

    def __init__(
        self, options: GridEngineOptions, *, config_dir: Path, stages_dir: Path, run_dir: Path, workspace_name: str
    ) -> None:
        super().__init__(
            options, config_dir=config_dir, stages_dir=stages_dir, run_dir=run_dir, workspace_name=workspace_name
        )
        self.accounting_grace_seconds = options.accounting_grace_seconds
        self._finished: dict[str, JobStatus] = {}  # from qacct: it never changes once written
        self._unlisted_since: dict[str, float] = {}  # left qstat, no accounting record yet

    # -- rendering (pure) ------------------------------------------------------------------------------
    def sharding(self, request: JobRequest) -> dict[str, int]:
        size = shape(request, self.options)
        return {"replicas": size.nodes, "processes": size.per_node}

    def render(self, request: JobRequest) -> Submission:
        return Submission(
            request=request,
            printable=job_script(request, self.options, self.paths),
            payload={
                "submit_with": "qsub",
                "job_name": job_name(request.run_id, request.stage.name, request.kind),
                # shown by `plan` where the site's arguments make it more than `qsub -terse`
                **({"submit_argv": qsub_argv(self.options, "-terse")} if self.options.submit_args else {}),
                **self.sharding(request),
            },
            rendezvous=job_rendezvous(request, self.options),
        )

    # -- side effects ------------------------------------------------------------------------------------
    def submit(self, submission: Submission) -> str:
        self.logs_dir.mkdir(parents=True, exist_ok=True)  # Grid Engine opens the job's log here
        Path(self.paths.workspace).mkdir(parents=True, exist_ok=True)  # the job's -wd
        output = run_command(qsub_argv(self.options, "-terse"), input_text=submission.printable, hint=HINT).stdout
        # -terse: `ID` or, for an array job, `ID.1-N:1`
        job_id = output.strip().splitlines()[-1].split(".")[0] if output.strip() else ""
        if not job_id.isdigit():
            raise SubmissionError(f"`qsub -terse` printed no job id: {output[:500]!r}")
        return job_id

    def poll(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """One qstat call for all ids; qacct once for each id qstat no longer lists."""
        if not job_ids:
            return {}
        wanted = set(job_ids)
        by_job: dict[str, list[Listed]] = {}
        for entry in qstat_jobs():
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
                return JobStatus(
                    job_id=job_id,
                    state=state,
                    native=native,
                    detail=(f"Grid Engine cannot start it ({native}): {self._error_reason(job_id)}; it was deleted"),
                )
        for wanted in (JobState.RUNNING, JobState.UNKNOWN, JobState.QUEUED):
            for state, native in states:
                if state is wanted and state is JobState.QUEUED and "h" in native.lower():
                    # qhold, `qsub -h` or a hold of the site's: it waits for `qrls`, which status names
                    return JobStatus(
                        job_id=job_id,
                        state=state,
                        native=f"{native}, held: qrls {job_id}",
                        detail=(
                            f"job {job_id} is held ({native}): Grid Engine starts it only once `qrls {job_id}` "
                            "releases it"
                        ),
                    )
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
        """A job qstat no longer lists. Accounting decides once it has a record of every task that started (it
        also sees what the job cannot: a SIGKILL over h_rt or from `qdel`); until then the job's own records
        (records.py) do: its exit records finish it, a start record alone makes it "finished, accounting
        pending" (not finished: it ran, its end is Grid Engine's to tell), and no start record after
        `accounting_grace_seconds` means it was deleted before it started."""
        if job_id in self._finished:
            return self._finished[job_id]
        evidence = read_evidence(self.logs_dir / job_id)
        records = qacct(job_id)
        if records and covers(records, evidence):
            status = confirmed(accounting_status(job_id, records), evidence)
        elif (status := evidence.status(job_id)) is None:
            return self._without_an_end(job_id, evidence, asked=records is not None)
        self._finished[job_id] = status
        self._unlisted_since.pop(job_id, None)
        return status

    def _without_an_end(self, job_id: str, evidence: Evidence, *, asked: bool) -> JobStatus | None:
        """Neither accounting nor the job's own exit records say how it ended (`asked`: qacct answered "none")."""
        waited = time.monotonic() - self._unlisted_since.setdefault(job_id, time.monotonic())
        grace = self.accounting_grace_seconds
        if evidence.started:
            slow = waited >= grace  # status shows it: on a busy site accounting can lag by minutes
            return JobStatus(
                job_id=job_id,
                state=JobState.RUNNING,
                native=PENDING_SLOW if slow else PENDING,
                detail=f"job {job_id} started (its start record) and left qstat {waited:.0f} s ago; "
                "Grid Engine's accounting has no record of it yet"
                + (f", over accounting_grace_seconds ({grace:.0f} s): accounting is slow here" if slow else ""),
            )
        if not asked or waited < grace:
            return None  # qacct failed this time, or its record may still come: ask again next cycle
        status = JobStatus(
            job_id=job_id,
            state=JobState.CANCELLED,
            native="DELETED",
            detail=(
                f"Grid Engine no longer lists job {job_id}, it left no start record and accounting has no record of it "
                f"after {grace:.0f} s: it was deleted before it started (`qdel` while pending or held)"
            ),
        )
        self._finished[job_id] = status
        return status

    def find_active(self, run_id: str, stage: str, kind: str) -> list[str]:
        """This user's unfinished jobs named RUN.STAGE[.verify]."""
        name = job_name(run_id, stage, kind)
        return list(
            dict.fromkeys(
                entry.job_id
                for entry in qstat_jobs()
                if entry.name == name and not map_native_state(entry.state, STATE_MAP).finished
            )
        )

    def scheduler_logs(self, job_id: str) -> list[Path]:
        return sorted(self.logs_dir.glob(f"sge-{job_id}.log")) + sorted(self.logs_dir.glob(f"sge-{job_id}.*.log"))

    def failure_detail(self, job_id: str, status: JobStatus) -> str:
        """Grid Engine's account of the end, the failed ranks the launchers named, and the first one's log tail."""
        lines = [status.detail] if status.detail else []
        job_logs = "\n".join(read_tail(path) for path in self.scheduler_logs(job_id))
        failed = sorted({int(rank) for rank in re.findall(r"^bcp-pipeline: rank (\d+) on", job_logs, re.MULTILINE)})
        if failed:
            lines.append("failed ranks: " + ", ".join(map(str, failed)))
            lines.append(self.rank_log_tail(job_id, failed[0]))
        elif job_logs.strip():
            lines.append("last lines of the job's log:\n" + indent(last_lines(job_logs, 10)))
        return "\n".join(lines)

    def cancel(self, job_ids: list[str]) -> None:
        if not job_ids:
            return
        try:
            run_command(["qdel", *job_ids], timeout=60, hint=HINT)
        except CommandError as exc:
            if "does not exist" not in exc.stderr:  # finished meanwhile: nothing to stop
                raise

    @classmethod
    def check_service(cls, given: Any) -> Any:
        from bcp_pipeline.backends.gridengine.check import check_gridengine  # its probes' imports load only for `check`

        return check_gridengine(given)


BACKEND = GridEngineBackend
