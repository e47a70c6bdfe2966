"""The kubernetes backend's one map from what the API says of a job to JobState (pure: model objects in, states
out; no I/O). An Indexed Job is judged by its conditions, then its pods and the nodes they are on; a Kubeflow
PyTorchJob by its own conditions. Unit-tested in tests/backends/kubernetes/test_states.py, on the real control
plane in tests/e2e/test_kubernetes_e2e.py."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bcp_pipeline.backends.contract import JobState, JobStatus, map_native_state
from bcp_pipeline.backends.kubernetes.kueue import QUEUE_LABEL, kueue_wait
from bcp_pipeline.backends.kubernetes.render import INDEX_ANNOTATION, TIME_LIMIT_EXIT

# The one map from what the API says of a stage's Job to JobState. A native state is built, in this order, from:
# 1. the Job's first true terminal condition (Complete, SuccessCriteriaMet, Failed with its reason), or its
#    FailureTarget (decided to fail, its pods being stopped) or Suspended condition;
# 1b. else, where it names a Kueue queue and is suspended, the wait for Kueue's admission (PENDING/KUEUE, with the
#    queue and Kueue's own word on its Workload where one was read: "insufficient unused quota for cpu ...");
# 2. else its pods (pod_trouble): a pod on a node that stopped being Ready (its kubelet lost: NODE-LOST), or a pod
#    the cluster disrupted (the DisruptionTarget condition: preempted, evicted through the Eviction API or by the
#    kubelet, removed by taint eviction or the pod garbage collector), which the pod failure policy's Ignore rule
#    makes the Job replace (DISRUPTED);
# 3. else a pod that cannot start (pod_waiting): one the scheduler finds no room for (PENDING/UNSCHEDULABLE, with
#    its message: "0/2 nodes are available: 2 Insufficient nvidia.com/gpu"), or whose image does not come
#    (PENDING/IMAGEPULL while ErrImagePull or ImagePullBackOff lasts the image pull grace or less, then
#    FAILED/IMAGEPULL; FAILED/IMAGE at once for an image name that can never be pulled);
# 4. else its ready pod count (RUNNING, or PENDING before any pod is ready).
# Anything else is "not finished yet" (map_native_state: UNKNOWN).
STATE_MAP: dict[str, JobState] = {
    "COMPLETE": JobState.SUCCEEDED,
    "SUCCESSCRITERIAMET": JobState.SUCCEEDED,  # an Indexed Job's success policy met (other indexes stopping)
    "FAILED/BACKOFFLIMITEXCEEDED": JobState.FAILED,  # its programs failed more than backoffLimit times
    "FAILED/PODFAILUREPOLICY": JobState.FAILED,  # a FailJob rule of the pod failure policy failed the Job
    # ... the gang rule (render.is_gang): a pod of a training was disrupted, so the attempt ended whole; lost, as a
    # lost node is: a continuation resubmits it (its default resubmit_on), else resume runs it again.
    "FAILED/DISRUPTED": JobState.LOST,
    # ... the time-limit rule: a pod's own timer (time_limiter.sh) ended it at the stage's runtime, counted from
    # its container's start; a per-job stop, continued like BCP's and Slurm's time limits.
    "FAILED/TIMELIMIT": JobState.TIMED_OUT,
    # retries_per_index (backoffLimitPerIndex): an index used up its retries; its Job failed once every index had
    # ended (FailedIndexes), or at once past maxFailedIndexes. The detail names the failed indexes.
    "FAILED/MAXFAILEDINDEXESEXCEEDED": JobState.FAILED,
    "FAILED/FAILEDINDEXES": JobState.FAILED,
    "FAILED/DEADLINEEXCEEDED": JobState.TIMED_OUT,  # activeDeadlineSeconds ran out (a Job rendered with one)
    # Decided to fail, its pods still being stopped: not finished until they are (the Failed condition follows),
    # so the stage's next attempt never overlaps this one's processes.
    "FAILURETARGET/BACKOFFLIMITEXCEEDED": JobState.RUNNING,
    "FAILURETARGET/PODFAILUREPOLICY": JobState.RUNNING,
    "FAILURETARGET/DEADLINEEXCEEDED": JobState.RUNNING,
    "FAILURETARGET/MAXFAILEDINDEXESEXCEEDED": JobState.RUNNING,
    "FAILURETARGET/FAILEDINDEXES": JobState.RUNNING,
    "SUSPENDED": JobState.QUEUED,
    # Created suspended in a Kueue queue (kubernetes.queue) and not admitted yet, or suspended again by Kueue
    # (preempted by a job of higher priority): waiting, never running or failed; its pods do not exist yet.
    "PENDING/KUEUE": JobState.QUEUED,
    # A pod on a node that is no longer Ready: the kubelet is gone, nothing on the node runs or reports, and the
    # Job controller replaces the pod only once the node is removed. The job is lost; the stage's next attempt
    # (resume) first deletes this Job (KubernetesBackend.submit), so no replacement pod ever runs beside it.
    "NODE-LOST": JobState.LOST,
    # A disrupted pod (DisruptionTarget): the Job replaces it itself (podFailurePolicy: Ignore); the stage waits.
    "DISRUPTED": JobState.PREEMPTED,
    # Waiting, and said why: the cluster may yet find room (an autoscaler adds a node) or the registry recover.
    "PENDING/UNSCHEDULABLE": JobState.QUEUED,
    "PENDING/IMAGEPULL": JobState.QUEUED,
    # The image did not come within the grace period, or its name can never be pulled: no wait until the deadline.
    "FAILED/IMAGEPULL": JobState.FAILED,
    "FAILED/IMAGE": JobState.FAILED,
    "RUNNING": JobState.RUNNING,  # pods ready
    "PENDING": JobState.QUEUED,  # pods created, none ready (unscheduled, starting)
}
# The Job controller's message when a pod's condition matched a FailJob rule (pkg/controller/job/pod_failure_policy.go:
# "Pod NS/NAME has condition DisruptionTarget matching FailJob rule at index 0"); only the gang rule matches it.
GANG_RULE_MESSAGE = "has condition DisruptionTarget matching FailJob rule"
# ... and when a container's exit code matched one ("Container stage for pod NS/NAME failed with exit code 124
# matching FailJob rule at index 1"): only the time-limit rule matches this code.
TIME_LIMIT_RULE_MESSAGE = f"failed with exit code {TIME_LIMIT_EXIT} matching FailJob rule"
# The default of backends.kubernetes.image_pull_grace: a registry's passing failure (throttling, a restart) is
# retried by the kubelet meanwhile.
IMAGE_PULL_GRACE_SECONDS = 300
IMAGE_PULL_WAITING = ("ErrImagePull", "ImagePullBackOff")
IMAGE_NEVER = ("InvalidImageName", "ErrImageNeverPull")  # nothing the kubelet retries can fix
# A PyTorchJob's conditions (kubeflow.org/v1 JobConditionType), the last true one deciding.
PYTORCHJOB_STATE_MAP: dict[str, JobState] = {
    "CREATED": JobState.QUEUED,
    "RUNNING": JobState.RUNNING,
    "RESTARTING": JobState.RUNNING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "SUSPENDED": JobState.QUEUED,
    "PENDING/KUEUE": JobState.QUEUED,  # runPolicy.suspend in a Kueue queue, not admitted yet (as a Job's)
    "FAILED/DEADLINEEXCEEDED": JobState.TIMED_OUT,  # runPolicy.activeDeadlineSeconds ran out (one rendered so)
    "FAILED/TIMELIMIT": JobState.TIMED_OUT,  # a pod's own timer (time_limiter.sh) ended it at the limit
}
# The training operator's one word for that (common/pkg/controller.v1/common/job.go, pastActiveDeadline): its Failed
# condition's reason names only the kind, the message says why.
PYTORCHJOB_DEADLINE_MESSAGE = "active longer than specified deadline"
TERMINAL_PHASES = ("Succeeded", "Failed")
REPLICA_TYPE_LABEL, REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-type", "training.kubeflow.org/replica-index"


def job_condition(job: Any) -> tuple[str, str] | None:
    """(native, detail) from the Job's conditions: a true Complete, SuccessCriteriaMet or Failed first, then a true
    FailureTarget or Suspended; None when none is true."""
    true = [c for c in job.status.conditions or [] if c.status == "True"]
    for condition in true:
        kind = condition.type.upper()
        if kind == "FAILED":
            reason = (condition.reason or "").upper()
            if reason == "PODFAILUREPOLICY" and GANG_RULE_MESSAGE in (condition.message or ""):
                reason = "DISRUPTED"
            elif reason == "PODFAILUREPOLICY" and TIME_LIMIT_RULE_MESSAGE in (condition.message or ""):
                reason = "TIMELIMIT"
            return f"FAILED/{reason}", with_failed_indexes(job, condition.message or "")
        if kind in ("COMPLETE", "SUCCESSCRITERIAMET"):
            return kind, condition.message or ""
    for condition in true:
        kind = condition.type.upper()
        if kind == "FAILURETARGET":
            return f"FAILURETARGET/{(condition.reason or '').upper()}", condition.message or ""
        if kind == "SUSPENDED":
            return kind, condition.message or ""
    return None


def with_failed_indexes(job: Any, message: str) -> str:
    """A failed Job's message, and the indexes that used up their retries where it has per-index retries (the
    Job's status.failedIndexes, e.g. "1,3-4"): which shards to look at."""
    failed = getattr(job.status, "failed_indexes", None)
    return f"{message} (failed indexes: {failed})" if failed else message


