"""Pure rendering of a stage into Kubernetes manifests (no I/O), golden-tested in tests/golden/kubernetes/.

A stage job is a headless Service (its pods' DNS names: the rendezvous) and one batch/v1 Job in Indexed mode:
completions = parallelism = the stage's pods (config/resources.rank_layout, the one place for nodes x processes),
each pod running `processes` processes of the stage program with RANK = JOB_COMPLETION_INDEX x processes +
LOCAL_RANK, MASTER_ADDR the index-0 pod's DNS name (`JOB-0.JOB`, through the Service) and a fixed MASTER_PORT.
The stage's runtime is a time limit each pod's container keeps itself (time_limited: counted from the container's
start, not from the Job's creation, so time spent waiting for capacity is not taken from it); `backoffLimit` counts
failed programs while the pod failure policy ignores disrupted pods (preempted, evicted, drained: the
DisruptionTarget condition), which the Job replaces, and fails the Job at once when a pod's limit runs out.
`launcher: pytorchjob` renders a Kubeflow PyTorchJob (kubeflow.org/v1) instead: Master + Worker replicas, the
training operator sets RANK/WORLD_SIZE/MASTER_ADDR itself.

A `megatron_bridge:` stage runs NVIDIA's Megatron-Bridge in its pods: each pod writes the data list (the same file,
atomically), then one torchrun starts a rank a GPU of stages/bridge_pretrain.py (static rendezvous at the index-0
pod in an Indexed Job; the operator's in a PyTorchJob); each pod asks for its GPUs (kubernetes.gpus, else the BCP
instance's). A `nemo:` stage runs NVIDIA's NeMo launcher the same way (nemo_pod.py): the first pod composes the
training config with the launcher's debug mode, then one torchrun in each pod runs NeMo's training script, a rank a
GPU, each pod asking for its GPUs.

The workspace is the PVC `workspace_claim`, mounted at the pipeline's workspace mount (the path the stage programs
use on BCP); secrets are Kubernetes Secrets referenced by name (`secretKeyRef`): no value is ever in a manifest.

The pods' commands run inside small bash wrappers, templates beside this module: the time limit
(time_limiter.sh), a plain stage's processes with their `[rankN]:` lines (pod_launcher.sh), and a PyTorchJob's
Master ending last (master_last.sh). `printable` is the manifests as `plan` prints them and `run` records them.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.kubernetes import kueue, nemo_pod
from bcp_pipeline.backends.kubernetes.training_checks import check_stages_in_image
from bcp_pipeline.backends.shared import templates
from bcp_pipeline.backends.shared.bridge_command import data_list_argv as bridge_data_list_argv
from bcp_pipeline.backends.shared.bridge_command import data_list_file, gpus_per_node, trains_with_bridge
from bcp_pipeline.backends.shared.bridge_command import rank_argv as bridge_rank_argv
from bcp_pipeline.backends.shared.command import placeholder_values, resolved_env, shell_join, stage_command
from bcp_pipeline.config.bridge import ENTRY_PROGRAM
from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.placeholders import substitute
from bcp_pipeline.config.pod_policies import ElasticPolicy
from bcp_pipeline.config.resources import KubernetesOptions, KubernetesResources, RankLayout
from bcp_pipeline.errors import SubmissionError

MANAGED_BY = "bcp-pipeline"
LABEL_RUN, LABEL_STAGE, LABEL_KIND, LABEL_JOB = (
    "bcp-pipeline/run",
    "bcp-pipeline/stage",
    "bcp-pipeline/kind",
    "bcp-pipeline/job",
)
CONTAINER = "stage"
NAME_MAX = 52  # a Job name; its pods are JOB-INDEX-xxxxx, and JOB-INDEX must stay a 63-character DNS label
UNSAFE = re.compile(r"[^a-z0-9-]+")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"

# The stage's time limit, kept by each pod's container itself (time_limiter.sh says how, and why not the Job's
# activeDeadlineSeconds: a Job waiting for capacity would lose its runtime to the queue; docs/backends/kubernetes.md,
# "Time limit"). The pod failure policy turns TIME_LIMIT_EXIT into a failed Job that states.py reads as timed out.
TIME_LIMIT_EXIT = 124  # as timeout(1)'s
STOP_SECONDS_ENV = "BCP_PIPELINE_STOP_SECONDS"  # how long the timer's SIGTERM gives the processes before it exits
# A Bridge training pod's time from SIGTERM to its ranks' end (kubernetes.termination_grace, else this): torchrun's wait
# for them (TORCH_ELASTIC_SHUTDOWN_TIMEOUT: torch 2.13 reads it; a torchrun without it SIGKILLs them 30 s after its
# SIGTERM) and the timer's (STOP_SECONDS_ENV); the pod's terminationGracePeriodSeconds is that plus POD_GRACE_SLACK
# (the wrappers' own exit), so a deleted pod's save is not cut by the kubelet's SIGKILL. 15 minutes: an 8B save
# (~96 GB of weights and optimizer state, every rank writing at once) takes minutes on a parallel file system.
TRAINING_GRACE_SECONDS = 900
POD_GRACE_SLACK = 30
TIME_LIMITER = templates.fill(
    templates.load(__package__, "time_limiter.sh", one_line=True), TIME_LIMIT_EXIT=str(TIME_LIMIT_EXIT)
)
# One rank's lines in a pod's log, which all the pod's ranks share: every line a rank prints starts `[rankN]:`,
# torchrun's own form, so `logs --rank N` and `logs --follow --rank N` take them out of pods/log (shared/logs.py
# rank_lines), and `kubectl logs` shows them as they came. Per-rank files on the workspace would need a pod to read
# them back: the workspace is a volume of the cluster, not a folder of the orchestrator's. POD_LAUNCHER starts a
# plain stage's processes so; torchrun (Megatron-Bridge and NeMo pods, PyTorchJobs) writes its ranks' lines so too:
# `--tee 3` copies each rank's stdout and stderr to the console, each line headed by this template of
# torch.distributed.elastic (`[rank${rank}]:`).
POD_LAUNCHER = templates.load(__package__, "pod_launcher.sh", one_line=True)
TORCHRUN_PREFIX_ENV = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:"}
TORCHRUN_TEE = "--tee=3"
# A PyTorchJob's Master ends last, so `cleanPodPolicy: Running` frees a failed job's GPUs without deleting a
# finished job's Workers, with their logs. The training operator ends a Master + Worker PyTorchJob when its Master
# pod ends, then deletes the pods still running. On a failure that is what a user wants (no pod holds its GPUs
# while it waits at a collective). On a success the Workers are still exiting when the Master has ended, and a
# Worker deleted then takes its log with it (Megatron-Bridge prints its training log from the last rank, a Worker).
# So each pod of such a job runs its command under MASTER_LAST (master_last.sh): the Master waits for every pod's
# end mark, in a folder of the attempt on the workspace. The time limit's timer keeps running around it.
MASTER_LAST = templates.load(__package__, "master_last.sh", one_line=True)
END_WAIT_SECONDS = 600  # the Master waits this long at most for the other pods' marks (a Worker ending slowly)
END_GRACE_SECONDS = 10  # then this long, for the Workers' pods to be reported ended (a kubelet's status update)


@dataclass(frozen=True, kw_only=True)
class Shape:
    """A stage's pods after deriving unset fields from the BCP section and the backend options."""

    pods: int
    processes: int
    image: str
    deadline_seconds: int | None


