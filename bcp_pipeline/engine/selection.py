"""Choosing what a `run` / `resume` invocation drives: a new run, or the continuation of the last one.

The one place that decides. `choose_run` and `choose_resume` take what the command line asked for and return a
`ChosenRun`: the run's state, the config it is driven with, and the stages this invocation may submit. Callers
drive it (engine/drive.py) and print; they change no state of their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bcp_pipeline.backends.registry import check_backend_limits, check_backend_ready, detachable_backends, make_backend
from bcp_pipeline.config.dag import downstream_of
from bcp_pipeline.config.model import Config, PipelineConfig
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.engine.state import (
    CANCELLED_WHILE,
    STALL_RESTARTS,
    RunState,
    RunStore,
    StageState,
    StageStatus,
    new_run_id,
)
from bcp_pipeline.engine.submitter import planned_requests
from bcp_pipeline.errors import ConfigError, StateError

PROFILE_RUN_ID = "PROFILE-CHECK"  # the run id jobs are rendered under to hold them against a check profile


@dataclass(kw_only=True)
class RunRequest:
    """What `run PIPELINE` asked for, as the command line parsed it."""

    pipeline: str
    config_file: Path
    backend: str | None = None  # None: the pipeline's own
    overrides: list[str] = field(default_factory=list)  # --set STAGE.KEY=VALUE
    from_stage: str | None = None
    only: list[str] | None = None
    restart: bool = False
    detach: bool = False  # the run goes to a BCP driver job, which chooses its own stages


@dataclass(kw_only=True)
class ChosenRun:
    """What one `run` or `resume` drives: a run, the config it is driven with, and the stages it may submit."""

    config: Config
    pipeline: PipelineConfig
    store: RunStore
    state: RunState
    selected: set[str]
    continued: bool = False  # an unfinished run is continued, rather than a new one started
    stopped_at: str = ""  # a continued run: where it stopped, before this invocation reset its stages ("concat failed")


def choose_run(request: RunRequest, store: RunStore) -> ChosenRun:
    """`run`: a new run, or the continuation of the pipeline's last unfinished one.

    Everything that can refuse the run is checked before a run is recorded, so a run that cannot start leaves
    nothing behind: the config, the backend's readiness (credentials, org, ACE) and limits (on BCP the ACE's,
    against every job the selected stages will submit), and --detach going to BCP.
    A continued run keeps its own --set overrides unless new ones are given, which replace them.
    """
    config = load_and_check(request.config_file, overrides=request.overrides, pipeline=request.pipeline)
    pipeline = config.pipeline(request.pipeline)
    backend = request.backend or pipeline.backend
    check_backend_ready(backend, config, pipeline)
    refuse_what_the_profile_rules_out(backend, config, pipeline, store, detach=request.detach)
    if request.detach and backend not in detachable_backends():
        raise ConfigError(
            f"--detach runs the orchestrator as a BCP job: it needs --backend "
            f"{' or '.join(detachable_backends())}, not {backend!r}"
        )
    selection = Selection(from_stage=request.from_stage, only=request.only)
    previous = pick_run(store, pipeline, backend, restart=request.restart)
    if previous is None:
        state = new_run(pipeline, backend, str(config.file.resolve()), request.overrides, selection)
        selected = selection.stages(pipeline)
        check_limits(backend, config, pipeline, state, selected, detach=request.detach)
        return ChosenRun(config=config, pipeline=pipeline, store=store, state=state, selected=selected)
    if previous.driver_owned:
        raise StateError(
            f"the last run of {pipeline.name} ({previous.run_id}) is detached: follow it with "
            f"`bcp-pipeline status {previous.run_id}`, continue it with `bcp-pipeline resume "
            f"{previous.run_id} --detach` (or without --detach, here), or pass --restart"
        )
    if request.overrides and request.overrides != previous.overrides:
        previous.overrides = request.overrides
    elif previous.overrides:
        config = load_and_check(request.config_file, overrides=previous.overrides, pipeline=request.pipeline)
        pipeline = config.pipeline(request.pipeline)
    stopped_at = where_it_stopped(previous)  # continue_run sets a failed stage pending again
    selected = continue_run(previous, pipeline, selection)
    check_limits(backend, config, pipeline, previous, selected, detach=request.detach)
    return ChosenRun(
        config=config,
        pipeline=pipeline,
        store=store,
        state=previous,
        selected=selected,
        continued=True,
        stopped_at=stopped_at,
    )


def where_it_stopped(state: RunState) -> str:
    """The stage a run stopped at, and how: the first failed or cancelled one, else the first active one, else the
    first pending one (`concat failed`)."""
    for wanted in (
        (StageStatus.FAILED, StageStatus.CANCELLED),
        tuple(status for status in StageStatus if status.active),
        (StageStatus.PENDING,),
    ):
        for name, stage in state.stages.items():
            if stage.status in wanted:
                return f"{name} {stage.status.value}"
    return "all stages done"


def refuse_what_the_profile_rules_out(
    backend: str, config: Config, pipeline: PipelineConfig, store: RunStore, *, detach: bool = False
) -> None:
    """Before a run is recorded: stages that the saved `check` profile of this service says cannot work."""
    probe = make_backend(backend, config, pipeline, store.run_dir(PROFILE_RUN_ID))
    if not probe.has_profile:
        return
    problems = probe.refusals([probe.render(r) for r in planned_requests(pipeline, PROFILE_RUN_ID)], detach=detach)
    if problems:
        raise ConfigError(
            "this service cannot run the pipeline as configured:\n  "
            + "\n  ".join(problems)
            + "\nChange those stages as each says, or run `bcp-pipeline check` again if the service "
            "changed. Nothing was submitted or recorded."
        )


def check_limits(
    backend: str, config: Config, pipeline: PipelineConfig, state: RunState, selected: set[str], *, detach: bool
) -> None:
    """The backend's service limits against every job the selected stages still submit (nothing is saved yet:
    a refused run leaves nothing behind)."""
    due = {name for name in selected if not state.stages[name].status.done}
    requests = [r for r in planned_requests(pipeline, state.run_id) if r.stage.name in due]
    check_backend_limits(backend, config, pipeline, requests, detach=detach)


def choose_resume(
    store: RunStore,
    run_id: str | None,
    *,
    config_file: Path | None,
    detach: bool,
    take_back: Callable[[ChosenRun], None],
) -> ChosenRun:
    """`resume [RUN] [--detach]`: the run (default: the latest) continued with the stages it was started with.

    With `detach` the run goes (back) to a driver job, which selects for itself. Without it, a run that a driver
    job owns is first taken back from it by `take_back` (detach/laptop.py; the engine knows no drivers), which
    refreshes the state to the driver's last one.
    """
    state = store.resolve(run_id)
    config, pipeline = run_config(state, config_file)
    check_backend_ready(state.backend, config, pipeline)
    chosen = ChosenRun(config=config, pipeline=pipeline, store=store, state=state, selected=set(), continued=True)
    if detach:
        if state.backend not in detachable_backends():
            raise ConfigError(
                f"--detach needs a run on the {' or '.join(detachable_backends())} backend; run "
                f"{state.run_id} is on {state.backend!r}"
            )
    check_limits(
        state.backend,
        config,
        pipeline,
        state,
        {name for name, stage in state.stages.items() if stage.status is not StageStatus.SKIPPED},
        detach=detach,
    )
    if detach:
        if not state.driver_owned:
            continue_run(state, pipeline, Selection())
        return chosen
    if state.driver_owned:
        take_back(chosen)
    chosen.selected = resume_selection(state, pipeline)
    return chosen


def open_run(store: RunStore, run_id: str | None, config_file: Path | None = None) -> ChosenRun:
    """A stored run (default: the latest) with its config, for `status`, `logs`, `report`, `cancel`, `verify`:
    nothing is selected and nothing is checked but the config."""
    state = store.resolve(run_id)
    config, pipeline = run_config(state, config_file)
    return ChosenRun(config=config, pipeline=pipeline, store=store, state=state, selected=set(), continued=True)


def run_config(state: RunState, config_file: Path | None = None) -> tuple[Config, PipelineConfig]:
    """The config a stored run is driven with: `config_file` (--config) if given, else the file it was started
    with; and the run's own --set overrides."""
    config = load_and_check(config_file or Path(state.config_file), overrides=state.overrides, pipeline=state.pipeline)
    return config, config.pipeline(state.pipeline)


