"""A stage that evaluates a Megatron-Bridge training's checkpoints on its held-out split as they land
(`evaluate_of: STAGE`, on a streamed edge from that stage).

Its program is stages/evaluate.py with `--from bridge`: for each checkpoint of the schedule (every
`save_interval` steps, and the last) it runs the training's own entry program (stages/bridge_pretrain.py) under
torchrun with the training's recipe, data list and overrides, plus those that make it an evaluation
(EVALUATION_OVERRIDES: Bridge's `validation.skip_train`, the checkpoint's step, no optimizer or RNG state, nothing
saved), and reads the loss from Bridge's own `validation loss at iteration N` line. What it runs is derived here:

- one data-parallel rank (world = TP x PP x CP), as the data index stage resolves it (config/bridge_index.py): the
  model is laid out as the training's is, so the checkpoint loads without resharding, and megatron-core's index
  names are the training's (the sample counts do not depend on the world size), so it builds no index;
- the training's images on every backend, run straight, as the training's ranks are;
- its verification counts one result per checkpoint of the schedule;
- a job that its site's limit ends before the training's last step is submitted again and goes on from its last
  result (`derived_continuation`).

Bridge reads the validation set from sample 0 when it skips training (megatron/bridge/data/loaders.py): every
checkpoint is scored on the same `eval_iters` x global-batch samples, those of the training's first validation
line. Pure: preflight.py calls `problem` then `prepare`.
"""

from __future__ import annotations

from bcp_pipeline.config import bridge
from bcp_pipeline.config.bridge_index import PER_JOB_KEYS, run_in_training_image
from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.model import Check, Continuation, MegatronBridgeTraining, PipelineConfig, StageConfig

ENTRY_PROGRAM = "evaluate.py"  # in stages/
RESULTS = "evaluate"  # the results' folder in the training's run folder: step-<step:08d>.json
# What makes the training's command an evaluation of one checkpoint; evaluate.py adds checkpoint.load and
# checkpoint.ckpt_step for each. Keys of megatron-bridge 0.6's ConfigContainer (the tests resolve them in it).
EVALUATION_OVERRIDES = (
    "validation.skip_train=true",
    "checkpoint.save=null",
    "checkpoint.load_optim=false",
    "checkpoint.load_rng=false",
    "checkpoint.async_save=false",
    "logger.tensorboard_dir=null",
)
# Rendered for a training and meaningless for one evaluation: its time limit, where it saves and how often
DROPPED_KEYS = (
    *PER_JOB_KEYS,
    "checkpoint.save",
    "checkpoint.load",
    "checkpoint.save_interval",
    "checkpoint.most_recent_k",
    "logger.tensorboard_dir",
)


def _section(target: StageConfig) -> MegatronBridgeTraining:
    assert target.megatron_bridge is not None  # `problem` checked it is a Bridge training
    return target.megatron_bridge


def _target(pipeline: PipelineConfig, stage: StageConfig) -> StageConfig:
    assert stage.evaluate_of is not None  # called for an evaluate_of stage only
    return pipeline.stages[stage.evaluate_of]


def results_dir(target: StageConfig) -> str:
    return f"{bridge.run_dir(target)}/{RESULTS}"


def scheduled_steps(every: int, target: int) -> list[int]:
    """The steps evaluated: every `every` steps, and the last (stages/evaluate.py's schedule)."""
    return sorted({*range(every, target + 1, every), target})


def world_size(target: StageConfig) -> int:
    """One data-parallel rank of the training's layout."""
    model = bridge.bridge_model(target)
    return model.tensor_parallel * model.pipeline_parallel * model.context_parallel


def training_overrides(target: StageConfig) -> list[str]:
    """The training's overrides less those of one job's saving and time limit (placeholders kept)."""
    runtime = f"{parse_duration(_section(target).time_margin) + 3600}s"  # only to render: its key is dropped
    rendered = bridge.bridge_overrides(target, values={}, runtime=runtime, run_id=bridge.RUN_ID)
    return [o for o in rendered if o.split("=", 1)[0].lstrip("+~") not in DROPPED_KEYS]


def setting(overrides: list[str], key: str) -> str | None:
    """The last value `overrides` give `key` (as Bridge applies them: the last one wins)."""
    found = None
    for item in overrides:
        name, _, value = item.partition("=")
        if name.lstrip("+~") == key:
            found = value
    return found


def evaluated_tokens(target: StageConfig) -> int:
    """Tokens one evaluation reads: eval_iters global batches of seq_length tokens each."""
    overrides = training_overrides(target)
    model = bridge.bridge_model(target)
    iters = int(setting(overrides, "validation.eval_iters") or 0)
    batch = int(setting(overrides, "validation.eval_global_batch_size") or model.global_batch_size)
    return iters * batch * model.seq_length


