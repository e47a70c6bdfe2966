"""Install, start, inspect and stop a Slurm cluster of one or more nodes on this machine (for tests and CI).

    scripts/slurm-cluster install                   # Debian packages, only those missing (needs root + apt)
    scripts/slurm-cluster start [--cpus 8]          # configure + start; prints `export SLURM_CONF=...`
    scripts/slurm-cluster start --nodes 2           # two slurmd, each in its own network namespace (below)
    scripts/slurm-cluster status                    # daemons, node state, queue; exit 0 running, 3 stopped
    scripts/slurm-cluster stop                      # scancel all jobs, stop exactly the daemons it started
    scripts/slurm-cluster env                       # prints `export SLURM_CONF=...`
    scripts/slurm-cluster kill-node node2           # multi-node: lose a node (SIGKILL slurmd + all on it)

Everything lives under one base folder (--base, else $BCP_SLURM_BASE, else <repo>/.slurm, or a folder in /tmp
where munged would refuse <repo>/.slurm): config, controller state, slurmd spool, logs, pid files, and munge's
key, seed and socket. Nothing is written to /etc. `start` and `stop` take a lock in the base folder.
Only the `export` line goes to stdout, so `eval "$(scripts/slurm-cluster start)"` works; messages go to stderr.

Authentication is munge with a private munged, not `AuthType=auth/none`: with auth/none slurmctld and slurmd
(which listen on all interfaces) run jobs as any uid, root included, for anyone who can reach their ports; and
auth/none is not shipped by every distribution's Slurm build. munge costs one extra daemon and ~10 ms at start.

`--nodes N` (N >= 2) runs one slurmctld and N slurmd (NodeName node1..nodeN), each slurmd in its own network
namespace and UTS namespace (its hostname is its node name), so srun really goes between nodes over a network.
It changes the machine only in these ways, all undone by `stop` (and by a `start` that finds them left behind by
a killed session): a Linux bridge `bcpbrHHHHHH` holding address S.1 of a /24 S.0/24 (HHHHHH: a hash of the base
folder; S: a /24 of 198.18.0.0/15, the range reserved for benchmarking, derived from the same hash), and per node
a network namespace `bcpHHHHHHnK` joined to the bridge by a veth pair (`bcpHHHHHHvK` on the host, `bcpHHHHHHpK`
inside) with address S.(10+K). Each slurmd also runs in a private mount namespace in which the cluster's own
hosts file (BASE/etc/hosts: nodeK -> S.(10+K)) is bind-mounted over /etc/hosts, so the nodes and their jobs
resolve each other's names as on a real cluster (a distributed job meets at its first node's host name) while the
machine's /etc/hosts is untouched. `start` refuses a /24 that another interface's address overlaps. Nothing else:
no default route in the namespaces, no NAT, no change to IP forwarding or firewall rules, so nothing in a
namespace reaches beyond this machine's bridge. The nodes share the machine's file systems (as an NFS or Lustre
workspace would be shared) and munge's unix socket. slurmctld (on the host) is reached at the bridge address.
A job on a lost node ends NODE_FAIL (`JobRequeue=0`, `SlurmdTimeout=6`) rather than being requeued, and a
`start` while the controller runs starts only the slurmd that are missing (`kill-node` loses one on purpose).
Needs root, iproute2 (`ip`, installed by `install`) and util-linux (`nsenter`, `unshare`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from . import common
from .common import ClusterError, run, say
from .netns import kill_namespace_processes, namespaces_of, net_down, net_exists, net_up
from .slurm_conf import choose_port, prepare
from .slurm_daemons import (
    missing_binaries,
    node_state,
    spawn,
    stop,
    terminate_all,
    wait_ready,
)
from .slurm_layout import (
    DEFAULT_PORT,
    NODE,
    PACKAGES,
    Layout,
    default_base,
    export_line,
    munge_rejects,
    slurm_env,
)


def cmd_install(args: argparse.Namespace) -> None:
    missing = missing_binaries(network=True)
    if not missing:
        say("Slurm, munge and iproute2 are already installed")
        return
    if shutil.which("apt-get") is None:
        raise ClusterError(
            f"cannot install Slurm: apt-get not found (missing: {' '.join(missing)}). "
            f"Install Slurm (slurmctld, slurmd, client commands) and munge with this system's package manager."
        )
    if os.geteuid() != 0:
        raise ClusterError(f"installing packages needs root (missing: {' '.join(missing)}); run as root or via sudo")
    say(f"installing {' '.join(PACKAGES)} (missing: {' '.join(missing)})")
    common.apt_install(PACKAGES)
    if still := missing_binaries(network=True):
        raise ClusterError(f"installed {' '.join(PACKAGES)} but still missing: {' '.join(still)}")
    say("installed: " + run(["slurmctld", "-V"]).stdout.strip())


def check_start(lay: Layout, args: argparse.Namespace) -> None:
    """Refuse a start that cannot work, before anything is changed."""
    if os.geteuid() != 0:
        raise ClusterError("starting the cluster needs root (slurmd launches jobs as their user)")
    if missing := missing_binaries(network=lay.multi):
        raise ClusterError(f"not installed: {' '.join(missing)}; run `scripts/slurm-cluster install` first")
    if args.cpus < 1:
        raise ClusterError(f"--cpus {args.cpus}: must be at least 1")
    if args.nodes < 1:
        raise ClusterError(f"--nodes {args.nodes}: must be at least 1")
    if why := munge_rejects(lay.base):
        raise ClusterError(f"cannot use base folder {lay.base}: {why}; pass e.g. --base /tmp/bcp-pipeline-slurm")


def cmd_start(args: argparse.Namespace) -> None:
    lay = Layout(args.base, args.nodes)
    check_start(lay, args)
    with common.locked(lay.lock):
        configured = Layout.load(lay.base)
        pids = configured.running()
        if any(pids.values()) and configured.nodes != lay.nodes:
            raise ClusterError(
                f"a {configured.nodes}-node cluster is running under {lay.base}; "
                f"`scripts/slurm-cluster stop` it first to start {lay.nodes} node(s)"
            )
        if all(pids.values()):
            wait_ready(lay, args.timeout)
            say(f"already running under {lay.base} (node {node_state(lay)}; to change --cpus or --port, stop first)")
        elif lay.multi and pids["munged"] and pids["slurmctld"]:
            restart_lost_nodes(lay, pids, args.timeout)
        else:
            start_cluster(lay, configured, pids, args)
    print(export_line(lay))


def restart_lost_nodes(lay: Layout, pids: dict[str, int | None], timeout: float) -> None:
    """The controller runs and only some slurmd are lost (`kill-node`): bring just those back."""
    t0 = time.monotonic()
    missing = [label for label, pid in pids.items() if pid is None]
    say(f"controller running; starting {', '.join(missing)}")
    for label in missing:
        spawn(lay, label)
    wait_ready(lay, timeout)
    say(f"{', '.join(missing)} back in {time.monotonic() - t0:.1f} s (nodes {node_state(lay)})")


def start_cluster(lay: Layout, configured: Layout, pids: dict[str, int | None], args: argparse.Namespace) -> None:
    """Everything from scratch, after clearing away what an earlier cluster left."""
    t0 = time.monotonic()
    if any(pids.values()):  # half a cluster (a daemon crashed): restart everything cleanly
        say("some daemons are not running; restarting all")
        terminate_all(configured)
    if net_exists(lay.net):  # left behind by a killed session (or a killed `stop`)
        say(f"removing the namespaces and bridge {lay.net.bridge} left behind by an earlier cluster")
        net_down(lay.net)
    port = choose_port(args.port)
    prepare(lay, args.cpus, port)
    try:
        if lay.multi:
            net_up(lay.net, lay.nodes)
        for d in lay.daemons:
            spawn(lay, d.label)
        wait_ready(lay, args.timeout)
    except ClusterError as failure:  # leave nothing half-started behind; the logs stay for the error message
        try:
            terminate_all(lay)
            net_down(lay.net)
        except ClusterError as cleanup:
            raise ClusterError(f"{failure}\n(and cleaning up after it failed: {cleanup})") from None
        raise
    where = (
        f"{lay.nodes} nodes ({', '.join(lay.node_names)}) with {args.cpus} CPUs each on bridge "
        f"{lay.net.bridge} ({lay.net.subnet}), slurmctld at {lay.net.host_address}:{port}"
        if lay.multi
        else f"{NODE} with {args.cpus} CPUs, slurmctld port {port}"
    )
    say(f"started under {lay.base} in {time.monotonic() - t0:.1f} s: {where}, slurmd port {port + 1}")


def cmd_status(args: argparse.Namespace) -> int:
    lay = Layout.load(args.base)
    pids = lay.running()
    for name, pid in pids.items():
        print(f"{name:10s} {'running, pid ' + str(pid) if pid else 'not running'}")
    if lay.multi:
        net = lay.net
        print(
            f"network    bridge {net.bridge} {net.host_address}/24 "
            f"{'present' if net_exists(net) else 'absent'}; namespaces: {' '.join(namespaces_of(net)) or 'none'}"
        )
    if not all(pids.values()):
        print(f"cluster under {lay.base}: {'partly running' if any(pids.values()) else 'stopped'}")
        return 3
    print(f"cluster under {lay.base}: running; {export_line(lay)}")
    print(
        run(
            ["sinfo", "-N", "-o", "%P %N %t %c %m"] if lay.multi else ["sinfo", "-o", "%P %D %t %c %m"],
            env=slurm_env(lay),
        ).stdout,
        end="",
    )
    print(run(["squeue", "-t", "all"], env=slurm_env(lay)).stdout, end="")
    return 0


def cmd_stop(args: argparse.Namespace) -> None:
    lay = Layout.load(args.base)
    # Checked before locking, so a stop never creates the base folder. Namespaces and bridge of a cluster whose
    # daemons were all killed still go.
    if not any(lay.running().values()) and not net_exists(lay.net):
        say(f"not running under {lay.base}")
        return
    with common.locked(lay.lock):
        stop(lay)


def cmd_kill_node(args: argparse.Namespace) -> None:
    """Lose a node as a power cut would: SIGKILL its slurmd, then everything else running on it (job steps and
    tasks), with no goodbye to the controller. `start` brings it back."""
    lay = Layout.load(args.base)
    if not lay.multi or args.node not in lay.node_names:
        raise ClusterError(
            f"kill-node {args.node}: not a node of a multi-node cluster under {lay.base} "
            f"(nodes: {', '.join(lay.node_names) if lay.multi else 'single-node cluster'})"
        )
    namespace = lay.net.namespace(lay.node_names.index(args.node) + 1)
    if pid := lay.daemon(f"slurmd@{args.node}").live_pid():
        common.signal_pid(pid, signal.SIGKILL)
        say(f"killed slurmd@{args.node} (pid {pid})")
    kill_namespace_processes(namespace)


def cmd_env(args: argparse.Namespace) -> None:
    lay = Layout(args.base)
    if not lay.conf.exists():
        raise ClusterError(f"no cluster configured under {lay.base}; run `scripts/slurm-cluster start`")
    print(export_line(lay))


def parser(base: Path) -> argparse.ArgumentParser:
    common_args = argparse.ArgumentParser(add_help=False)
    common_args.add_argument(
        "--base",
        type=lambda s: Path(s).resolve(),
        default=base,
        help=f"folder holding everything of the cluster (default: $BCP_SLURM_BASE, else "
        f"{common.REPO / '.slurm'} if munged accepts it, else a folder in /tmp; here: "
        f"{base})",
    )
    top = argparse.ArgumentParser(prog="slurm-cluster", description=__doc__.split("\n")[0])
    sub = top.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="apt-get install the Slurm and munge packages that are missing")
    start = sub.add_parser("start", parents=[common_args], help="configure and start; prints `export SLURM_CONF=...`")
    start.add_argument("--cpus", type=int, default=8, help="CPUs each node advertises (default 8)")
    start.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="slurmd count (default 1: node `localhost` on 127.0.0.1; 2 or more: node1..nodeN, each "
        "in its own network namespace on a private bridge, see the module docstring)",
    )
    start.add_argument(
        "--port", type=int, help=f"slurmctld port; slurmd uses port+1 (default: first free pair from {DEFAULT_PORT})"
    )
    start.add_argument("--timeout", type=float, default=30, help="seconds to wait for the node (default 30)")
    sub.add_parser("status", parents=[common_args], help="daemons, node and queue; exit 0 running, 3 not running")
    sub.add_parser("stop", parents=[common_args], help="cancel all jobs and stop the daemons this script started")
    sub.add_parser("env", parents=[common_args], help="print `export SLURM_CONF=...`")
    kill = sub.add_parser(
        "kill-node",
        parents=[common_args],
        help="multi-node: SIGKILL a node's slurmd and everything running on it (a lost node); `start` brings it back",
    )
    kill.add_argument("node", help="node name, e.g. node2")
    return top


def main(argv: list[str] | None = None) -> int:
    common.set_program("slurm-cluster")
    args = parser(default_base()).parse_args(argv)
    handler = {
        "install": cmd_install,
        "start": cmd_start,
        "status": cmd_status,
        "stop": cmd_stop,
        "env": cmd_env,
        "kill-node": cmd_kill_node,
    }
    try:
        return handler[args.command](args) or 0
    except ClusterError as exc:
        say(f"error: {exc}")
        return 1
    except BrokenPipeError:  # `status | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
