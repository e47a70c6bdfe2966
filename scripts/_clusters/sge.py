"""Install, start, inspect and stop a Son of Grid Engine cell of one or two exec hosts on this machine (tests, CI).

    scripts/sge-cluster install               # Debian's gridengine-master, -exec, -client and openmpi-bin (root +
                                              # apt), if missing
    scripts/sge-cluster start [--nodes 2]     # configure + start; prints the `export SGE_...` line
                      [--site tsubame]        # ... with TSUBAME4's node_f and JSV on top (sge_site.py)
    scripts/sge-cluster status                # daemons and queue instances; exit 0 running, 3 stopped
    scripts/sge-cluster stop                  # delete every job, stop exactly the daemons it started
    scripts/sge-cluster env                   # prints the `export SGE_...` line
    scripts/sge-cluster kill-execd HOST       # SIGKILL one exec daemon (its running jobs' shepherds stay)

A private cell: SGE_ROOT is BASE/root (--base, else $BCP_SGE_BASE, else <repo>/.sge) with its bin, lib, utilbin
and util folders linked to the Debian packages' files, cell `default`, classic spooling under BASE, `admin_user
none` (the daemons run as root), private ports (SGE_QMASTER_PORT, SGE_EXECD_PORT: every client needs them in its
environment, which is what the export line sets). Nothing is written to /etc and no init script is used.

Cell settings chosen for tests (measured: the defaults take 2-16 s to finish a trivial job and 14-29 s to reach
`qacct`; tuned, 1-1.5 s and at once): a one-second scheduler interval and flushes, accounting written at once,
`min_uid 0` (root's jobs), no load thresholds, `shell_start_mode unix_behavior` (the `#!` line of a job script is
honoured). Parallel environments: `smp` (all slots on one host), `mpi` (fill up), `make`, and `pe_node` (one slot
per host, `allocation_rule 1`: a job of N slots gets N hosts, one launcher each). Queue `all.q` on every exec host
with `--slots` slots each and a tmpdir per host. A host name that resolves to loopback is aliased (`host_aliases`)
so qmaster accepts clients.

`--nodes 2` adds a second exec host, `node2`, in its own network, UTS and mount namespaces, joined to the first by
a bridge with addresses from 198.18.0.0/15 (the same bridge, namespace and veth scheme as scripts/slurm-cluster:
one implementation of it, netns.py). qmaster and the first execd run in a private mount namespace in
which the cell's hosts file (BASE/etc/hosts: this machine's name at the bridge address, node2 at its own) is bound
over /etc/hosts, so qmaster resolves node2 and jobs on either host resolve the other; node2's execd has the same
file. The machine's /etc/hosts is untouched, and `stop` removes the bridge and namespace.

`--site tsubame` adds what TSUBAME4 has on top of a stock cell (sge_site.py): a consumable complex `node_f` (1 a
host: a whole node), the site's parallel environment `site_node_f`, and a server-side JSV that turns `-l node_f=N`
into N whole hosts (`-pe site_node_f N`) and refuses a job without node_f or h_rt, or one naming a PE.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from . import common
from .common import ClusterError, run, say, tail
from .netns import as_node, net_down, net_exists, net_up
from .sge_cell import (
    BINARIES,
    DEFAULT_PORT,
    PACKAGES,
    SGE_LIB,
    Layout,
    cell_env,
    configure,
    default_base,
    export_line,
    in_qmaster_namespace,
    prepare,
    queue_states,
)
from .sge_site import SITES

STOP_GRACE_S = 20.0
POLICY_RC = Path("/usr/sbin/policy-rc.d")


def missing_binaries() -> list[str]:
    return common.missing_programs(BINARIES, also_in=SGE_LIB)


def cmd_install(args: argparse.Namespace) -> None:
    if not missing_binaries() and shutil.which("ip") and shutil.which("mpirun"):
        say("Grid Engine, iproute2 and Open MPI are already installed")
        return
    if shutil.which("apt-get") is None or shutil.which("debconf-set-selections") is None:
        raise ClusterError(
            "cannot install Grid Engine: apt-get not found; install Son of Grid Engine 8.1.9 "
            "(qmaster, execd, client commands) with this system's package manager"
        )
    if os.geteuid() != 0:
        raise ClusterError("installing packages needs root; run as root or via sudo")
    preseed_debconf()
    with no_service_starts():
        say(f"installing {' '.join(PACKAGES)}")
        common.apt_install(PACKAGES, timeout=900, env={"RUNLEVEL": "1"})
    if still := missing_binaries() + ["mpirun"] * (shutil.which("mpirun") is None):
        raise ClusterError(f"installed {' '.join(PACKAGES)} but still missing: {' '.join(still)}")
    say("installed Son of Grid Engine and Open MPI")


def preseed_debconf() -> None:
    """Without these answers the packages' postinst asks on a terminal; the cell they configure is never used."""
    preseed = "".join(
        f"gridengine-common shared/{key} {kind} {value}\n"
        for key, kind, value in (
            ("gridengineconfig", "boolean", "true"),
            ("gridenginecell", "string", "default"),
            ("gridenginemaster", "string", socket.gethostname()),
        )
    )
    res = subprocess.run(["debconf-set-selections"], input=preseed, text=True, capture_output=True, check=False)
    if res.returncode != 0:
        raise ClusterError(f"debconf-set-selections failed: {res.stderr.strip()}")


