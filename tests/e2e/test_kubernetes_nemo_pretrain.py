"""A `nemo:` pretrain on the test cluster (scripts/k8s-cluster: Kubernetes' own control plane, the node agent
standing in for the kubelet): an Indexed Job of 2 pods, one a node, each asking for its GPU. The first pod writes the
data list and runs NVIDIA's launcher in its debug mode (it composes the training config and runs nothing), the other
waits for it; then torchrun in each pod (static rendezvous at the index-0 pod, through the headless Service) runs
NeMo's training script with that config, and a crash of the training fails the stage with its traceback.

STAND-INS (tests/fakes/README.md): the NeMo launcher and NeMo's training script (tests/fakes/nemo_launcher: real
hydra-core composes the config; the trainer trains no model and needs no GPU), and the kubelet (no image: the pod's
command runs on this machine, with the stage's env PATH putting this environment's python3 first, as a NeMo image's
PATH does). torchrun is PyTorch's own. The nodes' `nvidia.com/gpu` capacity is what the NVIDIA device plugin would
advertise on a GPU node: written into each Node's status by the test (one a node), so the real scheduler places
each pod, which asks for one, on a node of its own.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from support.cli import cli
from support.ddp_pretrain import stage_job
from support.k8s_cluster import (  # noqa: F401 (the fixture)
    K8sCluster,
    cluster_port,
    k8s_cluster,
    shared_claim,
    skip_unless_required,
    training_operator,
    training_operator_binary,
)
from support.nemo_project import fabricate_nemo_data, nemo_pipelines_yaml
from support.pipeline_fixtures import REPO, logs_and_status

from bcp_pipeline.engine.state import RunStore, StageStatus

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client  # noqa: E402

NAMESPACE = "bcp-nemo"
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def workspace(k8s_cluster: K8sCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The namespace, a ReadWriteMany claim on a hostPath folder (the workspace), and a GPU a node."""
    api = k8s_cluster.api()
    core = client.CoreV1Api(api)
    folder = tmp_path_factory.mktemp("nemo-workspace")
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    shared_claim(k8s_cluster, NAMESPACE, "bcp-pipeline-workspace", "bcp-nemo-workspace", folder)
    for node in core.list_node().items:  # the device plugin's part: a GPU a node, where the agent advertises none
        if int((node.status.allocatable or {}).get(GPU, "0")) < 1:
            core.patch_node_status(node.metadata.name, {"status": {"capacity": {GPU: "1"}, "allocatable": {GPU: "1"}}})
    return folder


def nemo_project(
    root: Path, cluster: K8sCluster, workspace: Path, name: str, extra: str = "", launcher: str = "job"
) -> Path:
    """A one-stage pipeline `nemo` whose data (two fabricated .bin/.idx pairs) lies in the workspace under `name`."""
    fabricate_nemo_data(workspace / name / "preprocessed")
    root.mkdir(parents=True)
    config = root / "pipelines.yaml"
    path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"  # the "image's" python3 first
    options = (
        f"{{kubeconfig: {cluster.kubeconfig}, namespace: {NAMESPACE}, code_dir: {REPO / 'stages'}, "
        f"python: {sys.executable},\npoll_seconds: 0.5, poll_max_seconds: 2.0}}"
    )
    stage = f'{{replicas: 2, gpus: 1, active_deadline: 5m, launcher: {launcher}, env: {{PATH: "{path}"}}}}'
    # The module's tests share one workspace (the PVC): each test's data, BPE and results under its own `name`.
    config.write_text(
        nemo_pipelines_yaml(
            "kubernetes",
            options,
            stage,
            workspace="{name: main, mount: /mount_workspace}",
            variables=f'{{data: "${{workspace}}/{name}"}}',
            data="${data}",
            results="${data}/results",
            margin="1m",
            extra_overrides=extra,
        )
    )
    return config


