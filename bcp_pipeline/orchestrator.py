"""Drive one run: submit stages whose needs are met, poll all active jobs in one call, verify, gate, persist.

The state file is saved after every change, so the orchestrator can die at any point (SIGKILL, Ctrl-C) and
`resume` picks up: jobs still running are re-attached, a stage caught between "submitting" and "submitted" is
looked up by its labels instead of being submitted twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .config import PipelineConfig, StageConfig, expected_count, resolve_int
from .errors import BackendCallError, PipelineError, StateError, SubmissionError
from .jobs import Backend, JobRequest, JobState, JobStatus
from .reporting import Reporter
from .state import JobRecord, RunState, RunStore, StageState, StageStatus
from .backends.common import last_lines, parse_lines

TRANSIENT_ERRORS_BEFORE_NOTICE = 3
SUBMIT_ATTEMPTS = 6  # consecutive failed submit calls before the stage fails (status calls retry forever)


@dataclass
class Orchestrator:
    pipeline: PipelineConfig
    backend: Backend
    store: RunStore
    state: RunState
    reporter: Reporter
    selected: set[str] = field(default_factory=set)  # stages this invocation may submit
    sleep: Callable[[float], None] = time.sleep
    _poll_failures: int = 0
    _submit_failures: dict[str, int] = field(default_factory=dict)

    # -- public ------------------------------------------------------------------------------------------
    def drive(self) -> bool:
        """Run until every selected stage is done or one fails; True if all succeeded."""
        self.check_sharding()
        self.backend.prepare(self.pipeline, execute=True)
        delay = self.backend.poll_min_seconds
        while True:
            changed = self.submit_ready()
            waiting = self.active_jobs()
            if not waiting and not self.submissions_due():
                break
            if waiting:
                changed |= self.poll_once(waiting)
            self.reporter.update(self.state)
            delay = self.backend.poll_min_seconds if changed else min(delay * 1.5, self.backend.poll_max_seconds)
            self.sleep(delay)
        self.reporter.update(self.state, final=True)
        return all(self.state.stages[name].status.done for name in self.selected)

    def check_sharding(self) -> None:
        """Refuse to resume a partly-run stage with a different replicas x processes, unless it can re-shard."""
        for name in self.selected:
            stage_state = self.state.stages[name]
            stage = self.pipeline.stages[name]
            if stage_state.sharding is None or stage_state.status.done or stage.reshardable:
                continue
            now = self.backend.sharding(self.request(name, "stage"))
            if now != stage_state.sharding:
                raise StateError(
                    f"stage {name!r} started with {_sharding_text(stage_state.sharding)} and is now configured for "
                    f"{_sharding_text(now)}; its finished shards were assigned by rank, so re-sharding could skip or "
                    f"redo work. Restore the old sharding, mark the stage `reshardable: true` if its program "
                    f"tolerates it, or start over with --restart")

    # -- submission ----------------------------------------------------------------------------------------
    def submission_due(self, name: str) -> str | None:
        """The kind of job stage `name` needs submitted now ("stage" / "verify"), or None.

        In-flight work (a stage marked SUBMITTING, a finished stage awaiting its verification job) is always
        completed; new stages start only while no stage has failed, so a failure stops the DAG.
        """
        if name not in self.selected:
            return None
        stage_state = self.state.stages[name]
        if stage_state.status is StageStatus.SUBMITTING:
            return "stage"  # also after a crash between marking and recording: submit() looks for the job first
        if stage_state.status is StageStatus.VERIFYING and stage_state.active_job() is None:
            return "verify"
        stopped = any(s.status in (StageStatus.FAILED, StageStatus.CANCELLED) for s in self.state.stages.values())
        if (not stopped and stage_state.status is StageStatus.PENDING
                and all(self.state.stages[need].status.done for need in self.pipeline.stages[name].needs)):
            return "stage"
        return None

    def submissions_due(self) -> bool:
        return any(self.submission_due(name) for name in self.pipeline.stages)

    def submit_ready(self) -> bool:
        """Submit every job that is due; a failing submit is retried next cycle, then fails its stage."""
        changed = False
        for name in self.pipeline.order():
            kind = self.submission_due(name)
            if kind is None:
                continue
            try:
                self.submit(name, kind)
                self._submit_failures.pop(name, None)
                changed = True
            except SubmissionError as exc:
                self._fail(name, self.state.stages[name], f"cannot submit its {kind} job: {exc}")
                changed = True
            except (BackendCallError, OSError) as exc:  # retried after the poll back-off, which grows meanwhile
                count = self._submit_failures[name] = self._submit_failures.get(name, 0) + 1
                if count >= SUBMIT_ATTEMPTS:
                    self._fail(name, self.state.stages[name], f"submitting its {kind} job failed {count} times: {exc}")
                else:
                    self.reporter.event(f"{name}: submitting its {kind} job failed ({exc}); retrying")
        return changed

    def request(self, name: str, kind: str) -> JobRequest:
        stage = self.pipeline.stages[name]
        stage_state = self.state.stages[name]
        if kind == "verify":
            args = verification_args(self.pipeline, stage)
            return JobRequest(run_id=self.state.run_id, pipeline=self.pipeline, stage=stage, kind="verify",
                              program="verify.py", args=tuple(args), attempt=stage_state.attempts)
        return JobRequest(run_id=self.state.run_id, pipeline=self.pipeline, stage=stage, kind="stage",
                          program=stage.program, args=tuple(stage.args), attempt=stage_state.attempts + 1)

    def submit(self, name: str, kind: str) -> None:
        """Submit the stage's job (or its verification), never a second one while one is alive."""
        stage_state = self.state.stages[name]
        request = self.request(name, kind)
        submission = self.backend.render(request)  # before any state change: a render error submits nothing
        if kind == "stage":
            stage_state.status = StageStatus.SUBMITTING
            stage_state.error = None
            stage_state.started_at = stage_state.started_at or time.time()
            sharding = self.backend.sharding(request)
            if stage_state.sharding is None or self.pipeline.stages[name].reshardable:
                stage_state.sharding = sharding
        else:
            stage_state.status = StageStatus.VERIFYING
        self.store.save(self.state)
        existing = self.backend.find_active(self.state.run_id, name, kind)
        if existing:
            job_id = existing[0]
            self.reporter.event(f"{name}: re-attached to {kind} job {job_id} (still active)")
        else:
            job_id = self.backend.submit(submission)
            self.reporter.event(f"{name}: submitted {'verification ' if kind == 'verify' else ''}job {job_id}")
        if kind == "stage":
            stage_state.attempts += 1
        stage_state.jobs.append(JobRecord(job_id=job_id, kind=kind, attempt=request.attempt, submitted_at=time.time()))
        stage_state.status = StageStatus.RUNNING if kind == "stage" else StageStatus.VERIFYING
        self.store.save(self.state)

    # -- polling -------------------------------------------------------------------------------------------
    def active_jobs(self) -> dict[str, tuple[str, JobRecord]]:
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
            self._poll_failures += 1
            if self._poll_failures >= TRANSIENT_ERRORS_BEFORE_NOTICE:
                self.reporter.event(f"status query failed {self._poll_failures} times in a row, still retrying: {exc}")
            return False
        self._poll_failures = 0
        changed = False
        for job_id, (name, job) in waiting.items():
            status = statuses.get(job_id)
            if status is None:
                continue  # not listed this cycle: unknown is "not finished"
            changed |= self.handle(name, job, status)
        return changed

    def handle(self, name: str, job: JobRecord, status: JobStatus) -> bool:
        stage_state = self.state.stages[name]
        changed = (job.state, job.native) != (status.state.value, status.native)
        job.state, job.native, job.detail = status.state.value, status.native, status.detail
        if not status.state.finished:
            if job.kind == "stage":
                self.update_progress(name, job)
            if status.state is JobState.PREEMPTED and changed:
                self.on_preempted(name, job)
            if changed:
                self.store.save(self.state)
            return changed
        job.ended_at = time.time()
        if job.kind == "stage":
            self.finish_stage_job(name, stage_state, job, status)
        else:
            self.finish_verification(name, stage_state, job, status)
        self.store.save(self.state)
        return True

    def update_progress(self, name: str, job: JobRecord) -> None:
        progress = self.backend.progress(job.job_id)
        if progress is not None:
            self.state.stages[name].progress = {"done": progress.done, "total": progress.total, "unit": progress.unit}

    def on_preempted(self, name: str, job: JobRecord) -> None:
        policy = getattr(self.pipeline.stages[name].resources(self.backend.name), "on_preempted", "wait")
        if policy == "resume" and self.backend.resume(job.job_id):
            self.reporter.event(f"{name}: job {job.job_id} was preempted; resumed it")
        else:
            self.reporter.event(f"{name}: job {job.job_id} was preempted; waiting for it to be resumed")

    def finish_stage_job(self, name: str, stage_state: StageState, job: JobRecord, status: JobStatus) -> None:
        self.update_progress(name, job)
        if status.state is JobState.SUCCEEDED:
            self.record_summary(stage_state, job)
        continuation = self.pipeline.stages[name].continuation
        if continuation and status.state.value in continuation.resubmit_on:
            if status.state is not JobState.SUCCEEDED:
                self.reporter.event(f"{name}: job {job.job_id} ended {status.native or status.state.value}; "
                                    "checking how far it got")
            stage_state.status = StageStatus.VERIFYING  # submit_ready submits the verification job
            return
        if status.state is not JobState.SUCCEEDED:
            stage_state.status = StageStatus.CANCELLED if status.state is JobState.CANCELLED else StageStatus.FAILED
            detail = self.backend.failure_detail(job.job_id, status) or status.detail
            stage_state.error = f"job {job.job_id} ended {status.native or status.state.value}" + (
                f": {detail}" if detail else "")
            stage_state.finished_at = time.time()
            self.reporter.event(f"{name}: FAILED ({stage_state.error.splitlines()[0]})")
            return
        if self.pipeline.stages[name].verify or continuation:
            stage_state.status = StageStatus.VERIFYING  # submit_ready submits the verification job
        else:
            self.succeed(name, stage_state)

    def record_summary(self, stage_state: StageState, job: JobRecord) -> None:
        """Keep the `##bcp-pipeline summary` line a stage program printed (e.g. the loss of a training run)."""
        try:
            lines = parse_lines(self.backend.logs(job.job_id, rank=0, tail=50), "summary")
        except (PipelineError, OSError):
            return  # a summary is a nicety: never fail a stage over it
        if lines and isinstance(lines[-1].get("text"), str):
            stage_state.extra["summary"] = lines[-1]["text"]

    def finish_verification(self, name: str, stage_state: StageState, job: JobRecord, status: JobStatus) -> None:
        try:
            text = self.backend.logs(job.job_id, rank=0)
        except PipelineError as exc:
            text = ""
            self.reporter.event(f"{name}: could not read verification log: {exc}")
        results = parse_lines(text, "verify")
        if not results:
            stage_state.status = StageStatus.FAILED
            stage_state.error = (f"verification job {job.job_id} ended {status.native} without a result line; "
                                 f"log tail:\n{last_lines(text, 10) or '(empty)'}")
            stage_state.finished_at = time.time()
            self.reporter.event(f"{name}: verification FAILED (no result line)")
            return
        result = results[-1]
        stage_state.verification = result
        if "steps" in result and not result.get("ok") and self.continue_stage(name, stage_state, result):
            return
        if result.get("ok"):
            self.succeed(name, stage_state)
            return
        stage_state.status = StageStatus.FAILED
        stage_state.error = "verification failed: " + "; ".join(
            [f"{c['glob']}: expected {c['expected']}, found {c['found']}"
             for c in result.get("checks", []) if c.get("found") != c.get("expected")]
            + ([f"step {result['steps']} of {result['target']}"] if "steps" in result else []))
        stage_state.finished_at = time.time()
        self.reporter.event(f"{name}: {stage_state.error}")

    def continue_stage(self, name: str, stage_state: StageState, result: dict) -> bool:
        """Training ended short of its target: resubmit the same job, or fail if it is stuck or out of attempts.

        Always handles the result (returns True): the stage is resubmitted or failed with a clear message.
        """
        continuation = self.pipeline.stages[name].continuation
        assert continuation is not None
        history = stage_state.extra.setdefault("steps_after_attempt", [])
        history.append(int(result["steps"]))
        stage_state.extra.update(steps=int(result["steps"]), target_steps=int(result["target"]))
        stage_state.progress = {"done": int(result["steps"]), "total": int(result["target"]), "unit": "steps"}
        gains = [after - before for before, after in zip([0, *history], history)]
        if len(gains) >= 2 and gains[-1] <= 0 and gains[-2] <= 0:
            self._fail(name, stage_state, f"no progress in the last two attempts (still at step {history[-1]} of "
                                          f"{result['target']}): training is not advancing; read `bcp-pipeline logs "
                                          f"{self.state.run_id} {name}` before spending more GPU hours")
            return True
        if stage_state.attempts >= continuation.max_attempts:
            self._fail(name, stage_state, f"reached max_attempts ({continuation.max_attempts}) at step "
                                          f"{history[-1]} of {result['target']}; raise continuation.max_attempts "
                                          "and run again to continue")
            return True
        self.reporter.event(f"{name}: at step {history[-1]} of {result['target']} after attempt "
                            f"{stage_state.attempts}; resubmitting to continue from the last checkpoint")
        stage_state.status = StageStatus.SUBMITTING  # submit_ready submits the same job again
        return True

    def _fail(self, name: str, stage_state: StageState, message: str) -> None:
        stage_state.status = StageStatus.FAILED
        stage_state.error = message
        stage_state.finished_at = time.time()
        self.reporter.event(f"{name}: FAILED: {message}")

    def succeed(self, name: str, stage_state: StageState) -> None:
        stage_state.status = StageStatus.SUCCEEDED
        stage_state.finished_at = time.time()
        stage_state.error = None
        summary = stage_state.extra.get("summary")
        self.reporter.event(f"{name}: succeeded{_verification_text(stage_state)}" + (f"; {summary}" if summary else ""))


def verification_args(pipeline: PipelineConfig, stage: StageConfig) -> list[str]:
    """`--check GLOB=COUNT` for each check, with the count derived through expect_from (pure)."""
    args = []
    for check in stage.verify:
        args += ["--check", f"{check.glob}={expected_count(pipeline, stage.name, check)}"]
    if stage.continuation:
        target = resolve_int(str(stage.continuation.target_steps), pipeline.vars)
        args += ["--progress", f"{stage.continuation.checkpoints}={target}"]
    return args


def _sharding_text(sharding: dict[str, int]) -> str:
    return f"{sharding['replicas']} replica(s) x {sharding['processes']} process(es)"


def _verification_text(stage_state: StageState) -> str:
    result = stage_state.verification
    if not result:
        return ""
    return " (verified: " + ", ".join(f"{c['found']}/{c['expected']} {c['glob'].rsplit('/', 1)[-1]}"
                                      for c in result.get("checks", [])) + ")"
