"""The backend contract: what the orchestrator asks of a backend, and the one generic job-state enum.

A backend renders a JobRequest into a Submission (pure, printable: `plan` shows exactly what `run` submits),
submits it, polls many jobs in one call, fetches logs and cancels. Each backend maps its native job states to
JobState through an explicit dict; a native state missing from the dict is UNKNOWN, which means "not finished
yet", never "failed" (treating it as failed would launch a duplicate on resume).

What differs between backends outside one run is asked of the Backend class through hooks, never by its name:
`for_run` (bound to a run), `check_ready` and `check_limits` (before a run is recorded), `describe_limits`
(`plan`'s view of the same), `check_service` (`bcp-pipeline check`), `detachable` (`run --detach`) and
`profile_key` (which saved `check` profile describes the configured service).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.errors import PipelineError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from bcp_pipeline.config.model import Config, PipelineConfig, StageConfig
    from bcp_pipeline.config.resources import RankLayout


class JobState(enum.Enum):
    """Generic state of one backend job."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"  # hit its runtime limit (BCP FAILED_RUN_LIMIT_EXCEEDED, Slurm TIMEOUT)
    PREEMPTED = "preempted"  # stopped by the scheduler; may be resumed
    CANCELLED = "cancelled"
    LOST = "lost"  # the job vanished (node or supervisor died) without a result
    STALLED = "stalled"  # cancelled by the run's stall guard: its training stopped advancing (engine/stall_guard.py;
    # never a backend's own state: set by the engine once the cancelled job has ended)
    UNKNOWN = "unknown"  # a native state we do not know: treated as not finished

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.TIMED_OUT,
    JobState.CANCELLED,
    JobState.LOST,
    JobState.STALLED,
}


def job_label(stage: str, kind: str) -> str:
    """`stage X` or `stage X (verification)`: the one spelling of a job in messages, tables and `check` rows."""
    return f"stage {stage}" + (" (verification)" if kind == "verify" else "")


def map_native_state(native: str, mapping: dict[str, JobState]) -> JobState:
    """Map a backend's state string; anything unknown is UNKNOWN (not finished)."""
    return mapping.get(native.strip().upper(), JobState.UNKNOWN)


@dataclass(kw_only=True)
class JobStatus:
    """What one poll says about one job."""

    job_id: str
    state: JobState
    native: str = ""  # the backend's own state name, shown to users
    detail: str = ""  # e.g. BCP statusDetails, Slurm reason, failing ranks
    exit_code: int | None = None


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """A backend-neutral request: run this stage's program (or its verification) for this run."""

    run_id: str
    pipeline: PipelineConfig
    stage: StageConfig
    kind: Literal["stage", "verify"]
    program: str  # file in stages/
    args: tuple[str, ...]  # may hold ${placeholders}; the backend resolves them for where the job runs
    attempt: int = 1
    # A data stage's job: the digest of what defines its outputs and what to do with outputs made under another
    # (engine/output_digest.py); passed to the program in its environment. None for verification and training.
    output_digest: str | None = None
    other_outputs: str = "redo"
    # The output digests of the stages it streams from (config/needs.py): its program waits for their records.
    stream_digests: tuple[str, ...] = ()

    @property
    def job_name(self) -> str:
        suffix = "-verify" if self.kind == "verify" else ""
        return f"{self.pipeline.name}.{self.stage.name}{suffix}"

    @property
    def label(self) -> str:
        """How messages and `check` rows name this job: `stage X`, or `stage X (verification)`."""
        return job_label(self.stage.name, self.kind)

    def resources(self, backend: str) -> Any:
        """The typed resources for `backend`: the stage's, or the pipeline's verification resources."""
        source = self.pipeline.verification if self.kind == "verify" else self.stage
        return getattr(source, backend)

    def rank_layout(self, backend: str) -> RankLayout:
        """Nodes x processes per node on `backend` (config.resources.rank_layout, the one place they come from)."""
        # Imported here: this module stays importable with the standard library alone, as the detached driver
        # needs before it has checked its image (tests/test_architecture.py).
        from bcp_pipeline.config.resources import rank_layout

        return rank_layout(self.pipeline.verification if self.kind == "verify" else self.stage, backend)