def test_a_nemo_pretrain_in_two_gpu_pods_trains_through_the_launcher_and_torchrun(  # noqa: F811
    k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = nemo_project(tmp_path / "p", k8s_cluster, workspace, "trains")
    assert cli(config, "run", "nemo", "--backend", "kubernetes") == 0
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    stage = state.stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED and stage.attempts == 1
    assert stage.sharding == {"replicas": 2, "processes": 1}  # 2 pods x 1 GPU: a rank a GPU
    assert stage.progress["done"] == 30 and stage.progress["unit"] == "steps", stage.progress
    # The config the launcher composed on the first pod, for this run's own NeMo run, is what NeMo's script read.
    run_dir = workspace / "trains/results" / f"gpt-{state.run_id}"
    composed = yaml.safe_load((run_dir / f"gpt-{state.run_id}_hydra.yaml").read_text())
    assert composed["trainer"]["num_nodes"] == 2 and composed["trainer"]["devices"] == 1
    assert composed["exp_manager"]["max_time_per_run"] == "0:00:04:00"  # the deadline 5m minus the 1m margin
    assert (run_dir / ".bcp-pipeline-composed").read_text().strip() == stage_job(stage)  # this attempt's mark
    assert {p.name.split("-step=")[1].split("-")[0] for p in (run_dir / "results/checkpoints").iterdir()} == {
        "10",
        "20",
        "30",
    }
    # Each pod asked for its GPU, and the scheduler put one on each node; torchrun's 2 nodes met.
    job = stage_job(stage)
    pods = (
        client.CoreV1Api(k8s_cluster.api())
        .list_namespaced_pod(NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={job}")
        .items
    )
    assert sorted(p.spec.node_name for p in pods) == ["node1", "node2"]
    assert all(p.spec.containers[0].resources.limits[GPU] == "1" for p in pods)
    log, status = logs_and_status(config, state.run_id, "pretrain", capsys)
    assert "reduced_train_loss=" in log and "global_step=29.000" in log
    assert f"30/30 steps, loss {stage.progress['loss']:.3g}" in status, status


def test_a_crashed_nemo_training_on_kubernetes_fails_its_stage(  # noqa: F811
    k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = nemo_project(
        tmp_path / "p", k8s_cluster, workspace, "crashes", extra=", +training.standin.crash_at_step=12"
    )
    assert cli(config, "run", "nemo", "--backend", "kubernetes") == 1
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    stage = state.stages["pretrain"]
    assert stage.status is StageStatus.FAILED and stage.attempts == 1, (stage.status, stage.error)
    assert "exited 1" in stage.error and "RuntimeError: CUDA error: an illegal memory access" in stage.error, (
        stage.error
    )
    capsys.readouterr()
    assert cli(config, "logs", state.run_id, "pretrain") == 0
    assert "RuntimeError: CUDA error" in capsys.readouterr().out


def test_a_nemo_pretrain_as_a_pytorchjob_composes_on_the_master_and_trains_on_both(  # noqa: F811
    k8s_cluster: K8sCluster, workspace: Path, tmp_path: Path
) -> None:
    """`launcher: pytorchjob`: the real training operator (v1.8.1) makes the Master and Worker pods; the Master
    (PET_NODE_RANK 0) composes, the Worker waits for it, and torchrun in each takes the operator's PET_* rendezvous."""
    if not training_operator_binary().is_file():
        skip_unless_required(f"no training operator at {training_operator_binary()}: run `scripts/k8s-cluster install`")
    config = nemo_project(tmp_path / "p", k8s_cluster, workspace, "operator", launcher="pytorchjob")
    with training_operator(k8s_cluster, cluster_port() + 10):
        assert cli(config, "run", "nemo", "--backend", "kubernetes") == 0
    state = RunStore(config.parent / ".bcp-pipeline").latest()
    stage = state.stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED and stage.jobs[0].native == "SUCCEEDED"
    run_dir = workspace / "operator/results" / f"gpt-{state.run_id}"
    composed = yaml.safe_load((run_dir / f"gpt-{state.run_id}_hydra.yaml").read_text())
    assert composed["trainer"]["num_nodes"] == 2 and composed["trainer"]["devices"] == 1
    assert {p.name.split("-step=")[1].split("-")[0] for p in (run_dir / "results/checkpoints").iterdir()} == {
        "10",
        "20",
        "30",
    }
    job = stage_job(stage)
    pods = (
        client.CoreV1Api(k8s_cluster.api())
        .list_namespaced_pod(NAMESPACE, label_selector=f"training.kubeflow.org/job-name={job}")
        .items
    )
    assert sorted(p.metadata.labels["training.kubeflow.org/replica-type"] for p in pods) == ["master", "worker"]
    assert sorted(p.spec.node_name for p in pods) == ["node1", "node2"]
    assert all(p.spec.containers[0].resources.limits[GPU] == "1" for p in pods)
