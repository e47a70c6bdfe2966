"""Typed per-backend sections of pipelines.yaml: what a stage asks of each backend, and backend-wide options.

A stage's backend sections (`bcp:`, `slurm:`, ..., merged over the pipeline's `defaults:`) become these
dataclasses, and `backends:` the options ones. Keys map 1:1 to fields; the field comments are the reference for
pipelines.yaml. BACKENDS at the end is the one table of backend names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from bcp_pipeline.config.instances import InstanceType
from bcp_pipeline.config.typed import Duration

LABEL_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
SECRET_PART = re.compile(r"^[A-Za-z0-9_.-]{1,63}$")
ENV_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,63}$")


@dataclass(frozen=True)
class RankLayout:
    """How a job's ranks are laid out on one backend: `nodes` x `per_node` processes, RANK 0..world_size-1."""

    nodes: int
    per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.per_node


@dataclass(kw_only=True)
class Mount:
    """A BCP workspace mounted into the job: `NAME:MOUNT:MODE`."""

    name: str
    mount: str
    mode: Literal["RW", "RO"] = "RW"


@dataclass(kw_only=True)
class BcpResources:
    """One `ngc base-command job run`: every field renders to one flag."""

    instance: str | None = None  # --instance, e.g. dgxa100.80g.8.norm
    image: str | None = None  # --image, e.g. nvcr.io/nvaie/nemo-framework-training:23.11
    replicas: int = 1  # --replicas (nodes); > 1 adds --array-type and a bcprun launcher
    processes: int = 1  # processes per replica, started by `bcprun --npernode`
    array_type: Literal["PYTORCH", "MPI", "PARALLEL", "HOROVOD"] = "PYTORCH"
    total_runtime: Duration | None = None  # --total-runtime; required by ngc when replicas > 1
    min_timeslice: Duration | None = None  # --min-timeslice
    preempt: Literal["RUNONCE", "RESUMABLE", "RESTARTABLE"] = "RUNONCE"
    priority: Literal["HIGH", "NORMAL", "LOW"] = "NORMAL"
    order: int = 50  # --order, 1..99
    workspaces: list[Mount] = field(default_factory=list)  # --workspace NAME:MOUNT:MODE
    result: str = "/results"  # --result
    secrets: list[str] = field(default_factory=list)  # --secret NAME or NAME:KEY:ENV (values never in argv)
    env: dict[str, str] = field(default_factory=dict)  # --env-var KEY:VALUE
    labels: list[str] = field(default_factory=list)  # --label (run and stage labels are added)
    on_preempted: Literal["resume", "wait"] = "resume"  # PREEMPTED: `ngc job resume` it, or wait for someone to
    launcher: Literal["bcprun", "none"] = "bcprun"  # none: the command starts its own ranks (NeMo launcher)
    command: list[str] | None = None  # run this instead of `python3 ${code}/PROGRAM ARGS`

    counts: ClassVar[tuple[str, ...]] = ()  # replicas and processes: checked with BCP's own rules (validate.py)
    image_field: ClassVar[str | None] = "image"  # the field naming the stage's container image (output digest)
    gpus_field: ClassVar[str | None] = None  # the field giving a training's GPUs (ranks) a node: the instance's here

    def rank_layout(self, bcp: BcpResources) -> RankLayout:
        return RankLayout(nodes=self.replicas, per_node=self.processes)


@dataclass(kw_only=True)
class LocalResources:
    """The embedded local backend: replicas x processes local processes."""

    replicas: int = 1
    processes: int = 1
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] | None = None

    counts: ClassVar[tuple[str, ...]] = ("replicas", "processes")  # each >= 1 where set (validate.py)
    image_field: ClassVar[str | None] = None  # local processes run in no container
    gpus_field: ClassVar[str | None] = None

    def rank_layout(self, bcp: BcpResources) -> RankLayout:
        return RankLayout(nodes=self.replicas, per_node=self.processes)


