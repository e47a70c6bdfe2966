"""A config ready to run: pipelines.yaml loaded and validated (config.py), then the checks that need to know what
a stage runs (today NeMo pretraining's, nemo.py), with errors at the same file:line:key as the loader's own.

Kept apart from config.py so that the loader knows nothing of NeMo: nemo.py builds on the typed config, and this
module, which imports both, is where the two meet. Every command that runs or renders jobs loads through
`load_and_check`.
"""

from __future__ import annotations

from pathlib import Path

from .pipelines import Config, PipelineConfig, StageConfig, load_config, validate_continuation
from .nemo import derived_continuation, static_preflight


def load_and_check(path: str | Path, overrides: list[str] | None = None, pipeline: str | None = None) -> Config:
    """`load_config` (same arguments), then `preflight`: the config `run`, `plan` and the other commands use."""
    config = load_config(path, overrides=overrides, pipeline=pipeline)
    preflight(config)
    return config


def preflight(config: Config) -> None:
    """Check every NeMo stage of every pipeline and fill in its default continuation; ConfigError at file:line."""
    for pipeline in config.pipelines.values():
        for stage in pipeline.stages.values():
            if stage.nemo:
                _check_nemo_stage(pipeline, stage)


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
