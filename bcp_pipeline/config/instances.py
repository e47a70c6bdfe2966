"""BCP instance types: the DGX ones this tool knows (GPUs, CPU cores, GPU peak) and those a pipeline declares."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(kw_only=True)
class InstanceType:
    """An instance type's facts for estimates (`backends.bcp.instances`, or one of KNOWN_INSTANCES)."""

    gpus: int  # GPUs per node
    cpu_cores: int  # physical CPU cores the job gets
    gpu_peak_tflops: float  # peak dense BF16 TFLOP/s of one GPU


A100_BF16_TFLOPS = 312.0  # NVIDIA A100 datasheet: BF16 Tensor Core, dense (624 with sparsity)
H100_SXM_BF16_TFLOPS = 989.0  # NVIDIA H100 datasheet, SXM: 1,979 with sparsity, half of it dense

DGX_A100_CORES = 128  # DGX A100 datasheet: 2 x AMD EPYC 7742, 64 cores each (256 threads)
DGX_H100_CORES = 112  # DGX H100 datasheet: 2 x Intel Xeon Platinum 8480C, 56 cores each (224 threads)

KNOWN_INSTANCES = {
    # A partial DGX A100 instance gets its share of the cores (16 per GPU): a declared assumption, not a BCP fact.
    **{
        f"dgxa100.80g.{g}.norm": InstanceType(
            gpus=g, cpu_cores=DGX_A100_CORES * g // 8, gpu_peak_tflops=A100_BF16_TFLOPS
        )
        for g in (1, 2, 4, 8)
    },
    "dgxa100.40g.8.norm": InstanceType(gpus=8, cpu_cores=DGX_A100_CORES, gpu_peak_tflops=A100_BF16_TFLOPS),
    "dgxh100.80g.8.norm": InstanceType(gpus=8, cpu_cores=DGX_H100_CORES, gpu_peak_tflops=H100_SXM_BF16_TFLOPS),
}


def instances_table(declared: dict[str, InstanceType]) -> dict[str, InstanceType]:
    """The known DGX instances, with `backends.bcp.instances` added or replacing them."""
    return {**KNOWN_INSTANCES, **declared}


def this_machine() -> InstanceType:
    """The local backend's one node: this machine's CPUs (os.cpu_count counts hardware threads), no GPU."""
    return InstanceType(gpus=0, cpu_cores=os.cpu_count() or 1, gpu_peak_tflops=0.0)
