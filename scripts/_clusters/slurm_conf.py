"""The files of a Slurm test cluster (see slurm.py): slurm.conf for one node or several, the nodes' hosts file,
munge's key and the folders, all written under the base folder, and the ports it listens on."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from .common import ClusterError, port_free
from .slurm_layout import DEFAULT_PORT, NODE, Layout


def choose_port(requested: int | None) -> int:
    if requested is not None:
        if not (port_free(requested) and port_free(requested + 1)):
            raise ClusterError(f"--port {requested}: port {requested} or {requested + 1} is in use; pick another")
        return requested
    for port in range(DEFAULT_PORT, DEFAULT_PORT + 200, 2):
        if port_free(port) and port_free(port + 1):
            return port
    raise ClusterError(f"no free port pair in {DEFAULT_PORT}-{DEFAULT_PORT + 200}; pass --port")


def mem_total_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise ClusterError("cannot read MemTotal from /proc/meminfo")


def render_conf(lay: Layout, cpus: int, port: int, mem_mb: int) -> str:
    """slurm.conf for one node that advertises `cpus` CPUs (may exceed the real count: tasks just share cores)."""
    if lay.multi:
        return render_multi_conf(lay, cpus, port, mem_mb)
    return f"""\
# Written by scripts/slurm-cluster; rewritten on every start. Single-node test cluster.
ClusterName=ci
SlurmctldHost={NODE}
SlurmUser=root
SlurmctldPort={port}
SlurmdPort={port + 1}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={lay.socket}
StateSaveLocation={lay.state}
SlurmdSpoolDir={lay.spool}
SlurmctldPidFile={lay.run / "slurmctld.pid"}
SlurmdPidFile={lay.run / "slurmd.pid"}
SlurmctldLogFile={lay.log("slurmctld")}
SlurmdLogFile={lay.log("slurmd")}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# Jobs start ~1 s after submission instead of ~3 s.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
# Finished jobs stay visible to scontrol/squeue for an hour (no slurmdbd, so no sacct).
MinJobAge=3600
# scancel: SIGTERM, then SIGKILL after 5 s (default 30).
KillWait=5
ReturnToService=2
SlurmdParameters=config_overrides
NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def render_multi_conf(lay: Layout, cpus: int, port: int, mem_mb: int) -> str:
    """slurm.conf for node1..nodeN, each `cpus` CPUs, reached at its namespace's address on the bridge."""
    net = lay.net
    nodes = "\n".join(
        f"NodeName={name} NodeAddr={net.address(k)} NodeHostname={name} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN"
        for k, name in enumerate(lay.node_names, start=1)
    )
    return f"""\
# Written by scripts/slurm-cluster; rewritten on every start. {lay.nodes}-node test cluster: each slurmd in its
# own network namespace on bridge {net.bridge} ({net.subnet}); slurmctld on the host at {net.host_address}.
ClusterName=ci
SlurmctldHost=localhost({net.host_address})
SlurmUser=root
SlurmctldPort={port}
SlurmdPort={port + 1}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={lay.socket}
StateSaveLocation={lay.state}
SlurmdSpoolDir={lay.spool}/%n
SlurmctldPidFile={lay.run / "slurmctld.pid"}
SlurmdPidFile={lay.run}/slurmd-%n.pid
SlurmctldLogFile={lay.log("slurmctld")}
SlurmdLogFile={lay.logs}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
MinJobAge=3600
KillWait=5
ReturnToService=2
# A lost node is noticed within seconds (default 300 s), and its jobs end NODE_FAIL instead of being requeued
# behind the orchestrator's back: the orchestrator's own resume is what is being tested.
SlurmdTimeout=6
JobRequeue=0
SlurmdParameters=config_overrides
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def prepare(lay: Layout, cpus: int, port: int) -> None:
    """Folders, munge's key (kept across starts), slurm.conf and the nodes' hosts file (rewritten every start)."""
    make_folders(lay)
    replace_file(lay.conf, render_conf(lay, cpus, port, max(1, mem_total_mb() // lay.nodes)))
    if lay.multi:
        replace_file(lay.hosts, render_hosts(lay), mode=0o644)


def make_folders(lay: Layout) -> None:
    """Slurm's folders (root's, 0755) and munge's (munge's own: munged refuses any other owner), and the key."""
    try:
        munge = pwd.getpwnam("munge")
    except KeyError:
        raise ClusterError("no `munge` user: run `scripts/slurm-cluster install`") from None
    spools = [lay.spool / n for n in lay.node_names] if lay.multi else []
    for d in (lay.base, lay.conf.parent, lay.state, lay.spool, *spools, lay.logs, lay.run):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
    for d, mode in ((lay.munge_dir, 0o700), (lay.munge_run, 0o755)):
        d.mkdir(exist_ok=True)
        os.chown(d, munge.pw_uid, munge.pw_gid)
        d.chmod(mode)
    if not lay.key.exists():
        fd = os.open(lay.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        os.chown(lay.key, munge.pw_uid, munge.pw_gid)


def replace_file(path: Path, text: str, mode: int | None = None) -> None:
    """Whole or not at all: a daemon reading the file meanwhile sees the old one or the new one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    if mode is not None:
        tmp.chmod(mode)
    os.replace(tmp, path)


def render_hosts(lay: Layout) -> str:
    """The nodes' /etc/hosts: every node's name at its bridge address, as a real cluster's DNS or hosts file has
    them. Jobs need it: a distributed job's ranks meet at the first node's host name (the Slurm backend's
    MASTER_ADDR=$(hostname)), and gloo binds to the address its own host name resolves to (else loopback)."""
    lines = ["127.0.0.1 localhost", f"{lay.net.host_address} slurmctld"]
    lines += [f"{lay.net.address(k)} {name}" for k, name in enumerate(lay.node_names, start=1)]
    return (
        "# Written by scripts/slurm-cluster for the nodes' mount namespaces; rewritten on every start.\n"
        + "\n".join(lines)
        + "\n"
    )
