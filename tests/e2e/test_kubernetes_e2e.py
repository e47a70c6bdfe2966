"""The kubernetes backend on a real control plane built from source (scripts/k8s-cluster via the `k8s_cluster`
fixture), with two node agents (the kubelet STAND-IN of tests/fakes/k8s_node_agent.py) in their own network
namespaces. The demo's data stages run as Indexed Jobs whose pods spread over both nodes, and their outputs are
compared byte for byte with a local run; status, logs (pods/log through the apiserver), cancel, check and every
bundled pipeline's manifests (server-side dry run) are tried against the same apiserver."""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from bcp_pipeline.cli.main import main
from bcp_pipeline.config.pipelines import load_config
from bcp_pipeline.engine.state import RunStore, StageStatus
from k8s_cluster import K8sCluster, k8s_cluster  # noqa: F401  (the fixture)
from pipeline_fixtures import REPO

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client  # noqa: E402

NAMESPACE = "bcp-e2e"
CLAIM = "bcp-pipeline-workspace"
# Demo data stages: (pods, processes per pod). download puts two ranks in each pod.
SPREAD = {"download": (2, 2), "extract": (2, 1), "concat": (2, 1), "tokenize-preprocess": (2, 1)}
RECORDS = {"download": "download", "extract": "extract", "concat": "concat", "tokenize-preprocess": "preprocess"}