def pod_trouble(pods: list[Any], ready_nodes: set[str] | None) -> tuple[str, str] | None:
    """NODE-LOST when a pod that has not ended is bound to a node not in `ready_nodes` (None: nodes unknown, not
    judged); else DISRUPTED when a pod carries a true DisruptionTarget condition; else None."""
    live = [p for p in pods if (p.status.phase if p.status else None) not in TERMINAL_PHASES]
    if ready_nodes is not None:
        for pod in live:
            if pod.spec.node_name and pod.spec.node_name not in ready_nodes:
                return "NODE-LOST", (
                    f"pod {pod.metadata.name} is on node {pod.spec.node_name}, which is not Ready "
                    "(its kubelet stopped reporting): the pod's processes are gone or unreachable"
                )
    for pod in newest_per_index(pods):  # a disrupted pod already replaced is past trouble
        for condition in (pod.status.conditions if pod.status else None) or []:
            if condition.type == "DisruptionTarget" and condition.status == "True":
                return "DISRUPTED", (
                    f"pod {pod.metadata.name} was disrupted ({condition.reason}: "
                    f"{condition.message or 'no message'}); the Job replaces it"
                )
    return None


def pod_waiting(pods: list[Any], now: float, grace: float = IMAGE_PULL_GRACE_SECONDS) -> tuple[str, str] | None:
    """Why the newest pod of an index cannot start, where one cannot (see STATE_MAP, 3); None when none waits so.
    `grace`: how long an image may fail to come before the job fails."""
    for pod in newest_per_index(pods):
        status = pod.status
        if status is None or status.phase in TERMINAL_PHASES:
            continue
        for condition in status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False" and condition.reason == "Unschedulable":
                return "PENDING/UNSCHEDULABLE", f"pod {pod.metadata.name} cannot be scheduled: {condition.message}"
        for container in status.container_statuses or []:
            waiting = container.state.waiting if container.state else None
            if waiting is None:
                continue
            said = f"pod {pod.metadata.name}: {waiting.reason}: {waiting.message or 'no message'}"
            if waiting.reason in IMAGE_NEVER:
                return "FAILED/IMAGE", said
            if waiting.reason in IMAGE_PULL_WAITING:
                since = status.start_time or pod.metadata.creation_timestamp
                waited = max(0.0, now - since.timestamp()) if since else 0.0
                if waited > grace:
                    return (
                        "FAILED/IMAGEPULL",
                        f"{said} (for {waited:.0f} s: the image cannot be pulled; check its "
                        "name and the registry's credentials, kubernetes image_pull_secrets)",
                    )
                return "PENDING/IMAGEPULL", f"{said} (for {waited:.0f} s; the stage fails after {grace:.0f} s)"
    return None


