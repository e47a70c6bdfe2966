"""State layer and test controls of the NGC API EMULATOR (tests/fakes/ngc_api.py). Test code, not NVIDIA code.

The emulator keeps everything in one folder, ``$NGC_FAKE_HOME``:

- ``state.json``    jobs (``{"job": ..., "jobStatusHistory": [...], "emu": ...}`` per id), workspaces, next id
- ``control.json``  test controls: job rules (fail / preempt / hold QUEUED), API request faults, page size
- ``timing.json``   how long jobs stay QUEUED / STARTING, and the longest a job may live
- ``variants.json`` which plausible variant of the real service to emulate (:data:`VARIANT_DEFAULTS`, README.md)
- ``secrets.json``  ``{"secret-name": {"KEY": "value"}}`` for ``--secret``
- ``requests.jsonl`` one line per API request answered: method, path, query, status (never a key or token)
- ``calls.jsonl``   one line per ``ngc`` invocation (tests/fakes/ngc): argv with the key redacted, exit code
- ``api.json``      where the running server listens: ``{url, grpc, ca, pid}``; ``tls/`` its certificate
- ``lock``          fcntl lock taken by every writer (the server, job supervisors, these helpers)
- ``workspaces/NAME/`` the workspace contents; ``jobs/ID/results/R/`` results of replica R (``joblog.log`` = log)

Only the standard library is imported here. Writers hold the lock and replace files atomically; readers read
without the lock.

Test-facing API: :class:`FakeNgc` (see its methods). The lower-level functions are shared with the emulator.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

FAKES_DIR = Path(__file__).resolve().parent
SERVER_PID_FILES = ("api-server.pid", "ngc-forkserver.pid")  # in HOME: the servers FakeNgc.start last started
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
INJECTABLE = frozenset({"FAILED", "FAILED_RUN_LIMIT_EXCEEDED", "KILLED_BY_SYSTEM", "TASK_LOST", "PREEMPTED"})


# The variants of the real service the emulator can play (README.md "Variants"); the defaults are today's guesses.
VARIANT_DEFAULTS: dict[str, Any] = {
    "commandline": "per_replica",  # or "launcher": the commandline runs once, on replica 0; bcprun fans out
    "bcprun_in_single_replica_jobs": True,  # False: no bcprun on PATH in a job with one replica
    "list_lag_seconds": 0.0,  # a new job shows in `job list` only this long after its creation ...
    "list_lag_calls": 0,  # ... and only after this many list requests that would have shown it
    "clock_skew_seconds": 0.0,  # the server's clock runs this far ahead (negative: behind) of this machine's
    "key_org": None,  # an nvapi- key belongs to this org (default: the emulator's org)
    "key_type": "PERSONAL_KEY",  # or "SERVICE_KEY" (what /v3/keys/get-caller-info answers for an nvapi- key)
    "ace": {},  # ACE limits (ACE_LIMIT_DEFAULTS), served in the ACE's JSON and enforced on `job run`
    "runonce_preemption": "resumable",  # a RUNONCE job: preempted and resumed like any ("resumable"), its
    # `job preempt` refused ("refused"), or preempted but its `job resume` refused ("not_resumable")
}
# The ACE's policy fields as ngcsdk's Ace / AceInstance data classes carry them; None: not set (no limit).
ACE_LIMIT_DEFAULTS: dict[str, Any] = {
    "maxRuntimeSeconds": 30 * 86400,
    "maxActiveJobsPerUser": None,  # jobs past it wait QUEUED until one of the user's active jobs ends
    "maxAllowedReplicas": None,
    "terminationGracePeriodSeconds": None,  # a number: `job kill` passes through PENDING_TERMINATION this long
    "allowMultinode": True,  # per instance (every instance of the emulated ACE gets the same values)
    "multiNodeSupportedArrayTypes": ["MPI", "PARALLEL", "PYTORCH", "HOROVOD"],
}
COMMANDLINE_MODELS = ("per_replica", "launcher")
RUNONCE_PREEMPTION = ("resumable", "refused", "not_resumable")


def read_variants(home: Path) -> dict[str, Any]:
    """The variant settings in force (defaults filled in), from ``variants.json``."""
    stored = read_json(Path(home) / "variants.json", {})
    variants = {**VARIANT_DEFAULTS, **stored}
    variants["ace"] = {**ACE_LIMIT_DEFAULTS, **(stored.get("ace") or {})}
    return variants


def now() -> float:
    """The server's clock: this machine's, shifted by the ``clock_skew_seconds`` variant of the emulator whose
    state folder is ``$NGC_FAKE_HOME`` (the server and its job supervisors run with it set)."""
    home = os.environ.get("NGC_FAKE_HOME")
    skew = read_json(Path(home) / "variants.json", {}).get("clock_skew_seconds") if home else 0
    return time.time() + float(skew or 0)


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


_LOCK_DEPTH = threading.local()  # per thread: the API server answers requests on several threads


@contextlib.contextmanager
def locked(home: Path) -> Iterator[None]:
    """Exclusive lock shared by every process and thread writing the emulator's state; re-entrant within a
    thread (flock on a second descriptor blocks, also against another thread of the same process)."""
    key = Path(home).resolve()
    depths = _LOCK_DEPTH.__dict__.setdefault("depths", {})
    if depths.get(key):
        depths[key] += 1
        try:
            yield
        finally:
            depths[key] -= 1
        return
    fd = os.open(key / "lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        depths[key] = 1
        yield
    finally:
        depths[key] = 0
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
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
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
    moment = datetime.fromtimestamp(now() if ts is None else ts, tz=timezone.utc)
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
    moment = time.time()  # runtime is measured on this machine's clock; dates are stamped on the server's
    stamp = iso_now()
    job, emu = entry["job"], entry["emu"]
    job_status = job["jobStatus"]
    if job_status.get("status") == "RUNNING" and emu.get("runningSince"):
        emu["runSeconds"] = emu.get("runSeconds", 0.0) + moment - emu.pop("runningSince")
    server_ms = int(parse_iso(stamp) * 1000)
    job_status.update(status=status, timestamp=server_ms, timestampStateEntry=server_ms)
    job_status.pop("statusDetails", None)
    if details:
        job_status["statusDetails"] = details
    job_status["statusType"] = status_type or DEFAULT_STATUS_TYPES.get(status, "OK")
    if status == "QUEUED":
        job_status["queuedAt"] = stamp
    elif status == "RUNNING":
        job_status.setdefault("startedAt", stamp)
        emu["runningSince"] = moment
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


def stop_job(
    home: Path,
    job_id: int | str,
    status: str,
    *,
    details: str | None = None,
    only_from: frozenset[str] | None = None,
    grace: bool = True,
) -> str | None:
    """Set a non-terminal job to ``status`` and SIGTERM its processes; returns the previous status.

    The supervisor sees the job is no longer RUNNING, escalates to SIGKILL after a grace period and never
    overwrites the status. A kill of a running job on an ACE with ``terminationGracePeriodSeconds`` (and
    ``grace``) first passes through PENDING_TERMINATION for that long: the supervisor ends it. Returns None when
    the job does not exist; raises ValueError when it is terminal, PENDING_TERMINATION or not in ``only_from``.
    """
    period = read_variants(home)["ace"].get("terminationGracePeriodSeconds") if grace else None
    with update_state(home) as state:
        entry = entry_of(state, job_id)
        if entry is None:
            return None
        previous = entry["job"]["jobStatus"]["status"]
        if (
            previous in TERMINAL_STATES
            or previous == "PENDING_TERMINATION"
            or (only_from is not None and previous not in only_from)
        ):
            raise ValueError(f"job {job_id} is {previous}")
        if status in TERMINAL_STATES and status.startswith("KILLED"):
            entry["job"]["terminationRequestedDate"] = iso_now()
            if period and entry["emu"].get("pgids"):
                entry["emu"]["terminating"] = {
                    "status": status,
                    "details": details,
                    "until": time.time() + float(period),
                }
                status, details = "PENDING_TERMINATION", None
        set_status(entry, status, details=details)
        pgids = list(entry["emu"].get("pgids", []))
    signal_groups(pgids, signal.SIGTERM)
    return previous


# --------------------------------------------------------------------------------------------------------------
# Test helper


class FakeNgc:
    """Drive the emulator from tests: the API server, environment, workspaces, secrets, faults, logs.

    >>> fake = FakeNgc(tmp_path / "ngc").start()     # doctest: +SKIP
    >>> fake.create_workspace("nemo-framework")      # doctest: +SKIP
    >>> subprocess.run(["ngc", ...], env=fake.env())  # doctest: +SKIP  (NVIDIA's CLI code, tests/fakes/ngc)
    >>> fake.shutdown()                              # doctest: +SKIP
    """

    API_KEY = "emulated-api-key-not-a-secret"  # what the emulator accepts at the token exchange

    def __init__(
        self,
        home: Path | str,
        *,
        org: str = "bcpp-test-org",
        ace: str = "bcpp-test-ace",
        api_key: str | None = None,
        tls_dir: Path | None = None,
        variants: dict[str, Any] | None = None,
    ) -> None:
        """``tls_dir``: where the server's certificate is kept (default HOME/tls). Share one across a test
        session: gRPC reads its CA roots once per process. ``variants``: see :meth:`set_variants`.
        ``api_key`` starting with ``nvapi-`` makes it a personal/service key (used directly as the bearer)."""
        self.home = Path(home)
        self.tls_dir = Path(tls_dir) if tls_dir else self.home / "tls"
        self.home.mkdir(parents=True, exist_ok=True)
        self.org = org
        self.ace = ace
        self.api_key = api_key or self.API_KEY
        if variants:
            self.set_variants(**variants)
        self._server: subprocess.Popen | None = None
        self._forkserver: subprocess.Popen | None = None
        self.api: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"FakeNgc({str(self.home)!r})"

    def __enter__(self) -> FakeNgc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- the API server ----------------------------------------------------------------------------------------
    def start(self, timeout: float = 180) -> FakeNgc:
        """Start the API emulator (tests/fakes/ngc_api.py) as a process; returns once it listens. The timeout is
        an upper bound only: the fork server imports NVIDIA's CLI, which on a loaded 2-core machine (CI's, beside
        a cold build) has taken more than 30 s."""
        announce = self.home / "api.json"
        announce.unlink(missing_ok=True)
        env = self._base_env()
        env.update(
            NGC_FAKE_API_KEY=self.api_key,
            NGC_FAKE_ORG=self.org,
            NGC_FAKE_ACE=self.ace,
            NGC_FAKE_TLS_DIR=str(self.tls_dir),
        )
        with open(self.home / "api-server.log", "ab") as log:
            self._server = subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, str(FAKES_DIR / "ngc_api.py"), str(self.home)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not announce.exists():
            if self._server.poll() is not None or time.monotonic() > deadline:
                log_text = (self.home / "api-server.log").read_text(errors="replace")[-2000:]
                raise FakeStateError(f"the NGC API emulator did not start; its log:\n{log_text}")
            time.sleep(0.05)
        self.api = read_json(announce, {})
        (self.home / SERVER_PID_FILES[0]).write_text(f"{self._server.pid}\n")
        self._start_forkserver(deadline)
        return self

    def _start_forkserver(self, deadline: float) -> None:
        """`ngc __forkserver__`: NVIDIA's CLI imported once, so each `ngc` call costs a fork, not an import."""
        socket_path = self.home / "ngc-forkserver.sock"
        socket_path.unlink(missing_ok=True)
        with open(self.home / "ngc-forkserver.log", "ab") as log:
            self._forkserver = subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, str(NGC_EMULATOR), "__forkserver__", str(socket_path)],
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (self.home / SERVER_PID_FILES[1]).write_text(f"{self._forkserver.pid}\n")
        while not socket_path.exists():
            if self._forkserver.poll() is not None or time.monotonic() > deadline:
                raise FakeStateError("the ngc fork server did not start; see ngc-forkserver.log")
            time.sleep(0.05)

    def stop_server(self) -> None:
        for process in (self._forkserver, self._server):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:  # it hangs: kill it
                    process.kill()
                    process.wait()
        self._server = self._forkserver = None
        (self.home / "ngc-forkserver.sock").unlink(missing_ok=True)

    # -- environment -------------------------------------------------------------------------------------------
    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        path_parts = [str(FAKES_DIR), str(Path(sys.executable).parent)]
        env["PATH"] = os.pathsep.join(path_parts + [env.get("PATH", "")])
        env["NGC_FAKE_HOME"] = str(self.home)
        env["NO_PROXY"] = ",".join(filter(None, ["127.0.0.1", "localhost", env.get("NO_PROXY")]))
        for key in [k for k in env if k.startswith("NGC_CLI_")]:
            del env[key]  # the user's own NGC settings must not leak into a test
        return env

    def env(self, base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
        """Environment for NVIDIA's client (``ngc`` = tests/fakes/ngc, or ngcsdk in-process) against this emulator:
        API and auth URLs on loopback, the test certificate as CA bundle (HTTPS and gRPC), the test API key, an
        empty CLI home, org and ACE. ``base`` replaces os.environ as the starting point."""
        if not self.api:
            raise FakeStateError("FakeNgc.start() first: the API emulator is not running")
        env = self._base_env() if base is None else dict(base)
        env.update(
            NGC_FAKE_HOME=str(self.home),
            NGC_CLI_API_URL=self.api["url"],
            NGC_CLI_AUTH_URL=self.api["url"],
            NGC_CLI_API_KEY=self.api_key,
            NGC_CLI_ORG=self.org,
            NGC_CLI_ACE=self.ace,
            NGC_CLI_HOME=str(self.home / "cli-home"),
            NGC_CLI_TRACE_DISABLE="1",
            REQUESTS_CA_BUNDLE=self.api["ca"],
            GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=self.api["ca"],
        )
        env.update(extra)
        return env

    def ngc(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run ``ngc`` (NVIDIA's CLI code, tests/fakes/ngc) with ``args``; output captured, any exit code."""
        return subprocess.run(
            [sys.executable, str(NGC_EMULATOR), *args],
            env=env or self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def set_timing(
        self, *, queued_seconds: float = 0.05, starting_seconds: float = 0.05, max_job_seconds: float = 3600
    ) -> None:
        """How long new jobs stay QUEUED and STARTING, and when a forgotten job is ended KILLED_BY_SYSTEM."""
        with locked(self.home):
            write_json(
                self.home / "timing.json",
                {
                    "queued_seconds": queued_seconds,
                    "starting_seconds": starting_seconds,
                    "max_job_seconds": max_job_seconds,
                },
            )

    def set_variants(self, **settings: Any) -> None:
        """Emulate another plausible variant of the real service (README.md "Variants"); keys of
        ``VARIANT_DEFAULTS``, and ``ace={...}`` with keys of ``ACE_LIMIT_DEFAULTS`` (merged over those set
        before). Takes effect for the next request and the next job started."""
        unknown = set(settings) - set(VARIANT_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown emulator variant(s) {sorted(unknown)}; known: {sorted(VARIANT_DEFAULTS)}")
        unknown = set(settings.get("ace") or {}) - set(ACE_LIMIT_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown ACE limit(s) {sorted(unknown)}; known: {sorted(ACE_LIMIT_DEFAULTS)}")
        if settings.get("commandline", "per_replica") not in COMMANDLINE_MODELS:
            raise ValueError(f"commandline must be one of {COMMANDLINE_MODELS}, not {settings['commandline']!r}")
        if settings.get("runonce_preemption", "resumable") not in RUNONCE_PREEMPTION:
            raise ValueError(
                f"runonce_preemption must be one of {RUNONCE_PREEMPTION}, not {settings['runonce_preemption']!r}"
            )
        with locked(self.home):
            stored = read_json(self.home / "variants.json", {})
            ace = {**(stored.get("ace") or {}), **(settings.pop("ace", None) or {})}
            write_json(self.home / "variants.json", {**stored, **settings, "ace": ace})

    def variants(self) -> dict[str, Any]:
        return read_variants(self.home)

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
    def inject(
        self,
        status: str,
        *,
        name: str | None = None,
        label: str | None = None,
        after_seconds: float | None = None,
        times: int | None = 1,
        details: str | None = None,
    ) -> None:
        """Make the next matching job(s) end with ``status`` (FAILED, FAILED_RUN_LIMIT_EXCEEDED, KILLED_BY_SYSTEM,
        TASK_LOST, PREEMPTED).

        ``name``/``label`` are fnmatch patterns (None: any job). ``after_seconds`` None: the job's command runs
        to its end, then the status replaces the real outcome; 0: the command never starts; t > 0: its
        processes are killed t seconds into RUNNING (or at their end, if sooner). ``times`` None: every match.
        A PREEMPTED job waits for ``job resume`` (re-runs the command line) or ``job kill``.
        """
        if status not in INJECTABLE:
            raise ValueError(f"status must be one of {sorted(INJECTABLE)}, not {status!r}")
        self._add_rule(
            {
                "action": "status",
                "status": status,
                "name": name,
                "label": label,
                "after_seconds": after_seconds,
                "times": times,
                "details": details,
            }
        )

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
        """Preempt a job now (as the system would): processes killed, PREEMPTED until resumed or killed. Any job,
        whatever its preempt class and the ``runonce_preemption`` variant (which is about requests)."""
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

    # -- API faults, the request log and the CLI call log ----------------------------------------------------
    def fail_requests(
        self,
        count: int,
        *,
        method: str | None = None,
        path: str | None = None,
        status: int = 503,
        message: str | None = None,
    ) -> None:
        """Make the next ``count`` API requests matching ``method`` (e.g. "GET", "GET,POST") and the fnmatch
        ``path`` (e.g. "*/jobs") fail with HTTP ``status``, as a transient error of the service would."""
        self._add_fault({"count": count, "method": method, "path": path, "status": status, "message": message})

    def delay_requests(
        self, seconds: float, *, count: int = 1, method: str | None = None, path: str | None = None, after: bool = False
    ) -> None:
        """Make the next ``count`` matching API requests wait ``seconds``: before they are carried out, or with
        ``after`` once they are carried out and before the answer (the job exists; the client does not know)."""
        self._add_fault(
            {"count": count, "method": method, "path": path, "status": None, "delay_seconds": seconds, "after": after}
        )

    def _add_fault(self, fault: dict[str, Any]) -> None:
        with update_control(self.home) as control:
            control.setdefault("faults", []).append(fault)

    def set_missing_images(self, images: list[str]) -> None:
        """Image names (`ORG/[TEAM/]REPO:TAG`, no `nvcr.io/`) the registry answers 404 for; every other exists."""
        with update_control(self.home) as control:
            control["missing_images"] = list(images)

    def set_gpu_utilization(
        self, percent: float | None, job_id: int | str | None = None, replica: int | None = None
    ) -> None:
        """A TEST-SET GPU utilization that `job telemetry` reports (for one job's replica, one job, or every job:
        `job_id` None) in place of the emulator's model (ngc_telemetry.py); None takes it back."""
        key = "*" if job_id is None else f"{job_id}:{replica}" if replica is not None else str(job_id)
        with update_control(self.home) as control:
            values = control.setdefault("gpu_utilization", {})
            if percent is None:
                values.pop(key, None)
            else:
                values[key] = float(percent)

    def set_page_size(self, size: int | None) -> None:
        """Cap the page size of every paged answer (``job list``...), so clients must follow the pages."""
        with update_control(self.home) as control:
            control["page_size"] = size

    def requests(self, method: str | None = None, path: str | None = None) -> list[dict[str, Any]]:
        """API requests the emulator answered, oldest first: ``{"method", "path", "query", "status", ...}``."""
        records = _read_jsonl(self.home / "requests.jsonl")
        return [
            r
            for r in records
            if (method is None or r["method"] == method) and (path is None or fnmatch.fnmatchcase(r["path"], path))
        ]

    def calls(self, command: str | None = None) -> list[dict[str, Any]]:
        """Logged invocations, oldest first; ``command`` filters on the normalized name, e.g. 'job list'."""
        return [r for r in _read_jsonl(self.home / "calls.jsonl") if command is None or r["command"] == command]

    def clear_calls(self) -> None:
        """Forget the CLI call log and the API request log."""
        with locked(self.home):
            (self.home / "calls.jsonl").unlink(missing_ok=True)
            (self.home / "requests.jsonl").unlink(missing_ok=True)

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
                    stop_job(self.home, job_id, "KILLED_BY_USER", details="Killed by FakeNgc.shutdown", grace=False)
        deadline = time.monotonic() + timeout
        for entry in self.jobs().values():
            for pid in entry["emu"].get("supervisorPids", []):
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
        self.stop_server()


def shutdown_abandoned(home: Path | str) -> None:
    """FakeNgc.shutdown for an emulator whose FakeNgc object is gone with its test process: kill its unfinished
    jobs, then the servers it last started (their pid files: a test may have restarted them since the fixture
    began). tests/support/reaper.py runs this."""
    FakeNgc(home).shutdown()
    for name in SERVER_PID_FILES:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((Path(home) / name).read_text()), signal.SIGTERM)


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


def reread_ngcsdk_environment() -> None:
    """ngcsdk reads NGC_CLI_* once, when first imported (two modules copy the URLs by name), and keeps tokens in a
    class-level cache: read them again for an imported ngcsdk that must now talk to another emulator."""
    # pylint: disable=import-outside-toplevel
    import importlib

    import ngcbase.api.authentication as authentication
    import ngcbase.environ as environ
    import ngcbase.util.utils as utils

    importlib.reload(environ)
    authentication.NGC_CLI_AUTH_URL = environ.NGC_CLI_AUTH_URL
    utils.NGC_CLI_API_URL = environ.NGC_CLI_API_URL
    authentication.Authentication.clear_in_memory_cache()


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


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
