"""The kubernetes backend on a real control plane built from source (scripts/k8s-cluster via the `k8s_cluster`
fixture), with two node agents (the kubelet STAND-IN of tests/fakes/k8s_node_agent.py) in their own network
namespaces: cancel, check, every bundled pipeline's manifests (server-side dry run), and Job and pod conditions (a
deadline, a failed program, a killed, deleted or evicted pod, a lost node) then resume. What every backend must do
the same way (the demo's data stages as Indexed Jobs whose pods spread over both nodes, byte-identical to a local run,
with status and logs through pods/log; a killed orchestrator's job re-attached by `resume`; one list of Jobs a poll)
is tests/e2e/test_backend_conformance.py's `TestKubernetes`."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.cli import cli
from support.k8s_cluster import (  # noqa: F401
    NODE_GPUS,
    K8sCluster,
    install_pytorchjob_crd,
    k8s_cluster,
    pytorchjob_crd_file,
    shared_claim,
    skip_unless_required,
)
from support.k8s_requests import every_bundled_stage_as_a_pytorchjob
from support.pipeline_fixtures import DEMO_SPREAD as SPREAD  # (pods, processes per pod)
from support.pipeline_fixtures import (
    K8S_CHAIN,
    REPO,
    start_orchestrator,
    wait_for,
    without_training,
    write_chain_project,
)

from bcp_pipeline.backends.contract import JobState
from bcp_pipeline.backends.kubernetes.render import INDEX_ANNOTATION
from bcp_pipeline.backends.shared.logs import rank_lines
from bcp_pipeline.config.load import load_config
from bcp_pipeline.engine.state import RunState, RunStore, StageStatus
from bcp_pipeline.errors import BackendCallError

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client  # noqa: E402

NAMESPACE = "bcp-e2e"
CLAIM = "bcp-pipeline-workspace"


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` but the completion records (times, hosts) and the results folder of runs."""
    files = {p.relative_to(root): p for p in sorted(root.rglob("*")) if p.is_file()}
    return {
        str(rel): p.read_bytes()
        for rel, p in files.items()
        if ".completions" not in rel.parts and ".bcp-pipeline" not in rel.parts
    }


