"""Polling: one backend call per cycle for every active job, and each job's new status recorded in the run state.

A failing status call is retried next cycle (reported after a few in a row), never a stage failure: the jobs may
well be running fine. Once calls have failed in a row for longer than the backend's `status_outage_limit`, the run
stops waiting (BackendUnreachable) and leaves its jobs as they are, for `resume`. A failing resume of a preempted
job is retried next cycle too. A preempted job the backend cannot resume is
killed and its stage's job submitted again. A job the backend does not list this cycle is "not finished yet".
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from bcp_pipeline.backends.contract import JobProgress, JobState, JobStatus
from bcp_pipeline.config.durations import format_duration
from bcp_pipeline.config.model import StageConfig
from bcp_pipeline.config.placeholders import resolve_int
from bcp_pipeline.config.training import training_plan
from bcp_pipeline.engine.context import RunContext
from bcp_pipeline.engine.outcomes import Outcomes
from bcp_pipeline.engine.stall_guard import StallWatch
from bcp_pipeline.engine.state import JobRecord, StageStatus
from bcp_pipeline.errors import BackendCallError, BackendUnreachable

TRANSIENT_ERRORS_BEFORE_NOTICE = 3


@dataclass
class Poller(RunContext):
    """Maps the backend's job statuses onto the run state; a finished job goes to Outcomes to decide its stage."""

    outcomes: Outcomes
    stall_watch: StallWatch
    _failures: int = 0  # status calls failed in a row
    _failing_since: float | None = None  # when the first of them failed (time.monotonic)
    _resume_failures: dict[str, int] = field(default_factory=dict)  # job id -> resume calls failed in a row

    def active_jobs(self) -> dict[str, tuple[str, JobRecord]]:
        """Job id -> (stage name, job) for every job a stage is waiting on."""
        waiting = {}
        for name, stage_state in self.state.stages.items():
            job = stage_state.active_job()
            if job is not None:
                waiting[job.job_id] = (name, job)
        return waiting

    def poll_once(self, waiting: dict[str, tuple[str, JobRecord]]) -> bool:
        """One backend call for every active job; a failing call is retried next cycle, not a stage failure."""
        try:
            statuses = self.backend.poll(list(waiting))
        except (BackendCallError, OSError) as exc:
            self.status_query_failed(exc)
            return False
        self._failures, self._failing_since = 0, None
        changed = False
        for job_id, (name, job) in waiting.items():
            status = statuses.get(job_id)
            if status is None:
                continue  # not listed this cycle: unknown is "not finished"
            changed |= self.handle(name, job, status)
        return changed

    def status_query_failed(self, exc: Exception) -> None:
        """Count a failed status call; past the backend's outage limit, stop the run (its jobs left as they are)."""
        now = time.monotonic()
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = now
        failing_for = now - self._failing_since
        limit = self.backend.status_outage_seconds
        if limit is not None and failing_for >= limit:
            name = self.backend.name
            raise BackendUnreachable(
                f"{name} has not answered a status query for {_spelled(failing_for)} "
                f"({self._failures} calls in a row failed; the last: {' '.join(str(exc).split())[:500]}). The run "
                f"stopped waiting and left its jobs as they are: they may well be running. Once {name} answers, "
                f"`bcp-pipeline resume {self.state.run_id}` re-attaches to them; `backends.{name}."
                f"status_outage_limit` in pipelines.yaml sets how long a run waits (now "
                f"{_spelled(limit)}; null: for ever)"
            )
        if self._failures >= TRANSIENT_ERRORS_BEFORE_NOTICE:
            until = "" if limit is None else f" (for {_spelled(limit)} at most)"
            self.progress.event(f"status query failed {self._failures} times in a row, still retrying{until}: {exc}")

    def handle(self, name: str, job: JobRecord, status: JobStatus) -> bool:
        """Record one job's status and, once it finished, its stage's transition; save on any change."""
        stage_state = self.state.stages[name]
        changed = (job.state, job.native) != (status.state.value, status.native)
        # A waiting job's reason (the scheduler's message, Kueue's) can change while its state stays: saved too, so
        # what the state file says of why it waits is the latest.
        new_reason = status.state is JobState.QUEUED and job.detail != status.detail
        job.state, job.native, job.detail = status.state.value, status.native, status.detail
        if status.state is JobState.RUNNING and job.started_at is None:
            job.started_at = time.time()  # the queued/running split of `report`'s timeline, to one poll interval
        if not status.state.finished:
            if job.kind == "stage":
                progress = self.update_progress(name, job)
                if is_training(self.pipeline.stages.get(name)):
                    if status.state is JobState.RUNNING:  # a service measures a job only once it runs
                        self.update_telemetry(job)
                    self.stall_watch.check(name, job, progress, running=status.state is JobState.RUNNING)
            if status.state is JobState.PREEMPTED and (changed or job.job_id in self._resume_failures):
                changed = self.on_preempted(name, job) or changed
            if changed or new_reason:
                self.store.save(self.state)
            return changed
        job.ended_at = time.time()
        if job.kind == "stage":
            self.update_progress(name, job)  # its last count, before the stage moves on
            if job.stall is not None and status.state is not JobState.SUCCEEDED:  # the stall guard cancelled it
                job.state, job.detail = JobState.STALLED.value, f"stalled: {job.stall.get('reason', '')}"
                self.outcomes.finish_stalled(name, stage_state, job)
            else:
                self.outcomes.finish_stage_job(name, stage_state, job, status)
        else:
            self.outcomes.finish_verification(name, stage_state, job, status)
        self.store.save(self.state)
        return True

    def update_progress(self, name: str, job: JobRecord) -> JobProgress | None:
        stage = self.pipeline.stages.get(name)
        progress = self.backend.progress(job.job_id, training=is_training(stage))
        if progress is not None:
            self.state.stages[name].progress = progress_record(stage, progress, self.pipeline.vars)
        return progress

    def update_telemetry(self, job: JobRecord) -> None:
        """A running training's GPU utilization per replica, where its backend measures it (saved when it changes)."""
        try:
            found = self.backend.gpu_utilization(job.job_id)
        except (BackendCallError, OSError):
            return  # a nicety: never fail a poll over it
        if found is None:
            return
        replicas = {str(replica): round(float(value), 1) for replica, value in sorted(found.items())}
        if job.gpu_utilization is None or job.gpu_utilization.get("replicas") != replicas:
            job.gpu_utilization = {"at": time.time(), "replicas": replicas}
            self.store.save(self.state)

    def on_preempted(self, name: str, job: JobRecord) -> bool:
        """Resume a preempted job where its stage says so; a failing resume call is tried again next cycle. True when
        the run state changed: the backend cannot resume the job, so the stage's job is submitted again."""
        policy = getattr(self.pipeline.stages[name].resources(self.backend.name), "on_preempted", "wait")
        if policy != "resume":
            self.progress.event(f"{name}: job {job.job_id} was preempted; waiting for it to be resumed")
            return False
        try:
            resumed = self.backend.resume(job.job_id)
        except (BackendCallError, OSError) as exc:
            self._resume_failed(name, job, "resuming", exc)
            return False
        if not resumed:
            return self.resubmit(name, job)
        self._resume_failures.pop(job.job_id, None)
        self.progress.event(f"{name}: job {job.job_id} was preempted; resumed it")
        return False

    def resubmit(self, name: str, job: JobRecord) -> bool:
        """The backend cannot resume this preempted job (Backend.resume said False): kill it, since a preempted job
        waits for a resume or a kill, then leave its stage to the submitter, which submits the stage's job (or the
        verification) again. Stage programs skip the shards the preempted job finished. A failing kill is tried again
        next cycle, before anything is submitted: never two jobs for one stage."""
        try:
            self.backend.cancel([job.job_id])
        except (BackendCallError, OSError) as exc:
            self._resume_failed(name, job, "killing", exc)
            return False
        self._resume_failures.pop(job.job_id, None)
        job.ended_at = time.time()
        job.detail = "preempted; the backend cannot resume it, so it was killed and submitted again"
        if job.kind == "stage":
            self.state.stages[name].status = StageStatus.SUBMITTING  # the submitter submits the stage's job again
        # (a verification job: the stage stays VERIFYING with no active job, which the submitter submits again)
        self.progress.event(
            f"{name}: job {job.job_id} was preempted and cannot be resumed here; killed it, "
            f"submitting the {'stage' if job.kind == 'stage' else 'verification'} job again"
        )
        return True

    def _resume_failed(self, name: str, job: JobRecord, doing: str, exc: Exception) -> None:
        failures = self._resume_failures[job.job_id] = self._resume_failures.get(job.job_id, 0) + 1
        if failures >= TRANSIENT_ERRORS_BEFORE_NOTICE:
            self.progress.event(
                f"{name}: {doing} preempted job {job.job_id} failed {failures} times in a row, still retrying: {exc}"
            )


def _spelled(seconds: float) -> str:
    """Seconds as a duration is written in pipelines.yaml (`1H`, `3S`), at least one second."""
    return format_duration(max(1, round(seconds)))


def is_training(stage: StageConfig | None) -> bool:
    """A stage whose job logs training steps (StageConfig.trains)."""
    return stage is not None and stage.trains


def progress_record(stage: StageConfig | None, progress: JobProgress, variables: dict[str, str]) -> dict:
    """What the run state keeps of a job's progress (`status` and the live view show it). A training's total, where
    its log does not say, is its continuation's target; tokens per step come from a training stage's model."""
    record: dict = {"done": progress.done, "total": progress.total, "unit": progress.unit}
    if progress.loss is not None:
        record["loss"] = progress.loss
    if progress.step_seconds is not None:
        record["step_seconds"] = progress.step_seconds
    if stage is not None and stage.trains and stage.continuation is not None and not progress.total:
        record["total"] = resolve_int(str(stage.continuation.target_steps), variables)
    if stage is not None and stage.engine is not None:
        with contextlib.suppress(ValueError):
            if (tokens := training_plan(stage).tokens_per_step) is not None:
                record["tokens_per_step"] = tokens
    return record
