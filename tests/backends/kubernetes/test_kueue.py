"""Kueue gang admission without a cluster (`kubernetes.queue`): what is rendered (the queue-name label on the job,
never on its pods; `suspend: true` on an Indexed Job and in a PyTorchJob's runPolicy), what is refused, and how a
suspended job in a queue reads (queued, with Kueue's reason where its Workload gives one). On the real Kueue:
tests/e2e/test_kubernetes_kueue_e2e.py. `status` says why a job waits."""

from __future__ import annotations

import pytest
from support.golden_files import REPO
from support.k8s_requests import request_for

from bcp_pipeline.backends.contract import JobState
from bcp_pipeline.backends.kubernetes.backend import KubernetesBackend
from bcp_pipeline.backends.kubernetes.kueue import QUEUE_LABEL, workload_message
from bcp_pipeline.backends.kubernetes.render import manifests
from bcp_pipeline.backends.kubernetes.states import pytorchjob_status, status_of
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.engine.state import JobRecord, RunState, StageState, StageStatus
from bcp_pipeline.engine.submitter import planned_requests
from bcp_pipeline.errors import SubmissionError
from bcp_pipeline.report.text import render_status

client = pytest.importorskip("kubernetes.client")


def test_a_queue_renders_the_label_on_the_job_only_and_creates_it_suspended() -> None:
    backend, request = request_for("sample", "sample.kubernetes.queue=team-a")
    service, job = manifests(request, backend.options)
    assert job["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert job["spec"]["suspend"] is True
    # Not on the pods (Kueue's pod integration would take them for plain pods of its own), nor on the Service.
    assert QUEUE_LABEL not in job["spec"]["template"]["metadata"]["labels"]
    assert QUEUE_LABEL not in service["metadata"]["labels"]
    backend, request = request_for("sample", "sample.kubernetes.queue=team-a", "sample.kubernetes.launcher=pytorchjob")
    (pytorchjob,) = manifests(request, backend.options)
    assert pytorchjob["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert pytorchjob["spec"]["runPolicy"]["suspend"] is True
    for replica in pytorchjob["spec"]["pytorchReplicaSpecs"].values():
        assert QUEUE_LABEL not in replica["template"]["metadata"]["labels"]


def test_without_a_queue_nothing_is_suspended_or_labelled() -> None:
    backend, request = request_for("sample")
    _, job = manifests(request, backend.options)
    assert "suspend" not in job["spec"] and QUEUE_LABEL not in job["metadata"]["labels"]
    backend, request = request_for("sample", "sample.kubernetes.launcher=pytorchjob")
    (pytorchjob,) = manifests(request, backend.options)
    assert "suspend" not in pytorchjob["spec"]["runPolicy"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sample.kubernetes.queue=Team_A", r"kubernetes.queue 'Team_A' is not a Kueue LocalQueue name"),
        ("sample.kubernetes.queue=" + "q" * 64, r"is not a Kueue LocalQueue name \(a DNS label: at most 63"),
        (
            "sample.kubernetes.labels={kueue.x-k8s.io/queue-name: team-a}",
            r"kubernetes.labels sets kueue.x-k8s.io/queue-name: name the Kueue LocalQueue with "
            r"kubernetes.queue: team-a",
        ),
    ],
)
def test_a_bad_queue_or_the_label_given_by_hand_is_refused_before_the_run(override: str, message: str) -> None:
    backend, request = request_for("sample", override)
    with pytest.raises(SubmissionError, match=message):
        manifests(request, backend.options)
    config = load_and_check(REPO / "pipelines.yaml", overrides=[override], pipeline="demo")
    with pytest.raises(SubmissionError, match=message):  # `run` refuses it before the run is recorded
        KubernetesBackend.check_limits(config, config.pipeline("demo"), planned_requests(config.pipeline("demo"), "r"))


def queued_job(*, suspend: bool, queue: str | None = "team-a", conditions: tuple = ()) -> client.V1Job:
    return client.V1Job(
        metadata=client.V1ObjectMeta(name="run-sample-a1", labels={QUEUE_LABEL: queue} if queue else {}),
        spec=client.V1JobSpec(suspend=suspend, template=client.V1PodTemplateSpec()),
        status=client.V1JobStatus(
            conditions=[client.V1JobCondition(type=t, status="True", reason=r) for t, r in conditions] or None
        ),
    )


QUOTA = "couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor default, 2 more needed"


def test_a_job_suspended_in_a_queue_is_queued_with_kueues_reason_never_running_or_failed() -> None:
    for conditions in ((), (("Suspended", "JobSuspended"),)):  # before and after the Job controller's first sync
        status = status_of(queued_job(suspend=True, conditions=conditions))
        assert (status.state, status.native) == (JobState.QUEUED, "PENDING/KUEUE")
        assert status.detail == "waiting for Kueue admission in queue team-a"
    status = status_of(queued_job(suspend=True), kueue_message=QUOTA)
    assert status.detail == f"waiting for Kueue admission in queue team-a: {QUOTA}"
    # Admitted (Kueue unsuspended it): the usual reading; a suspended Job in no queue stays SUSPENDED.
    assert status_of(queued_job(suspend=False)).native == "PENDING"
    assert (
        status_of(queued_job(suspend=True, queue=None, conditions=(("Suspended", "JobSuspended"),))).native
        == "SUSPENDED"
    )
    # An ended Job is ended, whatever its spec says.
    assert status_of(queued_job(suspend=True, conditions=(("Failed", "DeadlineExceeded"),))).state is JobState.TIMED_OUT


def test_a_pytorchjob_suspended_in_a_queue_is_queued_until_admitted() -> None:
    def obj(suspend: bool, *kinds: str) -> dict:
        return {
            "metadata": {"name": "p", "labels": {QUEUE_LABEL: "gpu"}},
            "spec": {"runPolicy": {"suspend": suspend}},
            "status": {
                "conditions": [{"type": k, "status": "True", "message": f"PyTorchJob p is {k}."} for k in kinds]
            },
        }

    status = pytorchjob_status(obj(True, "Created", "Suspended"), kueue_message=QUOTA)
    assert (status.state, status.native) == (JobState.QUEUED, "PENDING/KUEUE")
    assert status.detail == f"waiting for Kueue admission in queue gpu: {QUOTA}"
    assert pytorchjob_status(obj(False, "Created", "Running")).state is JobState.RUNNING
    assert pytorchjob_status(obj(True, "Created", "Succeeded")).state is JobState.SUCCEEDED


def test_kueues_reason_is_read_from_its_workloads_conditions() -> None:
    def workload(*conditions: dict) -> dict:
        return {"status": {"conditions": list(conditions)}}

    assert (
        workload_message(workload({"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": QUOTA}))
        == QUOTA
    )
    assert workload_message(workload({"type": "QuotaReserved", "status": "True", "message": "Quota reserved"})) is None
    assert workload_message(workload()) is None  # Kueue has not looked at it yet
    evicted = {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate x"}
    assert workload_message(workload(evicted)) == "evicted: Preempted to accommodate x"


def test_status_says_why_a_job_waits_and_nothing_for_one_that_runs_or_ended() -> None:
    waiting = JobRecord(
        job_id="r-b-a1",
        kind="stage",
        attempt=1,
        submitted_at=0.0,
        state="queued",
        native="PENDING/KUEUE",
        detail=f"waiting for Kueue admission in queue team-a: {QUOTA}",
    )
    running = JobRecord(
        job_id="r-a-a1", kind="stage", attempt=1, submitted_at=0.0, state="running", native="RUNNING", detail=""
    )
    state = RunState(
        run_id="r",
        pipeline="p",
        backend="kubernetes",
        config_file="pipelines.yaml",
        created_at=0.0,
        stages={
            "a": StageState(status=StageStatus.RUNNING, jobs=[running]),
            "b": StageState(status=StageStatus.RUNNING, jobs=[waiting]),
        },
    )
    text = render_status(state)
    assert f"b: job r-b-a1 PENDING/KUEUE: waiting for Kueue admission in queue team-a: {QUOTA}" in text
    assert "a: job" not in text
    waiting.state, waiting.ended_at = "cancelled", 1.0
    assert "waiting for Kueue" not in render_status(state)
