"""The typed knobs of a Megatron-Bridge training (`precision`, `async_save`, `fsdp`, `activation_offload` in the
megatron_bridge: section): the overrides each one renders, and the checks that refuse what Bridge, megatron-core
or the GPU would refuse only once the job runs. Facts from megatron-bridge 0.6.2 / megatron-core 0.19.2
(docs/pretraining.md, "Settings and why", has the files and lines):

- FP8 is Transformer Engine's, on Hopper (sm_90) and newer: an A100 (sm_80) has no FP8 tensor cores, and TE
  refuses FP8 there when the model is built. The recipes are Bridge's `bf16_with_fp8_delayed_scaling_mixed` and
  `bf16_with_fp8_current_scaling_mixed` (training/mixed_precision.py).
- `checkpoint.async_save` needs `checkpoint.save` (so it is rendered only with checkpoints on) and the torch_dist
  or fsdp_dtensor format (CheckpointConfig.finalize; ConfigContainer.validate); Bridge waits for the last
  background save before exiting.
- Megatron-FSDP (`ddp.use_megatron_fsdp`) needs `checkpoint.ckpt_format=fsdp_dtensor` whenever it saves or loads,
  and CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (ConfigContainer._validate_and_apply_megatron_fsdp_configs); it
  turns `ddp.average_in_collective` off itself, so that is not rendered with it.
- megatron-core's layer-level CPU offloading (`model.cpu_offloading`, `cpu_offloading_num_layers`) offloads fewer
  layers than the model has, and works with neither pipeline parallelism nor activation recomputation
  (TransformerConfig.__post_init__).
"""

from __future__ import annotations

import re

from bcp_pipeline.config.model import MegatronBridgeTraining, StageConfig
from bcp_pipeline.config.resources import RESOURCE_TYPES

# precision -> Bridge's mixed-precision recipe (its name, as `mixed_precision=NAME` takes it)
MIXED_PRECISION = {
    "bf16": "bf16_mixed",
    "fp8-delayed": "bf16_with_fp8_delayed_scaling_mixed",
    "fp8-current": "bf16_with_fp8_current_scaling_mixed",
    "fp8": "bf16_with_fp8_current_scaling_mixed",  # the scaling of Bridge's own FP8 Llama3-8B recipe
}
# An A100 named in a backend section: BCP's dgxa100 instances, a Slurm --gres=gpu:a100:8 or --constraint=a100, a
# Kubernetes node selector NVIDIA-A100-SXM4-80GB (the GPU feature discovery label), a Grid Engine -l gpu_type=a100
A100 = re.compile(r"a100(?!\d)", re.IGNORECASE)
A100_INSTANCE_TYPES = re.compile(r"^p4de?\.", re.IGNORECASE)  # EC2 p4d/p4de: 8 x A100 (a node selector's value)
FSDP_SHARDING = "optim_grads_params"  # what Bridge's own FSDP recipes shard (recipes/common.py)


def knob_overrides(section: MegatronBridgeTraining) -> list[str]:
    """The knobs' overrides, in addition to the section's checkpoint and DDP ones."""
    rendered = [f"mixed_precision={MIXED_PRECISION[section.precision]}"]
    if section.fsdp:
        rendered += ["ddp.use_megatron_fsdp=true", f"ddp.data_parallel_sharding_strategy={FSDP_SHARDING}"]
    if section.checkpoints and (section.fsdp or section.async_save):
        rendered.append(f"checkpoint.ckpt_format={'fsdp_dtensor' if section.fsdp else 'torch_dist'}")
    if section.async_save and section.checkpoints:  # no checkpoints (a `profile` job): nothing to save, in any way
        rendered.append("checkpoint.async_save=true")
    if section.activation_offload:
        rendered += [
            "model.cpu_offloading=true",
            f"model.cpu_offloading_num_layers={section.activation_offload}",
            "model.cpu_offloading_activations=true",
            "model.cpu_offloading_weights=false",
        ]
    return rendered


def without_fsdp_conflicts(section: MegatronBridgeTraining, overrides: list[str]) -> list[str]:
    """Megatron-FSDP turns average_in_collective off itself: not rendered on, so what `plan` shows is what runs."""
    if not section.fsdp:
        return overrides
    return [o for o in overrides if o != "ddp.average_in_collective=true"]


def declared_a100(stage: StageConfig) -> list[str]:
    """Where the stage's backend sections name an A100 ("bcp.instance dgxa100.80g.8.norm", ...). The BCP instance
    counts for every backend, as it does for the GPUs a node where another section gives none (bridge.py)."""
    found = []
    if stage.bcp.instance and A100.search(stage.bcp.instance):
        found.append(f"bcp.instance {stage.bcp.instance}")
    for key in ("extra_args", "srun_args", "partition"):
        found += [f"slurm.{key} {v}" for v in _texts(getattr(stage.slurm, key)) if A100.search(v)]
    for key in ("resources", "extra_args", "queue"):
        found += [f"gridengine.{key} {v}" for v in _texts(getattr(stage.gridengine, key)) if A100.search(v)]
    found += [
        f"kubernetes.node_selector {k}={v}"
        for k, v in stage.kubernetes.node_selector.items()
        if A100.search(v) or A100_INSTANCE_TYPES.match(v)
    ]
    return found


def _texts(value) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def knobs_error(stage: StageConfig) -> str | None:
    """Why the knobs cannot train on what the stage declares (None: they can)."""
    section = stage.megatron_bridge
    verbatim = [o for o in section.overrides if o.lstrip("+~").startswith("mixed_precision=") and "fp8" in o]
    if section.precision != "bf16" or verbatim:
        a100 = declared_a100(stage)
        asked = (
            f"megatron_bridge.overrides {verbatim[-1]}"
            if verbatim
            else f"megatron_bridge.precision {section.precision}"
        )
        if a100:
            return (
                f"{asked} trains in FP8, which needs Hopper (H100/H200) or newer GPUs, but {a100[0]} is an "
                "A100, where Transformer Engine has no FP8: use precision bf16 (the default) there, or an H100 "
                "or newer (on BCP a dgxh100 instance)"
            )
    if section.fsdp:
        for backend in RESOURCE_TYPES:
            if str(stage.resources(backend).env.get("CUDA_DEVICE_MAX_CONNECTIONS", "")).strip() == "1":
                return (
                    f"megatron_bridge.fsdp (Megatron-FSDP) needs CUDA_DEVICE_MAX_CONNECTIONS unset or above 1, "
                    f"but {backend}.env sets it to 1 (Bridge refuses that at start): drop it, or set it to 32 "
                    "as Bridge's own FSDP recipes do"
                )
    return None


def offload_error(section: MegatronBridgeTraining, num_layers: int, pipeline_parallel: int) -> str | None:
    """megatron-core's checks on layer-level CPU offloading, against the model the stage trains."""
    layers = section.activation_offload
    if not layers:
        return None
    if layers < 0 or layers >= num_layers:
        return (
            f"megatron_bridge.activation_offload {layers}: the layers whose activations go to CPU memory "
            f"must be from 1 to {num_layers - 1} (fewer than the model's {num_layers} layers; 0: none)"
        )
    if pipeline_parallel > 1:
        return (
            f"megatron_bridge.activation_offload {layers} with pipeline_parallel {pipeline_parallel}: "
            "megatron-core offloads activations only without pipeline parallelism; drop one of them"
        )
    return None
