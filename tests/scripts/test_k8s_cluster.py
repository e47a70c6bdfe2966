"""scripts/k8s-cluster and the node agent (kubelet stand-in) against the real control plane it starts: Nodes
registered and Ready, an Indexed Job's pods placed on both nodes by the real scheduler and run with their
completion index, Secret and PVC; exit codes into pod status and the Job's pod failure policy; pods/log through
the apiserver; deletion kills the process."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.k8s_cluster import K8sCluster, k8s_cluster, shared_claim  # noqa: F401  (the fixture)

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
        "name": "main",
        "image": "python:3.11",
        "command": ["python3", "-c", script],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "token", "key": "value"}}},
        ],
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "containers": [container],
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"job": name}},
            }
        ],
    }
    if volumes:
        container["volumeMounts"] = [
            {"name": "work", "mountPath": "/mnt/bcp-agent-test/work"},
            {"name": "secret", "mountPath": "/mnt/bcp-agent-test/secret", "readOnly": True},
        ]
        pod["volumes"] = [
            {"name": "work", "persistentVolumeClaim": {"claimName": "work"}},
            {"name": "secret", "secret": {"secretName": "token"}},
        ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": completions,
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [
                    {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [3]}}
                ]
            },
            "template": {"metadata": {"labels": {"job": name}}, "spec": pod},
        },
    }


@pytest.fixture(scope="module")
def cluster(k8s_cluster: K8sCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[K8sCluster, Path]:  # noqa: F811
    """The namespace, a Secret and a PVC bound to a hostPath PV (a folder every node sees, as FSx would be)."""
    api = k8s_cluster.api()
    core = client.CoreV1Api(api)
    shared = tmp_path_factory.mktemp("pv")
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    core.create_namespaced_secret(
        NAMESPACE, {"metadata": {"name": "token"}, "data": {"value": base64.b64encode(b"s3cr3t").decode()}}
    )
    shared_claim(k8s_cluster, NAMESPACE, "work", "agent-test-work", shared)
    return k8s_cluster, shared


def job_condition(batch: client.BatchV1Api, name: str) -> str | None:
    job = batch.read_namespaced_job(name, NAMESPACE)
    return next(
        (c.type for c in job.status.conditions or [] if c.status == "True" and c.type in ("Complete", "Failed")), None
    )


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
    script = (
        "import os, socket; i = os.environ['JOB_COMPLETION_INDEX']; "
        "secret = open('/mnt/bcp-agent-test/secret/value').read(); "
        "open(f'/mnt/bcp-agent-test/work/rank-{i}', 'w').write(f\"{os.environ['NODE_NAME']} "
        "{secret == os.environ['TOKEN']}\"); print('hello from index', i, flush=True)"
    )
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
    batch.create_namespaced_job(
        NAMESPACE, indexed_job("exit3", "import sys; print('bye'); sys.exit(3)", completions=1, volumes=False)
    )
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
    script = "import os, time; open('/mnt/bcp-agent-test/work/pid', 'w').write(str(os.getpid())); time.sleep(600)"
    batch.create_namespaced_job(NAMESPACE, indexed_job("sleeper", script, completions=1))
    pid_file = shared / "pid"
    pid = int(wait_for("the process to start", lambda: pid_file.is_file() and pid_file.read_text()))
    assert Path(f"/proc/{pid}").exists()
    batch.delete_namespaced_job("sleeper", NAMESPACE, propagation_policy="Foreground")
    wait_for(
        "the process to die",
        lambda: not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z",
    )
    wait_for(
        "the pod to be removed",
        lambda: not core.list_namespaced_pod(NAMESPACE, label_selector="job-name=sleeper").items,
    )


# -- what EKS nodes have: GPUs and EFA devices to schedule, images that may not come, /dev/shm, the environment -----
def bare_pod(name: str, command: list[str], *, image: str = "python:3.11", **container: Any) -> dict[str, Any]:
    """A pod of one container `main` (restartPolicy Never); `container` adds to the container (resources, env,
    volumeMounts); `volumes` given there goes to the pod."""
    volumes = container.pop("volumes", None)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "containers": [{"name": "main", "image": image, "command": command, **container}],
    }
    if volumes:
        spec["volumes"] = volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def run_pod(core: client.CoreV1Api, body: dict[str, Any]) -> str:
    """Create the pod, wait for it to succeed, return its log (through the apiserver)."""
    name = body["metadata"]["name"]
    core.create_namespaced_pod(NAMESPACE, body)
    phase = wait_for(
        f"pod {name} to end",
        lambda: (lambda p: p if p in ("Succeeded", "Failed") else None)(
            core.read_namespaced_pod(name, NAMESPACE).status.phase
        ),
    )
    # Raw: the client's own decoding turns a log that happens to be JSON ("67108864\n") into a Python repr.
    text = core.read_namespaced_pod_log(name, NAMESPACE, _preload_content=False).data.decode()
    assert phase == "Succeeded", text
    return text


def test_nodes_offer_gpus_and_efa_which_the_scheduler_counts(cluster: tuple[K8sCluster, Path]) -> None:
    """Each node's capacity has the extended resources of `start --node-gpus/--node-efa`; the real scheduler
    places a pod asking for all of a node's GPUs, and keeps one asking for more Unschedulable with its reason."""
    from support.k8s_cluster import NODE_EFA, NODE_GPUS

    k8s, _ = cluster
    core = client.CoreV1Api(k8s.api())
    for node in core.list_node().items:
        assert node.status.allocatable["nvidia.com/gpu"] == str(NODE_GPUS), node.status.allocatable
        assert node.status.allocatable["vpc.amazonaws.com/efa"] == str(NODE_EFA)
    fits = {"nvidia.com/gpu": str(NODE_GPUS), "vpc.amazonaws.com/efa": str(NODE_EFA)}
    assert (
        run_pod(core, bare_pod("gpus-fit", ["echo", "scheduled"], resources={"requests": fits, "limits": fits}))
        == "scheduled\n"
    )
    too_many = {"nvidia.com/gpu": str(NODE_GPUS + 1)}
    core.create_namespaced_pod(
        NAMESPACE, bare_pod("gpus-too-many", ["echo", "never"], resources={"requests": too_many, "limits": too_many})
    )

    def unschedulable() -> Any:
        conditions = core.read_namespaced_pod("gpus-too-many", NAMESPACE).status.conditions or []
        return next((c for c in conditions if c.type == "PodScheduled" and c.reason == "Unschedulable"), None)

    condition = wait_for("the over-request to be found unschedulable", unschedulable)
    assert "0/2 nodes are available: 2 Insufficient nvidia.com/gpu" in condition.message, condition.message
    time.sleep(3)  # and it stays so
    assert core.read_namespaced_pod("gpus-too-many", NAMESPACE).spec.node_name is None
    core.delete_namespaced_pod("gpus-too-many", NAMESPACE)