@dataclass(kw_only=True)
class SlurmResources:
    """One `sbatch` job of nodes x ntasks_per_node tasks started by `srun`; unset fields are derived from the
    stage's BCP section (nodes, tasks, time)."""

    nodes: int | None = None  # --nodes (default: bcp.replicas)
    ntasks_per_node: int | None = None  # --ntasks-per-node (default: bcp.processes)
    cpus_per_task: int = 1  # --cpus-per-task
    time: Duration | None = None  # --time (default: bcp.total_runtime; neither: the partition's default)
    partition: str | None = None  # --partition (default: backends.slurm.partition)
    account: str | None = None  # --account (default: backends.slurm.account)
    gpus_per_node: int | None = None  # --gpus-per-node
    mem: str | None = None  # --mem, e.g. 64G
    container_image: str | None = None  # Pyxis srun --container-image, e.g. nvcr.io#nvidia/nemo:24.05 (with
    # backends.slurm.container apptainer: a .sif path or docker://nvcr.io/nvidia/nemo:24.05)
    container_mounts: list[str] = field(default_factory=list)  # Pyxis --container-mounts SRC:DST[:FLAGS] (Apptainer
    # --bind SRC[:DST[:ro|rw]]; the
    # workspace and stages/ folders are added, mounted at the same paths)
    extra_args: list[str] = field(default_factory=list)  # more #SBATCH flags, verbatim, e.g. --exclusive
    srun_args: list[str] = field(default_factory=list)  # more srun flags, verbatim, e.g. --mpi=pmix
    on_preempted: Literal["resume", "wait"] = "resume"  # PREEMPTED: `scontrol requeue` it, or wait for someone to
    env: dict[str, str] = field(default_factory=dict)  # exported in the batch script (and so to every task)
    command: list[str] | None = None  # run this instead of `${python} ${code}/PROGRAM ARGS`

    counts: ClassVar[tuple[str, ...]] = ("nodes", "ntasks_per_node", "cpus_per_task")
    image_field: ClassVar[str | None] = "container_image"
    gpus_field: ClassVar[str | None] = "gpus_per_node"

    def rank_layout(self, bcp: BcpResources) -> RankLayout:
        return RankLayout(nodes=bcp.replicas if self.nodes is None else self.nodes,
                          per_node=bcp.processes if self.ntasks_per_node is None else self.ntasks_per_node)


@dataclass(kw_only=True)
class GridEngineResources:
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

    def rank_layout(self, bcp: BcpResources) -> RankLayout:
        return RankLayout(nodes=bcp.replicas if self.nodes is None else self.nodes,
                          per_node=bcp.processes if self.processes_per_node is None else self.processes_per_node)


@dataclass(kw_only=True)
class Toleration:
    """A pod toleration (`spec.tolerations[]`), e.g. of a GPU node group's taint."""

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


@dataclass(kw_only=True)
class ElasticPolicy:
    """A PyTorchJob's `elasticPolicy` (Kubeflow training operator v1): torchrun's elastic rendezvous, so the training
    goes on with fewer pods and restarts its ranks after one is lost, rather than the attempt ending."""

    min_replicas: int | None = None  # the fewest pods the training runs on (default: the stage's replicas)
    max_replicas: int | None = None  # the most (default: the stage's replicas, the Worker pods created)
    rdzv_backend: Literal["c10d", "etcd", "etcd-v2"] = "c10d"  # c10d: a store on the first Worker pod, nothing else
    max_restarts: int = 3  # restarts of the ranks (torchrun --max-restarts) before the job fails


