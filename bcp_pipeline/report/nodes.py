"""The node a stage's job runs on, per backend, as the estimates see it: the INSTANCE column's label and the facts
(GPUs, CPU cores, GPU peak) that `plan`'s figures rest on. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from bcp_pipeline.config.instances import InstanceType
from bcp_pipeline.config.model import StageConfig


@dataclass(frozen=True)
class NodeType:
    """One node of a stage's job on the backend planned: what the INSTANCE column says, the facts the estimate uses
    (GPUs, CPU cores, GPU peak; None: not known), a training's GPUs a node where the backend declares them, and
    notes on where the facts come from."""

    label: str | None
    facts: InstanceType | None
    training_gpus: int | None = None
    notes: tuple[str, ...] = ()


def node_type(
    stage: StageConfig, backend: str, instances: dict[str, InstanceType], here: InstanceType | None
) -> NodeType:
    """The hooks of the backend's section (config/sections/hooks.py) decide. A section naming an instance (BCP's):
    that instance. Jobs that run here (local): this machine (`here`), no GPUs. Any other (Slurm, Grid Engine,
    Kubernetes): the GPUs and CPUs the section declares, on nodes like the stage's BCP instance (the GPU's peak, and
    the cores where none are declared): a batch or pod spec names no node type the estimates could read."""
    section, bcp = stage.resources(backend), stage.bcp
    if section.instance_field:
        name = section.instance_name()
        known = instances.get(name or "")
        notes = () if known else (f"instance {name!r} is not known: declare it under backends.bcp.instances",)
        return NodeType(name, known, notes=notes)
    if section.runs_here:
        if here is None:
            return NodeType("this machine", None, 0, ("this machine's cores are not known here",))
        return NodeType("this machine", InstanceType(gpus=0, cpu_cores=here.cpu_cores, gpu_peak_tflops=0.0), 0)
    known = instances.get(bcp.instance or "")
    # A training's GPUs a node are its ranks a node, in the section's `gpus_field` as the renderers read it; a data
    # stage's, the GPUs it requests (Slurm's --gpus-per-node, a pod's nvidia.com/gpu: the same fields; where the
    # field counts ranks, `gpus_are_ranks` (Grid Engine's), its data jobs request no GPU).
    given = (getattr(section, section.gpus_field) or None) if section.gpus_field else None
    training_gpus = given if stage.engine else None
    label = section.node_label()
    if known is None:
        return NodeType(
            label or "-",
            None,
            training_gpus,
            (
                f"no node type: the estimates take the GPU and its peak from bcp.instance, and "
                f"{bcp.instance!r} is not known (declare it under backends.bcp.instances)",
            ),
        )
    declared_cores = section.declared_cores()
    data_gpus = None if section.gpus_are_ranks else given
    gpus = (training_gpus or known.gpus) if stage.engine else (data_gpus or 0)
    facts = InstanceType(gpus=gpus, cpu_cores=declared_cores or known.cpu_cores, gpu_peak_tflops=known.gpu_peak_tflops)
    note = (
        f"nodes taken to be like bcp.instance {bcp.instance} (its GPU's peak"
        + ("" if declared_cores else ", its CPU cores")
        + f"): {backend} names no node type"
    )
    return NodeType(label or f"like {bcp.instance}", facts, training_gpus, (note,))
