"""Run state on disk: one JSON file per run, written atomically after every change.

It is enough to re-attach after the orchestrator dies: every submitted job id is recorded (and the stage marked
SUBMITTING before the submit call, so a crash between submit and record is detected and the backend is asked for
the job by its labels instead of submitting a second one).
"""

from __future__ import annotations

import enum
import fcntl
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bcp_pipeline.atomic import atomic_write_json, atomic_write_text
from bcp_pipeline.backends.contract import JobState
from bcp_pipeline.errors import StateError

STATE_VERSION = 1
STATE_FOLDER = ".bcp-pipeline"  # next to the config file, unless --state-dir says where


CANCELLED_WHILE = "cancelled_while"  # StageState.extra: the status a cancelled stage had (selection.continue_run)
STALL_RESTARTS = "stall_restarts"  # StageState.extra: stalled jobs submitted again since the stage (re)started


class StageStatus(enum.Enum):
    PENDING = "pending"
    SUBMITTING = "submitting"  # recorded before the submit call; the job id follows
    RUNNING = "running"  # the stage's job is queued or running
    VERIFYING = "verifying"  # the stage's job succeeded; its verification job is queued or running
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"  # not selected (--from/--only): assumed done by the user
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        return self in (StageStatus.SUCCEEDED, StageStatus.SKIPPED)

    @property
    def active(self) -> bool:
        return self in (StageStatus.SUBMITTING, StageStatus.RUNNING, StageStatus.VERIFYING)


@dataclass(kw_only=True)
class JobRecord:
    job_id: str
    kind: str  # "stage" or "verify"
    attempt: int
    submitted_at: float
    state: str = "queued"  # JobState value
    native: str = ""
    detail: str = ""
    started_at: float | None = None  # when a poll first saw it running (None: never seen running)
    ended_at: float | None = None
    # A training job's stall guard (engine/stall_guard.py), on disk so that a restarted orchestrator goes on:
    steps_seen: int | None = None  # the highest step its log showed
    advanced_at: float | None = None  # when a poll first saw that step (or saw the job running again)
    slowest_step: float | None = None  # seconds: its longest wait between two step lines so far
    stall: dict[str, Any] | None = None  # {"reason", "at", "last_lines"}: found stalled, its cancel asked for
    gpu_utilization: dict[str, Any] | None = None  # {"at": time, "replicas": {"0": 97.0}}: the service's telemetry


@dataclass(kw_only=True)
class StageState:
    status: StageStatus = StageStatus.PENDING
    sharding: dict[str, int] | None = None  # {"replicas": R, "processes": P} it was (first) submitted with
    attempts: int = 0  # stage job submissions, resubmissions included
    jobs: list[JobRecord] = field(default_factory=list)
    started_at: float | None = None
    finished_at: float | None = None
    verification: dict[str, Any] | None = None  # {"ok": bool, "checks": [{glob, expected, found}]}
    error: str | None = None
    progress: dict[str, Any] | None = None  # {"done": n, "total": m, "unit": "files"}
    extra: dict[str, Any] = field(default_factory=dict)  # stage-specific facts (e.g. pretrain steps done)
    submit_call: str | None = None  # "stage"/"verify" from just before a submit call until its job is recorded:
    # a restart finding it set knows a job may exist that the service does not list yet

    def active_job(self) -> JobRecord | None:
        """The job the stage is waiting on, if any (the last one, while the stage is active)."""
        if self.status in (StageStatus.RUNNING, StageStatus.VERIFYING) and self.jobs and self.jobs[-1].ended_at is None:
            return self.jobs[-1]
        return None