def label_value(text: str) -> str:
    """A label value (63 characters of [A-Za-z0-9_.-]): longer ones keep their start and gain a hash."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", text).strip("_.-")
    if len(clean) <= 63:
        return clean
    return f"{clean[:54]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def job_name(request: JobRequest) -> str:
    """`RUN-STAGE[-verify]-aN` as a DNS label: unique per attempt, so a stage's next attempt never meets the last
    one's Job still being deleted."""
    suffix = ("-verify" if request.kind == "verify" else "") + f"-a{request.attempt}"
    base = UNSAFE.sub("-", f"{request.run_id}-{request.stage.name}".lower()).strip("-")
    if not base[:1].isalpha():  # a pipeline named 8b: the Service's (and a PyTorchJob's) name must start with a letter
        base = f"p{base}"
    if len(base) + len(suffix) > NAME_MAX:
        digest = hashlib.sha256(base.encode()).hexdigest()[:6]
        base = f"{base[: NAME_MAX - len(suffix) - 7].rstrip('-')}-{digest}"
    return base + suffix


def selector_labels(run_id: str, stage: str | None = None, kind: str | None = None) -> str:
    """A label selector for one run's jobs (one stage's, of one kind): what each poll lists by."""
    parts = [f"app.kubernetes.io/managed-by={MANAGED_BY}", f"{LABEL_RUN}={label_value(run_id)}"]
    if stage is not None:
        parts.append(f"{LABEL_STAGE}={label_value(stage)}")
    if kind is not None:
        parts.append(f"{LABEL_KIND}={kind}")
    return ",".join(parts)


