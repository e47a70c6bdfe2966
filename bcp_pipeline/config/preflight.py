"""A config ready to run: pipelines.yaml loaded and validated (config.py), then the checks that need to know what
a stage runs (today NeMo pretraining's, nemo.py), with errors at the same file:line:key as the loader's own.

Kept apart from config.py so that the loader knows nothing of NeMo: nemo.py builds on the typed config, and this
module, which imports both, is where the two meet. Every command that runs or renders jobs loads through
`load_and_check`.
"""

from __future__ import annotations

from pathlib import Path

from bcp_pipeline.config.load import load_config
from bcp_pipeline.config.model import Config, PipelineConfig, StageConfig
from bcp_pipeline.config.nemo import derived_continuation, static_preflight
from bcp_pipeline.config.validate import validate_continuation


def load_and_check(path: str | Path, overrides: list[str] | None = None, pipeline: str | None = None) -> Config:
    """`load_config` (same arguments), then `preflight`: the config `run`, `plan` and the other commands use."""
    config = load_config(path, overrides=overrides, pipeline=pipeline)
    preflight(config)
    return config


def preflight(config: Config) -> None:
    """Check every NeMo stage of every pipeline and fill in its default continuation; ConfigError at file:line."""
    taken_over: dict[tuple[str, str, str], str] = {}  # (workspace, results_dir, NeMo run) -> the pipeline taking it
    for pipeline in config.pipelines.values():
        for stage in pipeline.stages.values():
            if stage.nemo:
                _check_nemo_stage(pipeline, stage)
                _check_one_trainer(pipeline, stage, taken_over)


def _check_one_trainer(pipeline: PipelineConfig, stage: StageConfig,
                       taken_over: dict[tuple[str, str, str], str]) -> None:
    """Two pipelines of one file never train one NeMo run: each run trains its own (nemo.nemo_run_name), so only
    `continue_run` can name the same one twice, and that would have two trainings continue each other."""
    if not stage.nemo.continue_run:
        return
    key = (pipeline.workspace.name, stage.nemo.results_dir.rstrip("/"), stage.nemo.continue_run)
    other = taken_over.setdefault(key, pipeline.name)
    if other != pipeline.name:
        raise stage.where("nemo").error(
            f"pipeline {pipeline.name} continues NeMo run {stage.nemo.continue_run!r} in {key[1]} of workspace "
            f"{key[0]}, and so does pipeline {other}: two trainings would continue each other's checkpoints; "
            "give one of them another continue_run, or none (each run then trains its own)")


def _check_nemo_stage(pipeline: PipelineConfig, stage: StageConfig) -> None:
    try:
        static_preflight(pipeline, stage)
    except ValueError as exc:
        raise stage.where("nemo").error(str(exc)) from None
    if stage.continuation is None and stage.nemo.checkpoints:
        # Training continues by default: from the run's checkpoints up to the model's max_steps. A continuation
        # the file gives was validated by the loader; this one is new, so it is validated here.
        stage.continuation = derived_continuation(stage)
        validate_continuation(pipeline, stage.continuation, stage.where("continuation"))
