"""The real Kueue (sigs.k8s.io/kueue, built from its module source by `scripts/k8s-cluster install` into
~/.cache/bcp-pipeline/kueue/RELEASE) against the test cluster's apiserver, as its Deployment would run it, and the
queues a test admits through:

    with kueue(k8s_cluster, port, frameworks=("batch/job",)):
        make_queue(k8s_cluster.api(), NAMESPACE, "team-a", cpu="2")

What differs from a Deployment, and why:
- No webhook is registered (the training operator's is, tests/support/k8s_cluster.py; Kueue's would need its
  Service and a certificate for that name too): Kueue's mutating webhook, which suspends a labelled job on
  creation, never runs, so the backend renders `suspend: true` itself, and Kueue's job reconciler admits such a job
  as it would one its webhook suspended; that is also what the tests show works where the webhook is absent or
  fails open. Its webhook server still starts (Kueue always starts it), on loopback, with a self-signed
  certificate of the fixture's.
- Its certificates are the fixture's (internalCertManagement off): the webhook's in a folder of the cluster's base;
  the metrics server's at /etc/kueue/metrics/certs, the path Kueue reads them from (its Secret volume's mount in the
  Deployment), written there for the run of Kueue and removed after.
- The visibility API server (an aggregated API, which the apiserver could not reach either) is off.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from support.k8s_cluster import K8sCluster

RELEASE = "v0.17.0"  # scripts/_clusters/k8s_build.py KUEUE
CACHE = Path.home() / ".cache" / "bcp-pipeline" / "kueue" / RELEASE
NAMESPACE = "kueue-system"
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")  # cmd/kueue/main.go: fixed where internalCertManagement is off


def binary() -> Path:
    return CACHE / "bin" / "kueue"


def install_crds(api: Any) -> None:
    """Kueue's CRDs from its module source, each waited for until Established."""
    from kubernetes import client

    extensions = client.ApiextensionsV1Api(api)
    names = []
    for path in sorted((CACHE / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        extensions.create_custom_resource_definition(crd)
        names.append(crd["metadata"]["name"])
    deadline = time.monotonic() + 60
    for name in names:
        while not any(
            c.type == "Established" and c.status == "True"
            for c in extensions.read_custom_resource_definition(name).status.conditions or []
        ):
            assert time.monotonic() < deadline, f"Kueue's CRD {name} was not Established in 60 s"
            time.sleep(0.2)


def self_signed(folder: Path, name: str) -> None:
    """tls.crt and tls.key, a self-signed certificate for `name`, in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            f"/CN={name}",
            "-addext",
            f"subjectAltName=DNS:{name}",
            "-keyout",
            str(folder / "tls.key"),
            "-out",
            str(folder / "tls.crt"),
        ],
        check=True,
        capture_output=True,
    )


@contextlib.contextmanager
def kueue(cluster: K8sCluster, port: int, frameworks: tuple[str, ...] = ("batch/job",)) -> Iterator[None]:
    """Kueue's manager running against the cluster (its CRDs installed first), with the job `frameworks` it admits
    ("batch/job", "kubeflow.org/pytorchjob": that one needs the PyTorchJob CRD installed before); its health probes
    on 127.0.0.1:`port`, its webhook server on `port`+1. Ready once its readyz answers and its controllers started."""
    from kubernetes import client

    api = cluster.api()
    install_crds(api)
    client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
    folder = cluster.base / "kueue"
    self_signed(folder / "webhook-certs", f"kueue-webhook-service.{NAMESPACE}.svc")
    assert not METRICS_CERT_DIR.exists(), f"{METRICS_CERT_DIR} exists: another Kueue runs on this machine?"
    self_signed(METRICS_CERT_DIR, f"kueue-controller-manager-metrics-service.{NAMESPACE}.svc")
    config = folder / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "namespace": NAMESPACE,
                "health": {"healthProbeBindAddress": f"127.0.0.1:{port}"},
                "metrics": {"bindAddress": "0"},
                "webhook": {"port": port + 1, "host": "127.0.0.1", "certDir": str(folder / "webhook-certs")},
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {"enable": False},
                "integrations": {"frameworks": list(frameworks)},
            }
        )
    )
    log_path = cluster.base / "log" / "kueue.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [str(binary()), f"--config={config}", "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=2"],
            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
            stdout=log,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 90
        while not ready(port):
            assert process.poll() is None, f"Kueue exited ({process.returncode}): {tail(log_path)}"
            assert time.monotonic() < deadline, f"Kueue did not become ready in 90 s: {tail(log_path)}"
            time.sleep(0.5)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(METRICS_CERT_DIR.parent.parent, ignore_errors=True)  # /etc/kueue: only the fixture writes it


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def tail(path: Path, size: int = 3000) -> str:
    return path.read_bytes()[-size:].decode(errors="replace")


def make_queue(api: Any, namespace: str, name: str, *, cpu: str) -> None:
    """A ResourceFlavor `default`, a ClusterQueue `NAME-cq` of `cpu` CPUs (nominal quota, no borrowing) open to every
    namespace, and the LocalQueue `name` in `namespace` pointing at it."""
    from kubernetes import client

    objects = client.CustomObjectsApi(api)
    group, version = "kueue.x-k8s.io", "v1beta2"
    objects.create_cluster_custom_object(
        group,
        version,
        "resourceflavors",
        {"apiVersion": f"{group}/{version}", "kind": "ResourceFlavor", "metadata": {"name": "default"}},
    )
    objects.create_cluster_custom_object(
        group,
        version,
        "clusterqueues",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "ClusterQueue",
            "metadata": {"name": f"{name}-cq"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [{"name": "default", "resources": [{"name": "cpu", "nominalQuota": cpu}]}],
                    }
                ],
            },
        },
    )
    objects.create_namespaced_custom_object(
        group,
        version,
        namespace,
        "localqueues",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": f"{name}-cq"},
        },
    )
    deadline = time.monotonic() + 30
    while not any(
        c["type"] == "Active" and c["status"] == "True"
        for c in objects.get_namespaced_custom_object(group, version, namespace, "localqueues", name)
        .get("status", {})
        .get("conditions", [])
    ):
        assert time.monotonic() < deadline, f"LocalQueue {name} did not become Active in 30 s"
        time.sleep(0.3)