def evaluate_args(target: StageConfig) -> list[str]:
    """stages/evaluate.py's arguments for the training `target`, placeholders kept for the backends."""
    section = _section(target)
    model = bridge.bridge_model(target)
    folder = bridge.run_dir(target)
    hub = ["--hf-home", section.hf_home] if section.hf_home else []
    return [
        "--from",
        "bridge",
        "--checkpoints",
        f"{folder}/checkpoints",
        "--valid-data-dir",
        section.valid_data_dir or "",
        "--out",
        results_dir(target),
        "--every",
        str(section.save_interval),
        "--target-step",
        str(model.train_iters),
        "--recipe",
        section.recipe,
        "--world-size",
        str(world_size(target)),
        "--data-list",
        f"{folder}/{bridge.DATA_LIST_FILE}",
        *hub,
        "--",
        *training_overrides(target),
        *EVALUATION_OVERRIDES,
    ]


def problem(pipeline: PipelineConfig, stage: StageConfig) -> tuple[str, str] | None:
    """(key, why) where `stage` cannot evaluate its training as declared; None where it can."""
    name = stage.evaluate_of or ""
    target = pipeline.stages.get(name)
    if target is None or target.megatron_bridge is None:
        bridge_stages = [n for n, s in pipeline.stages.items() if s.megatron_bridge is not None]
        return "evaluate_of", (
            f"{name!r} is no megatron_bridge: stage of this pipeline (those are: "
            f"{', '.join(bridge_stages) or 'none'}); the smoke pretrain's evaluate stage gives its args itself "
            "(the demo's)"
        )
    if stage.program != ENTRY_PROGRAM:
        return "program", f"a stage with evaluate_of runs {ENTRY_PROGRAM}, not {stage.program}"
    if stage.args:
        return "args", (
            f"the args of an evaluate_of stage are derived from stage {name}'s megatron_bridge: section (its "
            "recipe, data list and overrides); leave them out"
        )
    if name not in stage.streamed:
        return "needs", (
            f"an evaluation starts beside its training and takes each checkpoint as it lands: give "
            f"needs: [{{stage: {name}, stream: true}}]"
        )
    section = target.megatron_bridge
    if not section.valid_data_dir:
        return "evaluate_of", (
            f"stage {name} has no held-out split to evaluate on: give its megatron_bridge.valid_data_dir "
            "(a held-out split's preprocessed folder, as slimpajama-8b-bridge's tokenize-validation writes)"
        )
    return None


def prepare(pipeline: PipelineConfig, stage: StageConfig) -> None:
    """Derive what the stage runs from its training (call after `problem` found none)."""
    target = _target(pipeline, stage)
    stage.args = evaluate_args(target)
    run_in_training_image(stage, target, ENTRY_PROGRAM)  # its Bridge, megatron-core and torchrun evaluate
    if not stage.verify:
        section, model = _section(target), bridge.bridge_model(target)
        count = len(scheduled_steps(section.save_interval, model.train_iters))
        stage.verify = [Check(glob=f"{results_dir(target)}/step-*.json", expect=count)]
    if stage.continuation is None:
        stage.continuation = derived_continuation(target)


def derived_continuation(target: StageConfig) -> Continuation:
    """Continue an evaluation that its site's job limit ended (TSUBAME's 24 h against a 5-day training) from its
    last result (stages/verify.py reads the highest step-NNNNNNNN.json: the schedule is evaluated in step order)
    up to the training's last step, in as many jobs as the training may take: it runs beside the training, so its
    jobs end at the same limit about as often."""
    return Continuation(
        checkpoints=results_dir(target),
        target_steps=bridge.bridge_model(target).train_iters,
        max_attempts=_section(target).max_attempts,
        attempts_key=f"{target.name}.megatron_bridge.max_attempts",  # the training's, which its evaluation follows
    )


def notice(pipeline: PipelineConfig, stage: StageConfig) -> str | None:
    """What `plan` says of an evaluation that would wait for nothing (a training set to save no checkpoint, as
    `profile` sets it): said, not refused, since a run of the training alone (`--only`) never starts it."""
    target = _target(pipeline, stage)
    if _section(target).checkpoints:
        return None
    return (
        f"pipeline {pipeline.name}, stage {stage.name}: stage {stage.evaluate_of} saves no checkpoint "
        "(megatron_bridge.checkpoints: false), so this evaluation would wait for one until its stall limit: run "
        f"the training alone (--only {stage.evaluate_of})"
    )
