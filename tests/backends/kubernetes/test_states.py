"""The kubernetes backend's one map from Job and pod conditions to JobState (backends/kubernetes/states.py), on
the client's own model objects as a list call returns them. The same states on the real control plane:
tests/e2e/test_kubernetes_e2e.py."""

from __future__ import annotations

import datetime

import pytest

from bcp_pipeline.backends.contract import JobState
from bcp_pipeline.backends.kubernetes.render import INDEX_ANNOTATION, TIME_LIMIT_EXIT
from bcp_pipeline.backends.kubernetes.states import STATE_MAP, native_state, ready_node_names, status_of

client = pytest.importorskip("kubernetes.client")
T0 = datetime.datetime(2026, 11, 26, tzinfo=datetime.timezone.utc)


def job(*conditions: tuple[str, str, str], ready: int = 0) -> client.V1Job:
    """A Job with conditions (type, status, reason)."""
    return client.V1Job(
        metadata=client.V1ObjectMeta(name="run-stage-a1"),
        status=client.V1JobStatus(
            ready=ready,
            conditions=[client.V1JobCondition(type=t, status=s, reason=r, message=f"{t} {r}") for t, s, r in conditions]
            or None,
        ),
    )


def pod(
    name: str, index: int, *, node: str = "node1", phase: str = "Running", age: int = 0, disruption: str | None = None
) -> client.V1Pod:
    conditions = [client.V1PodCondition(type="Ready", status="True")]
    if disruption:
        conditions.append(
            client.V1PodCondition(
                type="DisruptionTarget", status="True", reason=disruption, message="Eviction API: evicting"
            )
        )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            annotations={INDEX_ANNOTATION: str(index)},
            creation_timestamp=T0 + datetime.timedelta(seconds=age),
        ),
        spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(name="stage")]),
        status=client.V1PodStatus(phase=phase, conditions=conditions),
    )


def state(the_job: client.V1Job, pods: list = (), ready_nodes: set[str] | None = None) -> tuple[JobState, str]:
    status = status_of(the_job, list(pods), ready_nodes)
    return status.state, status.native


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([("Complete", "True", "CompletionsReached")], (JobState.SUCCEEDED, "COMPLETE")),
        ([("SuccessCriteriaMet", "True", "SuccessPolicy")], (JobState.SUCCEEDED, "SUCCESSCRITERIAMET")),
        ([("Failed", "True", "BackoffLimitExceeded")], (JobState.FAILED, "FAILED/BACKOFFLIMITEXCEEDED")),
        ([("Failed", "True", "PodFailurePolicy")], (JobState.FAILED, "FAILED/PODFAILUREPOLICY")),
        ([("Failed", "True", "DeadlineExceeded")], (JobState.TIMED_OUT, "FAILED/DEADLINEEXCEEDED")),
        ([("Failed", "True", "MaxFailedIndexesExceeded")], (JobState.FAILED, "FAILED/MAXFAILEDINDEXESEXCEEDED")),
        # Decided to fail while its pods are still stopping: not finished until the Failed condition comes.
        ([("FailureTarget", "True", "BackoffLimitExceeded")], (JobState.RUNNING, "FAILURETARGET/BACKOFFLIMITEXCEEDED")),
        (
            [("FailureTarget", "True", "DeadlineExceeded"), ("Failed", "True", "DeadlineExceeded")],
            (JobState.TIMED_OUT, "FAILED/DEADLINEEXCEEDED"),
        ),
        ([("Suspended", "True", "JobSuspended")], (JobState.QUEUED, "SUSPENDED")),
        ([("Suspended", "False", "JobResumed")], (JobState.QUEUED, "PENDING")),  # a false condition says nothing
        ([("Failed", "True", "SomeReasonOfAFutureRelease")], (JobState.UNKNOWN, "FAILED/SOMEREASONOFAFUTURERELEASE")),
    ],
)
def test_job_conditions_map_to_one_state(conditions: list, expected: tuple[JobState, str]) -> None:
    assert state(job(*conditions)) == expected


def test_an_unknown_failure_reason_is_not_finished_never_failed() -> None:
    assert not status_of(job(("Failed", "True", "NewReason")), [], None).state.finished


def test_ready_pods_run_and_none_ready_is_queued() -> None:
    assert state(job(ready=2), [pod("p0", 0), pod("p1", 1)], {"node1"}) == (JobState.RUNNING, "RUNNING")
    assert state(job(), [], {"node1"}) == (JobState.QUEUED, "PENDING")


def test_a_pod_on_a_node_that_is_not_ready_is_a_lost_job_with_the_node_named() -> None:
    status = status_of(job(ready=2), [pod("p0", 0), pod("p1", 1, node="node2")], {"node1"})
    assert (status.state, status.native) == (JobState.LOST, "NODE-LOST") and status.state.finished
    assert "p1" in status.detail and "node2" in status.detail
    assert status.exit_code == 1


