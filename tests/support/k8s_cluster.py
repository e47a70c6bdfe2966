"""A real Kubernetes control plane for tests (kube-apiserver, -controller-manager, -scheduler built from
Kubernetes' source, and etcd), started through scripts/k8s-cluster with two node agents (the kubelet STAND-IN of
tests/fakes/k8s_node_agent.py), each in its own network namespace, each offering NODE_GPUS GPUs and NODE_EFA EFA
devices and pulling only PULLABLE_IMAGES.

    def test_something(k8s_cluster: K8sCluster) -> None:
        api = k8s_cluster.api()  # a kubernetes.client.ApiClient for the cluster's admin

The build needs the Go module proxy, which tests never reach (tests/support/offline.py): `scripts/k8s-cluster
install` runs before pytest (by hand), or beside it (.ci/run builds in the background while the other tests run;
these tests start on a worker of their own, tests/support/parallel.py), and the fixture waits for a build in
progress (its lock is held), at most BCP_K8S_BUILD_WAIT seconds (default 3600), then starts what is installed. Where
it is not installed, or the machine cannot run it (not Linux, not root, no `ip`), the tests that use it are skipped
with the reason printed on the terminal; with BCP_K8S_REQUIRED=1 (.ci/run) they fail instead. The cluster lives
under its own base folder in /tmp (one per checkout), is stopped at the end of the module, and one a killed session
left behind is stopped before a new one starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.reaper import run_when_gone

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "k8s-cluster"
NODES = 2
# Each node shaped as an EKS GPU node (counts only; the node agent has no device behind them), so a GPU request is
# scheduled by the real scheduler and an over-request stays Unschedulable.
NODE_GPUS, NODE_EFA = 2, 1
# The images the nodes can pull (the registries the tests' pipelines name); any other gives ErrImagePull.
PULLABLE_IMAGES = ("nvcr.io/*", "python:*")


def script(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """scripts/k8s-cluster with this interpreter (the node agents need its `kubernetes` client)."""
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def cluster_base(repo: Path = REPO) -> Path:
    return Path("/tmp") / f"bcp-pipeline-k8s-{hashlib.sha1(str(repo).encode()).hexdigest()[:8]}"


def cluster_port(repo: Path = REPO) -> int:
    """The apiserver's port, one per checkout as the base folder is (the cluster takes PORT..PORT+4), so two
    checkouts' test sessions on one machine never meet on 16443."""
    return 20000 + int(hashlib.sha1(str(repo).encode()).hexdigest()[:8], 16) % 2000 * 5


@dataclass(frozen=True)
class K8sCluster:
    base: Path
    kubeconfig: Path
    nodes: tuple[str, ...]

    def script(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """scripts/k8s-cluster COMMAND --base BASE ARGS."""
        return script("--base", str(self.base), *args, timeout=timeout)

    def api(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))


def shared_claim(
    cluster: K8sCluster, namespace: str, claim: str, volume: str, folder: Path, storage: str = "1Gi"
) -> str:
    """A ReadWriteMany claim `claim` in `namespace`, bound to the hostPath PV `volume` on `folder` (a folder every
    node sees, as FSx would be), waited for until Bound (60 s at most); returns the claim's name."""
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())
    core.create_persistent_volume(
        {
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": storage},
                "accessModes": ["ReadWriteMany"],
                "hostPath": {"path": str(folder)},
                "storageClassName": "",
                "persistentVolumeReclaimPolicy": "Retain",
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": claim},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": storage}},
                "storageClassName": "",
                "volumeName": volume,
            },
        },
    )
    deadline = time.monotonic() + 60
    while core.read_namespaced_persistent_volume_claim(claim, namespace).status.phase != "Bound":
        assert time.monotonic() < deadline, f"claim {claim} did not bind to {volume}"
        time.sleep(0.5)
    return claim


def skip_unless_required(reason: str) -> None:
    """Skip a Kubernetes test that cannot run here, saying why; fail it instead under BCP_K8S_REQUIRED=1 (.ci/run,
    which builds everything these tests need)."""
    if os.environ.get("BCP_K8S_REQUIRED") == "1":
        pytest.fail(f"BCP_K8S_REQUIRED=1 and {reason}", pytrace=False)
    pytest.skip(reason)


def wait_for_a_build(say: Any = print) -> None:
    """Block while `scripts/k8s-cluster install` builds (the control plane, then the training operator: it holds
    .build.lock throughout), at most BCP_K8S_BUILD_WAIT seconds."""
    cache = Path(os.environ.get("BCP_K8S_CACHE") or Path.home() / ".cache" / "bcp-pipeline" / "k8s")
    lock_path = next(cache.glob("*/bin/.build.lock"), None)
    if lock_path is None:
        return
    started = time.monotonic()
    deadline = started + float(os.environ.get("BCP_K8S_BUILD_WAIT", "3600"))
    with lock_path.open("a") as lock:
        waiting = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waiting:
                    say(f"waiting for the Kubernetes build in the background (its log: {lock_path.parent}/build.log)")
                    waiting = True
                if time.monotonic() > deadline:
                    say(f"gave up waiting for the build after {time.monotonic() - started:.0f} s (BCP_K8S_BUILD_WAIT)")
                    return
                time.sleep(5)
                continue
            fcntl.flock(lock, fcntl.LOCK_UN)
            if waiting:
                say(f"the build ended after {time.monotonic() - started:.0f} s of waiting")
            return