@dataclass(kw_only=True)
class RunState:
    run_id: str
    pipeline: str
    backend: str
    config_file: str
    created_at: float
    overrides: list[str] = field(default_factory=list)
    stages: dict[str, StageState] = field(default_factory=dict)
    version: int = STATE_VERSION
    updated_at: float = 0.0
    detached: dict[str, Any] | None = None  # `run --detach`: {"owner": "driver" | "local"}; see detach/laptop.py

    @property
    def driver_owned(self) -> bool:
        """A detached run whose driver job, not this copy of the state, is the authority (detach/laptop.py)."""
        return bool(self.detached) and self.detached.get("owner") == "driver"

    def mark_cancelled(self) -> None:
        """Every stage not yet done (active or pending) and each of its unfinished jobs: cancelled.

        A job's last native state goes into its detail: left in `native`, a "running" seen before the cancel would
        be shown for the job ever after (status shows the native state where there is one)."""
        now = time.time()
        for stage in self.stages.values():
            if stage.status.active or stage.status is StageStatus.PENDING:
                if stage.status is StageStatus.VERIFYING:  # its work is done: a resume verifies it again, no more
                    stage.extra[CANCELLED_WHILE] = StageStatus.VERIFYING.value
                stage.status = StageStatus.CANCELLED
                for job in stage.jobs:
                    if job.ended_at is None:
                        if job.native:
                            job.detail = f"cancelled here while {job.native}" + (
                                f"; {job.detail}" if job.detail else ""
                            )
                        job.state, job.native, job.ended_at = JobState.CANCELLED.value, "", now

    @property
    def status(self) -> str:
        """Derived from the stages: failed, cancelled, succeeded, running (a stage active or done), or pending."""
        statuses = [s.status for s in self.stages.values()]
        if any(s is StageStatus.FAILED for s in statuses):
            return "failed"
        if any(s is StageStatus.CANCELLED for s in statuses):
            return "cancelled"
        if all(s.done for s in statuses):
            return "succeeded"
        # Between two stages none is active, yet the run is under way: "pending" is a run not started yet.
        return "running" if any(s.active or s is StageStatus.SUCCEEDED for s in statuses) else "pending"

    def still_going(self) -> bool:
        """Unfinished, or a job of it still recorded active (a failed stage's sibling may still run): what
        `cancel` has to stop, and what `remove` refuses to delete under."""
        return self.status in ("running", "pending") or any(s.active_job() for s in self.stages.values())

    def to_json(self) -> dict[str, Any]:
        payload = asdict(self)
        for stage in payload["stages"].values():
            stage["status"] = stage["status"].value
        payload["status"] = self.status
        return payload

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> RunState:
        payload = dict(payload)
        payload.pop("status", None)
        if payload.get("version") != STATE_VERSION:
            raise ValueError(f"state version {payload.get('version')!r}, this tool reads {STATE_VERSION}")
        stages = {}
        for name, raw in payload.pop("stages").items():
            try:
                raw = dict(raw)
                raw["status"] = StageStatus(raw["status"])
                raw["jobs"] = [JobRecord(**job) for job in raw.get("jobs", [])]
                stages[name] = StageState(**raw)
            except (ValueError, KeyError, TypeError) as exc:  # name the stage: the file has one block per stage
                raise ValueError(f"stages.{name}: {_reason(exc)}") from exc
        return cls(stages=stages, **payload)


def _reason(exc: Exception) -> str:
    """An error from reading state, in words (a bare KeyError prints as just the key)."""
    return f"missing key {exc.args[0]!r}" if isinstance(exc, KeyError) and exc.args else str(exc)


def new_run_id(pipeline: str, now: float | None = None) -> str:
    """`PIPELINE-YYYYmmdd-HHMMSS-xxxx`: readable, and sortable by creation time also within a second, as `xxxx` is
    the fraction of the second in 1/65536ths (a random `xxxx` put two runs of one second in a random order, and
    `run` then took a corrupt newest run for an older one). Unique as a random suffix was: runs of one pipeline
    within the same 15 microseconds would share it."""
    now = time.time() if now is None else now
    return f"{pipeline}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{int(now % 1 * 65536):04x}"


def store_for(
    config_file: Path, state_dir: str | Path | None = None, notice: Callable[[str], None] | None = None
) -> RunStore:
    """Where runs are kept: `state_dir` (--state-dir), else `.bcp-pipeline` next to the config file."""
    return RunStore(Path(state_dir) if state_dir else config_file.resolve().parent / STATE_FOLDER, notice=notice)