@dataclass(kw_only=True)
class KubernetesResources:
    """One batch/v1 Indexed Job of `replicas` pods (or a Kubeflow PyTorchJob), each pod running `processes`
    processes; unset fields are derived from the stage's BCP section (replicas, processes, image, runtime)."""

    replicas: int | None = None  # pods: the Job's completions = parallelism (default: bcp.replicas)
    processes: int | None = None  # processes per pod (default: bcp.processes, at most `cpu`'s whole cores)
    image: str | None = None  # the container image (default: bcp.image; neither: backends.kubernetes.image)
    cpu: str | None = None  # requests = limits of each pod, e.g. "8"
    memory: str | None = None  # e.g. 64Gi
    gpus: int = 0  # nvidia.com/gpu per pod
    efa: int = 0  # vpc.amazonaws.com/efa per pod (EKS p4de: 4, p5: 32); > 0 also sets FI_PROVIDER=efa and
    # FI_EFA_USE_DEVICE_RDMA=1 (NCCL's aws-ofi-nccl plugin then uses EFA, not TCP), unless `env` sets them
    shm_size: str | None = None  # /dev/shm as a memory emptyDir of this size, e.g. 16Gi (a pod gets 64 MiB otherwise,
    # too little for NCCL and DataLoader workers); mounted on every GPU or multi-process pod (unset there: no limit
    # but the pod's memory), and on any pod where set
    image_pull_secrets: list[str] = field(default_factory=list)  # Secrets for a private registry (NGC: nvcr.io)
    priority_class: str | None = None  # the pods' priorityClassName
    queue: str | None = None  # a Kueue LocalQueue of the namespace: the job is created suspended, with Kueue's
    # kueue.x-k8s.io/queue-name label, and its pods start all at once when Kueue admits it (gang admission)
    labels: dict[str, str] = field(default_factory=dict)  # more labels on the job and its pods (e.g. a cost centre);
    # the backend's own (bcp-pipeline/*, app.kubernetes.io/managed-by, Kueue's queue-name: `queue`) cannot be replaced
    annotations: dict[str, str] = field(default_factory=dict)  # annotations on the job and its pods
    ttl_after_finished: Duration | None = None  # the Job's ttlSecondsAfterFinished: deleted (with its pods and logs)
    # this long after it ended; unset: kept, so `logs` can read it
    node_selector: dict[str, str] = field(default_factory=dict)  # e.g. {node.kubernetes.io/instance-type: p5.48xlarge}
    tolerations: list[Toleration] = field(default_factory=list)
    active_deadline: Duration | None = None  # the time limit (default: bcp.total_runtime), kept by each pod's
    # container from its own start (not the Job's activeDeadlineSeconds, which would count time spent queued)
    backoff_limit: int | None = None  # pods that may fail (a failed program) before the Job fails; disrupted pods
    # don't count (unset: 0, or no limit across indexes with retries_per_index)
    retries_per_index: int | None = None  # an Indexed Job's backoffLimitPerIndex: each index (a shard of a data
    # stage) may fail this often before it alone fails, its other indexes going on (and their outputs kept)
    max_failed_indexes: int | None = None  # with retries_per_index: the Job fails at once when more indexes have
    # failed (maxFailedIndexes; unset: it fails once every index has succeeded or failed)
    secrets: list[str] = field(default_factory=list)  # SECRET:KEY:ENV, a Kubernetes Secret's key as an env var
    launcher: Literal["job", "pytorchjob"] = "job"  # pytorchjob: a Kubeflow PyTorchJob (training operator)
    elastic_policy: ElasticPolicy | None = None  # pytorchjob only: Worker pods in an elastic rendezvous
    service_account: str | None = None  # the pods' serviceAccountName (default: backends.kubernetes.service_account)
    mount_service_account_token: bool = False  # mount the service account's API token in the pods (off: stage
    # programs never call the Kubernetes API, and a token is a credential any code in the image could read)
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] | None = None  # run this instead of `${python} ${code}/PROGRAM ARGS`

    counts: ClassVar[tuple[str, ...]] = ()
    image_field: ClassVar[str | None] = "image"
    gpus_field: ClassVar[str | None] = "gpus"

    def rank_layout(self, bcp: BcpResources) -> RankLayout:
        """Unset processes: the BCP section's, but no more than the pod's whole CPUs where `cpu` gives them (a
        DGX's 48 download processes would crowd an 8-CPU pod)."""
        processes = self.processes
        if processes is None:
            cores = self.whole_cpus()
            processes = min(bcp.processes, cores) if cores else bcp.processes
        return RankLayout(nodes=bcp.replicas if self.replicas is None else self.replicas, per_node=processes)

    def whole_cpus(self) -> int | None:
        """The pod's CPUs where `cpu` asks for whole ones ("8"); None for none or a fraction ("500m", "7.5")."""
        return int(self.cpu) if self.cpu and re.fullmatch(r"[1-9]\d*", self.cpu.strip()) else None




@dataclass(kw_only=True)
class LocalOptions:
    """`backends.local` in pipelines.yaml: where the stand-in workspace lives."""

    workspace_dir: str = ".bcp-pipeline/workspaces"  # relative to the config file; one folder per workspace name
    python: str | None = None  # interpreter for stage programs (default: the orchestrator's)
    poll_seconds: float = 0.5
    status_outage_limit: Duration | None = None  # as on the clusters; a local job's status is read from files,
    # which fail only with the disk, so by default the run waits for ever




@dataclass(kw_only=True)
class DriverOptions:
    """`backends.bcp.driver`: the small job that runs the orchestrator inside BCP (`run --detach`)."""

    instance: str | None = None  # default: the instance of the pipeline's verification jobs (its smallest)
    image: str | None = None  # default: the image of the pipeline's verification jobs
    total_runtime: Duration = Duration("5D")  # the driver's own --total-runtime ...
    handover_before: Duration = Duration("30M")  # ... it submits its successor this long before that ends
    secret: str = "bcp-pipeline-ngc"  # the BCP secret (`ngc user secret create`) that holds the NGC API key ...
    secret_key: str = "api_key"  # ... under this key; it reaches the driver as NGC_CLI_API_KEY, nowhere else
    install_ngcsdk: bool = True  # pip install ngcsdk (and PyYAML) in the driver when its image lacks them
    python: str | None = None  # the driver's interpreter (default: backends.bcp.python)
    priority: Literal["HIGH", "NORMAL", "LOW"] = "NORMAL"


