"""Grid Engine's sections of pipelines.yaml: `backends.gridengine` and a stage's `gridengine:` (one qsub job).
Keys map 1:1 to fields; the field comments are the reference for pipelines.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from bcp_pipeline.config.sections.bcp import BcpResources
from bcp_pipeline.config.sections.hooks import RankLayout, Resources
from bcp_pipeline.config.typed import Duration


@dataclass(kw_only=True)
class GridEngineOptions:
    """`backends.gridengine`: a Grid Engine cell (Son of Grid Engine, Altair Grid Engine); a shared folder stands
    in for the workspace on the exec hosts."""

    workspace_dir: str = ".bcp-pipeline/workspaces"  # relative to the config file; every exec host must see it (and
    # the stages/ folder and the run folder, which holds the job logs)
    python: str | None = None  # interpreter on the exec hosts (default: the orchestrator's; python3 in a container)
    container: Literal["none", "apptainer"] = "none"  # apptainer: stages with a container_image run in it
    parallel_environment: str | None = None  # default -pe of distributed jobs
    project: str | None = None  # default -P of every job
    queue: str | None = None  # default -q of every job
    # On qsub's command line, not as `#$` lines: what a site takes only there (TSUBAME4's `-g GROUP`, which stock
    # Grid Engine has no directive for); `run`, `check` and the probe job submit with them.
    submit_args: list[str] = field(default_factory=list)
    # How a job over several hosts (a distributed stage, a training) starts its part on each host of $PE_HOSTFILE:
    # qrsh: one `$SGE_ROOT/bin/ARCH/qrsh -inherit` a host; mpirun: Open MPI's `mpirun -npernode 1 -hostfile`
    # (TSUBAME4's multi-node way; Open MPI starts the other hosts through qrsh -inherit itself where it finds Grid
    # Engine). Either way each host runs the same launcher; a stage's gridengine.start_hosts overrides this.
    start_hosts: Literal["qrsh", "mpirun"] = "qrsh"
    # Shell text run on the first host of such a job whose output (its first line) is MASTER_ADDR, e.g. the address
    # of a fast interface: `ip -4 -o addr show ib0 | awk '{print $4}' | cut -d/ -f1`; null: the first host's name
    # in $PE_HOSTFILE. A stage's gridengine.master_addr_command overrides this.
    master_addr_command: str | None = None
    # A job gone from qstat with no `qacct` record this long was deleted before it started. The cell writes
    # accounting every reporting_params flush_time (15 s by default), but a busy site's qacct lags by minutes: too
    # short a grace cancels a stage whose job finished. Longer only delays noticing a job deleted while pending.
    accounting_grace_seconds: float = 600.0
    poll_seconds: float = 1.0  # first qstat interval after a change ...
    poll_max_seconds: float = 15.0  # ... growing to this while nothing changes
    status_outage_limit: Duration | None = Duration("1h")  # a run stops waiting (exit 75, its jobs left running;


@dataclass(kw_only=True)
class GridEngineResources(Resources):
    """One `qsub` job with `#$` directives: an array job of `nodes` independent tasks, or (`distributed`) one job
    over a parallel environment with one launcher per host; unset fields are derived from the stage's BCP section."""

    nodes: int | None = None  # array tasks (-t 1-N) or hosts of the parallel environment (default: bcp.replicas)
    processes_per_node: int | None = None  # ranks each task or host starts (default: bcp.processes)
    distributed: bool = False  # the ranks meet (torch.distributed): one job over `-pe`, hosts from $PE_HOSTFILE,
    # MASTER_ADDR its first host, one launcher per host (start_hosts); false: independent replicas, an array job
    h_rt: Duration | None = None  # -l h_rt (default: bcp.total_runtime; neither: the queue's limit)
    resources: list[str] = field(default_factory=list)  # -l requests, verbatim, e.g. node_f=1 (TSUBAME), gpu=4
    parallel_environment: str | None = None  # -pe NAME NODES for a distributed job (default: backends.gridengine.
    # parallel_environment; none at all: a site whose `-l node_f=N` makes the job parallel, as TSUBAME's does)
    project: str | None = None  # -P (default: backends.gridengine.project)
    queue: str | None = None  # -q (default: backends.gridengine.queue)
    container_image: str | None = None  # Apptainer image: a .sif path or docker://REF (pulled on every host)
    container_binds: list[str] = field(default_factory=list)  # more Apptainer --bind SRC[:DST[:OPTS]] (the
    # workspace is bound at /mount_workspace; stages/ and the run folder at their own paths)
    extra_args: list[str] = field(default_factory=list)  # more `#$` lines, verbatim, e.g. -l gpu=4
    env: dict[str, str] = field(default_factory=dict)  # exported in the job script (and so to every rank)
    command: list[str] | None = None  # run this instead of `${python} ${code}/PROGRAM ARGS`
    numa_binding: bool = True  # a Megatron-Bridge rank's CPUs, and its memory where numactl may, on its GPU's NUMA node
    # (stages/rank_start.py; off: as the image and torchrun leave them)
    launcher: Literal["ranks", "torchrun"] = "ranks"  # a distributed stage's ranks on each host: started by the job
    # script with RANK etc. set, or by one torchrun a host (c10d rendezvous at the first host; in the container)
    start_hosts: Literal["qrsh", "mpirun"] | None = None  # how a job over several hosts starts its part on each
    # (default: backends.gridengine.start_hosts): `qrsh -inherit` a host, or one Open MPI `mpirun -npernode 1`
    master_addr_command: str | None = None  # shell text run on the first host whose output is MASTER_ADDR (default:
    # backends.gridengine.master_addr_command; neither: the first host of $PE_HOSTFILE)
    setup: list[str] = field(default_factory=list)  # shell lines run on every host before its ranks start, e.g.
    # ["source /etc/profile.d/modules.sh", "module load cuda/12.8.0"] (TSUBAME4), a virtual environment's activate
    reserve: bool = False  # -R y: resources reserved for this job as others finish (large node_f jobs)
    priority: int | None = None  # -p, -1023..1024 (users may only lower theirs: <= 0)
    advance_reservation: str | None = None  # -ar ID: run inside an advance reservation (`qrsub`)
    array_concurrency: int | None = None  # -tc N: at most N tasks of an array job at once
    node_scratch: bool = False  # the job's node-local $TMPDIR given to the stage as BCP_PIPELINE_SCRATCH (its
    # temporary files there, not on the shared workspace; outputs still land atomically in the workspace)

    counts: ClassVar[tuple[str, ...]] = ("array_concurrency",)
    image_field: ClassVar[str | None] = "container_image"
    gpus_field: ClassVar[str | None] = "processes_per_node"  # torchrun's --nproc-per-node
    gpus_are_ranks: ClassVar[bool] = True
    nodes_field: ClassVar[str | None] = "nodes"

    def rank_layout(self, bcp: BcpResources) -> RankLayout:
        return RankLayout(
            nodes=bcp.replicas if self.nodes is None else self.nodes,
            per_node=bcp.processes if self.processes_per_node is None else self.processes_per_node,
        )

    def launcher_image(self) -> str | None:
        """The launcher and the training run in the Apptainer image: a docker:// reference carries the release's
        tag; a .sif path does not (None: the pipeline's NeMo image, the one it was pulled from, is the guess)."""
        image = self.container_image or ""
        return image.removeprefix("docker://") if image.startswith("docker://") else None
