"""Driving a chosen run under its lock: the whole selection (`run`, `resume`), one stage's verification again
(`verify`), or stopping it (`cancel`); and a run's live job states for `status` and `report`."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

from bcp_pipeline.backends.contract import Backend
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.model import PipelineConfig
from bcp_pipeline.engine.cancelling import (
    CancelOutcome,
    QuietProgress,
    clear_request,
    request_cancel,
    stop_jobs,
    wait_for_answer,
)
from bcp_pipeline.engine.context import RunContext
from bcp_pipeline.engine.orchestrator import Orchestrator
from bcp_pipeline.engine.poller import is_training, progress_record
from bcp_pipeline.engine.progress import Progress
from bcp_pipeline.engine.selection import ChosenRun
from bcp_pipeline.engine.state import RunLock, RunState, StageStatus
from bcp_pipeline.engine.workspace_lock import hold_workspace
from bcp_pipeline.errors import BackendCallError, StateError


def drive_run(chosen: ChosenRun, progress: Progress) -> bool:
    """Drive the chosen stages to the end: True when all of them succeeded."""
    store, state = chosen.store, chosen.state
    run_dir = store.run_dir(state.run_id)
    try:
        with RunLock(run_dir):
            clear_request(run_dir)
            backend = make_backend(state.backend, chosen.config, chosen.pipeline, run_dir)
            # Before the first save: a refused run leaves nothing.
            with hold_workspace(backend, chosen.pipeline.workspace.name, state, store):
                store.save(state)
                progress.started(state, store.state_path(state.run_id))
                return Orchestrator(
                    pipeline=chosen.pipeline,
                    backend=backend,
                    store=store,
                    state=state,
                    progress=progress,
                    selected=chosen.selected,
                ).drive()
    except StateError:
        _remove_if_unmade(run_dir)
        raise


def _remove_if_unmade(run_dir: Path) -> None:
    """A new run refused before its first save leaves no folder: only its run lock would be in it."""
    if run_dir.is_dir() and [p.name for p in run_dir.iterdir()] == ["orchestrator.lock"]:
        (run_dir / "orchestrator.lock").unlink()
        run_dir.rmdir()


def verify_stage(chosen: ChosenRun, stage: str, progress: Progress) -> bool:
    """Run `stage`'s verification again and record the result: True when it passed.

    A stage may consume its inputs (extract deletes each .zst once its .jsonl is complete): a finished stage none
    of whose outputs is left while a stage that needs it has succeeded is not failed for that. It stays as it was (a
    failed one would have `run` redo it: the whole download again, kept on disk beside what extract made), and
    the message names the stage that checks what was made of them.
    """
    pipeline, state = chosen.pipeline, chosen.state
    if stage not in pipeline.stages or not pipeline.stages[stage].verify:
        raise StateError(
            f"stage {stage!r} of {pipeline.name} has no verification; stages with one: "
            + ", ".join(n for n, s in pipeline.stages.items() if s.verify)
        )
    run_dir = chosen.store.run_dir(state.run_id)
    with RunLock(run_dir):
        clear_request(run_dir)
        backend = make_backend(state.backend, chosen.config, pipeline, run_dir)
        # Counting files another run is writing proves nothing.
        with hold_workspace(backend, pipeline.workspace.name, state, chosen.store):
            before = copy.deepcopy(state.stages[stage])
            # The stage keeps its finished_at: checking its outputs again does not change when its work ended.
            state.stages[stage].status = StageStatus.VERIFYING  # with no verification job yet: one is submitted
            deferred = FinalDeferred(progress)
            Orchestrator(
                pipeline=pipeline, backend=backend, store=chosen.store, state=state, progress=deferred, selected={stage}
            ).drive()
            after = state.stages[stage]
            consumers = [
                name
                for name, other in pipeline.stages.items()
                if stage in other.needs and state.stages[name].status is StageStatus.SUCCEEDED
            ]
            checks = (after.verification or {}).get("checks") or []
            # All gone, not some: a successor consumes a stage's outputs whole, and a partial loss is a real one.
            consumed = bool(checks) and all(check.get("found") == 0 for check in checks)
            if after.status is StageStatus.FAILED and before.status is StageStatus.SUCCEEDED and consumers and consumed:
                before.jobs = after.jobs  # the verification job ran: it stays on record
                state.stages[stage] = before
                chosen.store.save(state)
                progress.event(
                    f"{stage}: none of its outputs is left, but {', '.join(consumers)}, which "
                    f"take(s) them as input, succeeded and may have consumed them (extract deletes each "
                    f"source once its output is complete): {stage} stays succeeded and the run is "
                    f"unchanged; `bcp-pipeline verify {state.run_id} {consumers[0]}` checks what was "
                    "made of them"
                )
            progress.update(state, final=True)
    return after.status is StageStatus.SUCCEEDED  # a consumed stage's shortfall is no pass, though nothing failed


class FinalDeferred:
    """A Progress passing all on but the final update, which its caller gives once it has settled the result."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def started(self, state: RunState, state_file: Path) -> None:
        self.progress.started(state, state_file)

    def event(self, text: str) -> None:
        self.progress.event(text)

    def update(self, state: RunState, final: bool = False) -> None:
        if not final:
            self.progress.update(state)


