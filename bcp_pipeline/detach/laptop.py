"""Detached runs on BCP (`run --detach`): the orchestrator runs as a small BCP job, the driver (driver.py).

From the laptop, a detached run is a run like any other. Its local state file is a mirror: `status`, `logs` and
`cancel` refresh it from the last `BCPP-STATE` line of the driver's job log (read through the transport), and
`state.detached["owner"]` says which copy is authoritative:

- "driver": the workspace's copy (`.bcp-pipeline/runs/RUN/state.json` under the mount), which drivers save;
- "local": the laptop's, after `cancel` or after `resume` without --detach took the run back. The next
  `--detach` uploads it.

The driver jobs themselves (their spec, look-up and lease) are in jobs.py; what both sides share, in protocol.py.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.bcp.backend import BcpBackend
from bcp_pipeline.backends.bcp.paths import UPLOAD_EXCLUDES
from bcp_pipeline.backends.bcp.render import label
from bcp_pipeline.backends.bcp.states import status_of
from bcp_pipeline.backends.bcp.transport import Transport
from bcp_pipeline.backends.contract import JobState, JobStatus
from bcp_pipeline.backends.retries import with_retries
from bcp_pipeline.config.model import Config, PipelineConfig
from bcp_pipeline.detach.jobs import active_drivers, driver_jobs, driver_spec
from bcp_pipeline.detach.protocol import (
    DRIVER_FOLDER,
    last_error,
    last_snapshot,
    submitted_commands,
    workspace_run_path,
)
from bcp_pipeline.engine.cancelling import CancelOutcome, QuietProgress, stop_jobs
from bcp_pipeline.engine.context import RunContext
from bcp_pipeline.engine.state import RunState, RunStore
from bcp_pipeline.errors import BackendCallError, StateError

LOG_TAIL_LINES = 400
STOP_WAIT_SECONDS = 120.0


def build_bundle(config: Config, into: Path, state: RunState | None) -> None:
    """What `--detach` uploads to the run folder in the workspace: driver/ (this package, stages/, the config with
    its stages_dir pointing at that copy) and, when the laptop's copy is the authoritative one, state.json."""
    folder = into / DRIVER_FOLDER
    ignore = shutil.ignore_patterns(*UPLOAD_EXCLUDES, "*.pyc")
    shutil.copytree(Path(__file__).resolve().parents[1], folder / "bcp_pipeline", ignore=ignore)
    shutil.copytree(config.stages_dir, folder / "stages", ignore=ignore)
    text = config.file.read_text(encoding="utf-8")
    text = STAGES_DIR_LINE.sub("stages_dir: stages  # the driver's copy (bcp-pipeline run --detach)", text)
    (folder / "pipelines.yaml").write_text(text, encoding="utf-8")
    if state is not None:
        (into / "state.json").write_text(json.dumps(state.to_json(), indent=2) + "\n", encoding="utf-8")


STAGES_DIR_LINE = re.compile(r"^stages_dir:.*$", re.MULTILINE)


@dataclass(kw_only=True)
class DriverView:
    """What `status` shows about a detached run's drivers."""

    jobs: list[JobStatus] = field(default_factory=list)  # oldest first
    error: str | None = None  # the latest driver's BCPP-ERROR line, when it gave up
    snapshot_from: str | None = None  # the driver job whose log the stages were read from

    @property
    def latest(self) -> JobStatus | None:
        return self.jobs[-1] if self.jobs else None

    def as_json(self) -> dict[str, Any]:
        return {
            "jobs": [
                {"job_id": j.job_id, "state": j.state.value, "native": j.native, "detail": j.detail} for j in self.jobs
            ],
            "error": self.error,
            "snapshot_from": self.snapshot_from,
        }


