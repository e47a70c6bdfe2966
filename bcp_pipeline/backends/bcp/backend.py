"""NGC Base Command Platform: every stage an `ngc base-command job run`, tracked through a transport.

The transport (transport_cli.py, transport_sdk.py) is NVIDIA's `ngc` CLI or ngcsdk's Python API; the API key reaches
either only through NGC's own settings (NGC_CLI_API_KEY or ~/.ngc/config), never through argv, logs or state.
One `job list --label <run label>` call per poll cycle covers all of a run's jobs.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bcp_pipeline.atomic import atomic_write_json, atomic_write_text
from bcp_pipeline.backends.bcp.account import account_of, profile_key_of
from bcp_pipeline.backends.bcp.admission import profile_refusals
from bcp_pipeline.backends.bcp.connect import make_transport, read_ngc_config
from bcp_pipeline.backends.bcp.driver import driver_job_shape
from bcp_pipeline.backends.bcp.paths import UPLOAD_EXCLUDES, code_destination
from bcp_pipeline.backends.bcp.render import (
    NO_REDIRECT,
    JobSpec,
    job_files,
    job_rendezvous,
    job_run_argv,
    job_spec,
    label,
    upload_argv,
)
from bcp_pipeline.backends.bcp.states import labels_of, status_of
from bcp_pipeline.backends.bcp.telemetry import INTERVAL_TIME, INTERVAL_UNIT, TelemetryReader
from bcp_pipeline.backends.bcp.telemetry import TYPE as TELEMETRY_TYPE
from bcp_pipeline.backends.bcp.transport import Transport, retry_policy
from bcp_pipeline.backends.contract import (
    Backend,
    JobProgress,
    JobRequest,
    JobStatus,
    PreparedAction,
    Submission,
    outage_seconds,
)
from bcp_pipeline.backends.profile import load_profile
from bcp_pipeline.backends.retries import with_retries
from bcp_pipeline.backends.shared.command import shell_join
from bcp_pipeline.backends.shared.locks import user_writer_lock
from bcp_pipeline.backends.shared.logs import training_progress, why_it_failed
from bcp_pipeline.config.model import Config, PipelineConfig
from bcp_pipeline.config.resources import BcpOptions
from bcp_pipeline.errors import BackendCallError
from bcp_pipeline.training_log import last_progress

LIST_LAG_MARGIN_SECONDS = 30.0  # beyond twice the list lag `check` measured, before a stage is submitted again
KILL_MARGIN_SECONDS = 60.0  # beyond the ACE's termination grace, before `cancel` says a killed job has not ended
FAILURE_LOG_LINES = 300  # read for a failed job's traceback, above its launcher's summary
TRAINING_LOG_LINES = 50  # the end of a training job's log read for its progress (a progress bar redraws in one line)
FAILED_REPLICA = re.compile(r"\bReplica (\d+)\b")  # statusDetails like "Replica 1 exited with code 3"


class BcpBackend(Backend):
    name = "bcp"
    detachable = True  # `run --detach`: a driver job in the ACE drives the run (detach/)

    def __init__(
        self,
        options: BcpOptions,
        *,
        pipeline: PipelineConfig,
        config_dir: Path,
        stages_dir: Path,
        run_dir: Path,
        workspace_name: str,
        mounted_workspace: Path | None = None,
        profile: dict[str, Any] | None = None,
    ) -> None:
        self.options = options
        self.pipeline = pipeline
        self.stages_dir = stages_dir
        self.run_dir = run_dir
        self.run_id = run_dir.name
        self.workspace_name = workspace_name
        self.poll_min_seconds = options.poll_min_seconds
        self.status_outage_seconds = outage_seconds(options.status_outage_limit)
        self.poll_max_seconds = options.poll_max_seconds
        self.lookup_grace_seconds = options.lookup_grace_seconds  # BCP's job list may lag job creation
        self.retry_policy = retry_policy(options)
        self.mounted_workspace = mounted_workspace  # where the workspace is mounted when the orchestrator runs in
        # a BCP job itself (the detached driver): stages/ is then copied in, not uploaded
        self._transport: Transport | None = None
        self.profile = profile  # what `check` found about this org/ACE (backends/profile.py); None: never checked
        self.has_profile = profile is not None
        self._progress_read: dict[str, tuple[float, JobProgress | None]] = {}  # job id -> (when read, what)
        self._replica_counts: dict[str, int] = {}  # job id -> its replicas (a job's definition never changes)
        self._telemetry = TelemetryReader(options.telemetry_seconds)
        lag = self.probe_fact("list_lag_seconds")
        if isinstance(lag, (int, float)) and lag >= 1:  # the list index lags here: look a job up that long, twice over
            self.lookup_grace_seconds = 2 * float(lag) + LIST_LAG_MARGIN_SECONDS

    # -- hooks: BCP outside one run (bcp/ready.py, bcp/check.py) -------------------------------------------------
    @classmethod
    def for_run(cls, config: Config, pipeline: PipelineConfig, run_dir: Path) -> BcpBackend:
        """With the `check` profile of the configured org and ACE, where one was saved (run_dir is STATE/runs/RUN:
        the profiles are in STATE/checks)."""
        options = config.options["bcp"]
        key = profile_key_of(options, os.environ)
        profile = load_profile(run_dir.parent.parent, key) if key else None
        return cls(
            options,
            pipeline=pipeline,
            profile=profile,
            config_dir=config.file.parent.resolve(),
            stages_dir=config.stages_dir,
            run_dir=run_dir,
            workspace_name=pipeline.workspace.name,
        )

    @classmethod
    def check_ready(cls, config: Config, pipeline: PipelineConfig | None) -> None:
        from bcp_pipeline.backends.bcp import admission as ready  # would BCP refuse the run? (admission.py)

        ready.check_ready(config, pipeline)

    @classmethod
    def check_limits(
        cls, config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *, detach: bool = False
    ) -> None:
        from bcp_pipeline.backends.bcp import admission as ready

        ready.check_limits(config, pipeline, requests, detach=detach)

    @classmethod
    def describe_limits(
        cls, config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *, detach: bool = False
    ) -> Any:
        from bcp_pipeline.backends.bcp import admission as ready

        return ready.describe_limits(config, pipeline, requests, detach=detach)

    @classmethod
    def check_service(cls, given: Any) -> Any:
        from bcp_pipeline.backends.bcp.check import check_bcp

        return check_bcp(given)

    @classmethod
    def profile_key(cls, options: BcpOptions, environ: Mapping[str, str]) -> str | None:
        return profile_key_of(options, environ)

    # -- one run ---------------------------------------------------------------------------------------------------
    @property
    def transport(self) -> Transport:
        """Chosen on first use, so `plan` (which only renders) needs neither the CLI nor ngcsdk."""
        if self._transport is None:
            self._transport = make_transport(self.options)
        return self._transport

    def writer_lock_path(self) -> Path:
        """A BCP workspace is named, not a folder here: its lock lives in this user's state folder, keyed by org and
        workspace name, so every orchestrator on this machine (any config file, any --state-dir) sees it; a run
        handed to a driver job leaves a record there naming it (engine/workspace_lock.py)."""
        return user_writer_lock(account_of(self.options, os.environ)[0] or "no-org", self.workspace_name)

    # -- pure ------------------------------------------------------------------------------------------
    def sharding(self, request: JobRequest) -> dict[str, int]:
        layout = request.rank_layout("bcp")
        return {"replicas": layout.nodes, "processes": layout.per_node}

    def probe_fact(self, *path: str) -> Any:
        """A fact the `check` probe jobs found (facts.probe.PATH...), None without a profile or that fact."""
        value: Any = ((self.profile or {}).get("facts") or {}).get("probe")
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def render(self, request: JobRequest) -> Submission:
        spelling = self.probe_fact("bcprun", "no_redirect_spelling")
        spec = job_spec(
            request,
            self.options,
            self.stages_dir,
            no_redirect=spelling if spelling in ("-no_redirect", "--no_redirect") else NO_REDIRECT,
        )
        argv = job_run_argv(spec)
        return Submission(
            request=request,
            printable=shell_join(argv),
            payload={"argv": argv, "spec": asdict(spec)},
            rendezvous=job_rendezvous(request),
            files=job_files(request, self.options, self.stages_dir),
        )

    def prepare(self, pipeline: PipelineConfig, execute: bool) -> list[PreparedAction]:
        """Upload stages/ into the workspace once per content hash (recorded in the run folder's parent)."""
        destination = code_destination(self.options, self.stages_dir)
        argv = upload_argv(self.options, self.workspace_name, self.stages_dir, destination)
        action = PreparedAction(
            description=f"upload stages/ to workspace {self.workspace_name} at {destination} (once per content hash)",
            printable=shell_join(argv),
        )
        if execute and self.mounted_workspace is not None:
            copy_code(self.stages_dir, self.mounted_workspace / destination)
        elif execute:
            uploads = self.run_dir.parent.parent / "bcp-uploads"
            marker = uploads / f"{self.workspace_name}-{destination.replace('/', '_')}"
            if not marker.is_file():
                with_retries(
                    lambda: self.transport.upload(self.workspace_name, self.stages_dir, destination, UPLOAD_EXCLUDES),
                    f"uploading stages/ to workspace {self.workspace_name}",
                    self.retry_policy,
                )
                atomic_write_json(
                    marker, {"workspace": self.workspace_name, "destination": destination, "uploaded_at": time.time()}
                )
        return [action]

    # -- through the transport -------------------------------------------------------------------------
    def submit(self, submission: Submission) -> str:
        self.put_job_files(submission.files)
        return self.transport.submit(JobSpec(**submission.payload["spec"]))

    def put_job_files(self, files: Mapping[str, str]) -> None:
        """Place a job's own files (a NeMo pretrain's script) in the workspace before the job runs: copied where the
        workspace is mounted (a detached driver), else uploaded once per file (their names hold their content's
        hash, so an uploaded name never needs uploading again)."""
        for relative, text in files.items():
            if self.mounted_workspace is not None:
                atomic_write_text(self.mounted_workspace / relative, text)
                continue
            marker = self.run_dir / "uploaded-job-files" / relative.replace("/", "_")
            if marker.is_file():
                continue
            staging = self.run_dir / "job-files" / Path(relative).parent.name
            atomic_write_text(staging / Path(relative).name, text)
            folder = str(Path(relative).parent)
            with_retries(
                lambda staging=staging, folder=folder: self.transport.upload(
                    self.workspace_name, staging, folder, UPLOAD_EXCLUDES
                ),
                f"uploading {relative} to workspace {self.workspace_name}",
                self.retry_policy,
            )
            atomic_write_text(marker, "")

    def poll(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """One `job list` call for every job of this run; `job info` only for ids the list window missed."""
        statuses = {}
        for job in self.transport.list_jobs([label("run", self.run_id)]):
            job_id = str(job.get("id"))
            if job_id in job_ids:
                statuses[job_id] = status_of(job)
        for job_id in set(job_ids) - set(statuses):
            statuses[job_id] = status_of(self.transport.job(job_id))
        return statuses

    def find_active(self, run_id: str, stage: str, kind: str) -> list[str]:
        return [str(job.get("id")) for job in self._labelled(run_id, stage, kind) if not status_of(job).state.finished]

    def find_submitted(self, run_id: str, stage: str, kind: str) -> list[str]:
        """Finished jobs too: `job list` keeps them (within list_duration)."""
        return [str(job.get("id")) for job in self._labelled(run_id, stage, kind)]

    def _labelled(self, run_id: str, stage: str, kind: str) -> list[dict[str, Any]]:
        """The run's jobs carrying this stage's and kind's labels, oldest first (ids grow with time)."""
        wanted = {label("run", run_id), label("stage", stage), label("kind", kind)}
        jobs = [job for job in self.transport.list_jobs([label("run", run_id)]) if wanted <= set(labels_of(job))]
        return sorted(jobs, key=lambda job: (len(str(job.get("id"))), str(job.get("id"))))

    def logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> str:
        return self.transport.log(job_id, rank, tail)

    def training_log(self, job_id: str, tail: int | None = None) -> str:
        """Replica 0's log, where every rank's output lands when replica 0's bcprun starts them all; where it shows
        no step line and the job has more replicas, the last replica's after it: Megatron-Bridge prints from the
        last rank only, and where each replica's bcprun starts its own node's ranks that rank's lines are in the
        last replica's log (`check`'s row "last rank's lines" shows which on an ACE)."""
        first = self.transport.log(job_id, 0, tail)
        replicas = self._replicas(job_id)
        if replicas < 2 or last_progress(first) is not None:
            return first
        last = self.transport.log(job_id, replicas - 1, tail)
        if last_progress(last) is None:
            return first
        return f"{first.rstrip(chr(10))}\n==> replica {replicas - 1} (the last rank's output) <==\n{last}"

    def _replicas(self, job_id: str) -> int:
        """The job's replica count (one `job info` call a job, then kept)."""
        if job_id not in self._replica_counts:
            definition = self.transport.job(job_id).get("jobDefinition") or {}
            self._replica_counts[job_id] = int(definition.get("replicaCount") or 1)
        return self._replica_counts[job_id]

    def progress(self, job_id: str, *, training: bool = False) -> JobProgress | None:
        """A training job's steps and loss from the end of its training log (training_log): at most every
        `training_log_seconds` a job. Other jobs: None (their progress would cost a call per replica per cycle)."""
        if not training:
            return None
        now = time.monotonic()
        last = self._progress_read.get(job_id)
        if last is not None and now - last[0] < self.options.training_log_seconds:
            return last[1]
        try:
            found = training_progress(self.training_log(job_id, TRAINING_LOG_LINES))
        except BackendCallError:
            found = last[1] if last else None  # a progress column is a nicety: never fail a poll over it
        self._progress_read[job_id] = (now, found)
        return found

    def gpu_utilization(self, job_id: str) -> dict[int, float] | None:
        """Each replica's GPU utilization from the job's telemetry (a `job telemetry` call per replica, at most every
        `telemetry_seconds` a job: bcp/telemetry.py)."""
        return self._telemetry.read(
            job_id,
            self._replicas(job_id),
            lambda replica: self.transport.telemetry(job_id, replica, [TELEMETRY_TYPE], INTERVAL_UNIT, INTERVAL_TIME),
        )

    def cancel(self, job_ids: list[str]) -> None:
        """Kill every job of this run, then wait until BCP reports them ended (a kill passes through
        PENDING_TERMINATION for the ACE's termination grace period). A job that does not carry this run's label,
        as read here whatever a server-side label filter returned, is not killed; a kill that fails does not stop
        the others, and is no failure when the job has ended meanwhile (BCP refuses to kill a FINISHED job)."""
        own = label("run", self.run_id)
        failures, killed = [], []
        for job_id in job_ids:
            try:
                labels = labels_of(self.transport.job(job_id))
                if own not in labels:
                    failures.append(
                        f"job {job_id}: not killed: it does not carry this run's label {own} "
                        f"(its labels: {', '.join(labels) or 'none'})"
                    )
                    continue
                self.transport.kill(job_id)
                killed.append(job_id)
            except BackendCallError as exc:
                if not self._ended(job_id):
                    failures.append(f"job {job_id}: {exc}")
        try:
            self._wait_ended(killed)
        except BackendCallError as exc:
            failures.append(str(exc))
        if failures:
            raise BackendCallError("could not kill every job:\n  " + "\n  ".join(failures))

    def _ended(self, job_id: str) -> bool:
        """Whether BCP reports the job ended, as read now (False when that cannot be read either)."""
        try:
            return status_of(self.transport.job(job_id)).state.finished
        except BackendCallError:
            return False

    def _wait_ended(self, job_ids: list[str]) -> None:
        """Until every killed job has ended: at most the ACE's terminationGracePeriodSeconds (asked only when a
        job has not ended at the first look) plus a margin."""
        pending, grace, deadline = list(job_ids), None, None
        delay = self.poll_min_seconds
        while pending:
            statuses = self.poll(pending)
            pending = [job_id for job_id in pending if job_id in statuses and not statuses[job_id].state.finished]
            if not pending:
                return
            if deadline is None:
                grace = self.termination_grace_seconds()
                measured = self.probe_fact("kill_seconds")  # how long a kill took when `check` timed one
                if isinstance(measured, (int, float)):
                    grace = max(grace or 0.0, float(measured))
                deadline = time.monotonic() + (grace or 0) + KILL_MARGIN_SECONDS
            if time.monotonic() > deadline:
                raise BackendCallError(
                    f"job(s) {', '.join(pending)} were killed but are still "
                    f"{', '.join(sorted({statuses[j].native for j in pending}))} after the ACE's termination grace "
                    f"period ({grace or 0:.0f} s) and {KILL_MARGIN_SECONDS:.0f} s more; check them with "
                    "`ngc base-command job info`"
                )
            time.sleep(delay)
            delay = min(delay * 2, self.poll_max_seconds)

    def termination_grace_seconds(self) -> float | None:
        """The ACE's terminationGracePeriodSeconds (how long a killed job may stay PENDING_TERMINATION); None
        when the ACE does not say or cannot be read."""
        name = self.options.ace or os.environ.get("NGC_CLI_ACE") or read_ngc_config(dict(os.environ)).get("ace")
        if not name:
            return None
        try:
            value = self.transport.ace(name).get("terminationGracePeriodSeconds")
        except BackendCallError:  # the ACE as `check` saw it, where a profile exists
            value = ((self.profile or {}).get("facts") or {}).get("ace", {}).get("terminationGracePeriodSeconds")
        return float(value) if isinstance(value, (int, float)) else None

    def resume(self, job_id: str) -> bool:
        """`job resume`; False, asking nothing more, for a RUNONCE job where `check` found that BCP refuses to
        resume one (facts.probe.runonce_preemption): the orchestrator then kills it and submits its stage again."""
        if self.probe_fact("runonce_preemption") == "not_resumable" and self.preempt_class(job_id) in ("RUNONCE", None):
            return False
        self.transport.resume(job_id)
        return True

    def preempt_class(self, job_id: str) -> str | None:
        """The job's preempt class as BCP records it (`runPolicy.preemptClass`); None where it does not say, which
        `resume` takes as RUNONCE (`job run`'s default): a needless resubmission restarts from the finished shards,
        while a resume BCP refuses would be asked for again every cycle."""
        policy = (self.transport.job(job_id).get("jobDefinition") or {}).get("runPolicy") or {}
        return str(policy["preemptClass"]) if policy.get("preemptClass") else None

    def failure_detail(self, job_id: str, status: JobStatus) -> str:
        """The status details and the end of the log of the replica they blame (replica 0 when none is named)."""
        lines = [status.detail] if status.detail else []
        blamed = FAILED_REPLICA.search(status.detail or "")
        replica = int(blamed.group(1)) if blamed else None
        which = f"replica {replica}'s" if replica is not None else "the job"
        try:
            log = self.logs(job_id, replica, tail=FAILURE_LOG_LINES)
            lines += why_it_failed(log, which)
        except BackendCallError as exc:
            lines.append(f"(job log unavailable: {exc})")
        return "\n".join(lines)

    def refusals(self, submissions: list[Submission], *, detach: bool = False) -> list[str]:
        """What the profile rules out (refusals.py)."""
        if not self.profile:
            return []
        driver = driver_job_shape(self.options, self.pipeline) if detach and self.pipeline else None
        return profile_refusals(self.profile, submissions, self.options, self.stages_dir, driver, detach=detach)

    def job_url(self, job_id: str) -> str | None:
        if not self.options.ui_url or (self.options.ui_url == BcpOptions.ui_url and not _nvidia_api()):
            return None  # NVIDIA's UI has no page of a job another service (the emulator) ran
        return self.options.ui_url.format(job_id=job_id, org=self.options.org or "", team=self.options.team or "")


def _nvidia_api() -> bool:
    """NVIDIA's client talks to NVIDIA's service: the API URL it is given (NGC_CLI_API_URL), if any, is NVIDIA's."""
    host = urllib.parse.urlsplit(os.environ.get("NGC_CLI_API_URL") or "https://api.ngc.nvidia.com").hostname or ""
    return host == "nvidia.com" or host.endswith(".nvidia.com")


def copy_code(source: Path, target: Path) -> None:
    """Put the stage programs at `target` in a mounted workspace once: copied beside it, then renamed into place,
    so a job never sees half of them (the folder name is their content hash)."""
    if target.is_dir():
        return
    staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns(*UPLOAD_EXCLUDES))
    try:
        os.rename(staging, target)
    except OSError:  # another driver put it there meanwhile (rename onto a non-empty folder fails)
        shutil.rmtree(staging, ignore_errors=True)
        if not target.is_dir():
            raise


BACKEND = BcpBackend
