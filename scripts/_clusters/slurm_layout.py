"""Where everything of one Slurm test cluster lives: every path, daemon and name derived from its base folder and
node count (see slurm.py for the cluster itself), and which base folder munged accepts."""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from .common import REPO, PidFile, tail
from .netns import Network

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "iproute2"]
# Binaries the script runs; if all are on PATH the packages count as installed (any other install is fine too).
BINARIES = ["slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo", "munged", "runuser"]
NETWORK_BINARIES = ["ip", "nsenter", "unshare"]  # --nodes 2 or more only (iproute2; util-linux, always there)
DEFAULT_PORT = 16817  # slurmctld; slurmd gets port+1. Not Slurm's 6817/6818, so a system Slurm does not clash.
NODE = "localhost"
SUN_PATH_MAX = 107  # a unix socket path longer than this cannot be bound


@dataclass(frozen=True)
class Daemon:
    name: str  # also the expected /proc/PID/comm
    pid_file: PidFile  # its markers: arguments only this cluster's instance of the daemon was started with
    log: Path
    node: str | None = None  # slurmd only: its NodeName

    @property
    def label(self) -> str:
        """Unique within a cluster: `slurmd` on one node, `slurmd@nodeK` with several."""
        return self.name if self.node in (None, NODE) else f"{self.name}@{self.node}"

    def live_pid(self) -> int | None:
        return self.pid_file.live_pid()


def daemon(name: str, pid_file: Path, markers: tuple[str, ...], log: Path, node: str | None = None) -> Daemon:
    return Daemon(name, PidFile(pid_file, name, markers), log, node)


@dataclass(frozen=True)
class Layout:
    """Every path and name of one cluster, derived from its base folder and its number of nodes."""

    base: Path
    nodes: int = 1

    @classmethod
    def load(cls, base: Path) -> Layout:
        """The cluster as last configured under `base` (its node count read from slurm.conf; 1 if none)."""
        try:
            lines = (base / "etc" / "slurm.conf").read_text().splitlines()
        except OSError:
            return cls(base)
        return cls(base, max(1, sum(line.startswith("NodeName=") for line in lines)))

    @property
    def multi(self) -> bool:
        return self.nodes > 1

    @property
    def node_names(self) -> list[str]:
        return [f"node{k}" for k in range(1, self.nodes + 1)] if self.multi else [NODE]

    @property
    def net(self) -> Network:
        return Network.of(self.base)

    @property
    def conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    @property
    def hosts(self) -> Path:  # the nodes' /etc/hosts (multi-node)
        return self.conf.parent / "hosts"

    @property
    def munge_dir(self) -> Path:  # key, seed and log: owned by munge, 0700
        return self.base / "munge"

    @property
    def munge_run(self) -> Path:  # socket and pid: owned by munge, 0755 so any user can reach the socket
        return self.base / "munge-run"

    @property
    def socket(self) -> Path:
        return self.munge_run / "munge.socket"

    @property
    def key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def spool(self) -> Path:
        return self.base / "spool"

    @property
    def logs(self) -> Path:
        return self.base / "log"

    @property
    def run(self) -> Path:
        return self.base / "run"

    @property
    def lock(self) -> Path:
        return self.base / ".lock"

    def log(self, daemon: str) -> Path:
        return self.munge_dir / "munged.log" if daemon == "munged" else self.logs / f"{daemon}.log"

    @property
    def daemons(self) -> list[Daemon]:
        """In start order; stopped in reverse (slurmd first, munged last: Slurm authenticates while it stops)."""
        return [
            daemon("munged", self.munge_run / "munged.pid", (f"--socket={self.socket}",), self.log("munged")),
            daemon("slurmctld", self.run / "slurmctld.pid", (str(self.conf),), self.log("slurmctld")),
            *self.slurmds,
        ]

    @property
    def slurmds(self) -> list[Daemon]:
        if not self.multi:
            return [daemon("slurmd", self.run / "slurmd.pid", (str(self.conf),), self.log("slurmd"), NODE)]
        # %n in SlurmdPidFile/SlurmdLogFile/SlurmdSpoolDir is the node name: one file or folder per slurmd.
        return [
            daemon("slurmd", self.run / f"slurmd-{n}.pid", (str(self.conf), n), self.log(f"slurmd-{n}"), n)
            for n in self.node_names
        ]

    def daemon(self, label: str) -> Daemon:
        return next(d for d in self.daemons if d.label == label)

    def running(self) -> dict[str, int | None]:
        """Live pid (or None) of every daemon of the cluster, by label."""
        return {d.label: d.live_pid() for d in self.daemons}

    def pid_files(self, labels: list[str]) -> dict[str, PidFile]:
        by_label = {d.label: d.pid_file for d in self.daemons}
        return {label: by_label[label] for label in labels}


def munge_rejects(base: Path) -> str | None:
    """Why munged (running as `munge`) would refuse files under `base`, or None if it accepts them.

    munged checks every folder above its key, socket and log: owned by root or munge, not writable by group or
    others unless sticky (like /tmp), and it must be able to pass through each one.
    """
    sock = base / "munge-run" / "munge.socket"
    if len(str(sock)) > SUN_PATH_MAX:
        return f"{sock} is too long for a unix socket path ({SUN_PATH_MAX} bytes at most)"
    try:
        munge_uid = pwd.getpwnam("munge").pw_uid
    except KeyError:
        munge_uid = 0  # not installed yet; judge by root ownership alone
    for folder in [base, *base.parents]:
        try:
            st = folder.stat()
        except FileNotFoundError:
            continue  # will be created by this script, owned by root
        if st.st_uid not in (0, munge_uid):
            return f"{folder} is owned by uid {st.st_uid} (munged accepts only root- or munge-owned folders)"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{folder} is writable by group or others without the sticky bit"
        if not st.st_mode & 0o001:
            return f"{folder} is not traversable by other users (munged runs as user munge)"
    return None


def default_base() -> Path:
    """$BCP_SLURM_BASE, else <repo>/.slurm, else (munged would refuse that) a folder in /tmp named after the repo.

    Deterministic, so `start`, `status`, `stop` and `env` all find the same cluster without being told.
    """
    if env := os.environ.get("BCP_SLURM_BASE"):
        return Path(env).resolve()
    if munge_rejects(REPO / ".slurm") is None:
        return REPO / ".slurm"
    return Path("/tmp") / f"bcp-pipeline-slurm-{hashlib.sha1(str(REPO).encode()).hexdigest()[:8]}"


def export_line(lay: Layout) -> str:
    return f"export SLURM_CONF={lay.conf}"


def slurm_env(lay: Layout) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(lay.conf)}


def log_tails(lay: Layout) -> str:
    return "\n".join(f"--- {d.log} (last lines):\n{tail(d.log)}" for d in lay.daemons)
