"""Slurm's sections of pipelines.yaml: `backends.slurm` and a stage's `slurm:` (one sbatch job). Keys map 1:1 to
fields; the field comments are the reference for pipelines.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from bcp_pipeline.config.sections.bcp import BcpResources
from bcp_pipeline.config.sections.hooks import RankLayout, Resources
from bcp_pipeline.config.typed import Duration


@dataclass(kw_only=True)
class SlurmOptions:
    """`backends.slurm`: a shared folder stands in for the workspace on the cluster."""

    workspace_dir: str = ".bcp-pipeline/workspaces"  # relative to the config file; must be on a file system every
    # node sees (so must the stages/ folder and the run folder, which holds the job logs)
    python: str | None = None  # interpreter on the compute nodes (default: the orchestrator's; python3 in a container)
    partition: str | None = None  # default --partition of every job
    account: str | None = None  # default --account of every job
    container: Literal["pyxis", "apptainer"] = "pyxis"  # how a stage's container_image runs: Pyxis's srun
    # --container-image (an enroot image), or each task as `apptainer exec --nv` (a .sif path or docker:// image)
    poll_seconds: float = 1.0  # first squeue interval after a change ...
    poll_max_seconds: float = 15.0  # ... growing to this while nothing changes
    status_outage_limit: Duration | None = Duration("1h")  # a run stops waiting (exit 75, its jobs left running;


@dataclass(kw_only=True)
class SlurmResources(Resources):
    """One `sbatch` job of nodes x ntasks_per_node tasks started by `srun`; unset fields are derived from the
    stage's BCP section (nodes, tasks, time)."""

    nodes: int | None = None  # --nodes (default: bcp.replicas)
    ntasks_per_node: int | None = None  # --ntasks-per-node (default: bcp.processes)
    cpus_per_task: int | None = None  # --cpus-per-task (default 1; a Bridge training: cpus_per_node / its GPUs)
    cpus_per_node: int | None = None  # a training node's cores, for that default (default: bcp.instance's where it is
    # a known DGX, e.g. 128 on a DGX A100; else 16 a GPU, a DGX A100's share)
    exclusive: bool | None = None  # --exclusive and --mem=0: whole nodes, all their memory (default: on for a Bridge
    # training, as NVIDIA's launcher's Slurm cluster config; off elsewhere, where `mem` gives the memory)
    save_seconds: int = 900  # a Bridge training gets SIGTERM this long before --time ends (--signal=TERM@N), time for
    # its checkpoint save (docs/backends/slurm.md, "Time to save"; a scancel's is the site's KillWait)
    time: Duration | None = None  # --time (default: bcp.total_runtime; neither: the partition's default)
    partition: str | None = None  # --partition (default: backends.slurm.partition)
    account: str | None = None  # --account (default: backends.slurm.account)
    gpus_per_node: int | None = None  # --gpus-per-node
    mem: str | None = None  # --mem, e.g. 64G
    container_image: str | None = None  # Pyxis srun --container-image, e.g. nvcr.io#nvidia/nemo:24.05 (with
    # backends.slurm.container apptainer: a .sif path or docker://nvcr.io/nvidia/nemo:24.05)
    container_mounts: list[str] = field(default_factory=list)  # Pyxis --container-mounts SRC:DST[:FLAGS] (Apptainer
    # --bind SRC[:DST[:ro|rw]]); the workspace, stages/ and the run folder (its logs) are added at the same paths
    extra_args: list[str] = field(default_factory=list)  # more #SBATCH flags, verbatim, e.g. --exclusive
    srun_args: list[str] = field(default_factory=list)  # more srun flags, verbatim, e.g. --mpi=pmix
    on_preempted: Literal["resume", "wait"] = "resume"  # PREEMPTED: `scontrol requeue` it, or wait for someone to
    env: dict[str, str] = field(default_factory=dict)  # exported in the batch script (and so to every task)
    command: list[str] | None = None  # run this instead of `${python} ${code}/PROGRAM ARGS`
    numa_binding: bool = True  # a Megatron-Bridge rank's CPUs, and its memory where numactl may, on its GPU's NUMA node
    # (stages/rank_start.py, under srun --cpu-bind=none; off: as srun binds them)

    counts: ClassVar[tuple[str, ...]] = ("nodes", "ntasks_per_node", "cpus_per_task", "cpus_per_node")
    image_field: ClassVar[str | None] = "container_image"
    gpus_field: ClassVar[str | None] = "gpus_per_node"
    nodes_field: ClassVar[str | None] = "nodes"

    def rank_layout(self, bcp: BcpResources) -> RankLayout:
        return RankLayout(
            nodes=bcp.replicas if self.nodes is None else self.nodes,
            per_node=bcp.processes if self.ntasks_per_node is None else self.ntasks_per_node,
        )

    def declared_cores(self) -> int | None:
        """Tasks a node x CPUs a task, where the tasks are given."""
        return self.ntasks_per_node * (self.cpus_per_task or 1) if self.ntasks_per_node else None
