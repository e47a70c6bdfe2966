"""DGX Cloud Lepton's sections of pipelines.yaml: `backends.lepton` and a stage's `lepton:` (one batch job of
workers of a resource shape: bcp_pipeline/backends/lepton/). Keys map 1:1 to fields; the field comments are the
reference for pipelines.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from bcp_pipeline.config.sections.bcp import BcpResources
from bcp_pipeline.config.sections.hooks import RankLayout, Resources
from bcp_pipeline.config.typed import Duration


@dataclass(kw_only=True)
class LeptonResources(Resources):
    """One DGX Cloud Lepton batch job (`lep job create`): `replicas` workers of one resource shape, each running
    `processes` processes; unset fields are derived from the stage's BCP section (replicas, processes, image)."""

    resource_shape: str | None = None  # e.g. gpu.8xh100-sxm, cpu.small (default: backends.lepton.resource_shape)
    node_group: str | None = None  # the dedicated node group (affinity; default: backends.lepton.node_group)
    replicas: int | None = None  # workers: the job's completions = parallelism (default: bcp.replicas)
    processes: int | None = None  # processes per worker (default: bcp.processes)
    gpus: int | None = None  # a training's GPUs (ranks) a worker (default: the BCP instance's, 8 on a DGX)
    image: str | None = None  # the container image (default: bcp.image; neither: backends.lepton.image)
    image_pull_secrets: list[str] = field(default_factory=list)  # registry secrets of the workspace (nvcr.io)
    shared_memory_size: int | None = None  # /dev/shm in MiB (default: 65536 for a training, else the service's)
    secrets: list[str] = field(default_factory=list)  # SECRET:ENV, a workspace secret by name as the variable ENV
    max_failure_retry: int = 0  # the service restarts a failed worker this often (0: retries are the orchestrator's)
    priority_class: str | None = None  # queue priority, e.g. mid-4000 (the service's default: none)
    can_be_preempted: bool = False  # the job yields its nodes to higher-priority jobs
    can_preempt: bool = False  # the job may evict lower-priority ones
    ttl_after_finished: Duration | None = None  # kept this long after it ended, then archived (default: options')
    labels: dict[str, str] = field(default_factory=dict)  # more labels on the job (the backend's own stay)
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] | None = None  # run this instead of `${python} ${code}/PROGRAM ARGS`
    numa_binding: bool = True  # a Megatron-Bridge rank's CPUs, and its memory where numactl may, on its GPU's NUMA node

    counts: ClassVar[tuple[str, ...]] = ("replicas", "processes", "gpus")
    image_field: ClassVar[str | None] = "image"
    digest_unset_image: ClassVar[bool] = False  # unset, it leaves the output digests as they were before this backend
    gpus_field: ClassVar[str | None] = "gpus"  # torchrun's --nproc_per_node in each worker
    gpus_are_ranks: ClassVar[bool] = True
    nodes_field: ClassVar[str | None] = "replicas"

    def rank_layout(self, bcp: BcpResources) -> RankLayout:
        return RankLayout(
            nodes=bcp.replicas if self.replicas is None else self.replicas,
            per_node=bcp.processes if self.processes is None else self.processes,
        )


@dataclass(kw_only=True)
class LeptonOptions:
    """`backends.lepton`: the DGX Cloud Lepton workspace (its id and URL; the token only ever from the environment,
    LEPTON_WORKSPACE_TOKEN) and the storage every job mounts as the pipeline's workspace."""

    workspace_id: str | None = None  # default: $LEPTON_WORKSPACE_ID
    url: str | None = None  # the workspace's API URL (default: $LEPTON_WORKSPACE_URL, else the SDK's from the id)
    storage: str = "node-nfs:lepton-shared-fs"  # a mount's `from`: the node group's shared file system
    storage_path: str = "/bcp-pipeline"  # folder in the storage holding one folder per pipeline workspace name
    node_group: str | None = None  # default node group of every job
    resource_shape: str = "cpu.small"  # default resource shape of every job
    image: str | None = None  # the image of stages whose lepton and bcp sections name none
    python: str = "python3"  # interpreter inside the image
    code_dir: str = ".bcp-pipeline/code"  # under the workspace: stages/ copied once per content hash
    mover_image: str = "busybox:1.37.0"  # the image of the job that copies stages/ into the storage
    master_port: int = 29400  # the rendezvous port on worker 0 (Lepton's torchrun template's)
    ttl_after_finished: Duration = Duration("1D")  # a finished job's record and logs are kept this long
    poll_seconds: float = 5.0  # first poll interval after a change ...
    poll_max_seconds: float = 30.0  # ... growing to this while nothing changes
    status_outage_limit: Duration | None = Duration("1h")  # a run stops waiting (exit 75, its jobs left running;
    # `resume` re-attaches) once listing the run's jobs has failed for this long in a row; null: wait for ever
    lookup_grace_seconds: float = 30.0  # a stage found "submitting" after a restart is looked up this long first
