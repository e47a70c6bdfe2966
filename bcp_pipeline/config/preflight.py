"""A config ready to run: pipelines.yaml loaded and validated (load.py), then the checks that need to know what a
stage runs (its training engine's: nemo.py for the NeMo launcher, bridge.py for Megatron-Bridge), with errors at the
same file:line:key as the loader's own.

Kept apart from the loader so that it knows nothing of the engines: they build on the typed config, and this module,
which imports both, is where they meet. Every command that runs or renders jobs loads through `load_and_check`.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from bcp_pipeline.config import bridge, bridge_index, evaluate, export, nemo
from bcp_pipeline.config.load import load_config
from bcp_pipeline.config.model import Config, PipelineConfig, StageConfig
from bcp_pipeline.config.validate import blamed, validate_continuation


def load_and_check(path: str | Path, overrides: list[str] | None = None, pipeline: str | None = None) -> Config:
    """`load_config` (same arguments), then `preflight`: the config `run`, `plan` and the other commands use."""
    config = load_config(path, overrides=overrides, pipeline=pipeline)
    preflight(config)
    return config


def preflight(config: Config) -> None:
    """Check every training stage of every pipeline and fill in its default continuation; ConfigError at
    file:line. What is worth saying but not refusing goes to `config.notices`."""
    taken_over: dict[tuple[str, str, str], str] = {}  # (workspace, results_dir, training) -> the pipeline taking it
    for pipeline in config.pipelines.values():
        for stage in pipeline.stages.values():
            if stage.nemo and stage.megatron_bridge:
                raise stage.where("megatron_bridge").error(
                    "a stage trains with one engine: give it nemo: (the NeMo launcher, images up to 24.12) or "
                    "megatron_bridge: (Megatron-Bridge, the NeMo images from 26.04 on), not both"
                )
            if stage.engine:
                config.notices += _check_training_stage(pipeline, stage)
                _check_one_trainer(pipeline, stage, taken_over)
        for stage in pipeline.stages.values():
            if stage.data_index_of is not None:
                _prepare_derived_stage(bridge_index, pipeline, stage)
            elif stage.megatron_bridge is not None:
                config.notices += filter(None, [bridge_index.unindexed_notice(pipeline, stage)])
            if stage.export_of is not None:
                _prepare_derived_stage(export, pipeline, stage)
            if stage.evaluate_of is not None:
                _prepare_derived_stage(evaluate, pipeline, stage)
                config.notices += filter(None, [evaluate.notice(pipeline, stage)])


def _prepare_derived_stage(kind: ModuleType, pipeline: PipelineConfig, stage: StageConfig) -> None:
    """A stage derived from its training (`data_index_of`: bridge_index, `export_of`: export, `evaluate_of`:
    evaluate): declared as it must be (the module's `problem`, at the key it names), then given its training's
    recipe, overrides, paths and images (the module's `prepare`)."""
    found = kind.problem(pipeline, stage)
    if found:
        key, why = found
        raise stage.where(key).error(why)
    kind.prepare(pipeline, stage)


def _check_one_trainer(
    pipeline: PipelineConfig, stage: StageConfig, taken_over: dict[tuple[str, str, str], str]
) -> None:
    """Two pipelines of one file never train one run: each run trains its own, so only `continue_run` can name the
    same one twice, and that would have two trainings continue each other."""
    section = getattr(stage, stage.engine)
    if not section.continue_run:
        return
    key = (pipeline.workspace.name, section.results_dir.rstrip("/"), section.continue_run)
    other = taken_over.setdefault(key, pipeline.name)
    if other != pipeline.name:
        raise stage.where(stage.engine).error(
            f"pipeline {pipeline.name} continues {'NeMo' if stage.engine == 'nemo' else 'Megatron-Bridge'} run "
            f"{section.continue_run!r} in {key[1]} of workspace "
            f"{key[0]}, and so does pipeline {other}: two trainings would continue each other's checkpoints; "
            "give one of them another continue_run, or none (each run then trains its own)"
        )


def _check_training_stage(pipeline: PipelineConfig, stage: StageConfig) -> list[str]:
    engine = nemo if stage.engine == "nemo" else bridge
    try:
        notices = engine.static_preflight(pipeline, stage) or []
    except ValueError as exc:
        # The engine checks values of many keys at once and names the one it refuses: the --set that gave it, if any
        raise blamed(stage.where(stage.engine), str(exc), pipeline, stage).error(str(exc)) from None
    if stage.continuation is None and getattr(stage, stage.engine).checkpoints:
        # Training continues by default: from the run's checkpoints up to its last step. A continuation the file
        # gives was validated by the loader; this one is new, so it is validated here.
        stage.continuation = engine.derived_continuation(stage)
        validate_continuation(pipeline, stage.continuation, stage.where("continuation"), stage)
    return notices
