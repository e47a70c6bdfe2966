"""Model FLOPs utilisation (MFU): the FLOPs a training step needs, over the step's time, over the devices' peak.

Pure arithmetic (no I/O). MFU = tokens/s x model FLOPs per token / (devices x peak FLOP/s of one device), the
definition of the PaLM paper (Chowdhery et al. 2022, appendix B): the FLOPs the model needs, not those the
hardware runs, so activation recomputation does not raise it. FLOPs per token are 6N + 12 L s h (Narayanan et al.
2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", eq. 3 without its
recomputation term; the same as PaLM's 6N + 6 L H Q T with H Q = h and T = s, counted for the causal mask's full
square as both count it).

Peaks are of one GPU's dense BF16 tensor cores, by the GPU an instance carries (the instance name says which);
an instance this module does not know is declared under `backends.bcp.instances` with its `gpu_peak_tflops`. A
CPU has no peak here: MFU on CPU is shown only against a peak the pipeline declares (`estimates.cpu_peak_tflops`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bcp_pipeline.config.instances import A100_BF16_TFLOPS, H100_SXM_BF16_TFLOPS
from bcp_pipeline.config.nemo import ModelShape

# The GPU of an instance, by the family its name starts with (dgxa100.80g.8.norm -> A100).
GPU_PEAKS_BY_FAMILY = {"dgxa100": ("A100", A100_BF16_TFLOPS), "dgxh100": ("H100 SXM", H100_SXM_BF16_TFLOPS)}


def params_for_flops(shape: ModelShape, tensor_parallel: int) -> int:
    """N: the weights of every matrix multiply a token goes through (layers and the output layer).

    Per layer: QKV and projection 4 h^2, FFN 2 or 3 (gated) x h x ffn; the output layer V x h with V padded as
    Megatron pads it. The input embedding is a lookup and position embeddings add no multiply; biases and norms
    are left out (well under 1 %).
    """
    h = shape.hidden_size
    per_layer = 4 * h * h + (3 if shape.gated_mlp else 2) * h * shape.ffn_hidden_size
    multiple = shape.make_vocab_size_divisible_by * tensor_parallel
    vocab = math.ceil(shape.vocab_size / multiple) * multiple
    return shape.num_layers * per_layer + vocab * h


def flops_per_token(shape: ModelShape, tensor_parallel: int) -> int:
    """Training FLOPs per token, 6N + 12 L s h (Narayanan et al. 2021, eq. 3 without recomputation; PaLM, app. B).

    6N: forward (2N) and backward (4N) through the weights; 12 L s h: the attention scores and their use
    (QK^T and AV, 2 s h each per layer forward, x3 for training). Recomputed activations are not counted, as MFU
    does not count them.
    """
    return 6 * params_for_flops(shape, tensor_parallel) + 12 * shape.num_layers * shape.seq_length * shape.hidden_size


@dataclass(frozen=True)
class Peak:
    """The peak a measured rate is held against: all devices of a job together, and what it is."""

    devices: int
    tflops_per_device: float
    source: str  # in words, for the reader: "64 x A100 BF16 dense (312 TFLOP/s each)"

    @property
    def flops_per_s(self) -> float:
        return self.devices * self.tflops_per_device * 1e12


def gpu_of_instance(instance: str | None) -> tuple[str, float] | None:
    """(GPU name, dense BF16 TFLOP/s) of a known instance family; None for one this module does not know."""
    family = (instance or "").split(".", 1)[0]
    return GPU_PEAKS_BY_FAMILY.get(family)


def gpu_peak(instance: str | None, gpus: int, declared_tflops: float | None = None) -> Peak | None:
    """The peak of `gpus` GPUs of `instance`: a declared figure wins (an unknown GPU has only that)."""
    known = gpu_of_instance(instance)
    if declared_tflops is not None:
        name = known[0] if known else f"the GPU of {instance}"
        return Peak(gpus, declared_tflops, f"{gpus} x {name}, declared {declared_tflops:g} TFLOP/s each")
    if known is None:
        return None
    return Peak(gpus, known[1], f"{gpus} x {known[0]} BF16 dense ({known[1]:g} TFLOP/s each, datasheet)")


def cpu_peak(declared_tflops: float | None, processes: int) -> Peak | None:
    """A CPU job's peak: only the one the pipeline declares (per process), never a guess."""
    if declared_tflops is None:
        return None
    return Peak(processes, declared_tflops, f"{processes} CPU process(es) x declared {declared_tflops:g} TFLOP/s")


def tokens_per_second(step_seconds: float, tokens_per_step: int) -> float:
    return tokens_per_step / step_seconds


def model_flops_utilization(tokens_per_s: float, per_token: float, peak: Peak) -> float:
    """MFU as a fraction: the model FLOPs done per second over the peak of every device of the job."""
    return tokens_per_s * per_token / peak.flops_per_s


def step_seconds_at(mfu: float, tokens_per_step: int, per_token: float, peak: Peak) -> float:
    """The step time a given MFU means (the inverse, for `plan`'s assumption in seconds per step)."""
    return tokens_per_step * per_token / (mfu * peak.flops_per_s)