def pytorchjob_crd_file() -> Path:
    """The Kubeflow training operator's own PyTorchJob CRD, as `scripts/k8s-cluster install` takes it from the
    operator's module source (github.com/kubeflow/training-operator, through the Go module proxy)."""
    return Path.home() / ".cache/bcp-pipeline/training-operator/v1.8.1/crds/kubeflow.org_pytorchjobs.yaml"


def install_pytorchjob_crd(api: Any) -> None:
    """Create the PyTorchJob CRD in the cluster and wait until it is Established (its API served)."""
    import yaml
    from kubernetes import client

    crd = yaml.safe_load(pytorchjob_crd_file().read_text())
    extensions = client.ApiextensionsV1Api(api)
    extensions.create_custom_resource_definition(crd)
    deadline = time.monotonic() + 30
    while not any(
        c.type == "Established" and c.status == "True"
        for c in extensions.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions or []
    ):
        assert time.monotonic() < deadline, "the PyTorchJob CRD was not Established in 30 s"
        time.sleep(0.2)


def unavailable_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"the Kubernetes test cluster needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the Kubernetes test cluster's nodes need root (network and mount namespaces)"
    if shutil.which("ip") is None or shutil.which("etcd") is None or shutil.which("openssl") is None:
        return "ip, etcd or openssl is missing: run `scripts/k8s-cluster install`"
    installed = subprocess.run([sys.executable, str(SCRIPT), "status"], capture_output=True, text=True)
    if "not installed" in installed.stderr:
        return installed.stderr.strip()
    return None


@pytest.fixture(scope="module")
def k8s_cluster(request: pytest.FixtureRequest) -> Iterator[K8sCluster]:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")

    def say(message: str) -> None:
        if reporter is not None:
            reporter.write_line(message, yellow=True)
        print(message, file=sys.stderr)

    wait_for_a_build(say)
    if reason := unavailable_reason():
        say(f"SKIPPING the Kubernetes tests: {reason}")
        skip_unless_required(f"the Kubernetes test cluster cannot run: {reason}")
    base = cluster_base()
    stale = script("--base", str(base), "stop")
    assert stale.returncode == 0, f"stopping a stale cluster under {base} failed:\n{stale.stderr}"
    disarm = run_when_gone([sys.executable, str(SCRIPT), "--base", str(base), "stop"])  # Ctrl-C, kill -9: stopped
    try:
        res = script(
            "--base",
            str(base),
            "start",
            "--fresh",
            "--nodes",
            str(NODES),
            "--port",
            str(cluster_port()),
            "--node-gpus",
            str(NODE_GPUS),
            "--node-efa",
            str(NODE_EFA),
            *(f"--node-image={pattern}" for pattern in PULLABLE_IMAGES),
        )
        if res.returncode != 0:
            pytest.fail(
                f"scripts/k8s-cluster start --nodes {NODES} failed (exit {res.returncode}):\n{res.stderr}",
                pytrace=False,
            )
        kubeconfig = Path(res.stdout.strip().splitlines()[-1].split("=", 1)[1])
        yield K8sCluster(base=base, kubeconfig=kubeconfig, nodes=tuple(f"node{k}" for k in range(1, NODES + 1)))
    finally:
        res = script("--base", str(base), "stop")
        disarm()
        assert res.returncode == 0, f"scripts/k8s-cluster stop failed:\n{res.stderr}"


def training_operator_binary() -> Path:
    """The Kubeflow training operator v1.8.1, built from its module source by `scripts/k8s-cluster install`."""
    return pytorchjob_crd_file().parent.parent / "bin" / "training-operator.v1"


# The operator's webhook certificates are read from this fixed folder (its pkg/cert: certDir), where the kubelet
# would mount its Secret; the fixture writes them there as that volume would.
OPERATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")


OPERATOR_WEBHOOK_CONFIGURATION = "validator.training-operator.kubeflow.org"  # the name its cert rotator patches
OPERATOR_WEBHOOK_PATH = "/validate-kubeflow-org-v1-pytorchjob"  # v1.8.1's (pkg/webhooks/pytorch)


