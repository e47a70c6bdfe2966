"""Kubernetes' sections of pipelines.yaml: `backends.kubernetes` and a stage's `kubernetes:` (an Indexed Job or a
PyTorchJob). Keys map 1:1 to fields; the field comments are the reference for pipelines.yaml."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from bcp_pipeline.config.pod_policies import ElasticPolicy, Toleration
from bcp_pipeline.config.sections.bcp import BcpResources
from bcp_pipeline.config.sections.hooks import RankLayout, Resources
from bcp_pipeline.config.typed import Duration, Where


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
    code_dir: str = "/opt/bcp-pipeline/stages"  # the stages/ folder inside the image (${workspace}/DIR: on the claim)
    python: str = "python3"  # interpreter inside the image
    master_port: int = 29500  # the rendezvous port on the index-0 pod
    poll_seconds: float = 2.0  # first poll interval after a change ...
    poll_max_seconds: float = 15.0  # ... growing to this while nothing changes
    status_outage_limit: Duration | None = Duration("1h")  # a run stops waiting (exit 75, its jobs left running;
    # `resume` re-attaches) once listing the run's Jobs has failed for this long in a row; null: wait for ever
    image_pull_grace: Duration = Duration("5M")  # how long a pod's image may fail to come (ErrImagePull,


@dataclass(kw_only=True)
class KubernetesResources(Resources):
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
    numa_binding: bool = True  # a Megatron-Bridge rank's CPUs, and its memory where numactl may, on its GPU's NUMA node
    # (stages/rank_start.py; off: as the image and torchrun leave them)
    termination_grace: Duration | None = None  # a training pod's terminationGracePeriodSeconds: how long a deleted
    # (preempted, drained) pod's ranks have from SIGTERM to save (default: 15M for a Bridge training, an 8B save)

    counts: ClassVar[tuple[str, ...]] = ()
    image_field: ClassVar[str | None] = "image"
    gpus_field: ClassVar[str | None] = "gpus"
    nodes_field: ClassVar[str | None] = "replicas"

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

    def declared_cores(self) -> int | None:
        return self.whole_cpus()

    def node_label(self) -> str | None:
        """The EKS instance type the pods are pinned to by their node selector, if they are."""
        return self.node_selector.get(EKS_INSTANCE_LABEL)

    def validate(self, stage: Any, at: Callable[[str | None], Where]) -> None:
        """What the keys mean together: a PyTorchJob's elastic policy, an Indexed Job's per-index retries."""
        for key in ("backoff_limit", "retries_per_index", "max_failed_indexes"):
            if (value := getattr(self, key)) is not None and value < 0:
                raise at(key).error(f"kubernetes.{key} must be >= 0, got {value}")
        pods = self.rank_layout(stage.bcp).nodes
        if self.max_failed_indexes is not None:
            if self.retries_per_index is None:
                raise at("max_failed_indexes").error(
                    "kubernetes.max_failed_indexes needs retries_per_index (the Job's maxFailedIndexes counts indexes "
                    "that used up their retries)"
                )
            if self.max_failed_indexes > pods:
                raise at("max_failed_indexes").error(
                    f"kubernetes.max_failed_indexes {self.max_failed_indexes} is "
                    f"more than the stage's {pods} pods (indexes)"
                )
        if self.retries_per_index is not None:
            if self.launcher == "pytorchjob":
                raise at("retries_per_index").error(
                    "kubernetes.retries_per_index is an Indexed Job's backoffLimitPerIndex; a PyTorchJob (launcher: "
                    "pytorchjob) has none: its failed pods count against backoff_limit"
                )
            if pods > 1 and stage.trains:
                raise at("retries_per_index").error(
                    f"kubernetes.retries_per_index on stage {stage.name}, a training of {pods} pods: they meet at a "
                    "rendezvous, which a retried index could never rejoin; set it on the data stages (or null here)"
                )
        if (elastic := self.elastic_policy) is not None:
            if self.launcher != "pytorchjob":
                raise at("elastic_policy").error(
                    "kubernetes.elastic_policy is a PyTorchJob's: it needs launcher: "
                    "pytorchjob (and the Kubeflow training operator on the cluster)"
                )
            low = pods if elastic.min_replicas is None else elastic.min_replicas
            high = pods if elastic.max_replicas is None else elastic.max_replicas
            if not 1 <= low <= pods <= high:
                raise at("elastic_policy").error(
                    f"kubernetes.elastic_policy needs 1 <= min_replicas <= replicas <= max_replicas, got min_replicas "
                    f"{low}, replicas {pods} (the Worker pods created), max_replicas {high}"
                )
            if elastic.max_restarts < 0:
                raise at("elastic_policy").error(
                    f"kubernetes.elastic_policy.max_restarts must be >= 0, got {elastic.max_restarts}"
                )


EKS_INSTANCE_LABEL = "node.kubernetes.io/instance-type"
