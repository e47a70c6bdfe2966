"""How the BCP backend talks to Base Command: NVIDIA's `ngc` CLI (a subprocess) or ngcsdk's Python API (in-process).

Both transports take the same JobSpec and give back the same job objects (the JSON shape of `job info`/`job list`:
`{"id", "jobStatus": {"status", "statusDetails"}, "labels": {"userLabels": {"values": [...]}}, ...}`), so the
backend above them does not know which one it has. The API key reaches either only through NGC's own settings
(NGC_CLI_API_KEY or ~/.ngc/config): never argv, a log or the run state.

`backends.bcp.transport: auto` takes the CLI when `ngc` is on PATH, else ngcsdk when it imports.
"""

from __future__ import annotations

import abc
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.bcp.render import JobSpec
from bcp_pipeline.backends.retries import RetryPolicy
from bcp_pipeline.config.durations import format_duration, parse_duration
from bcp_pipeline.config.resources import BcpOptions
from bcp_pipeline.errors import BackendCallError

SDK_VERSION = "4.19.1"  # the last ngcsdk with Base Command in it
CONFIG_HINT = "check `ngc config current` (API key, org, ACE) or NGC_CLI_API_KEY / NGC_CLI_ORG / NGC_CLI_ACE"


class Transport(abc.ABC):
    """The operations the BCP backend needs; each raises BackendCallError when the call fails."""

    name = ""

    def __init__(self, options: BcpOptions) -> None:
        self.options = options

    @abc.abstractmethod
    def submit(self, spec: JobSpec) -> str:
        """Submit one job; its id."""

    @abc.abstractmethod
    def list_jobs(self, labels: list[str]) -> list[dict[str, Any]]:
        """Jobs with any of `labels` (filtered on the server), created within `options.list_duration`."""

    @abc.abstractmethod
    def job(self, job_id: str) -> dict[str, Any]:
        """One job object, as `job info` has it."""

    @abc.abstractmethod
    def log(self, job_id: str, replica: int | None, tail: int | None) -> str:
        """Replica `replica`'s log (replica 0 when None); the last `tail` lines when given."""

    @abc.abstractmethod
    def telemetry(
        self, job_id: str, replica: int, types: list[str], interval_unit: str, interval_time: int
    ) -> list[dict[str, Any]]:
        """`job telemetry ID:R --type T...`: the replica's measurements since the job started, as NVIDIA's printer
        has them in JSON (a list of MeasurementResult: `{"series": [...]}`; backends/bcp/telemetry.py reads them)."""

    @abc.abstractmethod
    def kill(self, job_id: str) -> None: ...

    @abc.abstractmethod
    def preempt(self, job_id: str) -> None:
        """Ask for the job to be preempted (`job preempt`): it stops and waits PREEMPTED for `job resume`."""

    @abc.abstractmethod
    def resume(self, job_id: str) -> None: ...

    @abc.abstractmethod
    def upload(self, workspace: str, source: Path, destination: str, exclude: tuple[str, ...]) -> None:
        """Put the contents of folder `source` at `destination` in the workspace."""

    @abc.abstractmethod
    def ace(self, name: str) -> dict[str, Any]:
        """The ACE as `ace info` has it (its limits: maxRuntimeSeconds, terminationGracePeriodSeconds...)."""

    # -- the read-only look-ups `check` makes (and `run`, of the workspaces), in the JSON shape NVIDIA's printer
    # prints for the CLI (and ngcsdk's `toDict()`) --------------------------------------------------------------
    @abc.abstractmethod
    def who(self) -> dict[str, Any]:
        """`ngc user who` (ngcsdk's `users.who()`, the command's own call), by the kind of key:
        a legacy API key: {"user": {"id", "name", "roles": [{"org": {"name"}, "team"?: {"name"}, ...}]}};
        a personal key (nvapi-): what the key service says of it, {"type": "PERSONAL_KEY", "orgName", "user": {...}};
        a service key (nvapi-): {}, as NVIDIA's client asks nothing for one ("Service keys are not associated with
        users"; its printer says NO_USER)."""

    @abc.abstractmethod
    def image(self, name: str) -> dict[str, Any]:
        """`ngc registry image info ORG/[TEAM/]REPO:TAG` (`nvcr.io/` dropped): the tag's metadata."""

    @abc.abstractmethod
    def workspace(self, name: str) -> dict[str, Any]:
        """`ngc workspace info NAME`: {"name", "sizeInBytes", "aceName", ...}."""

    @abc.abstractmethod
    def secret_list(self) -> Any:
        """`ngc user secret list`, as NVIDIA's printer has it (secret_keys reads it)."""

    @abc.abstractmethod
    def client_version(self) -> str:
        """`ngc version info` (the standalone CLI's command; ngcsdk's CLI code has none), or ngcsdk's version."""

    @abc.abstractmethod
    def job_statuses(self, job_id: str) -> list[dict[str, Any]]:
        """`job info`'s jobStatusHistory items (job_history orders them)."""

    @abc.abstractmethod
    def storage_quota(self) -> list[dict[str, Any]]:
        """`ngc user storage`: the user's storage quotas ({"quota", "available", "aceName", ...} per storage
        cluster)."""

    def secret_keys(self) -> dict[str, list[str]]:
        """`ngc user secret list`: each secret's name -> its key names (values are never asked for)."""
        data = self.secret_list()
        # NVIDIA's printer (and toDict) leave out an empty list: {"version": "1"} is "no secrets".
        items = (data.get("secrets") or []) if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise BackendCallError(f"`user secret list` answered no list of secrets: {str(data)[:200]}")
        return {
            str(s.get("name")): [str(kv.get("key")) for kv in s.get("kv") or [] if isinstance(kv, dict)]
            for s in items
            if isinstance(s, dict)
        }

    def job_history(self, job_id: str) -> list[str]:
        """The statuses a job went through, oldest first (`job info`'s jobStatusHistory)."""
        items = [item for item in self.job_statuses(job_id) if isinstance(item, dict)]
        items.sort(key=lambda item: item.get("timestamp") or 0)
        return [str(item.get("status")) for item in items]


