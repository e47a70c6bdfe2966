"""What the three test-cluster scripts (scripts/slurm-cluster, sge-cluster, k8s-cluster) share: the repository
root, the error they print without a traceback, their stderr messages, running a command, locks, the ONE check of
"is the pid in this pid file our daemon" (live_pid), starting and stopping daemons, waiting for readiness, and
installing Debian packages."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # scripts/_clusters/common.py -> the repository
KILL_WAIT_S = 5.0  # after SIGKILL: only a process stuck in the kernel outlives this


class ClusterError(Exception):
    """A failure with a message that says what to do next; printed without a traceback."""


_program = ["cluster"]  # the script's name, the prefix of every message; set once by its main()


def set_program(name: str) -> None:
    """Name the running script (e.g. `slurm-cluster`) in the messages of every module, shared ones included."""
    _program[0] = name


def say(msg: str) -> None:
    """A message on stderr: stdout carries only what a caller evaluates (the `export` line, status tables)."""
    print(f"{_program[0]}: {msg}", file=sys.stderr, flush=True)


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command (argv list, never a shell), capturing output; never raises on a non-zero exit."""
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]}: timed out after {timeout:.0f} s")


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log, indented, for an error message."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        return f"    ({path}: {exc.strerror})"
    return "\n".join(f"    {line}" for line in text) or "    (empty)"


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Serialize start/stop of one cluster (e.g. two test sessions starting it at once)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def port_free(port: int) -> bool:
    """Whether `port` can be bound on every address (so on 127.0.0.1 and a cluster's bridge alike)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


# ----------------------------------------------------------------------------------------------------------
# Is this pid ours? One answer for every daemon of every cluster, so no script ever signals a stranger.


@dataclass(frozen=True)
class PidFile:
    """A daemon's pid file and what only this cluster's instance of the daemon has.

    A pid file is trusted only if that pid is alive, not a zombie, runs the daemon's program (`comm`) and was
    started with every one of `markers` (this cluster's config, socket or folder) as an argument, so another
    cluster's daemons and a process that reused the pid are never touched. Grid Engine's daemons take no
    arguments: their marker is their environment's SGE_ROOT=..., a whole KEY=VALUE entry of /proc/PID/environ.
    The process start time is not compared with the file's time: that depends on the wall clock (a clock step
    would make a live daemon look foreign), while a reused pid cannot carry this cluster's markers.
    """

    path: Path
    comm: str | None  # the program's name as /proc/PID/stat gives it (15 bytes at most); None: any (Python)
    markers: tuple[str, ...] = ()

    def live_pid(self) -> int | None:
        """The pid in the file if that process is this cluster's daemon, else None."""
        try:
            pid = int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if pid > 0 and self.is_ours(pid) else None

    def is_ours(self, pid: int) -> bool:
        proc = Path(f"/proc/{pid}")
        try:
            stat = (proc / "stat").read_text()
            argv = set((proc / "cmdline").read_bytes().decode(errors="replace").split("\0"))
        except OSError:
            return False
        # Field 2 is "(comm)" and comm may contain spaces and ')': split at the first '(' and the last ')'.
        comm, rest = stat[stat.find("(") + 1 : stat.rfind(")")], stat[stat.rfind(")") + 1 :].split()
        if not rest or rest[0] in ("Z", "X") or (self.comm is not None and comm != self.comm[:15]):
            return False
        if missing := set(self.markers) - argv:
            try:  # only Grid Engine's markers are here, and only root may read another user's environment
                environ = set((proc / "environ").read_bytes().decode(errors="replace").split("\0"))
            except OSError:
                return False
            return missing <= environ
        return True