CANCEL_ANSWER_SECONDS = 60.0  # how long `cancel` waits for the orchestrator driving the run to stop it


@dataclass(kw_only=True)
class Cancelled:
    """What `cancel` did to a run: `outcome` (its jobs), and who did it: here, or the orchestrator driving the run
    (`by_orchestrator`); `unanswered` when that orchestrator did not answer in time and the jobs were stopped
    from here (the request stays: it stops before its next submission)."""

    outcome: CancelOutcome
    by_orchestrator: bool = False
    unanswered: bool = False


def cancel_run(chosen: ChosenRun, answer_seconds: float = CANCEL_ANSWER_SECONDS) -> Cancelled:
    """Stop the run whatever instant the cancel lands in: its jobs that ended are recorded as they ended, the
    others cancelled, the run marked cancelled (engine/cancelling.py).

    Where another process drives the run (holds its lock), that orchestrator is asked to do it and this waits for
    its answer; one that does not answer in time has its jobs, as last saved, stopped from here.
    """
    store, state = chosen.store, chosen.state
    run_dir = store.run_dir(state.run_id)
    backend = make_backend(state.backend, chosen.config, chosen.pipeline, run_dir)
    lock = RunLock(run_dir)
    if not _acquired(lock):
        request_cancel(run_dir)
        deadline = time.monotonic() + answer_seconds
        while True:
            answer = wait_for_answer(run_dir, 0.5)
            if answer is not None:
                chosen.state = store.load(state.run_id)
                return Cancelled(outcome=answer, by_orchestrator=True)
            if _acquired(lock):  # it ended (or died) without seeing the request: this process does it
                break
            if time.monotonic() > deadline:
                return Cancelled(outcome=_stop_as_saved(backend, store.load(state.run_id)), unanswered=True)
    try:
        clear_request(run_dir)
        chosen.state = state = store.load(state.run_id)  # as the orchestrator that held the lock left it
        run = RunContext(pipeline=chosen.pipeline, backend=backend, store=store, state=state, progress=QuietProgress())
        return Cancelled(outcome=stop_jobs(run) if state.still_going() else CancelOutcome())
    finally:
        lock.release()


def _acquired(lock: RunLock) -> bool:
    try:
        lock.acquire()
    except StateError:
        return False
    return True


def _stop_as_saved(backend: Backend, state: RunState) -> CancelOutcome:
    """The jobs the saved state calls active, those still unfinished cancelled (nothing recorded: the state is the
    orchestrator's, which records the cancel when it next looks)."""
    active = [job.job_id for stage in state.stages.values() if (job := stage.active_job())]
    outcome = CancelOutcome()
    statuses = {}
    try:
        statuses = backend.poll(active) if active else {}
    except (BackendCallError, OSError) as exc:
        outcome.unasked = " ".join(str(exc).split())[:300]
    for job_id in active:
        status = statuses.get(job_id)
        if status is not None and status.state.finished:
            outcome.ended[job_id] = status.native or status.state.value
        else:
            outcome.stopped.append(job_id)
    if outcome.stopped:
        backend.cancel(outcome.stopped)
    return outcome


def refresh_jobs(backend: Backend, state: RunState, pipeline: PipelineConfig) -> None:
    """Live job states and progress into `state`, in memory only (`status`, `report`): the orchestrator driving
    the run owns its state file."""
    active = {job.job_id: (name, job) for name, s in state.stages.items() if (job := s.active_job())}
    if not active:
        return
    statuses = backend.poll(list(active))
    for job_id, (name, job) in active.items():
        status = statuses.get(job_id)
        if status is not None:
            job.state, job.native, job.detail = status.state.value, status.native, status.detail
        stage = pipeline.stages.get(name)
        progress = backend.progress(job_id, training=is_training(stage))
        if progress is not None:
            state.stages[name].progress = progress_record(stage, progress, pipeline.vars)
