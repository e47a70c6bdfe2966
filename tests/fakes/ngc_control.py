"""State layer and test controls of the ``ngc`` EMULATOR (tests/fakes/ngc). Test code, not NVIDIA code.

The emulator keeps everything in one folder, ``$NGC_FAKE_HOME``:

- ``state.json``   jobs (``{"job": ..., "jobStatusHistory": [...], "emu": ...}`` per id), workspaces, next id
- ``control.json`` test controls: job rules (fail / preempt / hold QUEUED) and CLI call failures or delays
- ``secrets.json`` ``{"secret-name": {"KEY": "value"}}`` for ``--secret``
- ``calls.jsonl``  one line per ``ngc`` invocation: argv, command, exit code, duration, whether ngcsdk was imported
- ``lock``         fcntl lock taken by every writer (CLI calls, job supervisors, these helpers)
- ``workspaces/NAME/`` the workspace contents; ``jobs/ID/results/R/`` results of replica R (``joblog.log`` = log)

Only the standard library is imported here: status calls of the emulator import this module and must answer
in milliseconds. Writers hold the lock and replace files atomically; readers read without the lock.

Test-facing API: :class:`FakeNgc` (see its methods). The lower-level functions are shared with the emulator.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import subprocess

FAKES_DIR = Path(__file__).resolve().parent
NGC_EMULATOR = FAKES_DIR / "ngc"
FIRST_JOB_ID = 3000001

# ngcsdk 4.19.1 basecommand.constants / JobStatusEnum (copied: this module must not import ngcsdk).
JOB_STATUSES = (
    "UNKNOWN", "CREATED", "PENDING_TERMINATION", "RUNNING", "KILLED_BY_USER", "KILLED_BY_ADMIN",
    "FAILED_RUN_LIMIT_EXCEEDED", "FAILED", "FINISHED_SUCCESS", "QUEUED", "CANCELED", "TASK_LOST", "PREEMPTED",
    "PREEMPTED_BY_ADMIN", "STARTING", "KILLED_BY_SYSTEM", "PENDING_STORAGE_CREATION", "RESOURCE_GRANTED",
    "RESOURCE_GRANT_DENIED", "RESOURCE_CONSUMPTION_REQUEST_IN_PROGRESS", "RESOURCE_LIMIT_EXCEEDED",
    "RESOURCE_RELEASED", "INFINITY_POOL_MISSING", "IM_INTERNAL_ERROR", "REQUESTING_RESOURCE",
)  # fmt: skip
TERMINAL_STATES = frozenset({
    "FINISHED_SUCCESS", "UNKNOWN", "KILLED_BY_USER", "FAILED_RUN_LIMIT_EXCEEDED", "FAILED", "CANCELED",
    "TASK_LOST", "KILLED_BY_SYSTEM", "KILLED_BY_ADMIN", "INFINITY_POOL_MISSING", "RESOURCE_RELEASED",
    "IM_INTERNAL_ERROR", "RESOURCE_GRANT_DENIED", "RESOURCE_LIMIT_EXCEEDED",
})  # fmt: skip
STATES_BEFORE_RUNNING = frozenset({"CREATED", "QUEUED", "STARTING", "PENDING_STORAGE_CREATION", "REQUESTING_RESOURCE"})
# JobStatus.statusType (enum UNKNOWN, OK, APPLICATION_ERROR, DOCKER_ERROR, CONTAINER_ERROR, SYSTEM_ERROR).
DEFAULT_STATUS_TYPES = {"FAILED": "APPLICATION_ERROR", "KILLED_BY_SYSTEM": "SYSTEM_ERROR", "TASK_LOST": "SYSTEM_ERROR"}
# What a test may inject into a job (the emulator kills the job's processes and sets the status).
INJECTABLE = frozenset({"FAILED", "FAILED_RUN_LIMIT_EXCEEDED", "KILLED_BY_SYSTEM", "PREEMPTED"})


class FakeStateError(RuntimeError):
    """The emulator's state folder is missing or unreadable (never silently reset)."""


# --------------------------------------------------------------------------------------------------------------
# Files, lock, atomic JSON


def home_from_env(environ: dict[str, str] | None = None) -> Path:
    """The state folder from ``NGC_FAKE_HOME``; created if missing."""
    value = (environ if environ is not None else os.environ).get("NGC_FAKE_HOME")
    if not value:
        raise FakeStateError("NGC_FAKE_HOME is not set: the ngc emulator (tests/fakes/ngc) keeps its state there")
    home = Path(value)
    home.mkdir(parents=True, exist_ok=True)
    return home