def shape(request: JobRequest, options: KubernetesOptions) -> Shape:
    res: KubernetesResources = request.resources("kubernetes")
    bcp = request.resources("bcp")
    layout = request.rank_layout("kubernetes")
    if trains_with_bridge(request, "kubernetes"):  # one rank a GPU
        layout = RankLayout(nodes=layout.nodes, per_node=gpus_per_node(request, "kubernetes"))
    elif nemo_pod.trains_with_nemo(request):  # one rank a GPU, as NeMo's trainer.devices says
        layout = RankLayout(nodes=layout.nodes, per_node=nemo_pod.gpus_per_pod(request))
    image = res.image or bcp.image or options.image
    if min(layout.nodes, layout.per_node) < 1:
        raise SubmissionError(
            f"{request.label}: kubernetes replicas and processes must be >= 1, got {layout.nodes} x {layout.per_node}"
        )
    if not image:
        raise SubmissionError(
            f"{request.label}: no container image: set the stage's kubernetes.image (or "
            "bcp.image), or backends.kubernetes.image"
        )
    deadline = res.active_deadline or bcp.total_runtime
    return Shape(
        pods=layout.nodes,
        processes=layout.per_node,
        image=image,
        deadline_seconds=parse_duration(deadline) if deadline else None,
    )


def job_values(request: JobRequest, options: KubernetesOptions) -> dict[str, str]:
    mount = request.pipeline.workspace.mount.rstrip("/")
    code = substitute(options.code_dir, {"workspace": mount}).rstrip("/")  # ${workspace}/...: stages/ on the claim
    return placeholder_values(
        request,
        workspace=mount,
        code=code,
        python=options.python,
        results=f"{mount}/.bcp-pipeline/results/{request.run_id}/{request.stage.name}",
    )


def labels(request: JobRequest, name: str) -> dict[str, str]:
    """The backend's labels (what it lists and selects by), after the stage's own `labels`, which cannot replace
    them."""
    return {
        **request.resources("kubernetes").labels,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_RUN: label_value(request.run_id),
        LABEL_STAGE: label_value(request.stage.name),
        LABEL_KIND: request.kind,
        LABEL_JOB: name,
    }


def metadata(request: JobRequest, job: str, namespace: str | None = None) -> dict[str, Any]:
    """The metadata of the job `job` (with its `namespace`) or of its pod template (without): the labels (the job's
    with its Kueue queue, where it has one), and the stage's annotations where it has some."""
    res: KubernetesResources = request.resources("kubernetes")
    annotations = dict(res.annotations)
    named = {"name": job, "namespace": namespace} if namespace else {}
    queue = {kueue.QUEUE_LABEL: res.queue} if namespace and res.queue else {}
    return {
        **named,
        "labels": {**labels(request, job), **queue},
        **({"annotations": annotations} if annotations else {}),
    }


