"""scripts/k8s-cluster and the node agent (kubelet stand-in) against the real control plane it starts: Nodes
registered and Ready, an Indexed Job's pods placed on both nodes by the real scheduler and run with their
completion index, Secret and PVC; exit codes into pod status and the Job's pod failure policy; pods/log through
the apiserver; deletion kills the process."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support.k8s_cluster import K8sCluster, k8s_cluster  # noqa: F401  (the fixture)

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client  # noqa: E402

NAMESPACE = "agent-test"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def indexed_job(name: str, script: str, *, completions: int, volumes: bool = True) -> dict[str, Any]:
    """An Indexed Job whose pods spread over the nodes, with the Secret and the PVC mounted."""
    container: dict[str, Any] = {
        "name": "main", "image": "stand-in", "command": ["python3", "-c", script],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "token", "key": "value"}}}],
    }
    pod: dict[str, Any] = {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [container],
                           "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                                          "whenUnsatisfiable": "DoNotSchedule",
                                                          "labelSelector": {"matchLabels": {"job": name}}}]}
    if volumes:
        container["volumeMounts"] = [{"name": "work", "mountPath": "/mnt/bcp-agent-test/work"},
                                     {"name": "secret", "mountPath": "/mnt/bcp-agent-test/secret", "readOnly": True}]
        pod["volumes"] = [{"name": "work", "persistentVolumeClaim": {"claimName": "work"}},
                          {"name": "secret", "secret": {"secretName": "token"}}]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"completionMode": "Indexed", "completions": completions, "parallelism": completions,
                     "backoffLimit": 0,
                     "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
                         "containerName": "main", "operator": "In", "values": [3]}}]},
                     "template": {"metadata": {"labels": {"job": name}}, "spec": pod}}}


@pytest.fixture(scope="module")
def cluster(k8s_cluster: K8sCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[K8sCluster, Path]:  # noqa: F811
    """The namespace, a Secret and a PVC bound to a hostPath PV (a folder every node sees, as FSx would be)."""
    api = k8s_cluster.api()
    core = client.CoreV1Api(api)
    shared = tmp_path_factory.mktemp("pv")
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": "token"},
                                              "data": {"value": base64.b64encode(b"s3cr3t").decode()}})
    core.create_persistent_volume({"metadata": {"name": "agent-test-work"}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "hostPath": {"path": str(shared)},
        "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain"}})
    core.create_namespaced_persistent_volume_claim(NAMESPACE, {"metadata": {"name": "work"}, "spec": {
        "accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "",
        "volumeName": "agent-test-work"}})
    wait_for("the PVC to bind", lambda: core.read_namespaced_persistent_volume_claim("work", NAMESPACE)
             .status.phase == "Bound")
    return k8s_cluster, shared


def job_condition(batch: client.BatchV1Api, name: str) -> str | None:
    job = batch.read_namespaced_job(name, NAMESPACE)
    return next((c.type for c in job.status.conditions or [] if c.status == "True"
                 and c.type in ("Complete", "Failed")), None)


def test_nodes_are_ready_with_leases_and_no_taint(cluster: tuple[K8sCluster, Path]) -> None:
    k8s, _ = cluster
    api = k8s.api()
    nodes = client.CoreV1Api(api).list_node().items
    assert sorted(n.metadata.name for n in nodes) == ["node1", "node2"]
    for node in nodes:
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert ready.status == "True"
        assert not [t for t in node.spec.taints or [] if t.key == "node.kubernetes.io/not-ready"]
        address = next(a.address for a in node.status.addresses if a.type == "InternalIP")
        assert address.startswith("198.1")
    leases = client.CoordinationV1Api(api).list_namespaced_lease("kube-node-lease").items
    assert sorted(lease.metadata.name for lease in leases) == ["node1", "node2"]


def test_indexed_job_runs_on_both_nodes_with_index_secret_and_pvc(cluster: tuple[K8sCluster, Path]) -> None:
    k8s, shared = cluster
    api = k8s.api()
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    script = ("import os, socket; i = os.environ['JOB_COMPLETION_INDEX']; "
              "secret = open('/mnt/bcp-agent-test/secret/value').read(); "
              "open(f'/mnt/bcp-agent-test/work/rank-{i}', 'w').write(f\"{os.environ['NODE_NAME']} "
              "{secret == os.environ['TOKEN']}\"); print('hello from index', i, flush=True)")
    batch.create_namespaced_job(NAMESPACE, indexed_job("hello", script, completions=2))
    assert wait_for("the Job to finish", lambda: job_condition(batch, "hello")) == "Complete"
    written = sorted((path.name, path.read_text()) for path in shared.glob("rank-*"))
    assert [name for name, _ in written] == ["rank-0", "rank-1"]
    assert sorted(text.split()[0] for _, text in written) == ["node1", "node2"]  # spread over both nodes
    assert all(text.endswith(" True") for _, text in written)  # the Secret as a file equals it as env
    pods = core.list_namespaced_pod(NAMESPACE, label_selector="job-name=hello").items
    for pod in pods:
        index = pod.metadata.annotations["batch.kubernetes.io/job-completion-index"]
        text = core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE)  # through the apiserver
        assert text == f"hello from index {index}\n"
        assert pod.status.container_statuses[0].state.terminated.exit_code == 0


def test_exit_code_reaches_the_pod_failure_policy(cluster: tuple[K8sCluster, Path]) -> None:
    k8s, _ = cluster
    api = k8s.api()
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    batch.create_namespaced_job(NAMESPACE, indexed_job("exit3", "import sys; print('bye'); sys.exit(3)",
                                                       completions=1, volumes=False))
    assert wait_for("the Job to fail", lambda: job_condition(batch, "exit3")) == "Failed"
    job = batch.read_namespaced_job("exit3", NAMESPACE)
    failed = next(c for c in job.status.conditions if c.type == "Failed")
    assert failed.reason == "PodFailurePolicy", failed
    pod = core.list_namespaced_pod(NAMESPACE, label_selector="job-name=exit3").items[0]
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3
    assert core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE, tail_lines=1) == "bye\n"


def test_deleting_a_job_kills_its_process(cluster: tuple[K8sCluster, Path]) -> None:
    k8s, shared = cluster
    api = k8s.api()
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    script = ("import os, time; open('/mnt/bcp-agent-test/work/pid', 'w').write(str(os.getpid())); "
              "time.sleep(600)")
    batch.create_namespaced_job(NAMESPACE, indexed_job("sleeper", script, completions=1))
    pid_file = shared / "pid"
    pid = int(wait_for("the process to start", lambda: pid_file.is_file() and pid_file.read_text()))
    assert Path(f"/proc/{pid}").exists()
    batch.delete_namespaced_job("sleeper", NAMESPACE, propagation_policy="Foreground")
    wait_for("the process to die", lambda: not Path(f"/proc/{pid}").exists() or
             Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z")
    wait_for("the pod to be removed", lambda: not core.list_namespaced_pod(
        NAMESPACE, label_selector="job-name=sleeper").items)