def operator_webhook(core: Any, address: str, port: int) -> dict:
    """The operator's PyTorchJob webhook as its manifests register it (through the Service kubeflow/training-operator,
    made here with one endpoint: `address`:`port`, where its webhook server listens on every address)."""
    core.create_namespaced_service(
        "kubeflow",
        {
            "metadata": {"name": "training-operator"},
            "spec": {"ports": [{"name": "webhook", "port": 443, "targetPort": port}]},
        },
    )
    core.create_namespaced_endpoints(
        "kubeflow",
        {
            "metadata": {"name": "training-operator"},
            "subsets": [{"addresses": [{"ip": address}], "ports": [{"name": "webhook", "port": port}]}],
        },
    )
    return {
        "name": "validator.pytorchjob.training-operator.kubeflow.org",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "clientConfig": {
            "service": {
                "namespace": "kubeflow",
                "name": "training-operator",
                "path": OPERATOR_WEBHOOK_PATH,
                "port": 443,
            }
        },
        "rules": [
            {
                "apiGroups": ["kubeflow.org"],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["pytorchjobs"],
            }
        ],
    }


@contextlib.contextmanager
def training_operator(cluster: K8sCluster, port: int) -> Iterator[None]:
    """The real training operator (v1.8.1, PyTorchJob only) against the cluster's apiserver, as its Deployment would
    run it: its namespace `kubeflow`, its webhook-certificate Secret (which its own cert rotator fills) written to
    its certificate folder, and its **validating webhook** registered as its manifests register it: the
    ValidatingWebhookConfiguration `validator.training-operator.kubeflow.org` calling the Service
    `kubeflow/training-operator` (its caBundle patched in by the rotator). The Service has no selector (the
    operator is no pod) and one endpoint, the host's bridge address where the operator's webhook server listens;
    the apiserver dials it (`--enable-aggregator-routing`: no kube-proxy routes ClusterIPs here) and checks the
    server certificate against the Service's DNS name, as on a real cluster. On a cluster without nodes (its
    apiserver on loopback, which Endpoints refuse), no webhook is registered; the CRD's schema still validates."""
    import base64

    from kubernetes import client

    api = cluster.api()
    core = client.CoreV1Api(api)
    install_pytorchjob_crd(api)
    core.create_namespace({"metadata": {"name": "kubeflow"}})
    core.create_namespaced_secret("kubeflow", {"metadata": {"name": "training-operator-webhook-cert"}})
    host = urllib.parse.urlsplit(api.configuration.host).hostname  # the apiserver's: the bridge where there are nodes
    webhooks = [] if host == "127.0.0.1" else [operator_webhook(core, host, port + 1)]
    admission = client.AdmissionregistrationV1Api(api)
    admission.create_validating_webhook_configuration(
        {"metadata": {"name": OPERATOR_WEBHOOK_CONFIGURATION}, "webhooks": webhooks}
    )
    log_path = cluster.base / "log" / "training-operator.log"
    offset = log_path.stat().st_size if log_path.is_file() else 0  # what this start writes, not an earlier one

    def said() -> bytes:
        with open(log_path, "rb") as handle:
            handle.seek(offset)
            return handle.read()

    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                str(training_operator_binary()),
                f"--kubeconfig={cluster.kubeconfig}",
                "--enable-scheme=pytorchjob",
                "--metrics-bind-address=0",
                f"--health-probe-bind-address=127.0.0.1:{port}",
                f"--webhook-server-port={port + 1}",
            ],
            env={**os.environ, "MY_POD_NAMESPACE": "kubeflow"},
            stdout=log,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 60
        while b'"controller": "pytorchjob-controller", "worker count"' not in said():
            assert process.poll() is None, f"the training operator exited: {said()[-2000:].decode()}"
            assert time.monotonic() < deadline, f"the training operator did not start: {said()[-2000:].decode()}"
            data = core.read_namespaced_secret("training-operator-webhook-cert", "kubeflow").data or {}
            if "tls.crt" in data:
                OPERATOR_CERT_DIR.mkdir(parents=True, exist_ok=True)
                for key, value in data.items():
                    (OPERATOR_CERT_DIR / key).write_bytes(base64.b64decode(value))
            time.sleep(0.5)
        while (
            webhooks
            and not admission.read_validating_webhook_configuration(OPERATOR_WEBHOOK_CONFIGURATION)
            .webhooks[0]
            .client_config.ca_bundle
        ):
            assert time.monotonic() < deadline, "the operator's cert rotator did not patch its webhook's caBundle"
            time.sleep(0.5)
        yield
    finally:
        # Its webhook goes with it: a PyTorchJob created later (failurePolicy Fail) would find no one answering.
        admission.delete_validating_webhook_configuration(OPERATOR_WEBHOOK_CONFIGURATION)
        for delete in (core.delete_namespaced_endpoints, core.delete_namespaced_service):
            try:
                delete("training-operator", "kubeflow")
            except client.exceptions.ApiException as exc:
                if exc.status != 404:
                    raise
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(OPERATOR_CERT_DIR, ignore_errors=True)  # the test CA's key goes with the operator