def container_env(request: JobRequest, options: KubernetesOptions, size: Shape, name: str) -> list[dict[str, Any]]:
    """The container's environment: the rendezvous, the stage's env, and each secret as a secretKeyRef."""
    res: KubernetesResources = request.resources("kubernetes")
    world = size.pods * size.processes
    env: list[dict[str, Any]] = [
        {"name": "BCP_PIPELINE_RUN_ID", "value": request.run_id},
        {"name": "BCP_PIPELINE_STAGE", "value": request.stage.name},
        {"name": "BCP_PIPELINE_PROCESSES", "value": str(size.processes)},
        {"name": "WORLD_SIZE", "value": str(world)},
        {"name": "LOCAL_WORLD_SIZE", "value": str(size.processes)},
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}},
        {"name": "MASTER_ADDR", "value": f"{name}-0.{name}"},
        {"name": "MASTER_PORT", "value": str(options.master_port)},
    ]
    given = resolved_env(request, "kubernetes", job_values(request, options))
    if res.efa:  # EFA requested: NCCL's libfabric plugin must be told to use it, or it falls back to TCP silently
        given = {**EFA_ENV, **given}
    for key, value in given.items():
        if not ENV_NAME.match(key):
            raise SubmissionError(f"{request.label}: kubernetes env name {key!r} is not a valid variable name")
        env.append({"name": key, "value": value})
    for spec in res.secrets:
        parts = spec.split(":")
        if len(parts) != 3 or not all(parts):
            raise SubmissionError(
                f"{request.label}: kubernetes secret {spec!r} must be SECRET:KEY:ENV (a "
                "Kubernetes Secret's key, exposed as the variable ENV)"
            )
        secret, key, variable = parts
        env.append({"name": variable, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    return env


EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}  # aws-ofi-nccl's settings (AWS's EKS docs)


def shared_memory(res: KubernetesResources, size: Shape, gpus: int | None) -> dict[str, Any] | None:
    """/dev/shm as a memory emptyDir where the pod needs more than the runtime's 64 MiB: GPUs (NCCL), several
    processes (their shared tensors), or a `shm_size` asked for; None elsewhere."""
    if not (res.shm_size or res.gpus or gpus or size.processes > 1):
        return None
    return {"name": "dshm", "emptyDir": {"medium": "Memory", **({"sizeLimit": res.shm_size} if res.shm_size else {})}}


def resources_of(res: KubernetesResources, gpus: int | None = None) -> dict[str, Any]:
    """Requests = limits of the pod: `gpus` where the training asks for them and the section names none."""
    amounts = {
        "cpu": res.cpu,
        "memory": res.memory,
        "nvidia.com/gpu": res.gpus or gpus or None,
        "vpc.amazonaws.com/efa": res.efa or None,
    }
    given = {key: str(value) for key, value in amounts.items() if value}
    return {"requests": given, "limits": given} if given else {}


def pod_spec(request: JobRequest, options: KubernetesOptions, size: Shape, name: str) -> dict[str, Any]:
    res: KubernetesResources = request.resources("kubernetes")
    mount = request.pipeline.workspace.mount.rstrip("/")
    bridge, nemo = trains_with_bridge(request, "kubernetes"), nemo_pod.trains_with_nemo(request)
    engine = bridge or nemo  # a training engine's pod: a rank a GPU, its GPUs requested
    if bridge:
        command, program = bridge_pod_command(request, options, size, torchrun_rendezvous=True)
    elif nemo:
        command, program = nemo_pod_command(request, options, size, torchrun_rendezvous=True)
    else:
        command = ["bash", "-c", POD_LAUNCHER, "bcp-pipeline-pod"]
        program = stage_command(request, "kubernetes", job_values(request, options))
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": size.image,
        "command": time_limited(command, size.deadline_seconds),
        "args": program,
        "workingDir": mount,
        "env": container_env(request, options, size, name),
        "volumeMounts": [{"name": "workspace", "mountPath": mount, "readOnly": request.kind == "verify"}],
    }
    if engine:
        with_torchrun_prefix(container)
    if grace := grace_seconds(request):  # time for a SIGTERM'd training's save, before the kubelet's SIGKILL
        given = {e["name"] for e in container["env"]}
        container["env"] += [{"name": k, "value": v} for k, v in stop_env(grace).items() if k not in given]
    if resources := resources_of(res, size.processes if engine else None):
        container["resources"] = resources
    # No API token in the pods unless a stage asks for one (mount_service_account_token): the stage programs never
    # call the Kubernetes API, and a mounted token is a credential any code in the image can read.
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": name,
        "automountServiceAccountToken": res.mount_service_account_token,
        "containers": [container],
        "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": options.workspace_claim}}],
    }
    if shm := shared_memory(res, size, size.processes if engine else None):
        spec["volumes"].append(shm)
        container["volumeMounts"].append({"name": shm["name"], "mountPath": "/dev/shm"})
    if res.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": secret} for secret in res.image_pull_secrets]
    if res.priority_class:
        spec["priorityClassName"] = res.priority_class
    if grace:
        spec["terminationGracePeriodSeconds"] = grace + POD_GRACE_SLACK
    if size.pods > 1:  # a pod per node where the nodes allow it, as a multi-node stage on BCP or Slurm has
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {LABEL_JOB: name}},
            }
        ]
    if service_account := res.service_account or options.service_account:
        spec["serviceAccountName"] = service_account
    if res.node_selector:
        spec["nodeSelector"] = dict(res.node_selector)
    if res.tolerations:
        spec["tolerations"] = [
            {
                key: value
                for key, value in (
                    ("key", t.key),
                    ("operator", t.operator),
                    ("value", t.value),
                    ("effect", t.effect),
                    ("tolerationSeconds", t.toleration_seconds),
                )
                if value is not None
            }
            for t in res.tolerations
        ]
    return spec


