"""The daemons of the Kubernetes test cluster (see k8s.py): etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and the node agents (tests/fakes/k8s_node_agent.py, the kubelet stand-in, each in its node's
network namespace); what each is started with, asking the apiserver whether it and the nodes are ready, and
stopping exactly what a start under this base folder started."""

from __future__ import annotations

import json
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import common
from .common import REPO, ClusterError, PidFile, tail
from .k8s_build import cache_bin
from .k8s_layout import SERVICE_CIDR, Layout
from .netns import in_namespace, kill_namespace_processes, net_down, net_exists

NODE_AGENT = REPO / "tests" / "fakes" / "k8s_node_agent.py"
NODE_AGENT_PORT = 10250
READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class Daemon:
    name: str  # the program (its argv[0]); also its pid and log file's name
    argv: tuple[str, ...]
    pid_file: PidFile  # checked before a signal is sent


@dataclass(frozen=True)
class NodeShape:
    """What every node agent offers besides its CPUs and memory (`start --node-gpus/--node-efa/--node-image`): the
    extended resources EKS's device plugins advertise (counts only: no device is behind them), and the images
    it can pull (fnmatch patterns; none given: every image)."""

    gpus: int = 0
    efa: int = 0
    images: tuple[str, ...] = ()

    def argv(self) -> tuple[str, ...]:
        return (f"--gpus={self.gpus}", f"--efa={self.efa}", *(f"--images={pattern}" for pattern in self.images))


def daemon(lay: Layout, argv: tuple[str, ...], *markers: str, name: str | None = None) -> Daemon:
    """A daemon whose markers are arguments only this cluster's instance was started with; its comm is its
    program's name (a node agent's is Python's, so any)."""
    name = name or Path(argv[0]).name
    return Daemon(name, argv, PidFile(lay.pid_file(name), None if argv[0] == "nsenter" else name, markers))


def daemons(lay: Layout, port: int, bin_dir: Path, shape: NodeShape = NodeShape()) -> list[Daemon]:
    """The four daemons in start order (stopped in reverse), each bound to 127.0.0.1 only (the apiserver: to the
    bridge where there are nodes), then the node agents. Ports: the apiserver's, +1 controller-manager,
    +2 scheduler, +3 etcd's clients, +4 etcd's peers."""
    controller_kubeconfig, scheduler_kubeconfig = (
        lay.base / f"{user}.kubeconfig" for user in ("controller-manager", "scheduler")
    )
    return [
        daemon(lay, etcd_argv(lay, port), f"--data-dir={lay.base / 'etcd'}"),
        daemon(
            lay,
            apiserver_argv(lay, port, bin_dir),
            f"--secure-port={port}",
            f"--tls-cert-file={lay.pki / 'apiserver.crt'}",
        ),
        daemon(
            lay,
            controller_manager_argv(lay, port, bin_dir),
            f"--secure-port={port + 1}",
            f"--kubeconfig={controller_kubeconfig}",
        ),
        daemon(
            lay, scheduler_argv(lay, port, bin_dir), f"--secure-port={port + 2}", f"--kubeconfig={scheduler_kubeconfig}"
        ),
        *(node_agent(lay, k, shape) for k in range(1, lay.nodes + 1)),
    ]


def etcd_url(port: int) -> str:
    return f"http://127.0.0.1:{port + 3}"


def etcd_argv(lay: Layout, port: int) -> tuple[str, ...]:
    client_url, peer_url = etcd_url(port), f"http://127.0.0.1:{port + 4}"
    return (
        "etcd",
        f"--name=bcp-k8s-{port}",
        f"--data-dir={lay.base / 'etcd'}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=bcp-k8s-{port}={peer_url}",
        "--listen-metrics-urls=",
        "--quota-backend-bytes=1073741824",
    )