def test_a_node_is_judged_only_for_pods_that_have_not_ended_and_only_when_nodes_are_known() -> None:
    ended = [pod("p0", 0), pod("p1", 1, node="node2", phase="Succeeded")]
    assert state(job(ready=1), ended, {"node1"}) == (JobState.RUNNING, "RUNNING")
    assert state(job(ready=2), [pod("p1", 1, node="node2")], None) == (JobState.RUNNING, "RUNNING")


def test_a_terminal_condition_wins_over_pod_trouble() -> None:
    lost = [pod("p1", 1, node="node2")]
    assert state(job(("Complete", "True", "CompletionsReached")), lost, {"node1"})[0] is JobState.SUCCEEDED
    assert state(job(("Failed", "True", "DeadlineExceeded")), lost, {"node1"})[0] is JobState.TIMED_OUT


@pytest.mark.parametrize(
    "reason",
    [
        "EvictionByEvictionAPI",
        "PreemptionByScheduler",
        "DeletionByTaintManager",
        "DeletionByPodGC",
        "TerminationByKubelet",
    ],
)
def test_a_disrupted_pod_is_preempted_not_finished_and_the_job_replaces_it(reason: str) -> None:
    status = status_of(job(ready=1), [pod("p0", 0), pod("p1", 1, phase="Failed", disruption=reason)], {"node1"})
    assert (status.state, status.native) == (JobState.PREEMPTED, "DISRUPTED") and not status.state.finished
    assert reason in status.detail and "replaces" in status.detail


def test_a_disrupted_pod_already_replaced_is_no_longer_trouble() -> None:
    replaced = [
        pod("p1-old", 1, phase="Failed", disruption="EvictionByEvictionAPI", age=0),
        pod("p1-new", 1, age=5),
        pod("p0", 0),
    ]
    assert state(job(ready=2), replaced, {"node1"}) == (JobState.RUNNING, "RUNNING")


def test_node_loss_is_told_before_a_disruption() -> None:
    pods = [pod("p0", 0, disruption="DeletionByTaintManager", node="node2")]
    assert native_state(job(ready=1), pods, {"node1"})[0] == "NODE-LOST"


def test_ready_nodes_are_those_whose_ready_condition_is_true() -> None:
    def node(name: str, ready: str) -> client.V1Node:
        return client.V1Node(
            metadata=client.V1ObjectMeta(name=name),
            status=client.V1NodeStatus(
                conditions=[
                    client.V1NodeCondition(type="MemoryPressure", status="False"),
                    client.V1NodeCondition(type="Ready", status=ready),
                ]
            ),
        )

    assert ready_node_names([node("node1", "True"), node("node2", "Unknown"), node("node3", "False")]) == {"node1"}


def test_every_mapped_native_state_is_one_the_map_can_produce() -> None:
    """No dead entries: each key is a condition the code reads, a pod trouble, a pod's wait or a pod count."""
    produced = {
        "COMPLETE",
        "SUCCESSCRITERIAMET",
        "SUSPENDED",
        "NODE-LOST",
        "DISRUPTED",
        "RUNNING",
        "PENDING",
        "PENDING/UNSCHEDULABLE",
        "PENDING/IMAGEPULL",
        "FAILED/DISRUPTED",
        "PENDING/KUEUE",
    }
    for key in STATE_MAP:
        kind, _, reason = key.partition("/")
        assert key in produced or (kind in ("FAILED", "FAILURETARGET") and reason), key


def waiting_pod(name: str, *, unschedulable: str | None = None, waiting: str | None = None) -> client.V1Pod:
    """A Pending pod the scheduler could not place (its message), or whose container waits (its reason)."""
    conditions = (
        [client.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable", message=unschedulable)]
        if unschedulable
        else None
    )
    containers = (
        [
            client.V1ContainerStatus(
                name="stage",
                image="nvcr.io/nvidia/nemo:25.11",
                image_id="",
                ready=False,
                restart_count=0,
                state=client.V1ContainerState(
                    waiting=client.V1ContainerStateWaiting(
                        reason=waiting, message='Back-off pulling image "nvcr.io/nvidia/nemo:25.11"'
                    )
                ),
            )
        ]
        if waiting
        else None
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, annotations={INDEX_ANNOTATION: "0"}, creation_timestamp=T0),
        spec=client.V1PodSpec(node_name="node1" if waiting else None, containers=[client.V1Container(name="stage")]),
        status=client.V1PodStatus(
            phase="Pending", conditions=conditions, container_statuses=containers, start_time=T0 if waiting else None
        ),
    )