def test_an_image_the_node_cannot_pull_waits_in_err_image_pull_and_never_runs(cluster: tuple[K8sCluster, Path]) -> None:
    """A pod of an image outside the nodes' pullable images waits as the kubelet's does: ErrImagePull, then
    ImagePullBackOff, with a message; its command never runs. A name no runtime can parse: InvalidImageName."""
    k8s, shared = cluster
    core = client.CoreV1Api(k8s.api())
    marker = shared / "unpullable-ran"
    core.create_namespaced_pod(
        NAMESPACE, bare_pod("unpullable", ["touch", str(marker)], image="registry.example/private/trainer:1")
    )

    def waiting(name: str, reason: str) -> Any:
        def check() -> Any:
            status = core.read_namespaced_pod(name, NAMESPACE).status
            state = status.container_statuses[0].state if status.container_statuses else None
            return status if state and state.waiting and state.waiting.reason == reason else None

        return check

    first = wait_for("ErrImagePull", waiting("unpullable", "ErrImagePull"), timeout=60)
    assert first.phase == "Pending" and first.start_time is not None
    assert (
        'failed to pull and unpack image "registry.example/private/trainer:1"'
        in first.container_statuses[0].state.waiting.message
    )
    backoff = wait_for("ImagePullBackOff", waiting("unpullable", "ImagePullBackOff"), timeout=30)
    assert backoff.container_statuses[0].state.waiting.message.startswith(
        'Back-off pulling image "registry.example/private/trainer:1"'
    )
    assert backoff.phase == "Pending" and not marker.exists()
    core.create_namespaced_pod(NAMESPACE, bare_pod("badname", ["true"], image="Not An Image"))
    wait_for("InvalidImageName", waiting("badname", "InvalidImageName"), timeout=60)
    for name in ("unpullable", "badname"):
        core.delete_namespaced_pod(name, NAMESPACE)
    wait_for(
        "the waiting pods to be removed",
        lambda: not {"unpullable", "badname"} & {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items},
    )
    assert not marker.exists()


