"""A real Kubernetes control plane for tests (kube-apiserver, -controller-manager, -scheduler built from
Kubernetes' source, and etcd), started through scripts/k8s-cluster with two node agents (the kubelet STAND-IN of
tests/fakes/k8s_node_agent.py), each in its own network namespace.

    def test_something(k8s_cluster: K8sCluster) -> None:
        api = k8s_cluster.api()  # a kubernetes.client.ApiClient for the cluster's admin

The build needs the Go module proxy, which tests never reach (tests/offline.py): `scripts/k8s-cluster install`
runs before pytest (by hand), or beside it (.ci/run builds in the background while the other tests run; these
tests come last, tests/parallel.py), and the fixture waits for a build in progress (its lock is held), at most
BCP_K8S_BUILD_WAIT seconds (default 3600), then starts what is installed. Where it is not installed, or the
machine cannot run it (not Linux, not root, no `ip`), the tests that use it are skipped with the reason printed
on the terminal; with BCP_K8S_REQUIRED=1 (.ci/run) they fail instead. The cluster lives under its own base folder in /tmp (one per checkout), is
stopped at the end of the module, and one a killed session left behind is stopped before a new one starts.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "k8s-cluster"
NODES = 2


def script(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """scripts/k8s-cluster with this interpreter (the node agents need its `kubernetes` client)."""
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def cluster_base(repo: Path = REPO) -> Path:
    return Path("/tmp") / f"bcp-pipeline-k8s-{hashlib.sha1(str(repo).encode()).hexdigest()[:8]}"


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


def wait_for_a_build(say: Any = print) -> None:
    """Block while `scripts/k8s-cluster install` builds the control plane (it holds .build.lock), at most
    BCP_K8S_BUILD_WAIT seconds."""
    status = subprocess.run([sys.executable, str(SCRIPT), "status"], capture_output=True, text=True)
    if "being built" not in status.stderr:
        return
    lock_path = Path(os.environ.get("BCP_K8S_CACHE") or Path.home() / ".cache" / "bcp-pipeline" / "k8s")
    lock_path = next(lock_path.glob("*/bin/.build.lock"), None)
    if lock_path is None:
        return
    say(f"waiting for the Kubernetes control plane being built in the background ({status.stderr.strip()})")
    deadline = time.monotonic() + float(os.environ.get("BCP_K8S_BUILD_WAIT", "3600"))
    started = time.monotonic()
    with lock_path.open("a") as lock:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(5)
                continue
            fcntl.flock(lock, fcntl.LOCK_UN)
            say(f"the build ended after {time.monotonic() - started:.0f} s of waiting")
            return
    say(f"gave up waiting for the build after {time.monotonic() - started:.0f} s (BCP_K8S_BUILD_WAIT)")


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
        if os.environ.get("BCP_K8S_REQUIRED") == "1":
            pytest.fail(f"BCP_K8S_REQUIRED=1 and the Kubernetes test cluster cannot run: {reason}", pytrace=False)
        say(f"SKIPPING the Kubernetes tests: {reason}")
        pytest.skip(reason)
    base = cluster_base()
    stale = script("--base", str(base), "stop")
    assert stale.returncode == 0, f"stopping a stale cluster under {base} failed:\n{stale.stderr}"
    try:
        res = script("--base", str(base), "start", "--fresh", "--nodes", str(NODES))
        if res.returncode != 0:
            pytest.fail(f"scripts/k8s-cluster start --nodes {NODES} failed (exit {res.returncode}):\n{res.stderr}",
                        pytrace=False)
        kubeconfig = Path(res.stdout.strip().splitlines()[-1].split("=", 1)[1])
        yield K8sCluster(base=base, kubeconfig=kubeconfig, nodes=tuple(f"node{k}" for k in range(1, NODES + 1)))
    finally:
        res = script("--base", str(base), "stop")
        assert res.returncode == 0, f"scripts/k8s-cluster stop failed:\n{res.stderr}"
