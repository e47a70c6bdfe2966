"""The stall guard: a running training whose step count has not advanced for too long is a hung attempt.

A multi-node job that hangs (before step 1 in a collective, or later) holds every GPU of the job until its runtime
ends, days for a pretraining. The guard watches the step count the poller already reads for `status` (the backend's
`progress`, at the backend's own cadence), notes when it last advanced and how slow the slowest step was, and once
nothing has moved for longer than the stage's `stall_guard` allows it keeps the job's last log lines and its reason
on the job, saves the state and asks the backend to cancel the job. The stall's outcome (verify, resubmit, fail) is
decided when the poll sees the job ended (outcomes.py `finish_stalled`), never while it may still run: a stage
never has two jobs.

The guard reads the step lines only: a training stage whose program prints none the guard reads (the smoke
pretrain's, NeMo's, Megatron's forms: training_log.py) counts as hung before its first step once `first_step` has
passed; such a stage sets `stall_guard.enabled: false`. A backend that reads no training progress at all is never
guarded.

What it keeps is on the job's record in the run state (`steps_seen`, `advanced_at`, `slowest_step`, `stall`), so
an orchestrator restarted mid-run goes on where the last one was. The decision itself is `stall_reason` (pure).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bcp_pipeline.backends.contract import Backend, JobProgress
from bcp_pipeline.backends.shared.logs import last_lines
from bcp_pipeline.config.durations import format_elapsed, parse_duration
from bcp_pipeline.config.model import StallGuard
from bcp_pipeline.engine.context import RunContext
from bcp_pipeline.engine.state import JobRecord
from bcp_pipeline.errors import BackendCallError, PipelineError
from bcp_pipeline.redact import redact, secret_values

SLOWEST_STEP_FACTOR = 3  # no step for this many times the slowest one so far: stalled (with the floor `at_least`)
STALL_LOG_LINES = 20  # the last lines of its training log kept with a stalled job, for `status`


def stall_limit(guard: StallGuard, job: JobRecord) -> tuple[float, str]:
    """How long the job may go without a new step, and what that limit is, in words."""
    if job.steps_seen is None:
        return float(parse_duration(guard.first_step)), f"stall_guard.first_step {guard.first_step}"
    if guard.after is not None:
        return float(parse_duration(guard.after)), f"stall_guard.after {guard.after}"
    floor = float(parse_duration(guard.at_least))
    derived = SLOWEST_STEP_FACTOR * (job.slowest_step or 0.0)
    if derived > floor:
        return derived, f"{SLOWEST_STEP_FACTOR}x its slowest step so far ({_spelled(job.slowest_step)})"
    return floor, (
        f"stall_guard.at_least {guard.at_least}, above {SLOWEST_STEP_FACTOR}x its slowest step so far"
        + (f" ({_spelled(job.slowest_step)})" if job.slowest_step else "")
    )


def _spelled(seconds: float) -> str:
    """`0.05 s`, `42 s`, `16m40s`."""
    return f"{seconds:.3g} s" if seconds < 100 else format_elapsed(seconds)


def stall_reason(guard: StallGuard, job: JobRecord, now: float) -> str | None:
    """Why a running job counts as stalled now, or None while it does not: no step line since it was seen running
    for longer than `first_step`, or no new step for longer than the limit (`stall_limit`)."""
    if not guard.enabled or job.started_at is None:
        return None
    since = job.advanced_at or job.started_at  # its last advance, or when it was last seen (again) running
    limit, basis = stall_limit(guard, job)
    quiet = now - since
    if quiet <= limit:
        return None
    if job.steps_seen is None:
        return f"no step line in {format_elapsed(quiet)} since it was seen running (limit: {basis})"
    return f"no new step for {format_elapsed(quiet)} after step {job.steps_seen} (limit: {basis})"


def observe(job: JobRecord, progress: JobProgress | None, now: float) -> bool:
    """Note a step count the job's log shows; True when it advanced (the job's record changed).

    A "step" here is the wait between two step lines, which is what a stall is measured against: one step where
    every step is logged (the smoke pretrain, NeMo), `log_interval` steps for Megatron-Bridge. Its slowest so far is
    the longest of the waits between two advances the polls saw and the training's own time for the steps between
    them (its step time times the steps advanced); a checkpoint save between two lines makes it longer."""
    if progress is None or progress.unit != "steps" or (job.steps_seen is not None and progress.done <= job.steps_seen):
        return False
    slowest = [job.slowest_step or 0.0]
    if job.steps_seen is not None and job.advanced_at is not None:
        slowest.append(now - job.advanced_at)
        if progress.step_seconds:
            slowest.append(progress.step_seconds * (progress.done - job.steps_seen))
    elif progress.step_seconds:
        slowest.append(progress.step_seconds)  # the first line seen: one step, the least it can be
    job.slowest_step = max(slowest) or None
    job.steps_seen, job.advanced_at = progress.done, now
    return True


def reads_progress(backend: Backend) -> bool:
    """Whether the backend reads a training's steps at all (it has its own `progress`): the contract's default
    answers None for ever."""
    return type(backend).progress is not Backend.progress


@dataclass
class StallWatch(RunContext):
    """Applies the stage's stall guard to each running training job the poller hands it."""

    _cancel_failures: dict[str, int] = field(default_factory=dict)  # job id -> cancel calls failed in a row
    _cancelled: set[str] = field(default_factory=set)  # stalled jobs this process has cancelled (their end is due)

    def check(self, name: str, job: JobRecord, progress: JobProgress | None, running: bool) -> None:
        """One poll's look at a training job: note its progress, or cancel it once it stalled."""
        guard = self.pipeline.stages[name].stall_guard
        if not reads_progress(self.backend):
            return  # a backend that never reads a training's steps would have every training "hang" before step 1
        now = time.time()
        if job.stall is not None:  # found stalled before: cancelled again after a failed call or a restart
            if job.job_id not in self._cancelled:
                self.cancel(name, job)
            return
        if observe(job, progress, now):
            self.store.save(self.state)  # on disk: a restarted orchestrator measures from this advance
            return
        if not running:  # preempted, or queued again: its quiet time counts from when it runs again
            if job.started_at is not None:
                job.advanced_at = now  # saved with the state change that the poller saves
            return
        reason = stall_reason(guard, job, now)
        if reason is None:
            return
        job.stall = {"reason": reason, "at": now, "last_lines": self.last_lines(job)}
        self.store.save(self.state)  # the stall is on disk before the cancel: a restart cancels it again, no more
        self.progress.event(f"{name}: job {job.job_id} stalled ({reason}); cancelling it")
        self.cancel(name, job)

    def last_lines(self, job: JobRecord) -> list[str]:
        """The end of the job's training log (secrets redacted), or why it could not be read."""
        try:
            text = self.backend.training_log(job.job_id, tail=STALL_LOG_LINES)
        except (PipelineError, OSError) as exc:
            return [f"(its log could not be read: {' '.join(str(exc).split())[:300]})"]
        return redact(last_lines(text, STALL_LOG_LINES), secret_values()).splitlines()

    def cancel(self, name: str, job: JobRecord) -> None:
        """Ask the backend to stop the stalled job; a failing call is tried again next cycle."""
        try:
            self.backend.cancel([job.job_id])
        except (BackendCallError, OSError) as exc:
            failures = self._cancel_failures[job.job_id] = self._cancel_failures.get(job.job_id, 0) + 1
            self.progress.event(
                f"{name}: cancelling stalled job {job.job_id} failed ({failures} in a row), trying again: {exc}"
            )
            return
        self._cancel_failures.pop(job.job_id, None)
        self._cancelled.add(job.job_id)