LIST_WINDOW_AHEAD = timedelta(days=1)


def list_window(duration: str, now: datetime | None = None) -> tuple[datetime, str]:
    """(end, duration) of a `job list` window that covers `duration` back from now and a day ahead of this
    machine's clock: the service stamps a job's createdDate with its own clock, and ngcsdk's window otherwise ends
    at ours, so a server clock running ahead would hide a job just created (and a resumed orchestrator would
    submit a duplicate). The end is naive UTC, the form ngcsdk formats with a `Z`."""
    now = now or datetime.now(timezone.utc)
    end = now.astimezone(timezone.utc).replace(tzinfo=None, microsecond=0) + LIST_WINDOW_AHEAD
    return end, format_duration(parse_duration(duration) + int(LIST_WINDOW_AHEAD.total_seconds()))


def first_json(text: str) -> Any:
    """The first JSON document on stdout (`--waitrun` appends more documents after it)."""
    decoder = json.JSONDecoder()
    text = text.lstrip()
    if not text:
        raise ValueError("empty output")
    value, _ = decoder.raw_decode(text)
    return value


def job_object(item: Any) -> dict[str, Any]:
    """`job info` wraps the job as {"job": {...}}; `job list` items are the job itself."""
    if isinstance(item, dict) and isinstance(item.get("job"), dict):
        return item["job"]
    return item if isinstance(item, dict) else {}


def as_dict(value: Any) -> dict[str, Any]:
    if hasattr(value, "toDict"):
        return value.toDict()
    return value if isinstance(value, dict) else {}


def retry_policy(options: BcpOptions) -> RetryPolicy:
    """How the calls that must survive a busy API (uploads, a driver's start and hand-over) are retried."""
    return RetryPolicy(
        attempts=options.retry_attempts,
        backoff=options.retry_backoff_seconds,
        max_wait=max(options.retry_backoff_seconds, 60.0),
    )