SHM_SIZE = "import os; s = os.statvfs('/dev/shm'); print(s.f_blocks * s.f_frsize)"


def test_every_pod_has_its_own_dev_shm_of_the_runtime_size_or_of_its_memory_empty_dir(
    cluster: tuple[K8sCluster, Path],
) -> None:
    """64 MiB (a container runtime's default) in the pod's own mount namespace; a memory emptyDir mounted there
    gives its sizeLimit, or without one the pod's memory limit."""
    k8s, _ = cluster
    core = client.CoreV1Api(k8s.api())
    assert run_pod(core, bare_pod("shm-default", [sys.executable, "-c", SHM_SIZE])) == f"{64 * 2**20}\n"
    dshm = [{"name": "dshm", "mountPath": "/dev/shm"}]
    sized = bare_pod(
        "shm-sized",
        [sys.executable, "-c", SHM_SIZE],
        volumeMounts=dshm,
        volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "128Mi"}}],
    )
    assert run_pod(core, sized) == f"{128 * 2**20}\n"
    limited = bare_pod(
        "shm-pod-limit",
        [sys.executable, "-c", SHM_SIZE],
        volumeMounts=dshm,
        volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        resources={"limits": {"memory": "256Mi"}, "requests": {"memory": "256Mi"}},
    )
    assert run_pod(core, limited) == f"{256 * 2**20}\n"
    # A pod's /dev/shm is its own: what one writes there, the next does not see; the host's is untouched.
    write = "open('/dev/shm/bcp-agent-test', 'w').write('x'); print('written')"
    assert run_pod(core, bare_pod("shm-write", [sys.executable, "-c", write])) == "written\n"
    assert not Path("/dev/shm/bcp-agent-test").exists()


def test_the_environment_is_the_pods_as_rendered_with_the_kubelets_expansion(cluster: tuple[K8sCluster, Path]) -> None:
    """The process sees the container's `env` (with `$(VAR)` expanded over the entries before it, `$$` escaped,
    an undefined reference kept, as the kubelet does; args expanded too), plus what a runtime adds (HOSTNAME, the
    image's PATH: this machine's): nothing else of this machine's environment."""
    k8s, _ = cluster
    core = client.CoreV1Api(k8s.api())
    env = [
        {"name": "A", "value": "one"},
        {"name": "B", "value": "$(A)-two"},
        {"name": "C", "value": "$$(A) $(NONE)"},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    # The environment block the process was started with (Python's os.environ may gain LC_CTYPE: PEP 538).
    dump = (
        "import json, sys; block = open('/proc/self/environ', 'rb').read().decode().split('\\0'); "
        "print(json.dumps({'env': dict(e.split('=', 1) for e in block if e), 'argv': sys.argv[1:]}))"
    )
    # This interpreter, not `python3` (pyenv's shim on PATH adds PYENV_* variables of its own before Python runs).
    text = run_pod(core, bare_pod("env", [sys.executable, "-c", dump, "$(B)", "$$(B)"], env=env))
    seen = json.loads(text)
    assert seen["argv"] == ["one-two", "$(B)"]
    assert {k: v for k, v in seen["env"].items() if k not in ("PATH", "HOSTNAME")} == {
        "A": "one",
        "B": "one-two",
        "C": "$(A) $(NONE)",
        "POD": "env",
    }
    assert seen["env"]["HOSTNAME"] == "env"
