"""Driving a chosen run under its lock: the whole selection (`run`, `resume`), one stage's verification again
(`verify`), or stopping it (`cancel`); and a run's live job states for `status` and `report`."""

from __future__ import annotations

from bcp_pipeline.backends.contract import Backend
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.model import PipelineConfig
from bcp_pipeline.engine.orchestrator import Orchestrator
from bcp_pipeline.engine.poller import is_training, progress_record
from bcp_pipeline.engine.progress import Progress
from bcp_pipeline.engine.selection import ChosenRun
from bcp_pipeline.engine.state import RunLock, RunState, StageStatus
from bcp_pipeline.engine.workspace_lock import hold_workspace
from bcp_pipeline.errors import StateError


def drive_run(chosen: ChosenRun, progress: Progress) -> bool:
    """Drive the chosen stages to the end: True when all of them succeeded."""
    store, state = chosen.store, chosen.state
    run_dir = store.run_dir(state.run_id)
    with RunLock(run_dir):
        backend = make_backend(state.backend, chosen.config, chosen.pipeline, run_dir)
        # Before the first save: a refused run leaves nothing.
        with hold_workspace(backend, chosen.pipeline.workspace.name, state, store):
            store.save(state)
            progress.started(state, store.state_path(state.run_id))
            return Orchestrator(pipeline=chosen.pipeline, backend=backend, store=store, state=state,
                                progress=progress, selected=chosen.selected).drive()


def verify_stage(chosen: ChosenRun, stage: str, progress: Progress) -> bool:
    """Run `stage`'s verification again and record the result: True when it passed."""
    pipeline, state = chosen.pipeline, chosen.state
    if stage not in pipeline.stages or not pipeline.stages[stage].verify:
        raise StateError(f"stage {stage!r} of {pipeline.name} has no verification; stages with one: "
                         + ", ".join(n for n, s in pipeline.stages.items() if s.verify))
    run_dir = chosen.store.run_dir(state.run_id)
    with RunLock(run_dir):
        backend = make_backend(state.backend, chosen.config, pipeline, run_dir)
        # Counting files another run is writing proves nothing.
        with hold_workspace(backend, pipeline.workspace.name, state, chosen.store):
            # The stage keeps its finished_at: checking its outputs again does not change when its work ended.
            state.stages[stage].status = StageStatus.VERIFYING  # with no verification job yet: one is submitted
            Orchestrator(pipeline=pipeline, backend=backend, store=chosen.store, state=state, progress=progress,
                         selected={stage}).drive()
    return state.stages[stage].status is StageStatus.SUCCEEDED


def cancel_run(chosen: ChosenRun) -> tuple[list[str], bool]:
    """Cancel the run's active jobs: (their ids, whether the run was marked cancelled here).

    Where another process drives the run (its lock is held), that orchestrator sees its jobs end and records it.
    """
    store, state = chosen.store, chosen.state
    backend = make_backend(state.backend, chosen.config, chosen.pipeline, store.run_dir(state.run_id))
    active = [job.job_id for stage in state.stages.values() if (job := stage.active_job())]
    if active:
        backend.cancel(active)
    lock = RunLock(store.run_dir(state.run_id))
    try:
        lock.acquire()
    except StateError:
        return active, False
    try:
        state.mark_cancelled()
        store.save(state)
    finally:
        lock.release()
    return active, True


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