@contextlib.contextmanager
def no_service_starts() -> Iterator[None]:
    """An init that starts services would start the packaged cell: hold them off with a policy-rc.d that says
    "not now" (exit 101), only where none exists, removed afterwards."""
    placed = not POLICY_RC.exists()
    if placed:
        POLICY_RC.write_text(
            "#!/bin/sh\n# written by bcp-pipeline's scripts/sge-cluster during apt-get install\nexit 101\n"
        )
        POLICY_RC.chmod(0o755)
    try:
        yield
    finally:
        if placed:
            POLICY_RC.unlink(missing_ok=True)


def spawn_qmaster(lay: Layout) -> None:
    argv = [str(SGE_LIB / "sge_qmaster")]
    if lay.nodes > 1:  # in a private mount namespace with the cell's hosts file, where node2 resolves
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            'mount --bind "$0" /etc/hosts && exec "$@"',
            str(lay.hosts_file),
            *argv,
        ]
    res = run(argv, env=cell_env(lay), timeout=30)
    if res.returncode != 0:
        raise ClusterError(
            f"sge_qmaster failed to start (exit {res.returncode}): {res.stderr.strip()}\n"
            f"{tail(lay.qmaster_spool / 'messages')}"
        )
    common.wait_for(
        "sge_qmaster",
        lambda: run(["qstat", "-g", "c"], env=cell_env(lay), timeout=10).returncode == 0,
        30,
        lambda: "\n" + tail(lay.qmaster_spool / "messages"),
    )


def spawn_execd(lay: Layout, host: str) -> None:
    execd = str(SGE_LIB / "sge_execd")
    if host == lay.first_host:
        argv = in_qmaster_namespace(lay, [execd])
    else:  # node2: namespace 1, its own host name, the cell's hosts file
        argv = as_node(lay.net, 1, host, lay.hosts_file, [execd])
    res = run(argv, env=cell_env(lay), timeout=30)
    if res.returncode != 0:
        raise ClusterError(f"sge_execd@{host} failed to start (exit {res.returncode}): {res.stderr.strip()}")
    common.wait_for(
        f"sge_execd@{host}",
        lambda: lay.execd_pid_file(host).live_pid() is not None,
        15,
        lambda: "\n" + tail(lay.execd_spool / host / "messages"),
    )


