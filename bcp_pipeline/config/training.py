"""A training stage as the estimates, the report and the live progress see it, whichever engine trains it (the NeMo
launcher, nemo.py; Megatron-Bridge, bridge.py): its model's shape, its sizes and steps, and where its settings are.
"""

from __future__ import annotations

from dataclasses import dataclass

from bcp_pipeline.config import bridge, nemo
from bcp_pipeline.config.model import StageConfig
from bcp_pipeline.config.nemo import ModelShape


@dataclass(frozen=True)
class TrainingPlan:
    """What a training stage trains, in engine-neutral terms."""

    engine: str  # the stage's section: nemo or megatron_bridge
    model: str  # the launcher config it is (or stands for)
    shape: ModelShape | None  # None: a model whose shape is not known (no FLOPs, no time estimate)
    tensor_parallel: int
    global_batch_size: int
    steps: int  # in all: the continuation's target
    gpus_per_node: int | None  # declared in the section; None: the instance's
    time_margin: str  # the runtime a job does not train
    max_attempts: int
    steps_key: str  # the `--set` key of `steps`, e.g. `nemo.max_steps`
    data_dir: str

    @property
    def tokens_per_step(self) -> int | None:
        return self.global_batch_size * self.shape.seq_length if self.shape else None


def training_plan(stage: StageConfig, backend: str | None = None) -> TrainingPlan | None:
    """The stage's training (None for a stage without an engine). ValueError where its sizes are not known."""
    if stage.nemo is not None:
        section, model = stage.nemo, nemo.model_config(stage, backend)
        return TrainingPlan(
            engine="nemo",
            model=section.model,
            shape=nemo.KNOWN_SHAPES.get(section.model),
            tensor_parallel=model.tensor_parallel,
            global_batch_size=model.global_batch_size,
            steps=model.max_steps,
            gpus_per_node=section.gpus_per_node,
            time_margin=section.time_margin,
            max_attempts=section.max_attempts,
            steps_key="nemo.max_steps",
            data_dir=section.data_dir,
        )
    if stage.megatron_bridge is not None:
        section, model = stage.megatron_bridge, bridge.bridge_model(stage)
        shape = ModelShape(
            num_layers=model.num_layers,
            hidden_size=model.hidden_size,
            ffn_hidden_size=model.ffn_hidden_size,
            seq_length=model.seq_length,
            gated_mlp=model.gated_mlp,
        )
        return TrainingPlan(
            engine="megatron_bridge",
            model=section.model,
            shape=shape,
            tensor_parallel=model.tensor_parallel,
            global_batch_size=model.global_batch_size,
            steps=model.train_iters,
            gpus_per_node=section.gpus_per_node,
            time_margin=section.time_margin,
            max_attempts=section.max_attempts,
            steps_key="megatron_bridge.train_iters",
            data_dir=section.data_dir,
        )
    return None