def grace_seconds(request: JobRequest) -> int | None:
    """A pod's time from SIGTERM to its end (kubernetes.termination_grace; a Bridge training's default covers an
    8B checkpoint save: TRAINING_GRACE_SECONDS); None: the kubelet's 30 s."""
    given = request.resources("kubernetes").termination_grace
    if given:
        return parse_duration(given)
    return TRAINING_GRACE_SECONDS if trains_with_bridge(request, "kubernetes") else None


def stop_env(grace_seconds: int) -> dict[str, str]:
    """A training pod's variables that give its ranks `grace_seconds` from SIGTERM (see TRAINING_GRACE_SECONDS)."""
    return {STOP_SECONDS_ENV: str(grace_seconds), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(grace_seconds)}


def time_limited(command: list[str], seconds: int | None) -> list[str]:
    """`command` run under the container's own timer (TIME_LIMITER) where the stage has a time limit."""
    if seconds is None:
        return command
    return ["bash", "-c", TIME_LIMITER, "bcp-pipeline-time-limit", str(seconds), *command]


def master_last(
    command: list[str],
    ends_dir: str,
    pods: int,
    *,
    wait_seconds: int = END_WAIT_SECONDS,
    grace_seconds: int = END_GRACE_SECONDS,
) -> list[str]:
    """`command` under MASTER_LAST: its pod's end marked in `ends_dir`, the Master waiting for all `pods`."""
    return [
        "bash",
        "-c",
        MASTER_LAST,
        "bcp-pipeline-master-last",
        ends_dir,
        str(pods),
        str(wait_seconds),
        str(grace_seconds),
        *command,
    ]


def with_torchrun_prefix(container: dict[str, Any]) -> None:
    """The torchrun container's rank line prefix (TORCHRUN_PREFIX_ENV), unless the stage's env sets its own."""
    given = {e["name"] for e in container["env"]}
    container["env"] += [
        {"name": key, "value": value} for key, value in TORCHRUN_PREFIX_ENV.items() if key not in given
    ]


