"""Choosing what a `run` / `resume` invocation drives: a new run, or the continuation of the last one."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..config.pipelines import PipelineConfig
from ..config.dag import downstream_of
from ..errors import ConfigError, StateError
from .state import RunState, RunStore, StageState, StageStatus, new_run_id


@dataclass(kw_only=True)
class Selection:
    """`--from STAGE` and `--only STAGE`: which stages this invocation may submit."""

    from_stage: str | None = None
    only: list[str] | None = None

    def stages(self, pipeline: PipelineConfig) -> set[str]:
        for name in [self.from_stage, *(self.only or [])]:
            if name is not None and name not in pipeline.stages:
                raise ConfigError(f"no stage {name!r} in pipeline {pipeline.name}; stages: {', '.join(pipeline.stages)}")
        needs = {name: stage.needs for name, stage in pipeline.stages.items()}
        if self.only:
            return set(self.only)
        if self.from_stage:
            return downstream_of(needs, self.from_stage)
        return set(pipeline.stages)


def new_run(pipeline: PipelineConfig, backend: str, config_file: str, overrides: list[str],
            selection: Selection) -> RunState:
    """A fresh run; stages outside the selection are SKIPPED (the user says they are done)."""
    selected = selection.stages(pipeline)
    stages = {name: StageState(status=StageStatus.PENDING if name in selected else StageStatus.SKIPPED)
              for name in pipeline.order()}
    return RunState(run_id=new_run_id(pipeline.name), pipeline=pipeline.name, backend=backend,
                    config_file=config_file, created_at=time.time(), overrides=list(overrides), stages=stages)


def continue_run(state: RunState, pipeline: PipelineConfig, selection: Selection) -> set[str]:
    """Prepare `state` to be driven again; return the stages this invocation may submit.

    Failed and cancelled stages go back to PENDING (their attempts and job history stay); `--from` also resets
    the stages downstream of it; succeeded stages are not redone otherwise. Active stages are re-attached.
    Without `--from`/`--only` the run continues with the stages it was started with: a stage it skipped stays
    skipped (`resume` of a run started with `--only` must not start the stages the user left out).
    """
    missing = set(pipeline.stages) ^ set(state.stages)
    if missing:
        raise StateError(f"run {state.run_id} has stages {sorted(state.stages)} but pipeline {pipeline.name} now "
                         f"has {sorted(pipeline.stages)}; start a new run with --restart")
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
            stage.status = StageStatus.PENDING
            stage.error = None
            stage.finished_at = None
            stage.verification = None
    return selected


def pick_run(store: RunStore, pipeline: PipelineConfig, backend: str, *, restart: bool) -> RunState | None:
    """The run `run PIPELINE` continues: the latest one of this pipeline unless it succeeded (or --restart)."""
    latest = store.latest(pipeline.name)
    if restart or latest is None or latest.status == "succeeded":
        return None
    if latest.backend != backend:
        raise StateError(f"the last run of {pipeline.name} ({latest.run_id}) is unfinished on backend "
                         f"{latest.backend!r}; continue it with --backend {latest.backend}, or pass --restart "
                         f"to start a new run on {backend!r}")
    return latest