def resume_selection(state: RunState, pipeline: PipelineConfig) -> set[str]:
    """Continue `state` with the stages it was started with (a resumed driver job does the same)."""
    return {
        name
        for name in continue_run(state, pipeline, Selection())
        if state.stages[name].status is not StageStatus.SKIPPED
    }


@dataclass(kw_only=True)
class Selection:
    """`--from STAGE` and `--only STAGE`: which stages this invocation may submit."""

    from_stage: str | None = None
    only: list[str] | None = None

    def stages(self, pipeline: PipelineConfig) -> set[str]:
        for name in [self.from_stage, *(self.only or [])]:
            if name is not None and name not in pipeline.stages:
                raise ConfigError(
                    f"no stage {name!r} in pipeline {pipeline.name}; stages: {', '.join(pipeline.stages)}"
                )
        needs = {name: stage.needs for name, stage in pipeline.stages.items()}
        if self.only:
            return set(self.only)
        if self.from_stage:
            return downstream_of(needs, self.from_stage)
        return set(pipeline.stages)


def new_run(
    pipeline: PipelineConfig, backend: str, config_file: str, overrides: list[str], selection: Selection
) -> RunState:
    """A fresh run; stages outside the selection are SKIPPED (the user says they are done)."""
    selected = selection.stages(pipeline)
    stages = {
        name: StageState(status=StageStatus.PENDING if name in selected else StageStatus.SKIPPED)
        for name in pipeline.order()
    }
    return RunState(
        run_id=new_run_id(pipeline.name),
        pipeline=pipeline.name,
        backend=backend,
        config_file=config_file,
        created_at=time.time(),
        overrides=list(overrides),
        stages=stages,
    )