def bridge_pod_command(
    request: JobRequest, options: KubernetesOptions, size: Shape, *, torchrun_rendezvous: bool
) -> tuple[list[str], list[str]]:
    """A Bridge pod's command and args: the data list, then one torchrun of the pod's ranks (the entry program and
    its arguments are the args). `torchrun_rendezvous`: the Indexed Job's static rendezvous at the index-0 pod; else
    the PyTorchJob operator's (torchrun reads its PET_* variables)."""
    values = job_values(request, options)
    deadline = None if size.deadline_seconds is None else f"{size.deadline_seconds}s"
    entry = bridge_rank_argv(request, "kubernetes", values, deadline)
    entry_file = f"{values['code']}/{ENTRY_PROGRAM}"
    missing = (
        f"bcp-pipeline: no {entry_file} in this pod: stages/ must be at backends.kubernetes.code_dir "
        "(baked into the image, or copied onto the workspace claim): docs/backends/kubernetes.md"
    )
    script = (
        f"{{ [ -f {shlex.quote(entry_file)} ] || {{ echo {shlex.quote(missing)} >&2; exit 2; }}; }} && "
        f"mkdir -p {shlex.quote(data_list_file(request, values).rsplit('/', 1)[0])} && "
        f"{shell_join(bridge_data_list_argv(request, values))} && "
        f'exec {torchrun(options, size, torchrun_rendezvous)} "$@"'
    )
    return ["bash", "-c", script, "bcp-pipeline-pod"], entry[2:]  # past `python -u`: torchrun runs the script


def nemo_pod_command(
    request: JobRequest, options: KubernetesOptions, size: Shape, *, torchrun_rendezvous: bool
) -> tuple[list[str], list[str]]:
    """A NeMo launcher pod's command and args (nemo_pod.py): the script, then NeMo's training script and its config
    as the args. The first pod: completion index 0, or the operator's PET_NODE_RANK 0 in a PyTorchJob."""
    pod, args = nemo_pod.nemo_pod(
        request,
        job_values(request, options),
        job=job_name(request),
        pods=size.pods,
        gpus=size.processes,
        deadline_seconds=size.deadline_seconds,
        torchrun=torchrun(options, size, torchrun_rendezvous),
        node_index='"$JOB_COMPLETION_INDEX"' if torchrun_rendezvous else '"$PET_NODE_RANK"',
    )
    return ["bash", "-c", nemo_pod.render(pod), "bcp-pipeline-pod"], args


def torchrun(options: KubernetesOptions, size: Shape, rendezvous_args: bool) -> str:
    """torchrun by its module (shell text), a process a GPU of the pod; `rendezvous_args`: the Indexed Job's static
    rendezvous at the index-0 pod; else the PyTorchJob operator's (torchrun reads its PET_* variables)."""
    words = [options.python, "-m", "torch.distributed.run", f"--nproc_per_node={size.processes}", TORCHRUN_TEE]
    if rendezvous_args:
        words += [
            f"--nnodes={size.pods}",
            '--node_rank="$JOB_COMPLETION_INDEX"',
            '--master_addr="$MASTER_ADDR"',
            '--master_port="$MASTER_PORT"',
        ]
    return " ".join(words)


def is_gang(request: JobRequest, size: Shape) -> bool:
    """A stage job whose pods meet at a rendezvous (a training: an engine's, or one continued to a step count) and
    so stand or fall together, rather than independent shards of data work."""
    return size.pods > 1 and request.kind == "stage" and request.stage.trains