def test_a_pod_that_cannot_start_says_why_and_an_unpullable_image_fails_the_job():
    now = T0.timestamp()
    message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    status = status_of(job(), [waiting_pod("p0", unschedulable=message)], {"node1"}, now=now + 600)
    assert (status.state, status.native) == (JobState.QUEUED, "PENDING/UNSCHEDULABLE")  # room may come
    assert status.detail == f"pod p0 cannot be scheduled: {message}"
    # An image pull failing: queued within the grace period, saying so; failed after it, naming the fix.
    pulling = [waiting_pod("p0", waiting="ImagePullBackOff")]
    early = status_of(job(), pulling, {"node1"}, now=now + 60)
    assert (early.state, early.native) == (JobState.QUEUED, "PENDING/IMAGEPULL")
    assert "ImagePullBackOff" in early.detail and "for 60 s; the stage fails after 300 s" in early.detail
    late = status_of(job(), pulling, {"node1"}, now=now + 301)
    assert (late.state, late.native, late.exit_code) == (JobState.FAILED, "FAILED/IMAGEPULL", 1)
    assert "image_pull_secrets" in late.detail
    # A name that can never be pulled fails at once.
    never = status_of(job(), [waiting_pod("p0", waiting="InvalidImageName")], {"node1"}, now=now)
    assert (never.state, never.native) == (JobState.FAILED, "FAILED/IMAGE")
    # Any other wait (a container being created) is plain PENDING; a lost node outranks a wait.
    creating = status_of(job(), [waiting_pod("p0", waiting="ContainerCreating")], {"node1"}, now=now)
    assert (creating.state, creating.native) == (JobState.QUEUED, "PENDING")
    assert status_of(job(), pulling, {"node2"}, now=now + 301).native == "NODE-LOST"
    # A decided Job is decided whatever its pods say.
    assert status_of(job(("Complete", "True", "")), pulling, {"node1"}, now=now + 301).state is JobState.SUCCEEDED


def test_the_image_pull_grace_is_the_backends_option():
    """backends.kubernetes.image_pull_grace (default 5 minutes) decides when an image that does not come fails."""
    now = T0.timestamp()
    pulling = [waiting_pod("p0", waiting="ErrImagePull")]
    assert status_of(job(), pulling, {"node1"}, now=now + 20, image_pull_grace=30).native == "PENDING/IMAGEPULL"
    late = status_of(job(), pulling, {"node1"}, now=now + 31, image_pull_grace=30)
    assert (late.state, late.native) == (JobState.FAILED, "FAILED/IMAGEPULL") and "for 31 s" in late.detail


def test_a_pods_time_limit_ends_the_job_as_timed_out():
    """The time-limit rule's FailJob (the container's own timer, render.TIME_LIMITER) reads as timed out, which a
    continuation continues; the Job controller's message names the exit code, so no other rule's reads so."""
    limited = client.V1Job(
        metadata=client.V1ObjectMeta(name="run-pretrain-a1"),
        status=client.V1JobStatus(
            conditions=[
                client.V1JobCondition(
                    type="Failed",
                    status="True",
                    reason="PodFailurePolicy",
                    message="Container stage for pod ns/run-pretrain-a1-0-x7k2p failed with exit code "
                    f"{TIME_LIMIT_EXIT} matching FailJob rule at index 1",
                )
            ]
        ),
    )
    status = status_of(limited, [], {"node1"})
    assert (status.state, status.native) == (JobState.TIMED_OUT, "FAILED/TIMELIMIT")
    assert "exit code 124" in status.detail
    assert STATE_MAP["FAILED/TIMELIMIT"] is JobState.TIMED_OUT


def test_a_disrupted_pod_of_a_gang_ends_the_attempt_as_lost():
    """The gang rule's FailJob (render.is_gang) reads as lost, which a continuation resubmits whole; a program's
    own failure under another FailJob rule stays failed."""
    gang = client.V1Job(
        metadata=client.V1ObjectMeta(name="run-pretrain-a1"),
        status=client.V1JobStatus(
            conditions=[
                client.V1JobCondition(
                    type="Failed",
                    status="True",
                    reason="PodFailurePolicy",
                    message="Pod ns/run-pretrain-a1-1-x7k2p has condition DisruptionTarget matching "
                    "FailJob rule at index 0",
                )
            ]
        ),
    )
    status = status_of(gang, [], {"node1"})
    assert (status.state, status.native) == (JobState.LOST, "FAILED/DISRUPTED") and "index 0" in status.detail
    assert state(job(("Failed", "True", "PodFailurePolicy"))) == (JobState.FAILED, "FAILED/PODFAILUREPOLICY")