@dataclass(kw_only=True)
class BcpOptions:
    """`backends.bcp`: how to reach Base Command Platform."""

    transport: Literal["auto", "cli", "sdk"] = "auto"  # how to reach BCP: the ngc CLI, ngcsdk 4.19.1 in-process, or
    # auto (the CLI when `ngc` is on PATH, else ngcsdk)
    ngc: str = "ngc"  # path of the ngc CLI
    org: str | None = None  # else NGC_CLI_ORG or ~/.ngc/config
    team: str | None = None
    ace: str | None = None
    python: str = "python3"  # interpreter inside the container
    code_dir: str = ".bcp-pipeline/code"  # under the pipeline workspace: stages/ uploaded once per content hash
    jobs_dir: str = ".bcp-pipeline/jobs"  # under the pipeline workspace: job scripts (a NeMo pretrain's), per run
    poll_min_seconds: float = 10.0
    poll_max_seconds: float = 60.0
    status_outage_limit: Duration | None = None  # as on the clusters, but waiting for ever by default: a detached
    # driver that stopped would leave its run undriven until someone resumes it, and NGC outages are short
    training_log_seconds: float = 60.0  # a running training's progress (steps, loss) is read from its log this often
    list_duration: Duration = Duration("30D")  # `job list --duration`: ngc's default 7-day window misses long runs
    lookup_grace_seconds: float = 60.0  # a stage found "submitting" after a restart is looked up in `job list`
    # this long before a job is submitted for it (the list may lag job creation)
    retry_attempts: int = 5  # calls made for an upload, a driver's start and hand-over when the API answers 429/5xx
    retry_backoff_seconds: float = 2.0  # first wait between them, doubling, with as much again of jitter
    ui_url: str | None = "https://bc.ngc.nvidia.com/jobs/{job_id}"  # job page shown by `status`; null to hide
    instances: dict[str, InstanceType] = field(default_factory=dict)  # instance types for estimates, added to or
    # replacing the known DGX ones (config/instances.py KNOWN_INSTANCES)
    driver: DriverOptions = field(default_factory=DriverOptions)  # `run --detach`: the orchestrator as a BCP job


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
    # `resume` re-attaches) once squeue has failed for this long in a row; null: wait for ever


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
    # `resume` re-attaches) once qstat has failed for this long in a row; null: wait for ever


@dataclass(kw_only=True)
class KubernetesOptions:
    """`backends.kubernetes`: the cluster (a kubeconfig, as kubectl reads it) and what every stage's pods share."""

    kubeconfig: str | None = None  # default: $KUBECONFIG, else ~/.kube/config
    context: str | None = None  # default: the kubeconfig's current-context
    namespace: str = "default"
    service_account: str | None = None  # the pods' serviceAccountName (default: the namespace's `default`)
    image: str | None = None  # the image of stages whose kubernetes and bcp sections name none
    workspace_claim: str = "bcp-pipeline-workspace"  # the PVC holding the workspace (ReadWriteMany across nodes),
    # mounted at the pipeline's workspace mount (the path the stage programs use on BCP)
    code_dir: str = "/opt/bcp-pipeline/stages"  # the stages/ folder inside the image
    python: str = "python3"  # interpreter inside the image
    master_port: int = 29500  # the rendezvous port on the index-0 pod
    poll_seconds: float = 2.0  # first poll interval after a change ...
    poll_max_seconds: float = 15.0  # ... growing to this while nothing changes
    status_outage_limit: Duration | None = Duration("1h")  # a run stops waiting (exit 75, its jobs left running;
    # `resume` re-attaches) once listing the run's Jobs has failed for this long in a row; null: wait for ever
    image_pull_grace: Duration = Duration("5M")  # how long a pod's image may fail to come (ErrImagePull,
    # ImagePullBackOff: the kubelet retries) before its job fails with the kubelet's reason


@dataclass(frozen=True)
class BackendSections:
    """A backend's two sections of pipelines.yaml: its backend-wide options and what a stage asks of it."""

    options: type
    resources: type


# THE table of backends: every name is written here and nowhere else (the registry finds backends/NAME/; the
# loader reads `backends.NAME` and each stage's `NAME:` section). Adding a backend adds one row
# (docs/backends/adding-a-backend.md).
BACKENDS: dict[str, BackendSections] = {
    "local": BackendSections(LocalOptions, LocalResources),
    "bcp": BackendSections(BcpOptions, BcpResources),
    "slurm": BackendSections(SlurmOptions, SlurmResources),
    "gridengine": BackendSections(GridEngineOptions, GridEngineResources),
    "kubernetes": BackendSections(KubernetesOptions, KubernetesResources),
}
RESOURCE_TYPES: dict[str, type] = {name: sections.resources for name, sections in BACKENDS.items()}
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