def signal_pid(pid: int, sig: int) -> None:
    """Signal a process checked just before; it may have exited since, which is what was wanted."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group (a job's shepherd and all it started); it may be gone already."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def wait_gone(pids: dict[str, tuple[PidFile, int]], timeout: float) -> dict[str, int]:
    """Wait until each daemon (label -> its pid file and the pid it had) is no longer that live pid; return the
    labels and pids still alive after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        alive = {label: pid for label, (pid_file, pid) in pids.items() if pid_file.live_pid() == pid}
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def terminate(daemons: dict[str, PidFile], grace: float, announce: bool = True, report_kill: bool = True) -> None:
    """Stop the live ones of `daemons` (label -> pid file) together: SIGTERM, SIGKILL to those still up after
    `grace` seconds (a daemon may ignore SIGTERM, e.g. slurmd while it retries a dead controller). `announce`:
    say which are stopped; `report_kill`: say which needed SIGKILL."""
    pids = {label: (pid_file, pid) for label, pid_file in daemons.items() if (pid := pid_file.live_pid())}
    for label, (_, pid) in pids.items():
        if announce:
            say(f"stopping {label} (pid {pid})")
        signal_pid(pid, signal.SIGTERM)
    for label, pid in wait_gone(pids, grace).items():
        if report_kill:
            say(f"{label} (pid {pid}) ignored SIGTERM for {grace:.0f} s; sending SIGKILL")
        signal_pid(pid, signal.SIGKILL)
        if wait_gone({label: pids[label]}, KILL_WAIT_S):
            raise ClusterError(f"{label} (pid {pid}) survived SIGKILL")


def spawn_detached(argv: list[str] | tuple[str, ...], log: Path, pid_file: Path) -> subprocess.Popen:
    """Start a daemon that stays in the foreground: its output appended to `log`, its pid written to `pid_file`,
    in a session of its own so a Ctrl-C in the starting shell does not stop it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as output:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True)
    pid_file.write_text(f"{process.pid}\n")
    return process


def processes(match: Callable[[Path], bool]) -> list[int]:
    """Live processes (not this one) whose /proc/PID folder `match`es; one that exits meanwhile is skipped."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if match(entry):
                    found.append(int(entry.name))
    return found


def processes_naming(text: str) -> list[int]:
    """Live processes (not this one) whose command line contains `text`."""
    marker = text.encode()
    return processes(lambda proc: marker in (proc / "cmdline").read_bytes())


# ----------------------------------------------------------------------------------------------------------
# Waiting and installing


def poll(ready: Callable[[], object], timeout: float, interval: float = 0.1) -> bool:
    """Call `ready` until it returns something true (then True) or `timeout` seconds have passed (then False).
    `ready` may raise ClusterError to end the wait early (a daemon that died meanwhile)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def wait_for(
    what: str, ready: Callable[[], object], timeout: float, detail: Callable[[], str] | str = "", interval: float = 0.1
) -> None:
    """poll(), raising "WHAT not ready after N s" (and `detail`: logs, states) on a timeout."""
    if not poll(ready, timeout, interval):
        raise ClusterError(f"{what} not ready after {timeout:.0f} s{detail() if callable(detail) else detail}")


def missing_programs(names: Iterable[str], also_in: Path | None = None) -> list[str]:
    """The programs neither on PATH nor (where given) in folder `also_in`."""
    return [n for n in names if shutil.which(n) is None and not (also_in and (also_in / n).exists())]


def apt_install(
    packages: list[str], timeout: float = 600, env: dict[str, str] | None = None, options: tuple[str, ...] = ()
) -> None:
    """`apt-get install` Debian packages (no recommends). If that fails, usually for stale or absent package
    lists, refresh them once and retry once. `options` go before the verb (e.g. a dpkg lock timeout)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", **(env or {})}
    install = ["apt-get", *options, "install", "-y", "-q", "--no-install-recommends", *packages]
    res = run(install, env=env, timeout=timeout)
    if res.returncode != 0:
        say("apt-get install failed; running apt-get update and retrying")
        upd = run(["apt-get", *options, "update", "-q"], env=env, timeout=600)
        res = run(install, env=env, timeout=timeout) if upd.returncode == 0 else upd
    if res.returncode != 0:
        output = (res.stdout + res.stderr)[-2000:]
        raise ClusterError(f"`{' '.join(res.args)}` failed (exit {res.returncode}):\n{output}")