def apiserver_argv(lay: Layout, port: int, bin_dir: Path) -> tuple[str, ...]:
    pki = lay.pki
    return (
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers={etcd_url(port)}",
        f"--bind-address={lay.api_address}",
        f"--secure-port={port}",
        f"--advertise-address={lay.api_address}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        "--kubelet-preferred-address-types=InternalIP",
        # No pod talks to the API through the `kubernetes` Service (and with no nodes its endpoint would
        # be 127.0.0.1, which Endpoints refuse): its endpoint is not kept.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        # A webhook behind a Service (the training operator's, Kueue's) is dialled at its endpoint, not its
        # ClusterIP, which no kube-proxy routes here; the certificate is still checked against the Service's name.
        "--enable-aggregator-routing=true",
    )


def controller_manager_argv(lay: Layout, port: int, bin_dir: Path) -> tuple[str, ...]:
    kubeconfig, pki = lay.base / "controller-manager.kubeconfig", lay.pki
    return (
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port + 1}",
        "--leader-elect=false",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        "--use-service-account-credentials=true",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # A lost node (its agent killed) is noticed in seconds, not the default 50 s, so the
        # node-loss tests end soon; the node agents renew their Leases every 2 s.
        "--node-monitor-period=2s",
        "--node-monitor-grace-period=12s",
        "--profiling=false",
    )


def scheduler_argv(lay: Layout, port: int, bin_dir: Path) -> tuple[str, ...]:
    kubeconfig = lay.base / "scheduler.kubeconfig"
    return (
        str(bin_dir / "kube-scheduler"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port + 2}",
        "--leader-elect=false",
        "--profiling=false",
    )


def agent_python() -> str:
    """The project's virtual environment has the `kubernetes` client the node agent uses (scripts/setup --test)."""
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def node_agent(lay: Layout, k: int, shape: NodeShape = NodeShape()) -> Daemon:
    """nodeK's agent, started in nodeK's network namespace (its pods' processes inherit it); `shape` changes
    only its arguments after the markers, so stopping it needs none."""
    node, pki, root = f"node{k}", lay.pki, lay.node_root(f"node{k}")
    argv = (
        agent_python(),
        str(NODE_AGENT),
        f"--kubeconfig={lay.base / f'{node}.kubeconfig'}",
        f"--dns-kubeconfig={lay.base / 'cluster-dns.kubeconfig'}",
        f"--node={node}",
        f"--address={lay.net.address(k)}",
        f"--port={NODE_AGENT_PORT}",
        f"--tls-cert={pki / f'{node}.crt'}",
        f"--tls-key={pki / f'{node}.key'}",
        f"--client-ca={pki / 'ca.crt'}",
        f"--root={root}",
        *shape.argv(),
    )
    return daemon(lay, tuple(in_namespace(lay.net, k, list(argv))), f"--root={root}", name=node)


def admin_context(lay: Layout) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(lay.pki / "ca.crt"))
    context.load_cert_chain(str(lay.pki / "admin.crt"), str(lay.pki / "admin.key"))
    return context


def api_get(lay: Layout, port: int, path: str) -> Any:
    with urllib.request.urlopen(
        f"https://{lay.api_address}:{port}{path}", context=admin_context(lay), timeout=5
    ) as response:
        return json.loads(response.read())


def ready_nodes(lay: Layout, port: int) -> set[str]:
    """Nodes whose Ready condition is True and that carry no not-ready taint (the scheduler places pods there)."""
    try:
        items = api_get(lay, port, "/api/v1/nodes")["items"]
    except (OSError, ValueError, KeyError):
        return set()
    ready = set()
    for node in items:
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        tainted = any(t["key"] == "node.kubernetes.io/not-ready" for t in node.get("spec", {}).get("taints", []))
        if conditions.get("Ready") == "True" and not tainted:
            ready.add(node["metadata"]["name"])
    return ready


