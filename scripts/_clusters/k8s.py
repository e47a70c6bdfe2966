"""Build, start, inspect and stop a Kubernetes control plane on 127.0.0.1 (for tests and CI).

    scripts/k8s-cluster install     # etcd (Debian's etcd-server) if missing; the control plane built from source;
                                    # the Kubeflow training operator's PyTorchJob CRD and the operator, from source
    scripts/k8s-cluster start       # certificates, etcd, kube-apiserver, -controller-manager, -scheduler;
                                    # prints `export KUBECONFIG=...`
    scripts/k8s-cluster start --fresh     # ... with an empty etcd (objects of earlier starts forgotten)
    scripts/k8s-cluster start --nodes 2   # ... and two Nodes, each a node agent in its own network namespace
    scripts/k8s-cluster start --nodes 2 --node-gpus 8 --node-efa 4 --node-image 'nvcr.io/*'
                                          # ... nodes shaped as EKS's p4de (counts only), pulling only nvcr.io's
    scripts/k8s-cluster kill-node node2   # lose a node: SIGKILL its agent and every pod process on it
    scripts/k8s-cluster status      # each daemon and the apiserver's /readyz; exit 0 running, 3 stopped
    scripts/k8s-cluster stop        # stops exactly the daemons it started
    scripts/k8s-cluster env         # prints `export KUBECONFIG=...`
    scripts/k8s-cluster workspace FOLDER  # a ReadWriteMany claim on FOLDER (hostPath volume); prints the
                                    # `--set backends.kubernetes...` options that run a pipeline here

The control plane is Kubernetes' own code: `install` builds kube-apiserver, kube-controller-manager and
kube-scheduler from the k8s.io/kubernetes module at the release pinned in scripts/k8s-control-plane/go.mod,
fetched through the Go module proxy. That wrapper module's `replace` lines point k8s.io/kubernetes' staging modules
(k8s.io/api, apimachinery, apiserver, client-go, ...) at their published v0.N.M releases, and its main.go links
the three programs into one binary that picks the program by the name it is started as (argv[0]; `install` makes
the three symlinks). The build (CGO_ENABLED=0, -trimpath, -ldflags=-s -w, under `nice -n 10`) is cached in
~/.cache/bcp-pipeline/k8s/RELEASE/bin (or $BCP_K8S_CACHE/RELEASE/bin), so only the first `install` on a machine
compiles; Go's own build cache makes a rebuild after a change of main.go a link of seconds (k8s_build.py).

Everything of one cluster lives under one base folder (--base, else $BCP_K8S_BASE, else <repo>/.k8s): the CA,
certificates and keys (pki/), the kubeconfigs, etcd's data, logs and pid files. Nothing is written to /etc. Every
daemon listens on 127.0.0.1 only, on ports from --port (default 16443: the apiserver; +1 controller-manager,
+2 scheduler, +3 etcd's clients, +4 etcd's peers), and all TLS is signed by the cluster's own CA. The kubeconfig
(BASE/admin.kubeconfig) holds a client certificate of the group system:masters: only for tests (k8s_pki.py).
No kubelet, container runtime, kube-proxy or DNS runs: tests/fakes/k8s_node_agent.py stands in for the kubelet.

`--nodes N` adds N Nodes node1..nodeN, each one node agent (the kubelet stand-in) in its own network namespace,
on the private bridge of scripts/slurm-cluster (netns.py here, shared with it and scripts/sge-cluster, so there
is one implementation of it): a bridge holding S.1 of a /24 of 198.18.0.0/15 hashed from the base folder, nodeK
at S.(10+K), no route off the machine. The apiserver then listens on S.1 instead of 127.0.0.1 (the nodes reach it
there, and it reaches their log servers at S.(10+K):10250); the kubeconfig names S.1. Each node agent has a
client certificate of `system:node:nodeK` and a serving certificate for its address, both signed by the cluster's
CA.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time
from pathlib import Path

from . import common
from .common import ClusterError, say
from .k8s_build import build_all, build_in_progress, build_log_path, cache_bin
from .k8s_daemons import (
    Daemon,
    NodeShape,
    daemons,
    kill_node,
    ready_nodes,
    readyz,
    stop,
    wait_ready,
)
from .k8s_layout import DEFAULT_PORT, Layout, default_base, export_line
from .k8s_pki import make_node_pki, make_pki, write_kubeconfigs
from .k8s_workspace import cmd_workspace
from .netns import net_up

# Another apt-get (a Slurm or Grid Engine install) may hold dpkg's lock: wait for it rather than fail.
APT_OPTIONS = ("-o", "DPkg::Lock::Timeout=600")


def cmd_install(args: argparse.Namespace) -> None:
    if shutil.which("etcd") is None:
        if shutil.which("apt-get") is None:
            raise ClusterError("etcd is not on PATH and apt-get is not here to install Debian's etcd-server")
        say("installing Debian's etcd-server")
        common.apt_install(["etcd-server"], options=APT_OPTIONS)
    if shutil.which("openssl") is None:
        raise ClusterError(
            "openssl is not on PATH (it makes the cluster's CA and certificates): apt-get install openssl"
        )
    if not args.packages_only:
        build_all()


def cmd_start(args: argparse.Namespace) -> None:
    lay = Layout(args.base, args.nodes)
    with common.locked(lay.lock):
        port = args.port or lay.saved_port()
        bin_dir = cache_bin()
        if not (bin_dir / "kube-apiserver").exists() or shutil.which("etcd") is None:
            raise ClusterError(f"the control plane is not installed ({bin_dir}): run `scripts/k8s-cluster install`")
        shape = NodeShape(gpus=args.node_gpus, efa=args.node_efa, images=tuple(args.node_image or ()))
        all_daemons = daemons(lay, port, bin_dir, shape)
        running = {d.name for d in all_daemons if d.pid_file.live_pid() is not None}
        if len(running) == len(all_daemons):
            say(f"already running under {lay.base}")
            print(export_line(lay))
            return
        if running or (lay.run / "nodes").is_file():
            say("stopping what an earlier start left running")
            stop(Layout.load(lay.base))
        prepare(lay, port, args.fresh)
        started = time.monotonic()
        start_daemons(lay, port, all_daemons)
        nodes = f", nodes {', '.join(lay.node_names)}" if lay.nodes else ""
        say(
            f"ready in {time.monotonic() - started:.1f} s: apiserver https://{lay.api_address}:{port}{nodes}, "
            f"logs in {lay.logs}"
        )
        print(export_line(lay))


def prepare(lay: Layout, port: int, fresh: bool) -> None:
    """Free ports, the nodes' network, certificates and kubeconfigs; with `fresh`, no objects of earlier starts."""
    busy = [p for p in range(port, port + 5) if not common.port_free(p)]  # any address: 127.0.0.1 and the bridge
    if busy:
        raise ClusterError(
            f"port(s) {', '.join(map(str, busy))} on 127.0.0.1 are in use: choose another --port "
            "(the cluster uses PORT..PORT+4)"
        )
    if lay.nodes:
        if shutil.which("ip") is None or shutil.which("nsenter") is None:
            raise ClusterError("--nodes needs `ip` (iproute2) and `nsenter` (util-linux), and root")
        net_up(lay.net, lay.nodes)
    (lay.run / "nodes").write_text(f"{lay.nodes}\n")
    if fresh:  # an empty cluster: etcd's data and the node agents' pod folders go (the PKI stays)
        shutil.rmtree(lay.base / "etcd", ignore_errors=True)
        shutil.rmtree(lay.base / "nodes", ignore_errors=True)
    make_pki(lay)
    make_node_pki(lay)
    write_kubeconfigs(lay, port)
    lay.port_file.write_text(f"{port}\n")