@pytest.fixture(scope="module")
def workspace(k8s_cluster: K8sCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The namespace and the workspace PVC, bound to a hostPath PV: a folder both nodes see, as FSx would be."""
    core = client.CoreV1Api(k8s_cluster.api())
    folder = tmp_path_factory.mktemp("k8s-workspace")
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    shared_claim(k8s_cluster, NAMESPACE, CLAIM, "bcp-e2e-workspace", folder, storage="10Gi")
    core.create_namespaced_secret(
        NAMESPACE, {"metadata": {"name": "hf-token"}, "data": {"token": base64.b64encode(b"hf_secret_VALUE").decode()}}
    )
    return folder


def demo_project(root: Path, backend: str, kubeconfig: Path, pretrain: dict | None = None) -> Path:
    """The bundled demo without its pretrain stage (data stages only), on `backend`; with `pretrain`, the pretrain
    stage kept with that kubernetes section."""
    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    demo = raw["pipelines"]["demo"]
    if pretrain is None:
        without_training(demo["stages"])
    else:
        demo["stages"]["pretrain"]["kubernetes"] = pretrain
    for stage, (pods, processes) in SPREAD.items():
        demo["stages"][stage]["kubernetes"] = {"replicas": pods, "processes": processes}
    demo["stages"]["download"]["kubernetes"]["secrets"] = ["hf-token:token:HF_TOKEN"]
    backends = raw.get("backends") or {}
    options = {
        "kubeconfig": str(kubeconfig),
        "namespace": NAMESPACE,
        "code_dir": str(REPO / "stages"),
        "python": sys.executable,
        "poll_seconds": 0.5,
        "poll_max_seconds": 2.0,
    }
    raw = {
        "version": raw.get("version", 1),
        "stages_dir": str(REPO / "stages"),
        "backends": {**backends, "kubernetes": options},
        "pipelines": {"demo": {**demo, "backend": backend}},
    }
    root.mkdir(parents=True)
    config = root / "pipelines.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def test_every_bundled_pipeline_is_accepted_by_the_apiserver(k8s_cluster: K8sCluster, workspace: Path) -> None:  # noqa: F811
    from bcp_pipeline.backends.kubernetes.client import create_object
    from bcp_pipeline.backends.registry import make_backend
    from bcp_pipeline.engine.submitter import planned_requests

    config = load_config(REPO / "pipelines.yaml")
    config.options["kubernetes"].namespace = NAMESPACE
    api = k8s_cluster.api()
    checked = 0
    for name, pipeline in config.pipelines.items():
        backend = make_backend("kubernetes", config, pipeline, Path("/tmp/none/runs") / f"{name}-RUN")
        for request in planned_requests(pipeline, f"{name}-RUN"):  # NeMo launcher pretrains too
            for obj in backend.render(request).payload["manifests"]:
                if obj["kind"] != "PyTorchJob":
                    create_object(api, obj, dry_run=True)  # raises with the apiserver's reason if refused
                    checked += 1
    assert checked > 20
    # Per-index retries (backoffLimitPerIndex, maxFailedIndexes, no global backoffLimit) and a mounted token of a
    # named service account, as rendered for a data stage of 2 pods.
    config = load_config(
        REPO / "pipelines.yaml",
        pipeline="demo",
        overrides=[
            "download.kubernetes.retries_per_index=2",
            "download.kubernetes.max_failed_indexes=1",
            "download.kubernetes.service_account=default",
            "download.kubernetes.mount_service_account_token=true",
        ],
    )
    config.options["kubernetes"].namespace = NAMESPACE
    backend = make_backend("kubernetes", config, config.pipeline("demo"), Path("/tmp/none/runs/demo-RUN"))
    request = next(r for r in planned_requests(config.pipeline("demo"), "demo-RUN") if r.stage.name == "download")
    job = backend.render(request).payload["manifests"][-1]
    assert (job["spec"]["backoffLimitPerIndex"], job["spec"]["maxFailedIndexes"]) == (2, 1), job["spec"]
    create_object(api, job, dry_run=True)


def submit_demo_stage(
    cluster: K8sCluster, root: Path, stage: str, overrides: list[str] = (), pretrain: dict | None = None
):
    """One job of the demo's `stage`, submitted straight through the backend (no run), under the run id
    demo-ROOT (each caller its own, so no two tests' Jobs share a name): (backend, job id)."""
    from bcp_pipeline.backends.registry import make_backend
    from bcp_pipeline.engine.submitter import planned_requests

    config = load_config(
        demo_project(root, "kubernetes", cluster.kubeconfig, pretrain=pretrain),
        overrides=list(overrides),
        pipeline="demo",
    )
    pipeline = config.pipeline("demo")
    run_id = f"demo-{root.name.upper()}"
    backend = make_backend("kubernetes", config, pipeline, root / "runs" / run_id)
    request = next(r for r in planned_requests(pipeline, run_id) if r.stage.name == stage)
    return backend, backend.submit(backend.render(request))


def test_a_pod_the_scheduler_cannot_place_is_shown_with_its_reason(
    k8s_cluster: K8sCluster,  # noqa: F811
    workspace: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    """The real kube-scheduler's own message for a GPU request no node can meet (each node has NODE_GPUS), in the
    job's status and in `status` of a run."""
    backend, job_id = submit_demo_stage(
        k8s_cluster, tmp_path / "gpu", "sample", [f"sample.kubernetes.gpus={NODE_GPUS + 1}"]
    )
    try:
        deadline = time.monotonic() + 60
        while (status := backend.poll([job_id])[job_id]).native != "PENDING/UNSCHEDULABLE":
            assert time.monotonic() < deadline, f"the pod was not reported unschedulable: {status}"
            time.sleep(0.5)
        assert status.state is JobState.QUEUED and not status.state.finished
        assert "cannot be scheduled: 0/2 nodes are available" in status.detail, status.detail
        assert "Insufficient nvidia.com/gpu" in status.detail, status.detail
    finally:
        backend.cancel([job_id])
    # The same through a run: `status` shows the stage's job waiting, with the scheduler's message.
    config = demo_project(tmp_path / "gpu-run", "kubernetes", k8s_cluster.kubeconfig)
    orchestrator = start_orchestrator(
        config, "run", "demo", "--only", "sample", "--set", f"sample.kubernetes.gpus={NODE_GPUS + 1}"
    )
    STARTED.append(orchestrator)

    def shown() -> str | None:
        capsys.readouterr()
        cli(config, "status")
        out = capsys.readouterr().out
        return out if "PENDING/UNSCHEDULABLE" in out else None

    out = wait_for(shown, timeout=60, what="status showing the unschedulable job")
    assert "Insufficient nvidia.com/gpu" in out, out
    assert cli(config, "cancel", RunStore(config.parent / ".bcp-pipeline").latest().run_id) == 0


def test_an_image_that_cannot_be_pulled_fails_the_stage_with_its_reason(
    k8s_cluster: K8sCluster,  # noqa: F811
    workspace: Path,
    tmp_path: Path,
) -> None:
    """The node agent cannot pull the image (not among the cluster's pullable images): the pod waits in
    ErrImagePull/ImagePullBackOff, the job reads as queued, saying so, then fails once
    backends.kubernetes.image_pull_grace has passed, and the run's stage fails with the kubelet's reason."""
    image = "registry.example/private/trainer:1"
    config = demo_project(tmp_path / "pull", "kubernetes", k8s_cluster.kubeconfig)
    overrides = ["--set", f"sample.kubernetes.image={image}", "--set", "backends.kubernetes.image_pull_grace=6s"]
    started = time.monotonic()
    assert cli(config, "run", "demo", "--only", "sample", *overrides) == 1
    took = time.monotonic() - started
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    stage = state.stages["sample"]
    assert stage.status is StageStatus.FAILED
    job = stage.jobs[-1]
    assert (job.state, job.native) == ("failed", "FAILED/IMAGEPULL"), job
    assert image in job.detail and ("ErrImagePull" in job.detail or "ImagePullBackOff" in job.detail), job.detail
    assert "image_pull_secrets" in job.detail, job.detail
    assert 6 < took < 60, took  # the grace, not the 5-minute default


SHM_SIZE = "import os; s = os.statvfs('/dev/shm'); print('shm', s.f_blocks * s.f_frsize)"


def test_a_pods_dev_shm_is_the_runtimes_64_mib_or_the_rendered_size(
    k8s_cluster: K8sCluster,  # noqa: F811
    workspace: Path,
    tmp_path: Path,
) -> None:
    """A stage program's /dev/shm: 64 MiB where nothing is rendered for it (one process, no GPU), the memory
    emptyDir's size with `shm_size`."""
    seen = {}
    for label, extra in {"default": [], "sized": ["sample.kubernetes.shm_size=96Mi"]}.items():
        backend, job_id = submit_demo_stage(
            k8s_cluster,
            tmp_path / f"shm-{label}",
            "sample",
            [
                "sample.kubernetes.replicas=1",
                "sample.kubernetes.processes=1",
                f'sample.kubernetes.command=[{sys.executable}, -c, "{SHM_SIZE}"]',
                *extra,
            ],
        )
        wait_for(
            lambda backend=backend, job_id=job_id: (lambda s: s if s.state.finished else None)(
                backend.poll([job_id])[job_id]
            ),
            timeout=60,
            what=f"the {label} job's end",
        )
        assert backend.poll([job_id])[job_id].state is JobState.SUCCEEDED
        seen[label] = rank_lines(backend.logs(job_id), 0).split()  # the pod launcher heads its lines `[rank0]:`
    assert seen == {"default": ["shm", str(64 * 2**20)], "sized": ["shm", str(96 * 2**20)]}


def test_an_evicted_pod_of_a_training_gang_ends_the_attempt_as_lost(
    k8s_cluster: K8sCluster,  # noqa: F811
    workspace: Path,
    tmp_path: Path,
) -> None:
    """The real Job controller applies the gang's FailJob rule to an evicted pod of a 2-pod training, and the
    condition it writes reads as lost (FAILED/DISRUPTED), which a continuation resubmits whole."""
    backend, job_id = submit_demo_stage(
        k8s_cluster,
        tmp_path / "gang",
        "pretrain",
        pretrain={"replicas": 2, "processes": 1, "command": ["sleep", "600"]},
    )
    core = client.CoreV1Api(k8s_cluster.api())
    try:

        def running_pods() -> list:
            pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={job_id}").items
            return pods if len(pods) == 2 and all(p.status.phase == "Running" for p in pods) else []

        pods = wait_for(running_pods, timeout=60, what="both pods of the gang running")
        evicted = pods[1].metadata.name
        core.create_namespaced_pod_eviction(
            evicted,
            NAMESPACE,
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": evicted, "namespace": NAMESPACE}},
        )
        status = wait_for(
            lambda: (lambda s: s if s.state.finished else None)(backend.poll([job_id])[job_id]),
            timeout=90,
            what="the gang's Job ended by its pod failure policy",
        )
        assert (status.state, status.native) == (JobState.LOST, "FAILED/DISRUPTED"), status
        assert evicted in status.detail, status.detail
    finally:
        backend.cancel([job_id])


def test_cancel_deletes_the_job_and_kills_its_pods(
    k8s_cluster: K8sCluster,
    workspace: Path,
    tmp_path: Path,  # noqa: F811
) -> None:
    backend, job_id = submit_demo_stage(
        k8s_cluster, tmp_path / "cancel", "sample", ["sample.kubernetes.command=[sleep, '600']"]
    )
    deadline = time.monotonic() + 60
    while backend.poll([job_id])[job_id].native != "RUNNING":
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.5)
    assert backend.find_active("demo-CANCEL", "sample", "stage") == [job_id]
    backend.cancel([job_id])
    core = client.CoreV1Api(k8s_cluster.api())
    while (
        backend.poll([job_id])
        or core.list_namespaced_pod(NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={job_id}").items
    ):
        assert time.monotonic() < deadline + 60, "the job or its pods outlived the cancel"
        time.sleep(0.5)


def finished_status(backend, job_id: str):
    """The job's status once it has ended (None before: for wait_for)."""
    status = backend.poll([job_id])[job_id]
    return status if status.state.finished else None


def test_per_index_retries_retry_a_bad_shard_alone_and_fail_with_its_index(
    k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path
) -> None:  # noqa: F811
    """retries_per_index on the real Job controller: index 1 fails (exit 3) and is retried once on its own while
    index 0 succeeds (with backoffLimit 0 the first failure would end the Job); then the Job fails with reason
    FailedIndexes, which reads as failed with the failed index named."""
    backend, job_id = submit_demo_stage(
        k8s_cluster,
        tmp_path / "perindex",
        "sample",
        [
            "sample.kubernetes.replicas=2",
            "sample.kubernetes.processes=1",
            "sample.kubernetes.retries_per_index=1",
            "sample.kubernetes.command=[bash, -c, 'echo index $JOB_COMPLETION_INDEX; test $JOB_COMPLETION_INDEX != 1 "
            "|| exit 3']",
        ],
    )
    try:
        status = wait_for(lambda: finished_status(backend, job_id), timeout=120, what="the per-index Job's end")
        assert (status.state, status.native) == (JobState.FAILED, "FAILED/FAILEDINDEXES"), status
        assert "(failed indexes: 1)" in status.detail, status.detail
        pods = (
            client.CoreV1Api(k8s_cluster.api())
            .list_namespaced_pod(NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={job_id}")
            .items
        )
        phases = sorted((p.metadata.annotations[INDEX_ANNOTATION], p.status.phase) for p in pods)
        assert phases == [("0", "Succeeded"), ("1", "Failed"), ("1", "Failed")], phases  # index 1: tried twice
        job = client.BatchV1Api(k8s_cluster.api()).read_namespaced_job(job_id, NAMESPACE)
        assert (job.spec.backoff_limit_per_index, job.status.succeeded, job.status.failed) == (1, 1, 2)
    finally:
        backend.cancel([job_id])


def test_logs_follow_streams_the_pods_lines_and_one_ranks_lines_come_apart(
    k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path
) -> None:  # noqa: F811
    """`logs --follow` through pods/log (follow=true, served by the kubelet stand-in): 2 pods x 2 ranks, each
    printing a line every 1.5 s; lines arrive while the job runs, the stream ends with the job, and `--rank N` (plain
    and followed) gives rank N's lines alone, out of the log its pod's ranks share."""
    import threading

    backend, job_id = submit_demo_stage(
        k8s_cluster,
        tmp_path / "follow",
        "sample",
        [
            "sample.kubernetes.replicas=2",
            "sample.kubernetes.processes=2",
            "sample.kubernetes.command=[bash, -c, 'for i in 1 2 3; do echo line $i of $RANK; sleep 1.5; done']",
        ],
    )
    received: list[tuple[float, str]] = []
    follower = threading.Thread(
        target=lambda: received.extend((time.monotonic(), line) for line in backend.follow_logs(job_id)), daemon=True
    )
    try:
        follower.start()
        status = wait_for(lambda: finished_status(backend, job_id), timeout=120, what="the job's end")
        ended = time.monotonic()
        follower.join(60)
        assert not follower.is_alive(), "the followed log did not end with the job"
        assert status.state is JobState.SUCCEEDED, status
        lines = [line for _, line in received]
        for rank in range(4):
            pod = f"{job_id}-{rank // 2}-"
            mine = [line for line in lines if line.startswith(f"[pod/{pod}") and f"] [rank{rank}]:" in line]
            assert [line.split("]:", 1)[1] for line in mine] == [f"line {i} of {rank}" for i in (1, 2, 3)], lines
        # The first lines came while the job ran (4.5 s of it from them on), not in one piece at its end.
        assert min(at for at, _ in received) < ended - 2, "no line came well before the job ended: not followed"
        assert backend.logs(job_id, rank=3) == "line 1 of 3\nline 2 of 3\nline 3 of 3"
        assert backend.logs(job_id, rank=2, tail=1) == "line 3 of 2"
        assert list(backend.follow_logs(job_id, rank=1)) == [f"line {i} of 1" for i in (1, 2, 3)]  # ended: all
    finally:
        backend.cancel([job_id])


def test_check_reports_the_cluster(
    k8s_cluster: K8sCluster,
    workspace: Path,
    tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture,
) -> None:
    config = demo_project(tmp_path / "check", "kubernetes", k8s_cluster.kubeconfig)
    capsys.readouterr()
    code = cli(config, "check", "demo", "--backend", "kubernetes", "--json")
    result = json.loads(capsys.readouterr().out)
    rows = {(row["topic"], row["assumes"]): row for row in result["rows"]}
    verdicts = {topic: row["verdict"] for (topic, _), row in rows.items()}
    assert verdicts["api"] == "ok" and verdicts["rights"] == "ok" and verdicts["workspace claim"] == "ok"
    assert verdicts["namespace"] == "ok" and verdicts["who am i"] == "ok"
    assert all(row["verdict"] == "ok" for (topic, _), row in rows.items() if topic == "manifests"), rows
    fits = [row for (topic, _), row in rows.items() if topic == "fits a node"]
    assert fits and all(row["verdict"] == "ok" for row in fits), fits
    # The probe Job, shaped as the first stage's: a RANK per pod on each node, the mount shared, the kill timed.
    assert verdicts["probe ranks"] == "ok" and verdicts["probe mount"] == "ok" and verdicts["kill timing"] == "ok"
    pods = sorted(result["facts"]["probe_pods"], key=lambda p: p["index"])
    assert [(p["index"], p["rank"]) for p in pods] == [("0", "0"), ("1", "1")]
    assert {p["node"] for p in pods} == set(k8s_cluster.nodes)
    assert all(p["marker"].startswith("bcpp-check-") for p in pods)
    assert 0 < result["facts"]["kill_seconds"] < 30
    shown = {topic: row["showed"] for (topic, _), row in rows.items()}
    assert "RANK 1 on node" in shown["probe ranks"] and "index(es) 0, 1" in shown["probe mount"]
    assert (
        not client.BatchV1Api(k8s_cluster.api())
        .list_namespaced_job(  # the probe is gone with the check
            NAMESPACE, label_selector="bcp-pipeline/kind=probe"
        )
        .items
    )
    assert code == 0


def test_check_names_a_stage_whose_pods_fit_no_node(
    k8s_cluster: K8sCluster,
    workspace: Path,
    tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture,
) -> None:
    """The node agents offer 8 CPUs and 16Gi each: a stage asking 64Gi fits none, and one whose nodeSelector
    matches no node fits none either; the rows name the stage, its request and the largest allocatable seen."""
    config = demo_project(tmp_path / "fit", "kubernetes", k8s_cluster.kubeconfig)
    capsys.readouterr()
    code = cli(
        config,
        "check",
        "demo",
        "--backend",
        "kubernetes",
        "--json",
        "--no-jobs",
        "--set",
        "concat.kubernetes.memory=64Gi",
        "--set",
        "extract.kubernetes.cpu=2",
        "--set",
        "extract.kubernetes.node_selector={kubernetes.io/hostname: no-such-node}",
    )
    rows = [row for row in json.loads(capsys.readouterr().out)["rows"] if row["topic"] == "fits a node"]
    concat = [row for row in rows if row["assumes"].startswith("stage concat:")]
    assert [row["verdict"] for row in concat] == ["different"], rows
    assert "memory 64Gi" in concat[0]["assumes"] and "largest allocatable memory 16Gi" in concat[0]["showed"], concat
    assert "0 of 2 matching node(s) fit" in concat[0]["showed"], concat
    extract = [row for row in rows if row["assumes"].startswith("stage extract:")]
    assert [row["verdict"] for row in extract] == ["different"], rows
    assert "labelled kubernetes.io/hostname=no-such-node" in extract[0]["assumes"] and "no node" in extract[0]["showed"]
    tokenize = [row for row in rows if row["assumes"].startswith("stage tokenize")]
    assert tokenize and all(row["verdict"] == "ok" for row in tokenize), rows
    assert code != 0


def test_check_tells_whether_the_training_operator_is_there_and_pytorchjobs_pass_its_crd_schema(
    k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:  # noqa: F811
    """Without the operator's CRD, a pytorchjob stage is a finding; with the operator's own CRD (v1.8.1, from its
    module source) installed, every bundled pipeline's stages rendered as PyTorchJobs pass its schema (a strict
    server-side dry run: an unknown field is refused), and check says so."""
    if not pytorchjob_crd_file().is_file():
        skip_unless_required(f"no PyTorchJob CRD at {pytorchjob_crd_file()}: run `scripts/k8s-cluster install`")
    from bcp_pipeline.backends.kubernetes.client import create_object

    config = demo_project(
        tmp_path / "operator",
        "kubernetes",
        k8s_cluster.kubeconfig,
        pretrain={"launcher": "pytorchjob", "replicas": 2, "processes": 1},
    )

    def check_rows() -> dict[str, list[dict]]:
        capsys.readouterr()
        cli(config, "check", "demo", "--backend", "kubernetes", "--json")
        rows: dict[str, list[dict]] = {}
        for row in json.loads(capsys.readouterr().out)["rows"]:
            rows.setdefault(row["topic"], []).append(row)
        return rows

    before = check_rows()
    assert [(r["verdict"], r["showed"]) for r in before["training operator"]] == [("different", "not installed")]
    pretrain = [r for r in before["manifests"] if "pretrain" in r["assumes"] and "verif" not in r["assumes"]]
    assert pretrain and all(r["verdict"] == "different" for r in pretrain), pretrain
    api = k8s_cluster.api()
    install_pytorchjob_crd(api)
    try:
        after = check_rows()
        assert [(r["verdict"], r["showed"]) for r in after["training operator"]] == [("ok", "installed")]
        assert all(r["verdict"] == "ok" for r in after["manifests"]), after["manifests"]
        checked = elastic = 0
        for obj in every_bundled_stage_as_a_pytorchjob(NAMESPACE):
            create_object(api, obj, dry_run=True)  # raises with the apiserver's reason if refused
            checked += 1
            elastic += "elasticPolicy" in obj["spec"]
        assert checked >= len(load_config(REPO / "pipelines.yaml").pipelines) * 3, checked
        assert elastic == len(load_config(REPO / "pipelines.yaml").pipelines), elastic
        # The schema is really applied: a field the CRD does not know is refused.
        bad = dict(obj, spec={**obj["spec"], "nprocPerNodeTypo": "2"})
        with pytest.raises(BackendCallError, match="nprocPerNodeTypo"):
            create_object(api, bad, dry_run=True)
    finally:
        client.ApiextensionsV1Api(api).delete_custom_resource_definition("pytorchjobs.kubeflow.org")


# -- Job and pod conditions on the real control plane, chaos, then resume -----------------------------------------
def report_data_of(html: str) -> dict:
    """The data a report page was drawn from (embedded as JSON, as tests/report/test_report_browser.py reads it)."""
    match = re.search(r'<script type="application/json" id=report-data>(.*?)</script>', html, re.S)
    assert match, "the report has no embedded data"
    return json.loads(match.group(1).replace("<\\/", "</"))


def claim(k8s_cluster: K8sCluster, name: str, folder: Path) -> str:  # noqa: F811
    """A workspace claim of its own (a test's own folder, as a hostPath PV both nodes see); returns its name."""
    folder.mkdir(parents=True, exist_ok=True)
    return shared_claim(k8s_cluster, NAMESPACE, f"ws-{name}", f"bcp-e2e-{name}", folder)


def chain_projects(k8s_cluster: K8sCluster, tmp_path: Path, name: str) -> tuple[Path, Path, Path]:  # noqa: F811
    """(the local reference's config, run already; the kubernetes project's config; its workspace folder)."""
    reference = write_chain_project(tmp_path / "local", K8S_CHAIN)
    assert cli(reference, "run", "chain", "--backend", "local") == 0
    config = write_chain_project(tmp_path / "k8s", K8S_CHAIN)
    folder = tmp_path / "workspace"
    raw = yaml.safe_load(config.read_text())
    raw["backends"]["kubernetes"] = {
        "kubeconfig": str(k8s_cluster.kubeconfig),
        "namespace": NAMESPACE,
        "image": "python:3.11",
        "workspace_claim": claim(k8s_cluster, name, folder),
        "code_dir": str(config.parent / "stages"),
        "python": sys.executable,
        "poll_seconds": 0.3,
        "poll_max_seconds": 1.0,
    }
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return reference, config, folder


def first_pods(k8s_cluster: K8sCluster, config: Path) -> dict[int, client.V1Pod]:  # noqa: F811
    """The running pods of the first stage's latest Job, by completion index (none before the run records one)."""
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    if state is None or not state.stages["first"].jobs:
        return {}
    job = state.stages["first"].jobs[-1].job_id
    pods = (
        client.CoreV1Api(k8s_cluster.api())
        .list_namespaced_pod(NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={job}")
        .items
    )
    return {
        int(p.metadata.annotations[INDEX_ANNOTATION]): p
        for p in pods
        if p.status.phase == "Running" and p.metadata.deletion_timestamp is None
    }


STARTED: list = []  # orchestrators a test started (killed after it, should it fail before they end)


@pytest.fixture(autouse=True)
def no_orchestrator_left() -> Iterator[None]:
    yield
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)


def stalled_first_stage(k8s_cluster: K8sCluster, config: Path, folder: Path):  # noqa: F811
    """The chain run started in a subprocess with its first stage's 2 pods running and held before their first
    item (the STALL marker of items.py); returns (orchestrator, pods by index)."""
    (folder / "first").mkdir(parents=True)
    (folder / "first" / "STALL").write_text("")
    orchestrator = start_orchestrator(config, "run", "chain", "--backend", "kubernetes")
    STARTED.append(orchestrator)
    pods = wait_for(
        lambda: (lambda found: found if len(found) == 2 else None)(first_pods(k8s_cluster, config)),
        timeout=90,
        what="the first stage's 2 pods running",
    )
    wait_for(lambda: rank_process(config, 1), timeout=30, what="rank 1's process")
    return orchestrator, pods


def rank_process(config: Path, rank: int) -> int | None:
    """The pid of the stage program of `rank` in this project (its environment names the rank; its command line
    the project's items.py)."""
    program = str(config.parent / "stages" / "items.py").encode()
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and program in (entry / "cmdline").read_bytes()
                and f"RANK={rank}".encode() in (entry / "environ").read_bytes().split(b"\0")
            ):
                return int(entry.name)
        except OSError:
            continue
    return None


def resume_to_the_reference(config: Path, reference: Path, folder: Path, orchestrator) -> RunState:
    """The first run ended FAILED (exit 1); `resume` (the STALL marker gone) ends like the local run."""
    output, _ = orchestrator.communicate(timeout=120)
    assert orchestrator.returncode == 1, output
    (folder / "first" / "STALL").unlink()
    assert cli(config, "resume") == 0
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
    assert state.stages["first"].attempts == 2
    assert tree(folder) == tree(reference.parent / "ws/main")
    return state


def test_a_time_limit_and_a_failed_program_map_to_timed_out_and_failed(
    k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path
) -> None:  # noqa: F811
    from bcp_pipeline.backends.contract import JobState
    from bcp_pipeline.backends.registry import make_backend
    from bcp_pipeline.engine.submitter import planned_requests

    config_file = demo_project(tmp_path / "states", "kubernetes", k8s_cluster.kubeconfig)
    ended = {}
    for label, overrides in {
        "deadline": ["sample.kubernetes.command=[sleep, '600']", "sample.kubernetes.active_deadline=2s"],
        "exit3": ["sample.kubernetes.command=[bash, -c, 'echo about to fail; exit 3']"],
    }.items():
        config = load_config(config_file, overrides=overrides, pipeline="demo")
        backend = make_backend("kubernetes", config, config.pipeline("demo"), tmp_path / "runs" / f"demo-{label}")
        request = next(
            r for r in planned_requests(config.pipeline("demo"), f"demo-{label}") if r.stage.name == "sample"
        )
        job_id = backend.submit(backend.render(request))

        def finished(backend=backend, job_id=job_id):
            status = backend.poll([job_id])[job_id]
            return status if status.state.finished else None

        ended[label] = backend, job_id, wait_for(finished, timeout=90, what=f"the {label} job's end")
    backend, job_id, status = ended["deadline"]
    # The pod's own timer ended it (time_limiter.sh), and the pod failure policy failed the Job at once.
    assert (status.state, status.native) == (JobState.TIMED_OUT, "FAILED/TIMELIMIT"), status
    assert "exit code 124" in status.detail, status.detail
    assert "time limit of 2 s" in backend.failure_detail(job_id, status)
    backend, job_id, status = ended["exit3"]
    assert (status.state, status.native) == (JobState.FAILED, "FAILED/BACKOFFLIMITEXCEEDED"), status
    detail = backend.failure_detail(job_id, status)
    assert "exited 3" in detail and "about to fail" in detail, detail


def test_time_spent_waiting_for_capacity_is_not_taken_from_the_time_limit(
    k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path
) -> None:  # noqa: F811
    """Every GPU of both nodes held by a first job, a stage with a 6 s limit that runs 3 s waits unschedulable for
    longer than its limit; once the GPUs are freed it runs, and succeeds: its limit counts from its pod's start
    (activeDeadlineSeconds would have failed it in the queue)."""
    holder, held = submit_demo_stage(
        k8s_cluster,
        tmp_path / "holder",
        "sample",
        [
            "sample.kubernetes.replicas=2",
            "sample.kubernetes.processes=1",
            f"sample.kubernetes.gpus={NODE_GPUS}",
            "sample.kubernetes.command=[sleep, '600']",
        ],
    )
    try:
        wait_for(
            lambda: (
                holder.poll([held])[held].native == "RUNNING"
                and (lambda pods: len(pods) == 2 and all(p.status.phase == "Running" for p in pods))(
                    client.CoreV1Api(k8s_cluster.api())
                    .list_namespaced_pod(NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={held}")
                    .items
                )
            ),
            timeout=60,
            what="both GPU-holding pods running",
        )
        backend, job_id = submit_demo_stage(
            k8s_cluster,
            tmp_path / "waiter",
            "sample",
            [
                "sample.kubernetes.replicas=1",
                "sample.kubernetes.processes=1",
                f"sample.kubernetes.gpus={NODE_GPUS}",
                "sample.kubernetes.active_deadline=6s",
                "sample.kubernetes.command=[bash, -c, 'sleep 3; echo in time']",
            ],
        )
        # Queued once the scheduler has tried its pod (before that: PENDING, no reason yet), then for longer than
        # its limit, waiting for capacity.
        wait_for(
            lambda: backend.poll([job_id])[job_id].native == "PENDING/UNSCHEDULABLE",
            timeout=30,
            what="the waiting job's pod found unschedulable",
        )
        waited_from = time.monotonic()
        while time.monotonic() - waited_from < 9:
            status = backend.poll([job_id])[job_id]
            assert (status.state, status.native) == (JobState.QUEUED, "PENDING/UNSCHEDULABLE"), status
            time.sleep(1)
    finally:
        holder.cancel([held])
    status = wait_for(
        lambda: (lambda s: s if s.state.finished else None)(backend.poll([job_id])[job_id]),
        timeout=90,
        what="the waiting job's end",
    )
    assert status.state is JobState.SUCCEEDED and status.native in ("COMPLETE", "SUCCESSCRITERIAMET"), status
    assert rank_lines(backend.logs(job_id), 0).strip() == "in time"


def test_a_killed_pod_process_fails_the_stage_then_resume_matches_a_local_run(
    k8s_cluster: K8sCluster,  # noqa: F811
    workspace: Path,
    tmp_path: Path,
) -> None:
    reference, config, folder = chain_projects(k8s_cluster, tmp_path, "kill")
    orchestrator, _ = stalled_first_stage(k8s_cluster, config, folder)
    os.kill(rank_process(config, 1), signal.SIGKILL)  # a failed program: counts against backoffLimit (0)
    state = resume_to_the_reference(config, reference, folder, orchestrator)
    first = state.stages["first"].jobs
    assert first[0].native == "FAILED/BACKOFFLIMITEXCEEDED" and first[0].state == "failed", first[0]


def test_a_deleted_pod_fails_the_stage_then_resume_matches_a_local_run(
    k8s_cluster: K8sCluster,  # noqa: F811
    workspace: Path,
    tmp_path: Path,
) -> None:
    reference, config, folder = chain_projects(k8s_cluster, tmp_path, "delete")
    orchestrator, pods = stalled_first_stage(k8s_cluster, config, folder)
    # A plain delete is no disruption (no DisruptionTarget): the killed program counts as a failure.
    client.CoreV1Api(k8s_cluster.api()).delete_namespaced_pod(pods[1].metadata.name, NAMESPACE)
    state = resume_to_the_reference(config, reference, folder, orchestrator)
    assert state.stages["first"].jobs[0].native == "FAILED/BACKOFFLIMITEXCEEDED"


def test_an_evicted_pod_is_replaced_by_the_job_and_the_run_goes_on(
    k8s_cluster: K8sCluster,  # noqa: F811
    workspace: Path,
    tmp_path: Path,
) -> None:
    reference, config, folder = chain_projects(k8s_cluster, tmp_path, "evict")
    orchestrator, pods = stalled_first_stage(k8s_cluster, config, folder)
    evicted = pods[1].metadata.name
    core = client.CoreV1Api(k8s_cluster.api())
    core.create_namespaced_pod_eviction(
        evicted,
        NAMESPACE,
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": evicted, "namespace": NAMESPACE}},
    )
    # The Eviction API marks the pod DisruptionTarget; the pod failure policy's Ignore rule replaces it.
    replacement = wait_for(
        lambda: (
            lambda found: found.get(1) if found.get(1) is not None and found[1].metadata.name != evicted else None
        )(first_pods(k8s_cluster, config)),
        timeout=60,
        what="index 1's replacement pod",
    )
    (folder / "first" / "STALL").unlink()
    output, _ = orchestrator.communicate(timeout=120)
    assert orchestrator.returncode == 0, output
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    assert state.stages["first"].attempts == 1  # the same Job went on: no resubmission, no resume
    job = client.BatchV1Api(k8s_cluster.api()).read_namespaced_job(state.stages["first"].jobs[0].job_id, NAMESPACE)
    assert job.status.succeeded == 2 and not job.status.failed, job.status  # the eviction counted as no failure
    assert replacement.metadata.name != evicted
    assert tree(folder) == tree(reference.parent / "ws/main")


def test_z_a_lost_node_is_a_lost_job_then_resume_runs_on_the_other_node_and_reports_it(  # last: node2 stays dead
    k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path
) -> None:  # noqa: F811
    reference, config, folder = chain_projects(k8s_cluster, tmp_path, "node")
    orchestrator, pods = stalled_first_stage(k8s_cluster, config, folder)
    lost = pods[1].spec.node_name
    killed = k8s_cluster.script("kill-node", lost)
    assert killed.returncode == 0, killed.stderr
    state = resume_to_the_reference(config, reference, folder, orchestrator)
    failed = state.stages["first"].jobs[0]
    assert (failed.native, failed.state) == ("NODE-LOST", "lost") and lost in failed.detail, failed
    # The lost attempt's Job was deleted before the next was created: nothing of it can be replaced later.
    batch = client.BatchV1Api(k8s_cluster.api())
    wait_for(
        lambda: all(
            j.metadata.name != failed.job_id or j.metadata.deletion_timestamp is not None
            for j in batch.list_namespaced_job(NAMESPACE).items
        ),
        timeout=30,
        what="the lost Job deleted",
    )
    second = state.stages["first"].jobs[-1].job_id
    survivors = (
        client.CoreV1Api(k8s_cluster.api())
        .list_namespaced_pod(NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={second}")
        .items
    )
    assert {p.spec.node_name for p in survivors} == set(k8s_cluster.nodes) - {lost}

    report = tmp_path / "report.html"
    assert cli(config, "report", "--out", str(report)) == 0
    data = report_data_of(report.read_text())
    assert data["run"]["status"] == "succeeded"
    commands = {c["job_id"]: c for c in data["commands"]}
    assert set(commands) == {job.job_id for stage in state.stages.values() for job in stage.jobs}
    assert "kind: Job" in commands[second]["text"] and "completionMode: Indexed" in commands[second]["text"]
    assert {s["stage"]: [c["found"] for c in s["checks"]] for s in data["stages"]} == {
        "first": [6],
        "second": [6],
        "third": [3],
    }
    assert "NODE-LOST" in report.read_text()