CORRUPT_STATE_GLOB = "state.corrupt-*.json"  # a run's unreadable state, set aside under this name (never deleted)
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # what run_dir accepts: a name inside runs/
RUN_ID_PATTERN = re.compile(r"^(?P<pipeline>.+)-\d{8}-\d{6}-[0-9a-f]{4}$")


@dataclass(frozen=True, kw_only=True)
class CorruptRun:
    """A run whose state.json could not be read: set aside as `path`, kept byte for byte."""

    run_id: str
    path: Path
    reason: str

    @property
    def pipeline(self) -> str | None:
        match = RUN_ID_PATTERN.match(self.run_id)
        return match.group("pipeline") if match else None

    def describe(self) -> str:
        return (
            f"run {self.run_id} is corrupt: its state file could not be read ({self.reason}) and is kept, set "
            f"aside, as {self.path}; nothing was deleted. Once repaired, rename it back to state.json to "
            "continue that run; other runs are not affected, and `run PIPELINE --restart` starts a new one"
        )


class RunStore:
    """The folder holding every run: `<root>/runs/<run_id>/{state.json, logs/, jobs/}`.

    `folder` other than `runs` keeps a kind of run apart under the same root (`profile`'s runs in `profiles/`: a
    `run PIPELINE` never continues one), where they share what the root holds (`checks/`, `bcp-uploads/`).

    A state.json that cannot be read is set aside (renamed `state.corrupt-TIME.json`, never rewritten) the first
    time it is found, reported once through `notice`, and from then on listed as a corrupt run: one bad file must
    not block the other runs, and guessing its content could resubmit jobs that are still running."""

    def __init__(self, root: Path, folder: str = "runs", notice: Callable[[str], None] | None = None) -> None:
        self.root = root
        self.folder = folder
        self.notice = notice or (lambda message: None)

    @property
    def runs_dir(self) -> Path:
        return self.root / self.folder

    def run_dir(self, run_id: str) -> Path:
        if not RUN_ID.match(run_id):  # from the command line: never a path out of runs/ (`../../etc`)
            raise StateError(
                f"{run_id!r} is not a run id (letters, digits, '.', '_' and '-'; e.g. "
                f"{new_run_id('demo')}): `bcp-pipeline list` shows the runs"
            )
        return self.runs_dir / run_id

    def state_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "state.json"

    def save(self, state: RunState) -> None:
        """Atomically; a folder that cannot take it (full) stops the run in one line, its last good state kept."""
        state.updated_at = time.time()
        path = self.state_path(state.run_id)
        try:
            # Unsorted: the stages stay in pipeline order, which `status` shows.
            atomic_write_json(path, state.to_json(), sort_keys=False)
        except OSError as exc:
            raise StateError(
                f"cannot save the state of run {state.run_id} in {path.parent}: "
                f"{exc.strerror or exc}; its last saved state is kept. Free space there (or fix the "
                f"folder), then `bcp-pipeline resume {state.run_id}` continues it"
            ) from None

    def keep_submission(self, run_id: str, job_id: str, text: str) -> None:  # for `report`; secrets out already
        atomic_write_text(self.run_dir(run_id) / "submitted" / f"{job_id}.txt", text + "\n")

    def load(self, run_id: str) -> RunState:
        path = self.state_path(run_id)
        if not path.is_file():
            corrupt = self.corrupt(run_id)
            if corrupt is not None:
                raise StateError(corrupt.describe())
            known = ", ".join(r.run_id for r in self.runs()[-5:]) or "(none)"
            raise StateError(f"no run {run_id!r} under {self.runs_dir}; recent runs: {known}")
        state = self._read(run_id, notify=False)  # raised, it is said once: not also as a notice
        if isinstance(state, CorruptRun):
            raise StateError(state.describe())
        return state

    def _read(self, run_id: str, notify: bool = True) -> RunState | CorruptRun:
        """The run's state, or (when it cannot be read) the corrupt run it is now, its file set aside."""
        path = self.state_path(run_id)
        try:
            return RunState.from_json(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:  # set aside meanwhile by another process
            return self.corrupt(run_id) or CorruptRun(run_id=run_id, path=path, reason="state.json vanished")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # AttributeError: e.g. "stages": []
            return self._set_aside(run_id, _reason(exc), notify)

    def _set_aside(self, run_id: str, reason: str, notify: bool = True) -> CorruptRun:
        """Rename the unreadable state.json to a name that says so (a link first: nothing is ever overwritten)."""
        path = self.state_path(run_id)
        aside = path.with_name(f"state.corrupt-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}.json")
        try:
            os.link(path, aside)
            os.unlink(path)
        except FileNotFoundError:  # another process set it aside first, and reported it
            return self.corrupt(run_id) or CorruptRun(run_id=run_id, path=path, reason=reason)
        corrupt = CorruptRun(run_id=run_id, path=aside, reason=reason)
        if notify:
            self.notice(corrupt.describe())
        return corrupt

    def corrupt(self, run_id: str) -> CorruptRun | None:
        """The run's state as set aside, when it was found corrupt (the latest such file)."""
        found = sorted(self.run_dir(run_id).glob(CORRUPT_STATE_GLOB))
        if not found:
            return None
        try:
            RunState.from_json(json.loads(found[-1].read_text(encoding="utf-8")))
            reason = "it reads now: rename it back to state.json"
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            reason = _reason(exc)
        return CorruptRun(run_id=run_id, path=found[-1], reason=reason)

    def scan(self) -> tuple[list[RunState], list[CorruptRun]]:
        """Every run: the readable ones oldest first, and the corrupt ones (set aside now or before)."""
        runs_dir = self.runs_dir
        if not runs_dir.is_dir():
            return [], []
        readable: list[RunState] = []
        corrupt: list[CorruptRun] = []
        for path in sorted(runs_dir.iterdir(), key=lambda p: p.name):
            if not RUN_ID.match(path.name):  # not a run's folder (PLAN runs aside, nothing else is made here)
                continue
            found = self._read(path.name) if (path / "state.json").is_file() else self.corrupt(path.name)
            if isinstance(found, RunState):
                readable.append(found)
            elif found is not None:
                corrupt.append(found)
        return sorted(readable, key=lambda s: (s.created_at, s.run_id)), corrupt

    def runs(self, pipeline: str | None = None) -> list[RunState]:
        """Readable runs, oldest first (run ids sort by creation time)."""
        return [state for state in self.scan()[0] if pipeline is None or state.pipeline == pipeline]

    def latest(self, pipeline: str | None = None) -> RunState | None:
        runs = self.runs(pipeline)
        return runs[-1] if runs else None

    def undriven(self, state: RunState) -> bool:
        """A run its state calls unfinished (running or pending) that no process drives: `resume` continues it.
        A run a BCP driver job owns is driven there, not under this machine's lock."""
        return (
            state.status in ("running", "pending")
            and not state.driver_owned
            and not RunLock.held(self.run_dir(state.run_id))
        )

    def resolve(self, run_id: str | None) -> RunState:
        """A run by id, or the most recent readable run when `run_id` is None."""
        if run_id:
            return self.load(run_id)
        readable, corrupt = self.scan()
        if not readable and corrupt:  # "no runs yet" would hide it (its notice said why it cannot be read)
            raise StateError(
                f"no readable run under {self.runs_dir}: run {corrupt[-1].run_id} is corrupt, its state "
                f"set aside as {corrupt[-1].path}; `bcp-pipeline list` shows the runs"
            )
        if not readable:
            raise StateError(f"no runs yet under {self.runs_dir}; start one with `bcp-pipeline run PIPELINE`")
        return readable[-1]


class RunLock:
    """An exclusive lock held while an orchestrator drives a run; released by the kernel even on SIGKILL."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "orchestrator.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise StateError(
                f"run {self.path.parent.name} is being driven by pid {holder}; "
                "watch it with `bcp-pipeline status`, or stop that process first"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    @staticmethod
    def held(run_dir: Path) -> bool:
        """Whether a live process drives the run now (holds its lock), asked without taking the lock for more
        than an instant and without writing to it: the kernel drops a SIGKILLed driver's lock, so a run whose
        state says running with no lock held is driven by nobody."""
        try:
            fd = os.open(run_dir / "orchestrator.lock", os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # drops the shared lock, if it was had
        return False

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