def start_daemons(lay: Layout, port: int, all_daemons: list[Daemon]) -> None:
    """etcd and the apiserver, then the controllers and node agents; on a failure, stop all of it."""

    def spawn(daemon: Daemon) -> subprocess.Popen:
        return common.spawn_detached(daemon.argv, lay.log(daemon.name), daemon.pid_file.path)

    try:
        # The controllers start once the apiserver is ready: before, their RBAC roles may not exist yet, and
        # the controller-manager exits (forbidden to read its authentication configmap).
        processes = {daemon.name: spawn(daemon) for daemon in all_daemons[:2]}
        wait_ready(lay, port, processes, controllers=False)
        processes.update({daemon.name: spawn(daemon) for daemon in all_daemons[2:]})
        wait_ready(lay, port, processes, controllers=True)
    except ClusterError:
        stop(lay)
        raise


def cmd_kill_node(args: argparse.Namespace) -> None:
    """Lose one node as a machine is lost: its agent and every pod process in its namespace SIGKILLed at once."""
    lay = Layout.load(args.base)
    if args.node not in lay.node_names:
        raise ClusterError(f"no node {args.node!r} here (nodes: {', '.join(lay.node_names) or 'none'})")
    kill_node(lay, args.node)
    say(f"{args.node} lost (its agent and pods killed)")