def headless_service(request: JobRequest, options: KubernetesOptions, name: str) -> dict[str, Any]:
    """The pods' DNS names (`JOB-INDEX.JOB`): published before the pods are ready, as a rendezvous needs."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": options.namespace, "labels": labels(request, name)},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {LABEL_JOB: name}},
    }


def failure_limits(res: KubernetesResources) -> dict[str, int]:
    """An Indexed Job's limits on failed pods: `backoffLimit` alone (default 0: the first failed program fails the
    stage), or with `retries_per_index` each index's own (`backoffLimitPerIndex`: a bad shard fails its index only,
    the others going on and their outputs kept for the next attempt) and `maxFailedIndexes`. There `backoffLimit`
    is rendered only where set: the apiserver's default is then no limit across indexes, as a limit of 0 would fail
    the Job at the first failed pod, per-index retries left unused."""
    if res.retries_per_index is None:
        return {"backoffLimit": res.backoff_limit or 0}
    limits = {} if res.backoff_limit is None else {"backoffLimit": res.backoff_limit}
    limits["backoffLimitPerIndex"] = res.retries_per_index
    if res.max_failed_indexes is not None:
        limits["maxFailedIndexes"] = res.max_failed_indexes
    return limits


def elastic_policy(policy: ElasticPolicy, pods: int) -> dict[str, Any]:
    """The PyTorchJob's `elasticPolicy` (v1 CRD): unset bounds are the stage's `pods`. Not its `nProcPerNode`, which
    the operator's webhook refuses beside the spec's own `nprocPerNode` (deprecated there)."""
    return {
        "minReplicas": pods if policy.min_replicas is None else policy.min_replicas,
        "maxReplicas": pods if policy.max_replicas is None else policy.max_replicas,
        "rdzvBackend": policy.rdzv_backend,
        "maxRestarts": policy.max_restarts,
    }


def indexed_job(request: JobRequest, options: KubernetesOptions) -> dict[str, Any]:
    size = shape(request, options)
    name = job_name(request)
    res: KubernetesResources = request.resources("kubernetes")
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": size.pods,
        "parallelism": size.pods,
        **failure_limits(res),
        # A disrupted pod (preempted, evicted, its node drained or tainted away) is replaced without counting
        # against backoffLimit, where the pods are independent shards; where they meet (a gang: a training's
        # rendezvous), a replacement could never rejoin its peers, so the whole attempt fails (states.py reads it
        # as lost, which a continuation resubmits whole). A failed program (any non-zero exit) counts.
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob" if is_gang(request, size) else "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget"}],
                },
                # A pod's time limit ran out (TIME_LIMITER): the Job fails at once, read as timed out (states.py).
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [TIME_LIMIT_EXIT]},
                },
                {"action": "Count", "onExitCodes": {"containerName": CONTAINER, "operator": "NotIn", "values": [0]}},
            ]
        },
        "template": {"metadata": metadata(request, name), "spec": pod_spec(request, options, size, name)},
    }
    # No activeDeadlineSeconds: it counts from the Job's start, queue time included; the pods keep the limit.
    if res.ttl_after_finished:
        spec["ttlSecondsAfterFinished"] = parse_duration(res.ttl_after_finished)
    if res.queue:
        # Created suspended: Kueue's Job reconciler admits it (unsuspends it) once the queue's quota fits all of its
        # pods, without relying on Kueue's mutating webhook to suspend it; no pod (so no time limit's timer) starts
        # before that.
        spec["suspend"] = True
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(request, name, options.namespace),
        "spec": spec,
    }


def pytorch_job(request: JobRequest, options: KubernetesOptions) -> dict[str, Any]:
    """A Kubeflow PyTorchJob: one Master and pods-1 Workers; the operator sets RANK/WORLD_SIZE/MASTER_ADDR (one
    process per pod: its `nproc_per_node` is the stage's processes, started by torchrun inside the image). With an
    `elastic_policy`, `pods` Workers and no Master: the operator gives torchrun an elastic rendezvous instead
    (PET_RDZV_BACKEND, PET_RDZV_ENDPOINT at the first Worker, PET_NNODES=MIN:MAX, PET_MAX_RESTARTS)."""
    size = shape(request, options)
    res: KubernetesResources = request.resources("kubernetes")
    name = job_name(request)
    template = pod_spec(request, options, size, name)
    container = template["containers"][0]
    container["name"] = "pytorch"  # the training operator finds the container by this name
    # torchrun, by its module (the same program: no dependence on where the image puts the script); it reads the
    # operator's PET_NNODES/PET_NODE_RANK/PET_MASTER_ADDR/PET_MASTER_PORT for the rest of its arguments.
    if trains_with_bridge(request, "kubernetes"):
        command, container["args"] = bridge_pod_command(request, options, size, torchrun_rendezvous=False)
    elif nemo_pod.trains_with_nemo(request):
        command, container["args"] = nemo_pod_command(request, options, size, torchrun_rendezvous=False)
    else:  # the stage's program (python's script, or with --no-python a `command` of its own), a process a rank
        command = [options.python, "-m", "torch.distributed.run", f"--nproc_per_node={size.processes}", TORCHRUN_TEE]
        if container["args"][:1] == [options.python]:
            container["args"] = container["args"][1:]
        else:
            command.append("--no-python")
        with_torchrun_prefix(container)
    if res.elastic_policy is None and size.pods > 1:  # cleanPodPolicy Running, below: the Master ends last
        command = master_last(command, f"{job_values(request, options)['results']}/.pods-ended/{name}", size.pods)
    container["command"] = time_limited(command, size.deadline_seconds)
    container["env"] = [
        e
        for e in container["env"]
        if e["name"] not in ("WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")
    ]
    container["ports"] = [{"name": "pytorchjob-port", "containerPort": options.master_port}]
    template.pop("subdomain")
    replica = {"restartPolicy": "Never", "template": {"metadata": metadata(request, name), "spec": template}}
    if res.elastic_policy is not None:  # the operator's elastic mode: Workers only (its rendezvous: worker-0)
        specs: dict[str, Any] = {"Worker": {"replicas": size.pods, **replica}}
    else:
        specs = {"Master": {"replicas": 1, **replica}}
        if size.pods > 1:
            specs["Worker"] = {"replicas": size.pods - 1, **replica}
    # Running: a failed job's pods still running are deleted, so none holds its GPUs (MASTER_LAST keeps a
    # finished job's Workers). None where elastic: the operator ends it at its first Worker's success. No
    # backoffLimit unless set: its pods are never restarted (restartPolicy Never), and a job failed by it has every
    # pod deleted, the failed ones' logs with them (the operator cleans up before the job counts as ended).
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": "None" if res.elastic_policy is not None else "Running",
        **({} if res.backoff_limit is None else {"backoffLimit": res.backoff_limit}),
    }
    # No activeDeadlineSeconds (it counts queue time): each pod keeps the limit; states.py reads its exit.
    if res.ttl_after_finished:
        run_policy["ttlSecondsAfterFinished"] = parse_duration(res.ttl_after_finished)
    if res.queue:  # as an Indexed Job's (above); Kueue's kubeflow.org/pytorchjob integration admits it
        run_policy["suspend"] = True
    spec: dict[str, Any] = {"nprocPerNode": str(size.processes), "runPolicy": run_policy, "pytorchReplicaSpecs": specs}
    if res.elastic_policy is not None:
        spec["elasticPolicy"] = elastic_policy(res.elastic_policy, size.pods)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": metadata(request, name, options.namespace),
        "spec": spec,
    }


def is_pytorchjob(request: JobRequest) -> bool:
    """A stage job rendered as a Kubeflow PyTorchJob (`launcher: pytorchjob`; verification jobs never are)."""
    return request.kind == "stage" and request.resources("kubernetes").launcher == "pytorchjob"


def manifests(request: JobRequest, options: KubernetesOptions) -> list[dict[str, Any]]:
    """Everything `run` creates for one job, in creation order."""
    kueue.check_queue(request)
    check_stages_in_image(request, options, shape(request, options).image)
    if is_pytorchjob(request):
        return [pytorch_job(request, options)]
    return [headless_service(request, options, job_name(request)), indexed_job(request, options)]


class _NoAliasDumper(yaml.SafeDumper):
    """Writes a value shared by two places (one labels dict in metadata and selector) out twice: `&id001`/`*id001`
    anchors are valid YAML but unreadable in `plan`, and kubectl users never write them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def printable(objects: list[dict[str, Any]]) -> str:
    """The manifests as YAML documents, exactly as submitted (key order kept, no anchors)."""
    return yaml.dump_all(objects, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, width=120)
