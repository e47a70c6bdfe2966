"""What a finished job means for its stage: succeed, fail, verify next, or resubmit to continue training.

Outcomes only changes the in-memory run state and tells the progress; the caller (poller.py) saves the state file
once the whole transition is made.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bcp_pipeline.backends.contract import JobState, JobStatus
from bcp_pipeline.backends.shared.logs import last_lines, parse_lines
from bcp_pipeline.engine.context import RunContext
from bcp_pipeline.engine.state import STALL_RESTARTS, JobRecord, StageState, StageStatus
from bcp_pipeline.engine.streams import unverified_upstreams
from bcp_pipeline.errors import PipelineError


@dataclass
class Outcomes(RunContext):
    """Stage transitions decided from a finished stage job or verification job."""

    def finish_stage_job(self, name: str, stage_state: StageState, job: JobRecord, status: JobStatus) -> None:
        """A stage job ended: verify it next (always, for a continued stage), succeed, or fail."""
        if status.state is JobState.SUCCEEDED:
            self.record_summary(stage_state, job)
        continuation = self.pipeline.stages[name].continuation
        if continuation and status.state.value in continuation.resubmit_on:
            if status.state is not JobState.SUCCEEDED:
                self.progress.event(
                    f"{name}: job {job.job_id} ended {status.native or status.state.value}; checking how far it got"
                )
            stage_state.status = StageStatus.VERIFYING  # the submitter submits the verification job
            return
        if status.state is not JobState.SUCCEEDED:
            stage_state.status = StageStatus.CANCELLED if status.state is JobState.CANCELLED else StageStatus.FAILED
            detail = self.backend.failure_detail(job.job_id, status) or status.detail
            stage_state.error = f"job {job.job_id} ended {status.native or status.state.value}" + (
                f": {detail}" if detail else ""
            )
            stage_state.finished_at = time.time()
            self.progress.event(f"{name}: FAILED ({stage_state.error.splitlines()[0]})")
            return
        if self.pipeline.stages[name].verify or continuation:
            stage_state.status = StageStatus.VERIFYING  # the submitter submits the verification job
            if waiting := unverified_upstreams(self.pipeline, self.state, name):
                self.progress.event(
                    f"{name}: its job finished; its verification waits for {', '.join(waiting)}'s (a streamed edge)"
                )
        else:
            self.succeed(name, stage_state)

    def finish_stalled(self, name: str, stage_state: StageState, job: JobRecord) -> None:
        """A job the stall guard cancelled has ended: a continued stage is verified first (its training may have
        reached its target before it hung), then restarted by continue_stage; another is restarted now."""
        reason = (job.stall or {}).get("reason", "stalled")
        if self.pipeline.stages[name].continuation:
            self.progress.event(f"{name}: stalled job {job.job_id} ended; checking how far it got")
            stage_state.status = StageStatus.VERIFYING  # the submitter submits the verification job
            return
        self.restart_stalled(name, stage_state, job, reason)

    def restart_stalled(self, name: str, stage_state: StageState, job: JobRecord, reason: str) -> None:
        """Submit the stage's job again after a stall, up to `stall_guard.max_restarts` times; then fail with the
        stall's reason (its last lines are on the job, for `status`)."""
        limit = self.pipeline.stages[name].stall_guard.max_restarts
        restarts = int(stage_state.extra.get(STALL_RESTARTS, 0))
        if restarts >= limit:
            self.fail(
                name,
                stage_state,
                f"job {job.job_id} stalled: {reason}; cancelled, after {restarts} "
                f"restart(s) of stalled jobs (stall_guard.max_restarts: {limit}). Its last "
                f"lines are below; `bcp-pipeline logs {self.state.run_id} {name}` has the "
                "rest",
            )
            return
        stage_state.extra[STALL_RESTARTS] = restarts + 1
        self.progress.event(
            f"{name}: job {job.job_id} stalled ({reason}); submitting it again (stall restart "
            f"{restarts + 1} of {limit})"
        )
        stage_state.status = StageStatus.SUBMITTING  # the submitter submits the same job again

    def record_summary(self, stage_state: StageState, job: JobRecord) -> None:
        """Keep the `##bcp-pipeline summary` line a stage program printed (e.g. the loss of a training run), and
        its `outputs` line: what it did with outputs another config made (stages/_common.py claim_outputs; said
        again by its last lines)."""
        try:
            text = self.backend.logs(job.job_id, rank=0, tail=50)
        except (PipelineError, OSError):
            return  # a summary is a nicety: never fail a stage over it
        lines = parse_lines(text, "summary")
        if lines and isinstance(lines[-1].get("text"), str):
            stage_state.extra["summary"] = lines[-1]["text"]
        found = parse_lines(text, "outputs")
        if found:
            stage_state.extra["outputs"] = found[-1]

    def finish_verification(self, name: str, stage_state: StageState, job: JobRecord, status: JobStatus) -> None:
        """A verification job ended: its last `##bcp-pipeline verify` line decides the stage."""
        try:
            text = self.backend.logs(job.job_id, rank=0)
        except PipelineError as exc:
            text = ""
            self.progress.event(f"{name}: could not read verification log: {exc}")
        results = parse_lines(text, "verify")
        if not results:
            stage_state.status = StageStatus.FAILED
            stage_state.error = (
                f"verification job {job.job_id} ended {status.native} without a result line; "
                f"log tail:\n{last_lines(text, 10) or '(empty)'}"
            )
            mark_finished(stage_state)
            self.progress.event(f"{name}: verification FAILED (no result line)")
            return
        result = results[-1]
        stage_state.verification = result
        if "steps" in result and not result.get("ok") and self.continue_stage(name, stage_state, result):
            return
        if result.get("ok"):
            # A continued evaluation's progress is its verified step; a training's is its log's (loss, throughput).
            if "steps" in result and not self.pipeline.stages[name].trains:
                stage_state.progress = verified_steps(result)
            self.succeed(name, stage_state)
            return
        stage_state.status = StageStatus.FAILED
        stage_state.error = "verification failed: " + "; ".join(
            [
                f"{c['glob']}: expected {c['expected']}, found {c['found']}"
                for c in result.get("checks", [])
                if c.get("found") != c.get("expected")
            ]
            + ([f"step {result['steps']} of {result['target']}"] if "steps" in result else [])
        )
        mark_finished(stage_state)
        self.progress.event(f"{name}: {stage_state.error}")

    def continue_stage(self, name: str, stage_state: StageState, result: dict) -> bool:
        """Training ended short of its target: resubmit the same job, or fail if it is stuck or out of attempts.

        Always handles the result (returns True): the stage is resubmitted or failed with a clear message.
        """
        continuation = self.pipeline.stages[name].continuation
        assert continuation is not None
        history = stage_state.extra.setdefault("steps_after_attempt", [])
        history.append(int(result["steps"]))
        stage_state.extra.update(steps=int(result["steps"]), target_steps=int(result["target"]))
        stage_state.progress = verified_steps(result)
        last = next((job for job in reversed(stage_state.jobs) if job.kind == "stage"), None)
        if last is not None and last.stall is not None:  # cancelled by the stall guard: its own budget decides
            self.restart_stalled(name, stage_state, last, last.stall.get("reason", "stalled"))
            return True
        gains = [after - before for before, after in zip([0, *history], history)]
        evaluated = self.pipeline.stages[name].evaluate_of
        # An evaluation's job may end at its limit with nothing new to evaluate while its training runs or waits in
        # a queue: no progress is a fault only once the training has ended (its checkpoints are all there by then).
        waiting = evaluated is not None and self._still_training(evaluated)
        if len(gains) >= 2 and gains[-1] <= 0 and gains[-2] <= 0 and not waiting:
            what = (
                f"evaluated to step {history[-1]} of {result['target']}, and stage {evaluated} has ended): the "
                "evaluation is not advancing"
                if evaluated is not None
                else f"still at step {history[-1]} of {result['target']}): training is not advancing"
            )
            self.fail(
                name,
                stage_state,
                f"no progress in the last two attempts ({what}; read `bcp-pipeline logs "
                f"{self.state.run_id} {name}` before spending more GPU hours",
            )
            return True
        stalled = sum(1 for job in stage_state.jobs if job.kind == "stage" and job.stall is not None)
        if stage_state.attempts - stalled >= continuation.max_attempts:  # stalled attempts: stall_guard.max_restarts
            self.fail(
                name,
                stage_state,
                f"reached max_attempts ({continuation.max_attempts}) at step "
                f"{history[-1]} of {result['target']}; raise it and run again to continue (--set "
                f"{continuation.attempts_key or name + '.continuation.max_attempts'}="
                f"{2 * continuation.max_attempts})",
            )
            return True
        self.progress.event(
            f"{name}: at step {history[-1]} of {result['target']} after attempt "
            f"{stage_state.attempts}; resubmitting to continue from {self.pipeline.stages[name].resumes_from}"
        )
        stage_state.status = StageStatus.SUBMITTING  # the submitter submits the same job again
        return True

    def _still_training(self, training: str) -> bool:
        """Whether stage `training` of this run may still save checkpoints (it has not ended)."""
        training_state = self.state.stages.get(training)
        return training_state is not None and (
            training_state.status is StageStatus.PENDING or training_state.status.active
        )

    def fail(self, name: str, stage_state: StageState, message: str) -> None:
        stage_state.status = StageStatus.FAILED
        stage_state.error = message
        mark_finished(stage_state)
        self.progress.event(f"{name}: FAILED: {message}")

    def succeed(self, name: str, stage_state: StageState) -> None:
        stage_state.status = StageStatus.SUCCEEDED
        mark_finished(stage_state)
        stage_state.error = None
        summary = stage_state.extra.get("summary")
        self.progress.event(f"{name}: succeeded{_verification_text(stage_state)}" + (f"; {summary}" if summary else ""))


def verified_steps(result: dict) -> dict:
    """A verification's step count as the stage's progress record."""
    return {"done": int(result["steps"]), "total": int(result["target"]), "unit": "steps"}


def mark_finished(stage_state: StageState) -> None:
    """When the stage's work ended, unless that is known: `verify RUN STAGE` checking a finished stage again must
    not move it (its ELAPSED, the report and the estimates all read it). A stage that runs again had it cleared
    (selection.continue_run)."""
    if stage_state.finished_at is None:
        stage_state.finished_at = time.time()


def _verification_text(stage_state: StageState) -> str:
    result = stage_state.verification
    if not result:
        return ""
    parts = [f"{c['found']}/{c['expected']} {c['glob'].rsplit('/', 1)[-1]}" for c in result.get("checks", [])]
    if "steps" in result:
        parts.append(f"step {result['steps']} of {result['target']}")
    return " (verified: " + ", ".join(parts) + ")" if parts else ""