def completion_index(pod: Any) -> int:
    """A pod's place in its job: an Indexed Job's completion index; a PyTorchJob's Master 0, Worker i i + 1 (the
    training operator's replica labels), as the operator numbers node ranks."""
    annotations, labels = pod.metadata.annotations or {}, pod.metadata.labels or {}
    if INDEX_ANNOTATION in annotations:
        return int(annotations[INDEX_ANNOTATION])
    index = int(labels.get(REPLICA_INDEX_LABEL, 0))
    return index + 1 if labels.get(REPLICA_TYPE_LABEL) == "worker" else index


def newest_per_index(pods: list[Any]) -> list[Any]:
    """The latest pod of each completion index (a replaced pod's successor)."""
    newest: dict[int, Any] = {}
    for pod in sorted(pods, key=lambda p: p.metadata.creation_timestamp):
        newest[completion_index(pod)] = pod
    return list(newest.values())


def native_state(
    job: Any,
    pods: Sequence[Any] = (),
    ready_nodes: set[str] | None = None,
    now: float | None = None,
    image_pull_grace: float = IMAGE_PULL_GRACE_SECONDS,
    kueue_message: str | None = None,
) -> tuple[str, str]:
    """(STATE_MAP key, detail) of a batch/v1 Job object and its pods (see STATE_MAP for the order); `now`: the
    time an image pull's wait is measured to (default: the clock's); `image_pull_grace`: how long it may last;
    `kueue_message`: what Kueue says of the Job's Workload (workload_message)."""
    decided = job_condition(job)
    if decided is not None and decided[0] != "SUSPENDED":
        return decided
    queue = (job.metadata.labels or {}).get(QUEUE_LABEL)
    waiting_for_kueue = kueue_wait(queue, bool(job.spec and job.spec.suspend), kueue_message)
    if waiting_for_kueue is not None:
        return waiting_for_kueue
    if decided is not None:
        return decided
    trouble = pod_trouble(list(pods), ready_nodes)
    if trouble is not None:
        return trouble
    waiting = pod_waiting(list(pods), time.time() if now is None else now, image_pull_grace)
    if waiting is not None:
        return waiting
    return ("RUNNING" if (job.status.ready or 0) > 0 else "PENDING"), ""


