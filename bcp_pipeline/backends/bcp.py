"""NGC Base Command Platform: every stage an `ngc base-command job run`, tracked through the `ngc` CLI.

The transport is the `ngc` CLI users already have (argv lists, `--format_type json`); the API key reaches it
only through its own environment/config (NGC_CLI_API_KEY or ~/.ngc/config), never through argv, logs or state.
One `job list --label <run label>` call per poll cycle covers all of a run's jobs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_json
from ..config import PipelineConfig
from ..errors import CommandError, SubmissionError
from ..jobs import Backend, JobRequest, JobState, JobStatus, PreparedAction, Submission, map_native_state
from ..procs import run_command
from ..resources import BcpOptions
from .bcp_render import code_destination, job_run_argv, label, upload_argv
from .common import last_lines, shell_join

# All 25 BCP job statuses (ngc-cli.md). PREEMPTED waits for `job resume`; unknown ones are "not finished".
STATE_MAP: dict[str, JobState] = {
    "CREATED": JobState.QUEUED,
    "QUEUED": JobState.QUEUED,
    "PENDING_STORAGE_CREATION": JobState.QUEUED,
    "REQUESTING_RESOURCE": JobState.QUEUED,
    "RESOURCE_CONSUMPTION_REQUEST_IN_PROGRESS": JobState.QUEUED,
    "RESOURCE_GRANTED": JobState.QUEUED,
    "STARTING": JobState.RUNNING,
    "RUNNING": JobState.RUNNING,
    "PENDING_TERMINATION": JobState.RUNNING,
    "PREEMPTED": JobState.PREEMPTED,
    "PREEMPTED_BY_ADMIN": JobState.PREEMPTED,
    "FINISHED_SUCCESS": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "FAILED_RUN_LIMIT_EXCEEDED": JobState.TIMED_OUT,
    "KILLED_BY_USER": JobState.CANCELLED,
    "KILLED_BY_ADMIN": JobState.CANCELLED,
    "CANCELED": JobState.CANCELLED,
    "KILLED_BY_SYSTEM": JobState.LOST,
    "TASK_LOST": JobState.LOST,
    "UNKNOWN": JobState.FAILED,
    "INFINITY_POOL_MISSING": JobState.FAILED,
    "RESOURCE_RELEASED": JobState.FAILED,
    "IM_INTERNAL_ERROR": JobState.FAILED,
    "RESOURCE_GRANT_DENIED": JobState.FAILED,
    "RESOURCE_LIMIT_EXCEEDED": JobState.FAILED,
}
NGC_HINT = "check `ngc config current` (API key, org, ACE) and that the ngc CLI is on PATH (backends.bcp.ngc)"


class BcpBackend(Backend):
    name = "bcp"

    def __init__(self, options: BcpOptions, *, pipeline: PipelineConfig, config_dir: Path, stages_dir: Path,
                 run_dir: Path, workspace_name: str) -> None:
        self.options = options
        self.pipeline = pipeline
        self.stages_dir = stages_dir
        self.run_dir = run_dir
        self.run_id = run_dir.name
        self.workspace_name = workspace_name
        self.poll_min_seconds = options.poll_min_seconds
        self.poll_max_seconds = options.poll_max_seconds

    # -- pure ------------------------------------------------------------------------------------------
    def sharding(self, request: JobRequest) -> dict[str, int]:
        res = request.resources("bcp")
        return {"replicas": res.replicas, "processes": res.processes}

    def render(self, request: JobRequest) -> Submission:
        argv = job_run_argv(request, self.options, self.stages_dir)
        return Submission(request=request, printable=shell_join(argv), payload={"argv": argv})

    def prepare(self, pipeline: PipelineConfig, execute: bool) -> list[PreparedAction]:
        """Upload stages/ into the workspace once per content hash (recorded in the run folder's parent)."""
        destination = code_destination(self.options, self.stages_dir)
        argv = upload_argv(self.options, self.workspace_name, self.stages_dir)
        action = PreparedAction(description=f"upload stages/ to workspace {self.workspace_name} at {destination} "
                                            "(once per content hash)", printable=shell_join(argv))
        if execute:
            marker = self.run_dir.parent.parent / "bcp-uploads" / f"{self.workspace_name}-{destination.replace('/', '_')}"
            if not marker.is_file():
                self._ngc(argv[1:], timeout=1800)
                atomic_write_json(marker, {"workspace": self.workspace_name, "destination": destination,
                                           "uploaded_at": time.time()})
        return [action]

    # -- transport -------------------------------------------------------------------------------------
    def _ngc(self, args: list[str], timeout: float = 120) -> str:
        argv = [self.options.ngc, *args]
        return run_command(argv, timeout=timeout, hint=NGC_HINT).stdout

    def _globals(self) -> list[str]:
        flags = []
        for flag, value in (("--org", self.options.org), ("--team", self.options.team), ("--ace", self.options.ace)):
            if value:
                flags += [flag, value]
        return [*flags, "--format_type", "json"]

    def submit(self, submission: Submission) -> str:
        output = self._ngc(submission.payload["argv"][1:])
        try:
            return str(_first_json(output)["job"]["id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SubmissionError(f"`ngc base-command job run` printed no job id ({exc}); output: {output[:500]}")

    def _list(self, *labels: str) -> list[dict[str, Any]]:
        args = ["base-command", "job", "list", "--duration", self.options.list_duration]
        for name in labels:
            args += ["--label", name]
        data = _first_json(self._ngc(args + self._globals()))
        return [_job_object(item) for item in (data if isinstance(data, list) else [])]

    def poll(self, job_ids: list[str]) -> dict[str, JobStatus]:
        """One `job list` call for every job of this run; `job info` only for ids the list window missed."""
        statuses = {}
        for job in self._list(label("run", self.run_id)):
            job_id = str(job.get("id"))
            if job_id in job_ids:
                statuses[job_id] = _status_of(job)
        for job_id in set(job_ids) - set(statuses):
            info = _first_json(self._ngc(["base-command", "job", "info", job_id, *self._globals()]))
            statuses[job_id] = _status_of(_job_object(info))
        return statuses

    def find_active(self, run_id: str, stage: str, kind: str) -> list[str]:
        wanted = {label("run", run_id), label("stage", stage), label("kind", kind)}
        active = []
        for job in self._list(label("run", run_id)):
            if wanted <= set(_labels_of(job)) and not _status_of(job).state.finished:
                active.append(str(job.get("id")))
        return active

    def logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> str:
        target = f"{job_id}:{rank}" if rank is not None else job_id
        args = ["base-command", "job", "log", target]
        if tail:
            args += ["--tail", "--lines", str(tail)]
        return self._ngc(args)

    def cancel(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self._ngc(["base-command", "job", "kill", job_id, *self._globals()])

    def resume(self, job_id: str) -> bool:
        self._ngc(["base-command", "job", "resume", job_id, *self._globals()])
        return True

    def failure_detail(self, job_id: str, status: JobStatus) -> str:
        lines = [status.detail] if status.detail else []
        try:
            lines.append("last lines of the job log:\n" + _indent(last_lines(self.logs(job_id, tail=15), 15)))
        except CommandError as exc:
            lines.append(f"(job log unavailable: {exc})")
        return "\n".join(lines)

    def job_url(self, job_id: str) -> str | None:
        if not self.options.ui_url:
            return None
        return self.options.ui_url.format(job_id=job_id, org=self.options.org or "", team=self.options.team or "")


def _first_json(text: str) -> Any:
    """The first JSON document on stdout (`--waitrun` appends more documents after it)."""
    decoder = json.JSONDecoder()
    text = text.lstrip()
    if not text:
        raise ValueError("empty output")
    value, _ = decoder.raw_decode(text)
    return value


def _job_object(item: Any) -> dict[str, Any]:
    """`job info` wraps the job as {"job": {...}}; `job list` items are the job itself."""
    if isinstance(item, dict) and isinstance(item.get("job"), dict):
        return item["job"]
    return item if isinstance(item, dict) else {}


def _labels_of(job: dict[str, Any]) -> list[str]:
    labels = job.get("labels") or {}
    user = labels.get("userLabels") if isinstance(labels, dict) else None
    if isinstance(user, dict):
        return list(user.get("values") or [])
    definition = job.get("jobDefinition") or {}
    return list(user or definition.get("userLabels") or [])


def _status_of(job: dict[str, Any]) -> JobStatus:
    status = job.get("jobStatus") or {}
    native = str(status.get("status") or "")
    return JobStatus(job_id=str(job.get("id")), state=map_native_state(native, STATE_MAP), native=native,
                     detail=str(status.get("statusDetails") or ""))


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())