def readyz(lay: Layout, port: int) -> str | None:
    """None when the apiserver answers /readyz with ok, else what it said (or why it did not answer)."""
    try:
        with urllib.request.urlopen(
            f"https://{lay.api_address}:{port}/readyz", context=admin_context(lay), timeout=5
        ) as response:
            body = response.read().decode(errors="replace").strip()
            return None if body == "ok" else body
    except OSError as exc:
        return str(getattr(exc, "reason", exc))


def default_service_account_exists(lay: Layout, port: int) -> bool:
    """The controller-manager's service-account controller has made `default` in `default`: pods can be created."""
    try:
        api_get(lay, port, "/api/v1/namespaces/default/serviceaccounts/default")
        return True
    except (OSError, ValueError):
        return False


def not_ready(lay: Layout, port: int, *, controllers: bool) -> str | None:
    """None when the apiserver answers ready (and, with `controllers`, the `default` service account exists and
    every node is ready), else why not."""
    why = readyz(lay, port)
    if why is not None or not controllers:
        return why
    if not default_service_account_exists(lay, port):
        return "no default service account yet"
    missing = set(lay.node_names) - ready_nodes(lay, port)
    return f"node(s) not ready yet: {', '.join(sorted(missing))}" if missing else None


def wait_ready(lay: Layout, port: int, started: dict[str, subprocess.Popen], *, controllers: bool) -> None:
    """Until not_ready() says nothing; a daemon that exits meanwhile ends the wait with its log."""
    why: list[str | None] = ["not asked yet"]

    def ready() -> bool:
        dead = [(name, process.returncode) for name, process in started.items() if process.poll() is not None]
        if dead:
            name, code = dead[0]
            raise ClusterError(f"{name} exited at start (status {code}); its log ends:\n" + tail(lay.log(name)))
        why[0] = not_ready(lay, port, controllers=controllers)
        return why[0] is None

    if not common.poll(ready, READY_TIMEOUT_S, interval=0.5):
        raise ClusterError(
            f"the apiserver was not ready in {READY_TIMEOUT_S:.0f} s ({why[0]}); its log ends:\n"
            + tail(lay.log("kube-apiserver"))
        )


def stop(lay: Layout) -> None:
    """Every daemon in reverse start order (SIGTERM, SIGKILL after STOP_GRACE_S), then whatever else this base
    folder's start left: processes naming it, and the nodes' namespaces with the pods' processes in them."""
    for d in reversed(daemons(lay, lay.saved_port(), cache_bin())):
        # Silent, as ever: a node agent in a pod watch takes its SIGTERM only when the watch ends (up to 60 s).
        common.terminate({d.name: d.pid_file}, STOP_GRACE_S, announce=False, report_kill=False)
        d.pid_file.path.unlink(missing_ok=True)
    # A daemon whose pid file was lost (a start that failed half-way, a killed script) still names this base
    # folder in its arguments: every such process was started by this script for this cluster.
    for pid in common.processes_naming(f"{lay.base}/"):
        common.signal_pid(pid, signal.SIGKILL)
    if shutil.which("ip") and net_exists(lay.net):
        net_down(lay.net)  # the pods' processes left in the namespaces go with them
    (lay.run / "nodes").unlink(missing_ok=True)


def kill_node(lay: Layout, node: str) -> None:
    """Lose one node as a machine is lost: its agent and every pod process in its namespace SIGKILLed at once."""
    k = lay.node_names.index(node) + 1
    if (pid := node_agent(lay, k).pid_file.live_pid()) is not None:
        common.signal_pid(pid, signal.SIGKILL)
    kill_namespace_processes(lay.net.namespace(k))
    # The pods' processes are in their own sessions, outside the namespace list when already reparented.
    for child in pod_processes(lay.node_root(node)):
        common.signal_pid(child, signal.SIGKILL)


def pod_processes(node_root: Path) -> list[int]:
    """Processes started for pods of one node agent: their command line holds the agent's hosts file."""
    return common.processes_naming(str(node_root / "hosts"))