def cli(config: Path, *args: str) -> int:
    return main(["--config", str(config), *args])


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` but the completion records (times, hosts) and the results folder of runs."""
    files = {p.relative_to(root): p for p in sorted(root.rglob("*")) if p.is_file()}
    return {str(rel): p.read_bytes() for rel, p in files.items()
            if ".completions" not in rel.parts and ".bcp-pipeline" not in rel.parts}


@pytest.fixture(scope="module")
def workspace(k8s_cluster: K8sCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The namespace and the workspace PVC, bound to a hostPath PV: a folder both nodes see, as FSx would be."""
    core = client.CoreV1Api(k8s_cluster.api())
    folder = tmp_path_factory.mktemp("k8s-workspace")
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    core.create_persistent_volume({"metadata": {"name": "bcp-e2e-workspace"}, "spec": {
        "capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany"], "hostPath": {"path": str(folder)},
        "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain"}})
    core.create_namespaced_persistent_volume_claim(NAMESPACE, {"metadata": {"name": CLAIM}, "spec": {
        "accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}, "storageClassName": "",
        "volumeName": "bcp-e2e-workspace"}})
    deadline = time.monotonic() + 60
    while core.read_namespaced_persistent_volume_claim(CLAIM, NAMESPACE).status.phase != "Bound":
        assert time.monotonic() < deadline, "the workspace PVC did not bind"
        time.sleep(0.5)
    core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "hf-token"},
                                              "data": {"token": base64.b64encode(b"hf_secret_VALUE").decode()}})
    return folder


def demo_project(root: Path, backend: str, kubeconfig: Path) -> Path:
    """The bundled demo without its pretrain stage (data stages only), on `backend`."""
    raw = yaml.safe_load((REPO / "pipelines.yaml").read_text())
    demo = raw["pipelines"]["demo"]
    del demo["stages"]["pretrain"]
    for stage, (pods, processes) in SPREAD.items():
        demo["stages"][stage]["kubernetes"] = {"replicas": pods, "processes": processes}
    demo["stages"]["download"]["kubernetes"]["secrets"] = ["hf-token:token:HF_TOKEN"]
    backends = raw.get("backends") or {}
    options = {"kubeconfig": str(kubeconfig), "namespace": NAMESPACE, "code_dir": str(REPO / "stages"),
               "python": sys.executable, "poll_seconds": 0.5, "poll_max_seconds": 2.0}
    raw = {"version": raw.get("version", 1), "stages_dir": str(REPO / "stages"),
           "backends": {**backends, "kubernetes": options},
           "pipelines": {"demo": {**demo, "backend": backend}}}
    root.mkdir(parents=True)
    config = root / "pipelines.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def test_demo_data_stages_spread_over_two_nodes_match_a_local_run(k8s_cluster: K8sCluster, workspace: Path,  # noqa: F811
                                                                  tmp_path: Path, capsys: pytest.CaptureFixture
                                                                  ) -> None:
    local = demo_project(tmp_path / "local", "local", k8s_cluster.kubeconfig)
    assert cli(local, "run", "demo") == 0
    config = demo_project(tmp_path / "k8s", "kubernetes", k8s_cluster.kubeconfig)
    assert cli(config, "run", "demo") == 0, capsys.readouterr().out
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    assert state.backend == "kubernetes" and all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
    nodes = {n.metadata.name: next(a.address for a in n.status.addresses if a.type == "InternalIP")
             for n in client.CoreV1Api(k8s_cluster.api()).list_node().items}
    data = workspace / "data/slimpajama"
    folders = {"download": data / "zst", "extract": data / "jsonl", "concat": data / "train",
               "tokenize-preprocess": data / "preprocessed"}
    for stage, (pods, processes) in SPREAD.items():
        assert state.stages[stage].sharding == {"replicas": pods, "processes": processes}
        ranks = [json.loads(p.read_text()) for p in sorted((folders[stage] / ".completions")
                                                            .glob(f"{RECORDS[stage]}-*.json"))]
        world = pods * processes
        assert [(r["rank"], r["world_size"]) for r in ranks] == [(rank, world) for rank in range(world)]
        used = {address for r in ranks for address in r["ran_on"]["addresses"]}
        assert used == set(nodes.values()), f"{stage} ran on {used}, not on both nodes {nodes}"
        assert state.stages[stage].verification["ok"]
    assert tree(workspace) == tree(local.parent / ".bcp-pipeline/workspaces/demo")

    capsys.readouterr()
    assert cli(config, "status") == 0
    assert state.stages["download"].jobs[-1].job_id in capsys.readouterr().out
    assert cli(config, "logs", state.run_id, "concat", "--rank", "1") == 0
    assert '"rank": 1' in capsys.readouterr().out  # rank 1's pod log, through pods/log
    for path in (config.parent / ".bcp-pipeline").rglob("*"):  # state, plan records, logs: the secret is only
        if path.is_file():                                        # ever named, never copied
            assert b"hf_secret_VALUE" not in path.read_bytes(), path


def test_every_bundled_pipeline_is_accepted_by_the_apiserver(k8s_cluster: K8sCluster, workspace: Path) -> None:  # noqa: F811
    from bcp_pipeline.backends.kubernetes import create_object
    from bcp_pipeline.backends.registry import make_backend
    from bcp_pipeline.engine.submitter import planned_requests

    config = load_config(REPO / "pipelines.yaml")
    config.options["kubernetes"].namespace = NAMESPACE
    api = k8s_cluster.api()
    checked = 0
    for name, pipeline in config.pipelines.items():
        backend = make_backend("kubernetes", config, pipeline, Path("/tmp/none/runs") / f"{name}-RUN")
        for request in planned_requests(pipeline, f"{name}-RUN"):
            for obj in backend.render(request).payload["manifests"]:
                if obj["kind"] != "PyTorchJob":
                    create_object(api, obj, dry_run=True)  # raises with the apiserver's reason if refused
                    checked += 1
    assert checked > 20


def test_cancel_deletes_the_job_and_kills_its_pods(k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path  # noqa: F811
                                                   ) -> None:
    from bcp_pipeline.backends.registry import make_backend
    from bcp_pipeline.engine.submitter import planned_requests

    config_file = demo_project(tmp_path / "cancel", "kubernetes", k8s_cluster.kubeconfig)
    config = load_config(config_file, overrides=["sample.kubernetes.command=[sleep, '600']"], pipeline="demo")
    pipeline = config.pipeline("demo")
    backend = make_backend("kubernetes", config, pipeline, tmp_path / "runs" / "demo-CANCEL")
    request = next(r for r in planned_requests(pipeline, "demo-CANCEL") if r.stage.name == "sample")
    job_id = backend.submit(backend.render(request))
    deadline = time.monotonic() + 60
    while backend.poll([job_id])[job_id].native != "RUNNING":
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.5)
    assert backend.find_active("demo-CANCEL", "sample", "stage") == [job_id]
    backend.cancel([job_id])
    core = client.CoreV1Api(k8s_cluster.api())
    while backend.poll([job_id]) or core.list_namespaced_pod(
            NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={job_id}").items:
        assert time.monotonic() < deadline + 60, "the job or its pods outlived the cancel"
        time.sleep(0.5)


def test_check_reports_the_cluster(k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path,  # noqa: F811
                                   capsys: pytest.CaptureFixture) -> None:
    config = demo_project(tmp_path / "check", "kubernetes", k8s_cluster.kubeconfig)
    capsys.readouterr()
    code = cli(config, "check", "demo", "--backend", "kubernetes", "--json")
    result = json.loads(capsys.readouterr().out)
    rows = {(row["topic"], row["assumes"]): row for row in result["rows"]}
    verdicts = {topic: row["verdict"] for (topic, _), row in rows.items()}
    assert verdicts["api"] == "ok" and verdicts["rights"] == "ok" and verdicts["workspace claim"] == "ok"
    assert verdicts["namespace"] == "ok" and verdicts["who am i"] == "ok"
    assert all(row["verdict"] == "ok" for (topic, _), row in rows.items() if topic == "manifests"), rows
    assert code == 0