@dataclass
class DetachedRun:
    """A run's driver jobs, seen and steered from the laptop."""

    config: Config
    pipeline: PipelineConfig
    store: RunStore
    state: RunState
    backend: BcpBackend

    @property
    def transport(self) -> Transport:
        return self.backend.transport

    def start(self, environ: Mapping[str, str]) -> tuple[str, bool]:
        """Submit a driver (uploading what it runs first), or resume a preempted one: (job id, resumed). A preempted
        driver that BCP will not resume here (a RUNONCE job, where `check` found such a resume refused) is killed,
        and a new driver takes over from the state the old one left in the workspace."""
        for job in active_drivers(self.transport, self.state.run_id):
            status = status_of(job)
            if status.state is JobState.PREEMPTED:
                if self.backend.resume(status.job_id):
                    return status.job_id, True
                self.transport.kill(status.job_id)  # its lease then belongs to an ended job: the new driver takes it
                continue
            raise StateError(
                f"run {self.state.run_id} is already driven by driver job {status.job_id} "
                f"({status.native}): follow it with `bcp-pipeline status {self.state.run_id}`, "
                f"stop it with `bcp-pipeline cancel {self.state.run_id}`"
            )
        upload_state = not self.state.driver_owned
        self.state.detached = {"owner": "driver"}
        with tempfile.TemporaryDirectory(prefix="bcpp-driver-") as tmp:
            build_bundle(self.config, Path(tmp), self.state if upload_state else None)
            with_retries(
                lambda: self.transport.upload(
                    self.pipeline.workspace.name, Path(tmp), workspace_run_path(self.state.run_id), UPLOAD_EXCLUDES
                ),
                f"uploading the driver's bundle to workspace {self.pipeline.workspace.name}",
                self.backend.retry_policy,
            )
        job_id = self.transport.submit(driver_spec(self.config, self.pipeline, self.state.run_id, environ))
        self.store.save(self.state)
        return job_id, False

    def refresh(self) -> DriverView:
        """Driver jobs and their last saved run state (into self.state and the local mirror, while they own it)."""
        jobs = driver_jobs(self.transport, self.state.run_id)
        view = DriverView(jobs=[status_of(job) for job in jobs])
        started = {str(job.get("id")) for job in jobs if (job.get("jobStatus") or {}).get("startedAt")}
        for status in reversed(view.jobs):
            ran = status.job_id in started or status.state is JobState.RUNNING
            log = self._log(status.job_id, ran)
            if status is view.latest and status.state.finished:
                view.error = last_error(log)
            snapshot = last_snapshot(log) or (last_snapshot(self._log(status.job_id, ran, full=True)) if log else None)
            if snapshot is not None:
                view.snapshot_from = status.job_id
                if self.state.driver_owned:
                    self._mirror(snapshot)
                break
        return view

    def _log(self, job_id: str, ran: bool, full: bool = False) -> str:
        """The driver job's log; "" for a job that never ran (BCP has no log for it). Any other failure to read it
        is an error: swallowed, `status` of a detached run would show nothing and say nothing."""
        try:
            return self.transport.log(job_id, None, None if full else LOG_TAIL_LINES)
        except BackendCallError as exc:
            if not ran:
                return ""
            raise BackendCallError(
                f"could not read the log of driver job {job_id}, which holds the run's state: {exc}"
            ) from None

    def _mirror(self, snapshot: dict[str, Any]) -> None:
        try:
            fresh = RunState.from_json(snapshot)
        except (ValueError, KeyError, TypeError) as exc:
            raise StateError(f"run {self.state.run_id}: the driver's last state line is unreadable ({exc})") from None
        self.state.stages, self.state.updated_at = fresh.stages, fresh.updated_at
        self.state.detached = {**(fresh.detached or {}), "owner": "driver"}
        self.store.save(self.state)

    def keep_submitted(self) -> None:
        """What the drivers submitted for each job (their logs' BCPP-SUBMITTED lines) into the local `submitted/`,
        where `report` reads it: the workspace's copy is out of this machine's reach."""
        kept = self.store.run_dir(self.state.run_id) / "submitted"
        for job in driver_jobs(self.transport, self.state.run_id):
            ran = bool((job.get("jobStatus") or {}).get("startedAt"))
            for job_id, text in submitted_commands(self._log(str(job.get("id")), ran, full=True)).items():
                if not (kept / f"{job_id}.txt").is_file():
                    self.store.keep_submission(self.state.run_id, job_id, text)

    def stop_drivers(self, wait_seconds: float = STOP_WAIT_SECONDS) -> list[str]:
        """Kill the run's live drivers and wait until BCP reports them ended: their ids."""
        ids = [str(job.get("id")) for job in active_drivers(self.transport, self.state.run_id)]
        if ids:
            self.backend.cancel(ids)
        deadline = time.monotonic() + wait_seconds
        while ids and active_drivers(self.transport, self.state.run_id):
            if time.monotonic() > deadline:
                raise StateError(
                    f"driver job(s) {', '.join(ids)} of run {self.state.run_id} were killed but have "
                    f"not ended after {wait_seconds:.0f} s; try again"
                )
            time.sleep(1.0)
        return ids

    def take_back(self) -> list[str]:
        """Stop the drivers and make the laptop's copy of the state (their last one) the authoritative one."""
        stopped = self.stop_drivers()
        self.refresh()
        self.state.detached = {"owner": "local"}
        self.store.save(self.state)
        return stopped

    def cancel(self) -> tuple[list[str], CancelOutcome | None]:
        """Kill the drivers and stop the run as the engine does (each job asked first: one that ended is recorded
        as it ended, never as cancelled), then any unfinished job of the run the state has no record of: (the
        drivers stopped, what was done to the jobs; None where the run had already finished)."""
        self.refresh()
        if not self.state.still_going() and not active_drivers(self.transport, self.state.run_id):
            return [], None  # finished: it stays the driver's, as `status` shows it
        drivers = self.take_back()
        if not self.state.still_going():
            return drivers, None
        outcome = stop_jobs(
            RunContext(
                pipeline=self.pipeline,
                backend=self.backend,
                store=self.store,
                state=self.state,
                progress=QuietProgress(),
            )
        )
        unrecorded = [
            str(job.get("id"))
            for job in self.transport.list_jobs([label("run", self.state.run_id)])
            if not status_of(job).state.finished and str(job.get("id")) not in outcome.stopped
        ]
        if unrecorded:  # e.g. submitted by a driver killed before it saved the job's id
            self.backend.cancel(unrecorded)
            outcome.stopped += unrecorded
        return drivers, outcome


def render_driver(view: DriverView, run_id: str, finished: bool, job_url) -> list[str]:
    """`status` lines about a detached run's drivers."""
    latest = view.latest
    if latest is None:
        return [f"driver: none found for run {run_id} (`bcp-pipeline resume {run_id} --detach` starts one)"]
    url = job_url(latest.job_id) if job_url else None
    count = f", driver {len(view.jobs)} of this run" if len(view.jobs) > 1 else ""
    lines = [f"driver: job {latest.job_id} {latest.native or latest.state.value}{count}" + (f"  {url}" if url else "")]
    if latest.state.finished and not finished:
        reason = view.error or latest.detail or "no reason given"
        lines.append(
            f"  the driver ended ({reason}); the run is not advancing: "
            f"`bcp-pipeline resume {run_id} --detach` starts a new one, "
            f"`bcp-pipeline resume {run_id}` continues it here"
        )
    elif latest.state is JobState.PREEMPTED:
        lines.append(f"  the driver was preempted: `bcp-pipeline resume {run_id} --detach` resumes it")
    return lines