def ready_node_names(nodes: list[Any]) -> set[str]:
    """The Nodes whose Ready condition is True (a lost kubelet's node turns Unknown within the node monitor's
    grace period)."""
    return {
        node.metadata.name
        for node in nodes
        if any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
    }


def pytorchjob_status(obj: dict[str, Any], pods: Sequence[Any] = (), kueue_message: str | None = None) -> JobStatus:
    """A PyTorchJob (a dict from the custom-objects API): its last true condition decides, but for one not ended that
    waits suspended in a Kueue queue (kueue_wait); a failed one whose pod exited by its time limit
    (time_limiter.sh: the operator's condition names only failed replicas, so the pods' exit codes tell)
    timed out."""
    conditions = [c for c in obj.get("status", {}).get("conditions", []) if c.get("status") == "True"]
    native = conditions[-1]["type"].upper() if conditions else "CREATED"
    detail = conditions[-1].get("message", "") if conditions else ""
    if native == "FAILED" and PYTORCHJOB_DEADLINE_MESSAGE in detail:
        native = "FAILED/DEADLINEEXCEEDED"  # a per-job stop, continued like BCP's and Slurm's time limits
    elif native == "FAILED" and (timed := [p.metadata.name for p in pods if exit_code(p) == TIME_LIMIT_EXIT]):
        native = "FAILED/TIMELIMIT"
        detail = f"{detail} The stage's time limit ran out: pod {', '.join(timed)} exited {TIME_LIMIT_EXIT}.".strip()
    if not native.startswith(("SUCCEEDED", "FAILED")):
        suspended = bool(obj.get("spec", {}).get("runPolicy", {}).get("suspend"))
        queue = obj["metadata"].get("labels", {}).get(QUEUE_LABEL)
        native, detail = kueue_wait(queue, suspended, kueue_message) or (native, detail)
    state = map_native_state(native, PYTORCHJOB_STATE_MAP)
    return JobStatus(
        job_id=obj["metadata"]["name"],
        state=state,
        native=native,
        detail=detail,
        exit_code=(0 if state is JobState.SUCCEEDED else 1) if state.finished else None,
    )


def exit_code(pod: Any) -> int | None:
    """The exit code of a pod's ended first container; None while it has not ended."""
    for container in (pod.status.container_statuses if pod.status else None) or []:
        terminated = container.state.terminated if container.state else None
        if terminated is not None:
            return terminated.exit_code
    return None


def status_of(
    job: Any,
    pods: Sequence[Any] = (),
    ready_nodes: set[str] | None = None,
    now: float | None = None,
    image_pull_grace: float = IMAGE_PULL_GRACE_SECONDS,
    kueue_message: str | None = None,
) -> JobStatus:
    native, detail = native_state(job, pods, ready_nodes, now, image_pull_grace, kueue_message)
    state = map_native_state(native, STATE_MAP)
    return JobStatus(
        job_id=job.metadata.name,
        state=state,
        native=native,
        detail=detail,
        exit_code=(0 if state is JobState.SUCCEEDED else 1) if state.finished else None,
    )
