"""Submission: which jobs are due, and submitting them without ever running two jobs for one stage.

Crash safety rests on the order in `Submitter.submit`: the stage is marked SUBMITTING and the state saved BEFORE
the backend's submit call, so an orchestrator that dies in between finds the mark on resume and looks the job up
by its labels (`find_submitted`: live or ended, any job it has no record of) instead of submitting a second one.
A job created just before the crash may not be listed yet: such a stage is looked up again each cycle for the
backend's `lookup_grace_seconds` before it is submitted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.config.bridge_index import index_manifest
from bcp_pipeline.config.model import PipelineConfig, StageConfig, expected_count
from bcp_pipeline.config.placeholders import resolve_int
from bcp_pipeline.engine.context import RunContext
from bcp_pipeline.engine.outcomes import Outcomes
from bcp_pipeline.engine.output_digest import output_digest
from bcp_pipeline.engine.state import JobRecord, StageStatus
from bcp_pipeline.engine.streams import need_met, unverified_upstreams
from bcp_pipeline.errors import BackendCallError, SubmissionError
from bcp_pipeline.redact import redact, secret_values

SUBMIT_ATTEMPTS = 6  # consecutive failed submit calls before the stage fails (status calls retry forever)


@dataclass
class Submitter(RunContext):
    """Submits each stage's job and verification job when due; failed submit calls are retried a few times."""

    outcomes: Outcomes
    selected: set[str]  # stages this invocation may submit
    _failures: dict[str, int] = field(default_factory=dict)  # stage -> submit calls failed in a row
    stop_asked: Callable[[], bool] = lambda: False  # asked before every submission: a `cancel` from elsewhere
    # (stage, kind) found in flight when this orchestrator started -> when the look-up first came back empty
    _recovering: dict[tuple[str, str], float | None] = field(init=False)

    def __post_init__(self) -> None:
        self._recovering = {}
        for name, stage_state in self.state.stages.items():
            # A stage is SUBMITTING only from just before its submit call; a stage awaiting its verification job
            # is VERIFYING before any call too, so only the saved mark of a call says one may have been made (a
            # driver handing over between two cycles must not make its successor wait for a job never asked for).
            if stage_state.status is StageStatus.SUBMITTING:
                self._recovering[(name, "stage")] = None
            elif (
                stage_state.status is StageStatus.VERIFYING
                and stage_state.active_job() is None
                and stage_state.submit_call == "verify"
            ):
                self._recovering[(name, "verify")] = None

    def due(self, name: str) -> str | None:
        """The kind of job stage `name` needs submitted now ("stage" / "verify"), or None.

        In-flight work (a stage marked SUBMITTING, a finished stage awaiting its verification job) is always
        completed; new stages start only while no stage has failed, so a failure stops the DAG. A streamed need
        is met once its job is submitted; the verification then waits for the upstream's (streams.py).
        """
        if name not in self.selected:
            return None
        stage_state = self.state.stages[name]
        if stage_state.status is StageStatus.SUBMITTING:
            return "stage"  # also after a crash between marking and recording: submit() looks for the job first
        if stage_state.status is StageStatus.VERIFYING and stage_state.active_job() is None:
            # A streamed edge: the upstream's outputs are counted complete before this stage's are (streams.py).
            return None if unverified_upstreams(self.pipeline, self.state, name) else "verify"
        # A stage of this invocation that failed stops the rest; one it does not run (--only, --from, left failed
        # or cancelled before) stops nothing by itself: where it is needed, the need below is unmet.
        stopped = any(
            s.status in (StageStatus.FAILED, StageStatus.CANCELLED)
            for other, s in self.state.stages.items()
            if other in self.selected
        )
        if (
            not stopped
            and stage_state.status is StageStatus.PENDING
            and all(need_met(self.pipeline, self.state, name, need) for need in self.pipeline.stages[name].needs)
        ):
            return "stage"
        return None

    def blocked(self) -> list[str]:
        """Why each selected stage still pending cannot start: a need this invocation does not run, not done."""
        reasons = []
        for name in self.pipeline.order():
            if name not in self.selected or self.state.stages[name].status is not StageStatus.PENDING:
                continue
            unmet = [
                need
                for need in self.pipeline.stages[name].needs
                if need not in self.selected and not need_met(self.pipeline, self.state, name, need)
            ]
            if unmet:
                states = ", ".join(f"{need} ({self.state.stages[need].status.value})" for need in unmet)
                reasons.append(
                    f"{name}: not started: it needs {states}, which this invocation does not run; add "
                    f"--only {' --only '.join(unmet)}, or `bcp-pipeline resume {self.state.run_id}` "
                    "runs the stages the run was started with"
                )
        return reasons

    def anything_due(self) -> bool:
        return any(self.due(name) for name in self.pipeline.stages)

    def submit_ready(self) -> bool:
        """Submit every job that is due; a failing submit is retried next cycle, then fails its stage."""
        changed = False
        for name in self.pipeline.order():
            kind = self.due(name)  # asked per stage: a failure just above stops the stages after it
            if kind is None:
                continue
            if self.stop_asked():  # no job is submitted after a cancel: the orchestrator stops the run
                return changed
            try:
                changed |= self.submit(name, kind)
                self._failures.pop(name, None)
            except SubmissionError as exc:
                self.outcomes.fail(name, self.state.stages[name], f"cannot submit its {kind} job: {exc}")
                self.store.save(self.state)  # on disk: the loop may end now, and `status` must not say "submitting"
                changed = True
            except (BackendCallError, OSError) as exc:  # retried after the poll back-off, which grows meanwhile
                count = self._failures[name] = self._failures.get(name, 0) + 1
                if count >= SUBMIT_ATTEMPTS:
                    self.outcomes.fail(
                        name, self.state.stages[name], f"submitting its {kind} job failed {count} times: {exc}"
                    )
                else:
                    self.progress.event(f"{name}: submitting its {kind} job failed ({exc}); retrying")
        return changed

    def request(self, name: str, kind: str) -> JobRequest:
        """The backend-neutral request for stage `name`'s next job of `kind` (pure)."""
        attempts = self.state.stages[name].attempts
        return job_request(
            self.pipeline,
            self.pipeline.stages[name],
            kind,
            self.state.run_id,
            attempt=attempts if kind == "verify" else attempts + 1,
        )

    def submit(self, name: str, kind: str) -> bool:
        """Submit the stage's job (or its verification), never a second one while one is alive: False while a job
        an earlier orchestrator may have created is still being looked for."""
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
        stage_state.submit_call = kind
        self.store.save(self.state)  # the mark is on disk before the job can exist: see the module docstring
        known = {job.job_id for job in stage_state.jobs}
        unrecorded = [j for j in self.backend.find_submitted(self.state.run_id, name, kind) if j not in known]
        if unrecorded:  # submitted by an orchestrator that died before it saved the id: adopt it, live or ended
            job_id = unrecorded[-1]
            self.progress.event(f"{name}: re-attached to {kind} job {job_id} (submitted before a restart)")
        elif self._still_looking(name, kind):
            return False
        else:
            job_id = self.backend.submit(submission)
            self.progress.event(f"{name}: submitted {'verification ' if kind == 'verify' else ''}job {job_id}")
        if kind == "stage":
            stage_state.attempts += 1
        stage_state.jobs.append(JobRecord(job_id=job_id, kind=kind, attempt=request.attempt, submitted_at=time.time()))
        stage_state.status = StageStatus.RUNNING if kind == "stage" else StageStatus.VERIFYING
        stage_state.submit_call = None
        self.store.save(self.state)
        self._recovering.pop((name, kind), None)
        if not unrecorded:
            self.record_submission(job_id, submission.printable)
        return True

    def _still_looking(self, name: str, kind: str) -> bool:
        """True while a stage found in flight at start has had no job listed for less than the lookup grace."""
        if (name, kind) not in self._recovering:
            return False  # marked by this orchestrator: it knows it has not submitted yet
        grace = self.backend.lookup_grace_seconds
        first_miss = self._recovering[(name, kind)]
        if first_miss is None:
            first_miss = self._recovering[(name, kind)] = time.monotonic()
            if grace > 0:
                self.progress.event(
                    f"{name}: no {kind} job listed for it yet; looking again for up to {grace:.0f} s "
                    "before submitting one (a job created just before a restart may be listed late)"
                )
        return time.monotonic() - first_miss < grace

    def record_submission(self, job_id: str, printable: str) -> None:
        """Keep what was submitted for `report` (`<run>/submitted/<job id>.txt`), secret values redacted.

        After the state is saved: the job exists either way, and losing this copy only makes `report` re-render it.
        """
        try:
            self.store.keep_submission(self.state.run_id, job_id, redact(printable, secret_values()))
        except OSError as exc:
            self.progress.event(f"could not keep the submitted command of job {job_id} ({exc}); report re-renders it")