_LOCK_DEPTH: dict[Path, int] = {}


@contextlib.contextmanager
def locked(home: Path) -> Iterator[None]:
    """Exclusive lock shared by every process writing the emulator's state; re-entrant within a process
    (a second flock on a new descriptor would block on our own lock)."""
    key = Path(home).resolve()
    if _LOCK_DEPTH.get(key):
        _LOCK_DEPTH[key] += 1
        try:
            yield
        finally:
            _LOCK_DEPTH[key] -= 1
        return
    fd = os.open(key / "lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _LOCK_DEPTH[key] = 1
        yield
    finally:
        _LOCK_DEPTH[key] = 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def read_json(path: Path, default: Any) -> Any:
    """Read a JSON file written by :func:`write_json`; a missing file gives ``default``, a corrupt one raises."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise FakeStateError(f"corrupt emulator file {path}: {error}") from None


def write_json(path: Path, data: Any) -> None:
    """Temp file + rename, so lock-free readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def empty_state() -> dict[str, Any]:
    return {"version": 1, "nextJobId": FIRST_JOB_ID, "jobs": {}, "workspaces": {}}


def read_state(home: Path) -> dict[str, Any]:
    return read_json(home / "state.json", empty_state())


@contextlib.contextmanager
def update_state(home: Path) -> Iterator[dict[str, Any]]:
    """Lock, read, let the caller modify, write back (only when the block did not raise)."""
    with locked(home):
        state = read_state(home)
        yield state
        write_json(home / "state.json", state)


@contextlib.contextmanager
def update_control(home: Path) -> Iterator[dict[str, Any]]:
    """Same as :func:`update_state` for ``control.json``."""
    with locked(home):
        control = read_json(home / "control.json", {})
        yield control
        write_json(home / "control.json", control)


# --------------------------------------------------------------------------------------------------------------
# Job records and status transitions (shared by the CLI, the job supervisors and the test helpers)


def iso_now(ts: float | None = None) -> str:
    """NGC's timestamp form, e.g. ``2024-01-31T12:00:00.123Z`` (UTC)."""
    moment = datetime.fromtimestamp(time.time() if ts is None else ts, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_iso(text: str) -> float:
    """Inverse of :func:`iso_now` (epoch seconds)."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def entry_of(state: dict[str, Any], job_id: int | str) -> dict[str, Any] | None:
    return state["jobs"].get(str(job_id))


def set_status(
    entry: dict[str, Any], status: str, *, details: str | None = None, status_type: str | None = None
) -> None:
    """Move a job to ``status``: update ``job.jobStatus`` and append it to ``jobStatusHistory``."""
    if status not in JOB_STATUSES:
        raise ValueError(f"not a Base Command job status: {status!r}")
    now = time.time()
    stamp = iso_now(now)
    job, emu = entry["job"], entry["emu"]
    job_status = job["jobStatus"]
    if job_status.get("status") == "RUNNING" and emu.get("runningSince"):
        emu["runSeconds"] = emu.get("runSeconds", 0.0) + now - emu.pop("runningSince")
    job_status.update(status=status, timestamp=int(now * 1000), timestampStateEntry=int(now * 1000))
    job_status.pop("statusDetails", None)
    if details:
        job_status["statusDetails"] = details
    job_status["statusType"] = status_type or DEFAULT_STATUS_TYPES.get(status, "OK")
    if status == "QUEUED":
        job_status["queuedAt"] = stamp
    elif status == "RUNNING":
        job_status.setdefault("startedAt", stamp)
        emu["runningSince"] = now
    elif status in ("PREEMPTED", "PREEMPTED_BY_ADMIN"):
        job_status["preemptedAt"] = stamp
        job["preemptionRequestedDate"] = stamp
    if status in TERMINAL_STATES:
        job_status["endedAt"] = stamp
    if emu.get("runSeconds"):
        job_status["totalRuntimeSeconds"] = int(emu["runSeconds"])
    job["lastStatusUpdatedDate"] = stamp
    entry["jobStatusHistory"].append(dict(job_status))


def signal_groups(pgids: list[int], sig: int) -> None:
    """Signal the process groups of a job's replicas (each replica runs in its own session)."""
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def stop_job(home: Path, job_id: int | str, status: str, *, details: str | None = None,
             only_from: frozenset[str] | None = None) -> str | None:
    """Set a non-terminal job to ``status`` and SIGTERM its processes; returns the previous status.

    The supervisor sees the job is no longer RUNNING, escalates to SIGKILL after a grace period and never
    overwrites the status. Returns None when the job does not exist; raises ValueError when it is terminal
    or not in ``only_from``.
    """
    with update_state(home) as state:
        entry = entry_of(state, job_id)
        if entry is None:
            return None
        previous = entry["job"]["jobStatus"]["status"]
        if previous in TERMINAL_STATES or (only_from is not None and previous not in only_from):
            raise ValueError(f"job {job_id} is {previous}")
        if status in TERMINAL_STATES and status.startswith("KILLED"):
            entry["job"]["terminationRequestedDate"] = iso_now()
        set_status(entry, status, details=details)
        pgids = list(entry["emu"].get("pgids", []))
    signal_groups(pgids, signal.SIGTERM)
    return previous


# --------------------------------------------------------------------------------------------------------------
# Test helper


class FakeNgc:
    """Drive the emulator from tests: environment, workspaces, secrets, injected failures, call log.

    >>> fake = FakeNgc(tmp_path / "ngc")            # doctest: +SKIP
    >>> fake.create_workspace("nemo-framework")     # doctest: +SKIP
    >>> subprocess.run(["ngc", ...], env=fake.env())  # doctest: +SKIP
    """

    def __init__(self, home: Path | str) -> None:
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"FakeNgc({str(self.home)!r})"

    # -- environment -------------------------------------------------------------------------------------------
    def env(self, base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
        """Environment for running ``ngc``: tests/fakes and this Python first on PATH, NGC_FAKE_HOME, NGC_CLI_*."""
        env = dict(os.environ if base is None else base)
        path_parts = [str(FAKES_DIR), str(Path(sys.executable).parent)]
        env["PATH"] = os.pathsep.join(path_parts + [env.get("PATH", "")])
        env["NGC_FAKE_HOME"] = str(self.home)
        env.setdefault("NGC_CLI_ORG", "bcpp-test-org")
        env.setdefault("NGC_CLI_ACE", "bcpp-test-ace")
        env.update(extra)
        return env

    def ngc(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run the emulator with ``args`` (no leading 'ngc'); text output captured, never raises on exit code."""
        import subprocess  # pylint: disable=import-outside-toplevel  (the emulator's status path skips it)

        return subprocess.run(
            [sys.executable, str(NGC_EMULATOR), *args],
            env=env or self.env(), capture_output=True, text=True, timeout=timeout, check=False,
        )

    # -- workspaces and secrets -------------------------------------------------------------------------------
    def create_workspace(self, name: str) -> str:
        """Create a workspace (as ``ngc workspace create --name``) and return its id."""
        with update_state(self.home) as state:
            return ensure_workspace(self.home, state, name, org="bcpp-test-org", ace="bcpp-test-ace")["id"]

    def workspace_path(self, name: str) -> Path:
        return self.home / "workspaces" / name

    def set_secret(self, name: str, values: dict[str, str]) -> None:
        """Define a secret for ``--secret NAME[:KEY[:ENV]]`` (values go to job env vars only)."""
        with locked(self.home):
            secrets = read_json(self.home / "secrets.json", {})
            secrets[name] = dict(values)
            write_json(self.home / "secrets.json", secrets)

    # -- job rules ----------------------------------------------------------------------------------------------
    def inject(self, status: str, *, name: str | None = None, label: str | None = None,
               after_seconds: float | None = None, times: int | None = 1, details: str | None = None) -> None:
        """Make the next matching job(s) end with ``status`` (FAILED, FAILED_RUN_LIMIT_EXCEEDED, KILLED_BY_SYSTEM,
        PREEMPTED).

        ``name``/``label`` are fnmatch patterns (None: any job). ``after_seconds`` None: the job's command runs
        to its end, then the status replaces the real outcome; 0: the command never starts; t > 0: its
        processes are killed t seconds into RUNNING (or at their end, if sooner). ``times`` None: every match.
        A PREEMPTED job waits for ``job resume`` (re-runs the command line) or ``job kill``.
        """
        if status not in INJECTABLE:
            raise ValueError(f"status must be one of {sorted(INJECTABLE)}, not {status!r}")
        self._add_rule({"action": "status", "status": status, "name": name, "label": label,
                        "after_seconds": after_seconds, "times": times, "details": details})

    def hold_queued(self, *, name: str | None = None, label: str | None = None, times: int | None = 1) -> None:
        """Keep the next matching job(s) QUEUED until :meth:`release`."""
        self._add_rule({"action": "hold", "name": name, "label": label, "times": times})

    def clear_rules(self) -> None:
        with update_control(self.home) as control:
            control["rules"] = []

    def release(self, job_id: int | None = None) -> None:
        """Let held QUEUED jobs (all, or one) start."""
        with update_state(self.home) as state:
            for key, entry in state["jobs"].items():
                if job_id is None or key == str(job_id):
                    entry["emu"]["held"] = False

    def preempt(self, job_id: int) -> None:
        """Preempt a job now (as the system would): processes killed, PREEMPTED until resumed or killed."""
        stop_job(self.home, job_id, "PREEMPTED", details="Preempted by the emulator (test control)")

    def backdate(self, job_id: int, days: float) -> None:
        """Pretend a job was created ``days`` earlier (for ``job list`` time-window tests)."""
        with update_state(self.home) as state:
            job = state["jobs"][str(job_id)]["job"]
            created = parse_iso(job["createdDate"]) - days * 86400
            job["createdDate"] = job["jobStatus"]["createdDate"] = iso_now(created)

    def _add_rule(self, rule: dict[str, Any]) -> None:
        with update_control(self.home) as control:
            control.setdefault("rules", []).append(rule)

    # -- CLI call failures and the call log ---------------------------------------------------------------------
    def fail_calls(self, count: int, *, match: str | None = None, message: str | None = None,
                   exit_code: int = 1) -> None:
        """Make the next ``count`` CLI calls (whose joined argv matches the fnmatch ``match``) fail as a
        transient error would: ``{"error": message}`` on stderr, exit ``exit_code``, nothing done."""
        with update_control(self.home) as control:
            control["fail"] = {"count": count, "match": match, "message": message, "exit_code": exit_code}

    def delay_calls(self, seconds: float, *, count: int = 1, match: str | None = None) -> None:
        """Make the next ``count`` matching CLI calls sleep ``seconds`` first (for caller timeouts)."""
        with update_control(self.home) as control:
            control["delay"] = {"count": count, "match": match, "seconds": seconds}

    def calls(self, command: str | None = None) -> list[dict[str, Any]]:
        """Logged invocations, oldest first; ``command`` filters on the normalized name, e.g. 'job list'."""
        path = self.home / "calls.jsonl"
        if not path.exists():
            return []
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [r for r in records if command is None or r["command"] == command]

    def clear_calls(self) -> None:
        with locked(self.home):
            (self.home / "calls.jsonl").unlink(missing_ok=True)

    # -- inspection and clean-up --------------------------------------------------------------------------------
    def jobs(self) -> dict[int, dict[str, Any]]:
        """All job records by id (``{"job", "jobStatusHistory", "emu"}``)."""
        return {int(k): v for k, v in read_state(self.home)["jobs"].items()}

    def status(self, job_id: int) -> str:
        return self.jobs()[job_id]["job"]["jobStatus"]["status"]

    def wait_for(self, job_id: int, statuses: set[str] | frozenset[str] | None = None, timeout: float = 30) -> str:
        """Poll the state file (no CLI call) until the job's status is in ``statuses`` (default: terminal)."""
        goal = TERMINAL_STATES if statuses is None else statuses
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(job_id)
            if status in goal:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {status} after {timeout} s (wanted {sorted(goal)})")
            time.sleep(0.05)

    def shutdown(self, timeout: float = 10) -> None:
        """Kill every unfinished job (KILLED_BY_USER) and wait until the supervisors have exited."""
        for job_id, entry in self.jobs().items():
            if entry["job"]["jobStatus"]["status"] not in TERMINAL_STATES:
                with contextlib.suppress(ValueError):
                    stop_job(self.home, job_id, "KILLED_BY_USER", details="Killed by FakeNgc.shutdown")
        deadline = time.monotonic() + timeout
        for entry in self.jobs().values():
            for pid in entry["emu"].get("supervisorPids", []):
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)


def ensure_workspace(
    home: Path, state: dict[str, Any], name: str, *, org: str | None, ace: str | None
) -> dict[str, Any]:
    """Create a workspace record and folder if missing (call inside :func:`update_state`)."""
    workspaces = state.setdefault("workspaces", {})
    if name not in workspaces:
        number = len(workspaces) + 1
        workspaces[name] = {
            "id": f"emuWs{number:04d}{name.encode().hex()[:10]}",
            "name": name,
            "aceName": ace,
            "orgName": org,
            "createdDate": iso_now(),
            "creatorUserName": "Emulated User",
            "status": "COMPLETED",
        }
    (home / "workspaces" / name).mkdir(parents=True, exist_ok=True)
    return workspaces[name]


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by its parent or init) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: assume it runs
    return stat.rpartition(")")[2].split()[0] != "Z"