@dataclass(kw_only=True)
class Submission:
    """A rendered job: `printable` is exactly what would be submitted (a command line, a script...)."""

    request: JobRequest
    printable: str
    payload: dict[str, Any] = field(default_factory=dict)  # backend-specific, JSON-serialisable
    # Where a job of several ranks meets (MASTER_ADDR, MASTER_PORT, WORLD_SIZE as the job will get them, in
    # words where only the job knows the value); None for a job of one rank. `plan` prints it.
    rendezvous: dict[str, Any] | None = None
    # Files the job needs where it runs, written before it is submitted (path as the backend places it -> text):
    # e.g. a BCP NeMo pretrain's script in the workspace. `plan` prints them beside the job.
    files: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        extra = {"rendezvous": self.rendezvous} if self.rendezvous is not None else {}
        extra |= {"files": self.files} if self.files else {}
        return {
            "stage": self.request.stage.name,
            "kind": self.request.kind,
            "name": self.request.job_name,
            "printable": self.printable,
            **self.payload,
            **extra,
        }


@dataclass(kw_only=True)
class PreparedAction:
    """A side effect a backend needs once per run before the first stage (e.g. uploading stages/)."""

    description: str
    printable: str


@dataclass(kw_only=True)
class JobProgress:
    done: int
    total: int  # 0: not known from the job (a training's total then comes from its stage)
    unit: str = "items"
    loss: float | None = None  # a training's last logged loss
    step_seconds: float | None = None  # ... and its time per step


