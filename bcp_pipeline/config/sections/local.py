"""The local backend's sections of pipelines.yaml: `backends.local` and a stage's `local:` (processes of this
machine). Keys map 1:1 to fields; the field comments are the reference for pipelines.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from bcp_pipeline.config.sections.bcp import BcpResources
from bcp_pipeline.config.sections.hooks import RankLayout, Resources
from bcp_pipeline.config.typed import Duration


@dataclass(kw_only=True)
class LocalOptions:
    """`backends.local` in pipelines.yaml: where the stand-in workspace lives."""

    workspace_dir: str = ".bcp-pipeline/workspaces"  # relative to the config file; one folder per workspace name
    python: str | None = None  # interpreter for stage programs (default: the orchestrator's)
    poll_seconds: float = 0.5
    status_outage_limit: Duration | None = None  # as on the clusters; a local job's status is read from files,
    # which fail only with the disk, so by default the run waits for ever
    max_processes: int | None = None  # the most processes (replicas x processes) a local job may start; default 8 per


@dataclass(kw_only=True)
class LocalResources(Resources):
    """The embedded local backend: replicas x processes local processes."""

    replicas: int = 1
    processes: int = 1
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] | None = None

    counts: ClassVar[tuple[str, ...]] = ("replicas", "processes")  # each >= 1 where set (validate.py)
    image_field: ClassVar[str | None] = None  # local processes run in no container
    gpus_field: ClassVar[str | None] = None
    runs_here: ClassVar[bool] = True

    def rank_layout(self, bcp: BcpResources) -> RankLayout:
        return RankLayout(nodes=self.replicas, per_node=self.processes)