def continue_run(state: RunState, pipeline: PipelineConfig, selection: Selection) -> set[str]:
    """Prepare `state` to be driven again; return the stages this invocation may submit.

    Failed and cancelled stages go back to PENDING (their attempts and job history stay); `--from` also resets
    the stages downstream of it; succeeded stages are not redone otherwise. Active stages are re-attached.
    Without `--from`/`--only` the run continues with the stages it was started with: a stage it skipped stays
    skipped (`resume` of a run started with `--only` must not start the stages the user left out).
    """
    missing = set(pipeline.stages) ^ set(state.stages)
    if missing:
        raise StateError(
            f"run {state.run_id} has stages {sorted(state.stages)} but pipeline {pipeline.name} now "
            f"has {sorted(pipeline.stages)}; start a new run with --restart"
        )
    if selection.from_stage or selection.only:
        selected = selection.stages(pipeline)
    else:
        selected = {name for name, stage in state.stages.items() if stage.status is not StageStatus.SKIPPED}
    for name in selected:
        stage = state.stages[name]
        reset = stage.status in (StageStatus.FAILED, StageStatus.CANCELLED, StageStatus.SKIPPED)
        if selection.from_stage or selection.only:
            reset = reset or stage.status is StageStatus.SUCCEEDED
        if reset:
            # A stage cancelled while its finished job was being verified resumes at its verification: submitting
            # its job again would redo finished work (a resumed run's TRIES 2 for a download that was done).
            verifying = stage.extra.pop(CANCELLED_WHILE, None) == StageStatus.VERIFYING.value
            again = verifying and stage.status is StageStatus.CANCELLED and not (selection.from_stage or selection.only)
            stage.status = StageStatus.VERIFYING if again else StageStatus.PENDING
            stage.extra.pop(STALL_RESTARTS, None)  # a stage run again gets the stall guard's restarts afresh
            stage.error = None
            stage.finished_at = None
            stage.verification = None
    return selected


def never_submitted(state: RunState) -> bool:
    """No stage of the run ever got to a submit call."""
    return all(
        not stage.jobs and stage.submit_call is None and stage.status is not StageStatus.SUBMITTING
        for stage in state.stages.values()
    )


def pick_run(store: RunStore, pipeline: PipelineConfig, backend: str, *, restart: bool) -> RunState | None:
    """The run `run PIPELINE` continues: the latest one of this pipeline unless it succeeded (or --restart)."""
    if restart:
        return None
    readable, corrupt = store.scan()
    runs = [state for state in readable if state.pipeline == pipeline.name]
    latest = runs[-1] if runs else None
    newer_corrupt = [c for c in corrupt if c.pipeline == pipeline.name and (latest is None or c.run_id > latest.run_id)]
    if newer_corrupt:  # continuing an older run instead would be a guess
        raise StateError(
            f"the last run of {pipeline.name} ({newer_corrupt[-1].run_id}) is corrupt, its state set "
            f"aside as {newer_corrupt[-1].path}: pass --restart to start a new run (or repair that "
            "file and rename it back to state.json to continue it)"
        )
    if latest is None or latest.status == "succeeded":
        return None
    if latest.backend != backend and never_submitted(latest):
        # Nothing of it runs anywhere: it blocks nothing (it stays listed, to be continued with its backend).
        return None
    if latest.backend != backend:
        raise StateError(
            f"the last run of {pipeline.name} ({latest.run_id}) is unfinished on backend "
            f"{latest.backend!r}; continue it with --backend {latest.backend}, or pass --restart "
            f"to start a new run on {backend!r}"
        )
    return latest
