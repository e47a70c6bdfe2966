"""THE table of backends: each backend's two sections of pipelines.yaml, and the one place a job's rank layout
comes from.

A backend's sections are a module of config/sections/: its backend-wide options (`backends.NAME`) and what a stage
asks of it (its `NAME:` section, merged over the pipeline's `defaults:`), a `Resources` subclass whose hooks are what
config/, report/ and cli/ ask of a backend instead of its name (config/sections/hooks.py). The classes are
re-exported here, as the table names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bcp_pipeline.config.sections.bcp import BcpOptions, BcpResources
from bcp_pipeline.config.sections.gridengine import GridEngineOptions, GridEngineResources
from bcp_pipeline.config.sections.hooks import RankLayout, Resources
from bcp_pipeline.config.sections.kubernetes import KubernetesOptions, KubernetesResources
from bcp_pipeline.config.sections.lepton import LeptonOptions, LeptonResources
from bcp_pipeline.config.sections.local import LocalOptions, LocalResources
from bcp_pipeline.config.sections.slurm import SlurmOptions, SlurmResources


@dataclass(frozen=True)
class BackendSections:
    """A backend's two sections of pipelines.yaml: its backend-wide options and what a stage asks of it."""

    options: type
    resources: type[Resources]


# THE table of backends: every name is written here and nowhere else (the registry finds backends/NAME/; the
# loader reads `backends.NAME` and each stage's `NAME:` section). Adding a backend adds one row
# (docs/backends/adding-a-backend.md).
BACKENDS: dict[str, BackendSections] = {
    "local": BackendSections(LocalOptions, LocalResources),
    "bcp": BackendSections(BcpOptions, BcpResources),
    "slurm": BackendSections(SlurmOptions, SlurmResources),
    "gridengine": BackendSections(GridEngineOptions, GridEngineResources),
    "kubernetes": BackendSections(KubernetesOptions, KubernetesResources),
    "lepton": BackendSections(LeptonOptions, LeptonResources),
}
RESOURCE_TYPES: dict[str, type[Resources]] = {name: sections.resources for name, sections in BACKENDS.items()}
OPTION_TYPES: dict[str, type] = {name: sections.options for name, sections in BACKENDS.items()}


def rank_layout(sections: Any, backend: str) -> RankLayout:
    """The node and process counts of a job on `backend`, from a stage's (or the verification's) sections. The ONE
    place these counts come from: the local supervisor, the batch scripts, the BCP job (`--replicas`, bcprun's
    `--nnodes/--npernode`), the pods, the recorded sharding, the rendezvous `plan` shows and the estimates all call
    it, so they cannot disagree about a distributed stage's world size.

    local: replicas x processes; bcp: replicas x processes; slurm: nodes x ntasks_per_node; gridengine: nodes x
    processes_per_node; kubernetes: replicas (pods) x processes; each unset Slurm, Grid Engine or Kubernetes count
    taken from the bcp section, so a pipeline written for BCP runs at the same shape on any of them.
    """
    if backend not in BACKENDS:
        raise ValueError(f"no rank layout for backend {backend!r} ({', '.join(BACKENDS)})")
    return getattr(sections, backend).rank_layout(sections.bcp)