def cmd_start(args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        raise ClusterError("starting the cell needs root (execd runs jobs as their owners)")
    if missing := missing_binaries():
        raise ClusterError(
            f"Grid Engine is not installed (missing: {' '.join(missing)}); run `scripts/sge-cluster install`"
        )
    lay = Layout(args.base, args.nodes, args.site)
    with common.locked(lay.lock):
        old = Layout.load(lay.base)
        if (old.nodes, old.site) == (lay.nodes, lay.site) and all(old.running().values()):
            say(f"already running under {lay.base}")
            print(export_line(old))
            return
        stop(old)
        start_cell(lay, args.port or DEFAULT_PORT, args.slots, args.timeout)
    print(export_line(lay))


def start_cell(lay: Layout, port: int, slots: int, timeout: float) -> None:
    for candidate in (port, port + 1):
        if not common.port_free(candidate):
            raise ClusterError(f"port {candidate} is in use; pass another --port")
    started = time.monotonic()
    prepare(lay, port)
    if lay.nodes > 1:
        net_up(lay.net, lay.nodes - 1)  # the exec hosts after the first each get a namespace
    spawn_qmaster(lay)
    configure(lay, slots)
    for host in lay.hosts:
        spawn_execd(lay, host)
    common.wait_for(
        "the exec hosts",
        lambda: (states := queue_states(lay)).keys() == set(lay.hosts) and not any("u" in s for s in states.values()),
        timeout,
        lambda: f": {queue_states(lay)}",
    )
    say(f"cell up in {time.monotonic() - started:.1f} s: {', '.join(lay.hosts)}")


def cmd_status(args: argparse.Namespace) -> int:
    lay = Layout.load(args.base)
    pids = lay.running()
    for label, pid in pids.items():
        print(f"{label}: {'running, pid ' + str(pid) if pid else 'stopped'}")
    if not pids["sge_qmaster"]:
        return 3
    for host, state in queue_states(lay).items():
        print(f"all.q@{host}: {state or 'ok'}")
    return 0 if all(pids.values()) else 3


def shepherds_of(lay: Layout) -> list[int]:
    """sge_shepherd processes of this cell (their working folder is under its execd spool), which outlive execd."""
    return common.processes(
        lambda proc: (
            (proc / "comm").read_text().strip() == "sge_shepherd" and str(lay.execd_spool) in os.readlink(proc / "cwd")
        )
    )


def stop(lay: Layout) -> None:
    pids = lay.running()
    if pids["sge_qmaster"]:
        run(["qdel", "-f", "-u", "*"], env=cell_env(lay), timeout=30)
        common.poll(lambda: not shepherds_of(lay), 15, interval=0.2)
    # execd and qmaster together: SIGTERM, SIGKILL after the grace
    common.terminate(lay.daemons(), STOP_GRACE_S, announce=False)
    for pid in shepherds_of(lay):  # jobs of an execd killed earlier: nothing will ever reap them
        common.signal_group(pid, signal.SIGKILL)
    if net_exists(lay.net):
        net_down(lay.net)
    if any(pids.values()):
        say(f"stopped (logs and spool kept under {lay.base})")


def cmd_stop(args: argparse.Namespace) -> None:
    lay = Layout.load(args.base)
    with common.locked(lay.lock):
        stop(lay)


def cmd_env(args: argparse.Namespace) -> None:
    lay = Layout.load(args.base)
    if not (lay.common / "bootstrap").exists():
        raise ClusterError(f"no cell configured under {lay.base}; run `scripts/sge-cluster start`")
    print(export_line(lay))


def cmd_kill_execd(args: argparse.Namespace) -> None:
    lay = Layout.load(args.base)
    if args.host not in lay.hosts:
        raise ClusterError(f"kill-execd {args.host}: not an exec host of the cell ({', '.join(lay.hosts)})")
    if pid := lay.execd_pid_file(args.host).live_pid():
        common.signal_pid(pid, signal.SIGKILL)
        say(f"killed sge_execd@{args.host} (pid {pid})")


def start_execd(args: argparse.Namespace) -> None:
    lay = Layout.load(args.base)
    if lay.execd_pid_file(args.host).live_pid() is None:
        spawn_execd(lay, args.host)


def parser(base: Path) -> argparse.ArgumentParser:
    common_args = argparse.ArgumentParser(add_help=False)
    common_args.add_argument(
        "--base",
        type=lambda s: Path(s).resolve(),
        default=base,
        help=f"folder holding the whole cell (default: $BCP_SGE_BASE, else {common.REPO / '.sge'})",
    )
    top = argparse.ArgumentParser(prog="sge-cluster", description=__doc__.split("\n")[0])
    sub = top.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="apt-get install Son of Grid Engine's packages if missing")
    start = sub.add_parser("start", parents=[common_args], help="configure and start; prints the export line")
    start.add_argument("--nodes", type=int, choices=(1, 2), default=1, help="exec hosts (2: node2 in namespaces)")
    start.add_argument("--slots", type=int, default=8, help="slots of all.q on each host (default 8)")
    start.add_argument("--port", type=int, help=f"qmaster port; execd uses port+1 (default {DEFAULT_PORT})")
    start.add_argument("--timeout", type=float, default=30, help="seconds to wait for the exec hosts")
    start.add_argument("--site", choices=SITES, help="a site's own set-up on top (tsubame: node_f, its JSV)")
    sub.add_parser("status", parents=[common_args], help="daemons and queue instances; exit 0 running, 3 not")
    sub.add_parser("stop", parents=[common_args], help="delete all jobs, stop the daemons, remove the namespace")
    sub.add_parser("env", parents=[common_args], help="print the export line")
    kill = sub.add_parser(
        "kill-execd", parents=[common_args], help="SIGKILL one exec daemon (its jobs' shepherds stay)"
    )
    kill.add_argument("host")
    revive = sub.add_parser("start-execd", parents=[common_args], help="start one exec daemon again after kill-execd")
    revive.add_argument("host")
    return top


def main(argv: list[str] | None = None) -> int:
    common.set_program("sge-cluster")
    args = parser(default_base()).parse_args(argv)
    handler = {
        "install": cmd_install,
        "start": cmd_start,
        "status": cmd_status,
        "stop": cmd_stop,
        "env": cmd_env,
        "kill-execd": cmd_kill_execd,
        "start-execd": start_execd,
    }
    try:
        return handler[args.command](args) or 0
    except ClusterError as exc:
        say(f"error: {exc}")
        return 1
