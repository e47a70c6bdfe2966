"""The daemons of a Slurm test cluster (see slurm.py): starting each one (in its node's namespaces where there are
several nodes), waiting for the nodes to be ready, and stopping them with the jobs they run."""

from __future__ import annotations

import shutil

from . import common
from .common import ClusterError, run, say
from .netns import as_node, net_down, net_exists
from .slurm_layout import BINARIES, NETWORK_BINARIES, NODE, Layout, log_tails, slurm_env

READY_STATES = {"idle", "mix", "alloc"}  # mix/alloc: restarted with jobs kept from the saved state
STOP_GRACE_S = 15.0  # slurmd ignores SIGTERM while it retries a dead controller; SIGKILL after this
JOBS_GONE_S = 20.0  # how long `stop` lets slurmd kill the cancelled jobs' steps


def missing_binaries(network: bool = False) -> list[str]:
    return [b for b in BINARIES + (NETWORK_BINARIES if network else []) if shutil.which(b) is None]


def daemon_argv(lay: Layout, label: str) -> list[str]:
    """The command that starts one daemon; each forks into the background and writes its pid file."""
    daemon = lay.daemon(label)
    if daemon.name == "munged":
        return [
            "runuser",
            "-u",
            "munge",
            "--",
            "munged",
            f"--socket={lay.socket}",
            f"--key-file={lay.key}",
            f"--pid-file={lay.munge_run / 'munged.pid'}",
            f"--log-file={lay.log('munged')}",
            f"--seed-file={lay.munge_dir / 'munged.seed'}",
        ]
    if daemon.name == "slurmctld":
        return ["slurmctld", "-f", str(lay.conf)]
    if not lay.multi:
        return ["slurmd", "-f", str(lay.conf), "-N", NODE]
    # Its node's network and UTS namespaces (its hostname is its node name), the cluster's hosts file over
    # /etc/hosts, so the nodes and their jobs resolve each other's names as on a real cluster.
    k = lay.node_names.index(daemon.node) + 1
    return as_node(lay.net, k, daemon.node, lay.hosts, ["slurmd", "-f", str(lay.conf), "-N", daemon.node])


def spawn(lay: Layout, label: str) -> None:
    """Start one daemon and wait for its live pid."""
    argv = daemon_argv(lay, label)
    res = run(argv, env=slurm_env(lay), timeout=30)
    if res.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed (exit {res.returncode}): {res.stderr.strip()}\n{log_tails(lay)}")
    daemon = lay.daemon(label)
    # The pid file appears just after the parent process returns.
    if not common.poll(daemon.live_pid, 10, interval=0.05):
        raise ClusterError(f"{label} did not stay up (no live pid in {daemon.pid_file.path})\n{log_tails(lay)}")


def node_states(lay: Layout) -> dict[str, str]:
    """Each node's short sinfo state (idle, mix, down*, ...), or one entry "sinfo" with the error."""
    res = run(["sinfo", "-h", "-N", "-n", ",".join(lay.node_names), "-o", "%N %t"], env=slurm_env(lay), timeout=10)
    if res.returncode != 0:
        return {"sinfo": f"exit {res.returncode}: {res.stderr.strip()}"}
    return dict(line.split()[:2] for line in res.stdout.splitlines() if len(line.split()) >= 2)


def describe(lay: Layout, states: dict[str, str]) -> str:
    if not lay.multi and NODE in states:
        return states[NODE]
    return " ".join(f"{n}={s}" for n, s in states.items())


def node_state(lay: Layout) -> str:
    return describe(lay, node_states(lay))


def wait_ready(lay: Layout, timeout: float) -> None:
    """Until every node is ready for jobs; a daemon that exits meanwhile ends the wait with the logs."""
    state = [""]

    def ready() -> bool:
        states = node_states(lay)
        state[0] = describe(lay, states)
        if all(states.get(n) in READY_STATES for n in lay.node_names):
            return True
        if dead := [n for n, p in lay.running().items() if p is None]:
            raise ClusterError(f"{', '.join(dead)} exited during start-up\n{log_tails(lay)}")
        return False

    common.wait_for("node", ready, timeout, lambda: f" (sinfo state: {state[0]!r})\n{log_tails(lay)}", interval=0.2)


def terminate(labels: list[str], lay: Layout) -> None:
    common.terminate(lay.pid_files(labels), STOP_GRACE_S)


def terminate_all(lay: Layout) -> None:
    """Every daemon, in reverse start order (slurmd first, munged last)."""
    terminate([d.label for d in reversed(lay.daemons)], lay)


def active_jobs(lay: Layout) -> list[str]:
    res = run(["squeue", "-h", "-t", "PD,CF,R,CG,S,RQ,RS,RF,SO,ST", "-o", "%A"], env=slurm_env(lay), timeout=20)
    return res.stdout.split() if res.returncode == 0 else []


def cancel_jobs(lay: Layout) -> None:
    """scancel every job, then let slurmd kill the job steps (KillWait=5): slurmstepd processes would outlive
    slurmd otherwise."""
    if not (jobs := active_jobs(lay)):
        return
    say(f"cancelling {len(jobs)} job(s): {' '.join(jobs)}")
    run(["scancel", *jobs], env=slurm_env(lay))
    if not common.poll(lambda: not active_jobs(lay), JOBS_GONE_S, interval=0.2):
        say(f"jobs still active after {JOBS_GONE_S:.0f} s, stopping anyway: {' '.join(active_jobs(lay))}")


def stop(lay: Layout) -> None:
    pids = lay.running()
    if pids["slurmctld"] and pids["munged"]:
        cancel_jobs(lay)
    terminate([d.label for d in lay.slurmds] + ["slurmctld"], lay)
    terminate(["munged"], lay)
    if net_exists(lay.net):  # after slurmd: what still runs in a namespace is a leftover job step
        net_down(lay.net)
        say(f"removed bridge {lay.net.bridge} and the nodes' namespaces")
    say(f"stopped (logs and state kept under {lay.base})")
