"""The smoke pretrain on 2 ranks as one Indexed Job of 2 pods on the test cluster (scripts/k8s-cluster: Kubernetes'
own control plane, the node agent standing in for the kubelet), one pod per node: rank 1 meets rank 0 at the
index-0 pod's DNS name through the headless Service, and the losses equal a one-process run to rtol 1e-4, as on
the other backends (tests/e2e/test_pretrain_backends.py). An evicted pod of that 2-pod training ends the attempt,
which the continuation resubmits whole, and the result still equals one process. The same training as a
PyTorchJob through the real training operator; its cancel, next attempt, failed Worker and time limit."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import _pretrain_checkpoints
import pytest
import yaml
from support.cli import cli
from support.ddp_pretrain import (  # noqa: F401 (fixtures)
    RUN_NAME,
    STEPS,
    assert_trained_like_one_process,
    data_dir,
    reference,
    stage_job,
    write_project,
)
from support.k8s_cluster import (  # noqa: F401 (the fixture)
    K8sCluster,
    cluster_port,
    k8s_cluster,
    shared_claim,
    skip_unless_required,
    training_operator,
    training_operator_binary,
)
from support.k8s_requests import every_bundled_stage_as_a_pytorchjob
from support.pipeline_fixtures import REPO, start_orchestrator, wait_for

from bcp_pipeline.backends.contract import JobState
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.load import load_config
from bcp_pipeline.engine.state import RunStore, StageStatus
from bcp_pipeline.errors import BackendCallError

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client  # noqa: E402

NAMESPACE = "bcp-ddp"


@pytest.fixture(scope="module")
def workspace(k8s_cluster: K8sCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    core = client.CoreV1Api(k8s_cluster.api())
    folder = tmp_path_factory.mktemp("ddp-workspace")
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    shared_claim(k8s_cluster, NAMESPACE, "bcp-pipeline-workspace", "bcp-ddp-workspace", folder)
    return folder


def kubernetes_project(cluster: K8sCluster, root: Path, data: Path, pretrain: dict, run_name: str = RUN_NAME) -> Path:
    """The `ddp` project on this cluster's namespace, its pretrain's kubernetes section `pretrain`; `run_name`: a
    training of its own in the module's workspace (results/RUN_NAME)."""
    config = write_project(root, data)
    raw = yaml.safe_load(config.read_text())
    raw["backends"]["kubernetes"] = {
        "kubeconfig": str(cluster.kubeconfig),
        "namespace": NAMESPACE,
        "code_dir": str(REPO / "stages"),
        "python": sys.executable,
        "poll_seconds": 0.5,
        "poll_max_seconds": 2.0,
    }
    stage = raw["pipelines"]["ddp"]["stages"]["pretrain"]
    stage["kubernetes"] = pretrain
    if run_name != RUN_NAME:
        stage["args"] = [run_name if a == RUN_NAME else a for a in stage["args"]]
        stage["verify"] = [{"glob": f"${{workspace}}/results/{run_name}/train_summary.json", "expect": 1}]
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def test_kubernetes_two_pods_train_as_one(
    k8s_cluster: K8sCluster,
    workspace: Path,
    tmp_path: Path,  # noqa: F811
    data_dir: Path,
    reference: dict,
) -> None:  # noqa: F811
    config = kubernetes_project(k8s_cluster, tmp_path / "p", data_dir, {"replicas": 2, "processes": 1})
    assert cli(config, "run", "ddp", "--backend", "kubernetes") == 0
    stage = RunStore(config.parent / ".bcp-pipeline").latest().stages["pretrain"]
    assert stage.sharding == {"replicas": 2, "processes": 1}
    loaded = load_config(config, pipeline="ddp")
    backend = make_backend("kubernetes", loaded, loaded.pipeline("ddp"), config.parent / ".bcp-pipeline/runs/x")
    job = stage_job(stage)
    logs = [backend.logs(job, rank=rank) for rank in (0, 1)]  # each rank's pod, through pods/log
    name = job
    assert f"rank 1 of 2: met at {name}-0.{name}:" in logs[1] and "(gloo, cpu)" in logs[1], logs[1]
    pods = (
        client.CoreV1Api(k8s_cluster.api())
        .list_namespaced_pod(NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={job}")
        .items
    )
    assert sorted(p.spec.node_name for p in pods) == ["node1", "node2"]
    assert_trained_like_one_process(workspace / "results" / RUN_NAME / "train_summary.json", logs, reference)


def test_a_pytorchjob_through_the_real_training_operator_trains_as_one(  # noqa: F811
    k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path, data_dir: Path, reference: dict
) -> None:
    """`launcher: pytorchjob`: the Kubeflow training operator v1.8.1 (built from its source, run against the
    cluster's apiserver) makes the Master and Worker pods of the rendered PyTorchJob, with its own RANK,
    WORLD_SIZE and PET_* rendezvous; torchrun in each pod starts the stage program; the losses equal one process."""
    if not training_operator_binary().is_file():
        skip_unless_required(f"no training operator at {training_operator_binary()}: run `scripts/k8s-cluster install`")
    config = kubernetes_project(
        k8s_cluster,
        tmp_path / "p",
        data_dir,
        {"replicas": 2, "processes": 1, "launcher": "pytorchjob"},
        run_name="pytorchjob",
    )
    with training_operator(k8s_cluster, cluster_port() + 10):
        assert cli(config, "run", "ddp", "--backend", "kubernetes") == 0
        next_attempt_and_cancel_stop_a_running_pytorchjob(k8s_cluster, config)
        a_failed_worker_and_a_time_limit_end_a_pytorchjob(k8s_cluster, config)
        the_operators_webhook_admits_every_bundled_stage_and_refuses_a_bad_name(k8s_cluster)
    stage = RunStore(config.parent / ".bcp-pipeline").latest().stages["pretrain"]
    job = stage_job(stage)
    assert stage.jobs[0].native == "SUCCEEDED"  # the PyTorchJob's own condition
    obj = client.CustomObjectsApi(k8s_cluster.api()).get_namespaced_custom_object(
        "kubeflow.org", "v1", NAMESPACE, "pytorchjobs", job
    )
    assert obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    pods = (
        client.CoreV1Api(k8s_cluster.api())
        .list_namespaced_pod(NAMESPACE, label_selector=f"training.kubeflow.org/job-name={job}")
        .items
    )
    assert sorted(p.metadata.labels["training.kubeflow.org/replica-type"] for p in pods) == ["master", "worker"]
    # cleanPodPolicy Running deletes only pods still running: the Master ended last (master_last.sh), so both stay.
    assert [p.status.phase for p in pods] == ["Succeeded", "Succeeded"]
    assert sorted(p.spec.node_name for p in pods) == ["node1", "node2"]
    loaded = load_config(config, pipeline="ddp")
    backend = make_backend("kubernetes", loaded, loaded.pipeline("ddp"), config.parent / ".bcp-pipeline/runs/x")
    logs = [backend.logs(job, rank=rank) for rank in (0, 1)]  # the Master's and the Worker's pod, by pods/log
    assert "rank 1 of 2: met at" in logs[1] and f"{job}-master-0" in logs[1], logs[1]
    assert_trained_like_one_process(workspace / "results" / "pytorchjob" / "train_summary.json", logs, reference)


def next_attempt_and_cancel_stop_a_running_pytorchjob(cluster: K8sCluster, config: Path) -> None:
    """A stage's next attempt deletes its earlier PyTorchJob that still runs (a killed orchestrator's), and `cancel`
    deletes a PyTorchJob with its pods: through the custom-objects API, not as a batch Job (a 404 there)."""
    from dataclasses import replace

    from bcp_pipeline.engine.submitter import planned_requests

    loaded = load_config(config, pipeline="ddp", overrides=["pretrain.kubernetes.command=[sleep, '600']"])
    pipeline = loaded.pipeline("ddp")
    backend = make_backend("kubernetes", loaded, pipeline, config.parent / ".bcp-pipeline/runs/ddp-CANCEL")
    first = next(r for r in planned_requests(pipeline, "ddp-CANCEL") if r.stage.name == "pretrain")
    objects, core = client.CustomObjectsApi(cluster.api()), client.CoreV1Api(cluster.api())

    def pods(job: str) -> list:
        return core.list_namespaced_pod(NAMESPACE, label_selector=f"training.kubeflow.org/job-name={job}").items

    def gone(job: str) -> bool:
        try:
            objects.get_namespaced_custom_object("kubeflow.org", "v1", NAMESPACE, "pytorchjobs", job)
        except client.exceptions.ApiException as exc:
            return exc.status == 404 and not pods(job)
        return False

    def wait(predicate, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"{what}: {backend.poll(submitted)}"
            time.sleep(0.5)

    def submit(attempt: int) -> str:
        submitted.append(backend.submit(backend.render(replace(first, attempt=attempt))))
        return submitted[-1]

    submitted: list[str] = []
    # cancel: a running PyTorchJob deleted with its pods (not as a batch Job: a 404 there).
    cancelled = submit(7)
    wait(lambda: backend.poll([cancelled])[cancelled].native == "RUNNING", "a PyTorchJob running")
    assert len(pods(cancelled)) == 2
    backend.cancel([cancelled])
    wait(lambda: gone(cancelled), f"PyTorchJob {cancelled} and its pods deleted by cancel")
    # A stage's next attempt deletes the earlier one still running (a killed orchestrator's) before it starts.
    earlier = submit(1)
    wait(lambda: backend.poll([earlier])[earlier].native == "RUNNING", "the first attempt's PyTorchJob running")
    later = submit(2)
    assert later != earlier
    wait(lambda: gone(earlier), f"attempt 1's PyTorchJob {earlier} and its pods deleted by attempt 2's submit")
    assert backend.poll([later])[later].native == "RUNNING"  # torchrun runs `sleep` itself (--no-python)
    backend.cancel([later])
    wait(lambda: gone(later), f"PyTorchJob {later} deleted by cancel")
    assert backend.poll([cancelled, earlier, later]) == {}


def a_failed_worker_and_a_time_limit_end_a_pytorchjob(cluster: K8sCluster, config: Path) -> None:
    """A Worker whose rank exits 3 fails the PyTorchJob, with the rank's exit and lines in the failure's detail, and
    the operator (cleanPodPolicy Running) deletes the Master still running, so it holds nothing; the failed Worker's
    pod stays, with its log. A job past its time limit (each pod's timer exits 124) is timed out, which a
    continuation continues."""
    from dataclasses import replace

    from bcp_pipeline.engine.submitter import planned_requests

    core = client.CoreV1Api(cluster.api())
    ended = {}
    for label, overrides in {
        "worker": [
            "pretrain.kubernetes.command=[bash, -c, 'if [ $RANK = 1 ]; then echo the worker fails; "
            "exit 3; fi; sleep 600']"
        ],
        "limit": ["pretrain.kubernetes.command=[sleep, '600']", "pretrain.kubernetes.active_deadline=3s"],
    }.items():
        loaded = load_config(config, pipeline="ddp", overrides=overrides)
        pipeline = loaded.pipeline("ddp")
        backend = make_backend("kubernetes", loaded, pipeline, config.parent / f".bcp-pipeline/runs/ddp-{label}")
        request = next(r for r in planned_requests(pipeline, f"ddp-{label}") if r.stage.name == "pretrain")
        job = backend.submit(backend.render(replace(request, attempt=1)))
        ended[label] = (
            backend,
            job,
            wait_for(
                lambda backend=backend, job=job: (lambda status: status if status.state.finished else None)(
                    backend.poll([job])[job]
                ),
                timeout=120,
                what=f"the {label} PyTorchJob's end",
            ),
        )
    backend, job, status = ended["worker"]
    assert (status.state, status.native) == (JobState.FAILED, "FAILED"), status
    detail = backend.failure_detail(job, status)
    assert f"pod {job}-worker-0" in detail and "the worker fails" in detail, detail

    def pods() -> dict[str, str]:
        return {
            p.metadata.name: p.status.phase
            for p in core.list_namespaced_pod(NAMESPACE, label_selector=f"training.kubeflow.org/job-name={job}").items
        }

    wait_for(
        lambda: pods() == {f"{job}-worker-0": "Failed"},
        timeout=60,
        what="the failed PyTorchJob's running Master deleted by the operator (cleanPodPolicy Running)",
    )
    backend, job, status = ended["limit"]
    assert (status.state, status.native) == (JobState.TIMED_OUT, "FAILED/TIMELIMIT"), status
    assert f"time limit ran out: pod {job}-" in status.detail and "exited 124" in status.detail, status.detail
    for backend, job, _ in ended.values():
        backend.cancel([job])


def test_an_evicted_pod_ends_the_attempt_and_the_continuation_resubmits_it_whole(  # noqa: F811
    k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path, data_dir: Path, reference: dict
) -> None:
    """Issue 36: a disrupted pod of a 2-pod training (the Eviction API, as a drain or a preemption gives it) fails
    the whole Job by the gang's pod failure policy, read as lost; the stage's continuation submits a second attempt
    of both pods, which trains on from the last checkpoint to a result equal to one process."""
    config = kubernetes_project(
        k8s_cluster, tmp_path / "p", data_dir, {"replicas": 2, "processes": 1}, run_name="evicted"
    )
    raw = yaml.safe_load(config.read_text())
    raw["pipelines"]["ddp"]["stages"]["pretrain"]["continuation"] = {
        "checkpoints": "${workspace}/results/evicted/checkpoints",
        "target_steps": STEPS,
    }
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    store = RunStore(config.parent / ".bcp-pipeline")
    core = client.CoreV1Api(k8s_cluster.api())
    orchestrator = start_orchestrator(config, "run", "ddp", "--backend", "kubernetes")
    try:
        wait_for(
            lambda: _pretrain_checkpoints.latest_checkpoint(workspace / "results/evicted/checkpoints"),
            timeout=240,
            what="a first checkpoint",
        )
        job = store.latest().stages["pretrain"].jobs[0].job_id
        evicted = next(
            p.metadata.name
            for p in core.list_namespaced_pod(NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={job}").items
            if p.metadata.annotations["batch.kubernetes.io/job-completion-index"] == "1"
        )
        core.create_namespaced_pod_eviction(
            evicted,
            NAMESPACE,
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": evicted, "namespace": NAMESPACE}},
        )
        output, _ = orchestrator.communicate(timeout=300)
    finally:
        orchestrator.kill()
    assert orchestrator.returncode == 0, output
    stage = store.latest().stages["pretrain"]
    first, last = [j for j in stage.jobs if j.kind == "stage"][0], stage_job(stage)
    assert (first.state, first.native) == ("lost", "FAILED/DISRUPTED"), first
    assert stage.status is StageStatus.SUCCEEDED and stage.attempts == 2, stage
    loaded = load_config(config, pipeline="ddp")
    backend = make_backend("kubernetes", loaded, loaded.pipeline("ddp"), config.parent / ".bcp-pipeline/runs/x")
    logs = [backend.logs(last, rank=rank) for rank in (0, 1)]  # the second attempt's two pods
    resumed = re.search(rf"resuming from .* at step (\d+) of {STEPS}", logs[0])
    assert resumed and 4 <= int(resumed.group(1)) < STEPS, logs[0]
    assert_trained_like_one_process(
        workspace / "results/evicted/train_summary.json", logs, reference, resumed_from=int(resumed.group(1))
    )


def the_operators_webhook_admits_every_bundled_stage_and_refuses_a_bad_name(cluster: K8sCluster) -> None:
    """The operator's own validating webhook is called (registered by the `training_operator` fixture as its
    manifests register it): every bundled stage rendered as a PyTorchJob passes it in a server-side dry run, and a
    name it refuses (not a DNS-1035 label) but the CRD's schema accepts is refused by it."""
    from bcp_pipeline.backends.kubernetes.client import create_object

    api = cluster.api()
    objects = every_bundled_stage_as_a_pytorchjob(NAMESPACE)
    for obj in objects:
        create_object(api, obj, dry_run=True)
    bad = {**objects[0], "metadata": {**objects[0]["metadata"], "name": "1-starts-with-a-digit"}}
    refusal = 'admission webhook "validator.pytorchjob.training-operator.kubeflow.org" denied the request'
    with pytest.raises(BackendCallError, match=refusal):
        create_object(api, bad, dry_run=True)