def cmd_stop(args: argparse.Namespace) -> None:
    lay = Layout.load(args.base)
    with common.locked(lay.lock):
        stop(lay)
    say("stopped")


def cmd_status(args: argparse.Namespace) -> int:
    lay = Layout.load(args.base)
    port = lay.saved_port()
    if not (cache_bin() / "kube-apiserver").exists():
        if build_in_progress():
            say(f"the control plane is being built ({cache_bin()}; log: {build_log_path()})")
        else:
            say(f"the control plane is not installed ({cache_bin()}): run `scripts/k8s-cluster install`")
    up = 0
    for daemon in daemons(lay, port, cache_bin()):
        pid = daemon.pid_file.live_pid()
        up += pid is not None
        print(f"{daemon.name:24} {'running, pid ' + str(pid) if pid else 'stopped'}")
    if up:
        why = readyz(lay, port)
        print(f"{'apiserver /readyz':24} {'ok' if why is None else why}")
        if lay.nodes:
            print(f"{'nodes ready':24} {', '.join(sorted(ready_nodes(lay, port))) or 'none'}")
    return 0 if up == 4 + lay.nodes else 3


def cmd_env(args: argparse.Namespace) -> None:
    print(export_line(Layout.load(args.base)))


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="k8s-cluster", description=__doc__.split("\n\n")[0])
    top.add_argument(
        "--base", type=Path, default=None, help="the cluster's folder (default: $BCP_K8S_BASE or <repo>/.k8s)"
    )
    verbs = top.add_subparsers(dest="verb", required=True)
    install = verbs.add_parser("install", help="etcd and the control plane (built from source once, then cached)")
    install.add_argument(
        "--packages-only",
        action="store_true",
        help="only the Debian packages (etcd-server, "
        "openssl): .ci/run installs them before the tests and builds in the background",
    )
    start = verbs.add_parser("start", help="start the control plane; prints `export KUBECONFIG=...`")
    start.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"the apiserver's port (default {DEFAULT_PORT}, or the last start's); the cluster uses PORT..PORT+4",
    )
    start.add_argument("--fresh", action="store_true", help="start empty: forget every object of earlier starts")
    start.add_argument(
        "--nodes",
        type=int,
        default=0,
        help="node agents (kubelet stand-ins), each in its own network namespace (needs root); default 0",
    )
    start.add_argument(
        "--node-gpus",
        type=int,
        default=0,
        help="nvidia.com/gpu each node offers (a count: no device is behind it); default 0",
    )
    start.add_argument(
        "--node-efa", type=int, default=0, help="vpc.amazonaws.com/efa each node offers (a count); default 0"
    )
    start.add_argument(
        "--node-image",
        action="append",
        metavar="PATTERN",
        help="an image the nodes can pull "
        "(fnmatch pattern, repeatable); a pod of any other image waits in ErrImagePull and "
        "ImagePullBackOff; default: every image",
    )
    kill = verbs.add_parser("kill-node", help="SIGKILL one node's agent and its pods' processes")
    kill.add_argument("node")
    verbs.add_parser("status", help="daemons and /readyz; exit 0 running, 3 stopped")
    verbs.add_parser("stop", help="stop the daemons this base folder's start started")
    verbs.add_parser("env", help="print `export KUBECONFIG=...`")
    workspace = verbs.add_parser(
        "workspace",
        help="a ReadWriteMany claim on FOLDER for a pipeline's workspace; "
        "prints the `--set` options that run a pipeline on this cluster",
    )
    workspace.add_argument("folder", type=Path, help="where the workspace's files live (made if missing)")
    workspace.add_argument(
        "--name",
        default="bcp-pipeline-workspace",
        help="the claim and its volume (default: "
        "bcp-pipeline-workspace, backends.kubernetes.workspace_claim's default)",
    )
    workspace.add_argument("--namespace", default="default", help="the claim's namespace, made if missing")
    workspace.add_argument("--size", default="10Gi", help="the capacity declared (hostPath does not enforce it)")
    return top


def main(argv: list[str] | None = None) -> int:
    common.set_program("k8s-cluster")
    args = parser().parse_args(argv)
    args.base = (args.base or default_base()).resolve()
    try:
        handler = {
            "install": cmd_install,
            "start": cmd_start,
            "status": cmd_status,
            "stop": cmd_stop,
            "env": cmd_env,
            "kill-node": cmd_kill_node,
            "workspace": cmd_workspace,
        }[args.verb]
        return handler(args) or 0
    except ClusterError as exc:
        say(f"error: {exc}")
        return 1