def job_request(pipeline: PipelineConfig, stage: StageConfig, kind: str, run_id: str, attempt: int = 1) -> JobRequest:
    """Stage `stage`'s job of `kind`: its program, or verify.py with the stage's checks (pure)."""
    if kind == "verify":
        return JobRequest(
            run_id=run_id,
            pipeline=pipeline,
            stage=stage,
            kind="verify",
            program="verify.py",
            args=tuple(verification_args(pipeline, stage)),
            attempt=attempt,
        )
    # Training (an engine's, or continued from checkpoints) follows its own rules for what it finds.
    data_stage = not stage.trains
    return JobRequest(
        run_id=run_id,
        pipeline=pipeline,
        stage=stage,
        kind="stage",
        program=stage.program,
        args=tuple(stage.args),
        attempt=attempt,
        output_digest=output_digest(pipeline, stage.name) if data_stage else None,
        other_outputs=stage.other_outputs,
        stream_digests=tuple(output_digest(pipeline, need) for need in stage.streamed),
    )


def planned_requests(pipeline: PipelineConfig, run_id: str) -> list[JobRequest]:
    """Every job a run of `pipeline` submits once, in DAG order: each stage, then its verification (pure)."""
    requests = []
    for name in pipeline.order():
        stage = pipeline.stages[name]
        requests.append(job_request(pipeline, stage, "stage", run_id))
        if stage.verify:
            requests.append(job_request(pipeline, stage, "verify", run_id))
    return requests


def verification_args(pipeline: PipelineConfig, stage: StageConfig) -> list[str]:
    """`--check GLOB=COUNT` for each check, with the count derived through expect_from (pure)."""
    args = []
    for check in stage.verify:
        args += ["--check", f"{check.glob}={expected_count(pipeline, stage.name, check)}"]
    if stage.data_index_of:  # its manifest: every file it lists there at its size, and no other
        args += ["--listed", index_manifest(pipeline.stages[stage.data_index_of])]
    if stage.continuation:
        target = resolve_int(str(stage.continuation.target_steps), pipeline.vars)
        args += ["--progress", f"{stage.continuation.checkpoints}={target}"]
    return args