class Backend(abc.ABC):
    """The contract every backend implements; nothing else in the orchestrator is backend-specific (what config/,
    report/ and cli/ must know of a backend's sections is asked of its config section: config/sections/hooks.py)."""

    name: str = ""  # its key in config.resources.BACKENDS, and its folder under backends/
    # `run --detach` can hand its runs to a job of the service itself (BCP). Only a flag: detach/ is BCP's by nature
    # (its driver job, lease and bundle upload import backends/bcp/), so a second detachable backend would mean
    # rewriting detach/ behind a contract of its own, not just setting this.
    detachable: bool = False
    poll_min_seconds: float = 1.0
    poll_max_seconds: float = 10.0
    # How long status queries may fail in a row before the run stops waiting (BackendUnreachable); None: for ever.
    status_outage_seconds: float | None = None
    # How long a job just created may stay missing from find_submitted (a service whose listing lags its
    # submissions, or whose clock runs ahead of ours): a resumed orchestrator looks again until then before it
    # submits a second job for a stage it found marked "submitting".
    lookup_grace_seconds: float = 0.0

    # -- hooks: what differs between backends outside one run -----------------------------------------------
    @classmethod
    def for_run(cls, config: Config, pipeline: PipelineConfig, run_dir: Path) -> Backend:
        """This backend bound to one run's folder (logs, local job records), from the config's options."""
        return cls(
            config.options[cls.name],
            config_dir=config.file.parent.resolve(),  # type: ignore[call-arg]
            stages_dir=config.stages_dir,
            run_dir=run_dir,
            workspace_name=pipeline.workspace.name,
        )

    @classmethod
    def check_ready(cls, config: Config, pipeline: PipelineConfig | None) -> None:
        """What the backend needs before the first submission, checked before a run is recorded: raises a
        PipelineError naming what is missing and how to get it. `plan` does not call this: it needs nothing.
        By default a backend needs nothing more than its config."""
        return None

    @classmethod
    def check_limits(
        cls, config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *, detach: bool = False
    ) -> None:
        """The service's own limits against the jobs this invocation may submit, before a run is recorded; raises
        a ConfigError naming each stage, the limit and the `--set` that fixes it. Called after check_ready.
        By default the service sets no limits a run could be checked against."""
        return None

    @classmethod
    def describe_limits(
        cls, config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *, detach: bool = False
    ) -> Any:
        """`plan`'s view of check_limits (something `str()` prints); None for a backend with no such limits."""
        return None

    @classmethod
    def check_service(cls, given: Any) -> Any:
        """`bcp-pipeline check`: a backends.checks.CheckInput in, a CheckOutcome out: one row per assumption the
        orchestrator makes about this service, and the facts the backend adapts to (saved as its profile:
        backends/profile.py). Typed loosely here so that the contract does not import what checks import."""
        raise NotImplementedError(f"backend {cls.name} has no `check`")

    @classmethod
    def profile_key(cls, options: Any, environ: Mapping[str, str]) -> str | None:
        """The name of the saved `check` profile of the service `options` configure; None where `check` keeps
        none this backend reads back (then `run` does not suggest `check`)."""
        return None

    # -- one run ---------------------------------------------------------------------------------------------------
    def prepare(self, pipeline: PipelineConfig, execute: bool) -> list[PreparedAction]:
        """Once per run before the first submission; with execute=False only describe it (for `plan`)."""
        return []

    @abc.abstractmethod
    def sharding(self, request: JobRequest) -> dict[str, int]:
        """`{"replicas": R, "processes": P}` the request would run with (recorded, checked on resume)."""

    @abc.abstractmethod
    def render(self, request: JobRequest) -> Submission:
        """Pure: turn a request into a submission. Raises SubmissionError when it cannot be rendered."""

    @abc.abstractmethod
    def submit(self, submission: Submission) -> str:
        """Submit; return the backend's job id. Raises SubmissionError / BackendCallError."""

    @abc.abstractmethod
    def poll(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """Status of all `job_ids` in ONE backend call; ids the backend no longer knows are omitted."""

    @abc.abstractmethod
    def find_active(self, run_id: str, stage: str, kind: str) -> list[str]:
        """Jobs of this run, stage and kind that are not finished (guards against a second job on a stage)."""

    def find_submitted(self, run_id: str, stage: str, kind: str) -> list[str]:
        """Jobs of this run, stage and kind, finished ones too where the backend still knows them, oldest first.

        The submitter adopts one it has no record of (the orchestrator died between the submit call and saving
        its id) instead of submitting again. By default only live jobs: a backend that forgets finished jobs
        (Slurm's squeue) can do no better, and the stage then runs again."""
        return self.find_active(run_id, stage, kind)

    @abc.abstractmethod
    def logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> str:
        """The job's log (one rank/replica when given); `tail` keeps the last lines."""

    def follow_logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> Iterator[str]:
        """`logs --follow`: the job's log lines (one rank's when given) as they are written, until the job has ended;
        `tail`: starting from the last lines written so far. A backend that cannot follow its logs says so."""
        raise PipelineError(
            f"`logs --follow` is not available on the {self.name} backend (its logs are read once "
            "the service has them); run `logs` again, with --tail N for the latest lines"
        )

    def training_log(self, job_id: str, tail: int | None = None) -> str:
        """The log that holds a training job's step lines, for `logs`, `status` and the report: rank 0's for the
        NeMo launcher and the smoke pretrain, the last rank's for Megatron-Bridge (it prints from there only).
        Here every rank's log, as `logs` gives it; a backend whose logs cost a call each reads fewer."""
        return self.logs(job_id, None, tail)

    @abc.abstractmethod
    def cancel(self, job_ids: list[str]) -> None:
        """Stop these jobs."""

    def gpu_utilization(self, job_id: str) -> dict[int, float] | None:
        """A running job's GPU utilization per replica (percent, the service's latest sample), where the service
        measures it (BCP's job telemetry), at most as often as reading it is cheap; None where it does not (the
        default) or has no sample yet. `status` and the report show it; nothing decides on it."""
        return None

    def resume(self, job_id: str) -> bool:
        """Resume a PREEMPTED job; False when the backend cannot (the orchestrator then cancels it and submits its
        stage's job again: engine/poller.py)."""
        return False

    def progress(self, job_id: str, *, training: bool = False) -> JobProgress | None:
        """Items done of total, when the stage reports it and the backend can read it cheaply; for a `training`
        job, its steps and last loss from its log."""
        return None

    def failure_detail(self, job_id: str, status: JobStatus) -> str:
        """A human explanation of a failed job: failing ranks, the tail of their logs, scheduler reason."""
        return status.detail

    def job_url(self, job_id: str) -> str | None:
        return None

    def writer_lock_path(self) -> Path:
        """The file whose lock marks the one writer of this backend's workspace data (engine/workspace_lock.py):
        where every orchestrator that could write the same data sees it, whatever its config file or --state-dir.
        A workspace that is a folder here (local, Slurm, Grid Engine): beside it, so any config file or state
        folder that shares the folder shares the lock (on a cluster, on the shared file system the folder is on).
        A backend whose workspace is no folder here overrides this (BCP, Kubernetes: shared/locks.py's
        user_writer_lock)."""
        if self.local_workspace is None:
            raise NotImplementedError(f"backend {self.name} names no writer lock for its workspace")
        return self.local_workspace.parent / f".{self.local_workspace.name}.writer.lock"

    has_profile: bool = False  # a saved `check` profile of this service was found (backends/profile.py)
    local_workspace: Path | None = None  # the workspace as a folder on this machine, where it is one (local, Slurm)

    def refusals(self, submissions: list[Submission], *, detach: bool = False) -> list[str]:
        """Jobs that what `bcp-pipeline check` found about this service says cannot work, each named with the
        difference; [] without a profile. Checked before a run is recorded (`detach`: `run --detach`)."""
        return []


def outage_seconds(limit: str | None) -> float | None:
    """A backend's `status_outage_limit` (validated on load) in seconds; None: no limit."""
    return None if limit is None else float(parse_duration(limit))
