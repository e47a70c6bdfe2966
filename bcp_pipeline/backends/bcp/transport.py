"""How the BCP backend talks to Base Command: NVIDIA's `ngc` CLI (a subprocess) or ngcsdk's Python API (in-process).

Both transports take the same JobSpec and give back the same job objects (the JSON shape of `job info`/`job list`:
`{"id", "jobStatus": {"status", "statusDetails"}, "labels": {"userLabels": {"values": [...]}}, ...}`), so the
backend above them does not know which one it has. The API key reaches either only through NGC's own settings
(NGC_CLI_API_KEY or ~/.ngc/config): never argv, a log or the run state.

`backends.bcp.transport: auto` takes the CLI when `ngc` is on PATH, else ngcsdk when it imports.
"""

from __future__ import annotations

import abc
import configparser
import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bcp_pipeline.config.durations import format_duration, parse_duration
from bcp_pipeline.errors import BackendCallError, CommandError, ConfigError
from bcp_pipeline.procs import run_command
from bcp_pipeline.config.resources import BcpOptions
from bcp_pipeline.backends.bcp.render import JobSpec, global_flags, job_run_argv, upload_argv
from bcp_pipeline.backends.retries import RetryPolicy

SDK_VERSION = "4.19.1"  # the last ngcsdk with Base Command in it
INSTALL_HINT = ("install one of: NVIDIA's ngc CLI (https://org.ngc.nvidia.com/setup/installers/cli, then put `ngc` "
                f"on PATH or set backends.bcp.ngc), or ngcsdk {SDK_VERSION}: pip install \"bcp-pipeline[bcp]\"")
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


# -- the ngc CLI ---------------------------------------------------------------------------------------------
class CliTransport(Transport):
    """NVIDIA's `ngc` CLI, one subprocess per call, `--format_type json`."""

    name = "cli"

    def run_ngc(self, args: list[str], timeout: float = 120) -> str:
        """Any ngc command's stdout (errors as BackendCallError): also what bcp_lookups' read-only look-ups use."""
        return self._run(args, timeout).stdout

    def _run(self, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        try:
            return run_command([self.options.ngc, *args], timeout=timeout, hint=CONFIG_HINT)
        except CommandError as exc:  # what the service answered, as far as NVIDIA's error text says
            exc.http_status = http_status_in(exc.stderr)
            exc.unreachable = exc.returncode == 124 or (exc.http_status is None and unreachable_in(exc.stderr))
            raise

    def global_flags(self) -> list[str]:
        """--org/--team/--ace as configured, for a command of ours (every call passes them)."""
        return global_flags(self.options.org, self.options.team, self.options.ace)

    def submit(self, spec: JobSpec) -> str:
        output = self.run_ngc(job_run_argv(spec)[1:])
        try:
            return str(first_json(output)["job"]["id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendCallError(f"`ngc base-command job run` printed no job id ({exc}); output: {output[:500]}")

    def list_jobs(self, labels: list[str]) -> list[dict[str, Any]]:
        end, duration = list_window(self.options.list_duration)
        args = ["base-command", "job", "list", "--end-time", end.strftime("%Y-%m-%d::%H:%M:%S"),
                "--duration", duration]
        for name in labels:
            args += ["--label", name]
        data = first_json(self.run_ngc(args + self.global_flags()))
        return [job_object(item) for item in (data if isinstance(data, list) else [])]

    def job(self, job_id: str) -> dict[str, Any]:
        return job_object(first_json(self.run_ngc(["base-command", "job", "info", job_id, *self.global_flags()])))

    def log(self, job_id: str, replica: int | None, tail: int | None) -> str:
        # No --format_type json: NVIDIA's printer prints nothing for `job log` in JSON mode. The org/team/ACE
        # flags as on every other call: without them ngc falls back to its own config (or "Missing org").
        args = ["base-command", "job", "log", f"{job_id}:{replica}" if replica is not None else job_id]
        if tail:
            args += ["--tail", "--lines", str(tail)]
        return self.run_ngc(args + global_flags(self.options.org, self.options.team, self.options.ace, json_output=False))

    def kill(self, job_id: str) -> None:
        # `job kill` exits 0 even when the kill fails: its error is the JSON on stderr.
        argv = ["base-command", "job", "kill", job_id, *self.global_flags()]
        stderr = self._run(argv).stderr
        try:
            failed = "error" in first_json(stderr)
        except (ValueError, TypeError):
            failed = False  # no JSON error document: warnings at most
        if failed:
            raise CommandError([self.options.ngc, *argv], 0, stderr, hint=CONFIG_HINT)

    def preempt(self, job_id: str) -> None:
        # Unlike `job kill`, a failed `job preempt` exits 1 (its error document on stderr): _run raises.
        self.run_ngc(["base-command", "job", "preempt", job_id, *self.global_flags()])

    def resume(self, job_id: str) -> None:
        self.run_ngc(["base-command", "job", "resume", job_id, *self.global_flags()])

    def upload(self, workspace: str, source: Path, destination: str, exclude: tuple[str, ...]) -> None:
        self.run_ngc(upload_argv(self.options, workspace, source, destination, exclude)[1:], timeout=1800)

    def ace(self, name: str) -> dict[str, Any]:
        data = first_json(self.run_ngc(["base-command", "ace", "info", name, *self.global_flags()]))
        return data.get("ace", data) if isinstance(data, dict) else {}


# -- ngcsdk ----------------------------------------------------------------------------------------------------
class SdkTransport(Transport):
    """ngcsdk 4.19.1's `Client().basecommand` in this process: no CLI download, one import for the whole run."""

    name = "sdk"

    def __init__(self, options: BcpOptions) -> None:
        super().__init__(options)
        self._client: Any = None

    def _make_client(self) -> Any:
        import ngcsdk  # pylint: disable=import-outside-toplevel

        client = ngcsdk.Client()
        # The key stays where NGC keeps it (NGC_CLI_API_KEY / ~/.ngc/config); only org/team/ACE are ours. The org
        # is passed even where it comes from NGC_CLI_ORG or ngc's config: given none, ngcsdk silently takes an
        # nvapi- key's own org, so every call would go to another org than the CLI's (and `check`'s) under the
        # same settings; given one, it refuses a key of another org ("doesn't match organization").
        client.configure(org_name=self.options.org or client.config.org_name, team_name=self.options.team,
                         ace_name=self.options.ace)
        return client

    def call(self, what: str, operation: Callable[[Any], Any]) -> Any:
        """Run one ngcsdk operation on the (lazily made) client; its prints (progress, transfer summaries) are
        kept off our stdout; its errors become BackendCallError."""
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                if self._client is None:
                    self._client = self._make_client()
                return operation(self._client)
        except Exception as exc:  # ngcsdk raises NgcException, requests' errors, ValueError for bad config...
            message = " ".join(str(exc).split()) or type(exc).__name__
            status = sdk_http_status(exc, message)
            raise BackendCallError(f"ngcsdk {what}: {message}\n  {CONFIG_HINT}", http_status=status,
                                   unreachable=status is None and sdk_unreachable(exc, message)) from None

    def submit(self, spec: JobSpec) -> str:
        kwargs = sdk_run_kwargs(spec)
        return str(self.call("basecommand.jobs.run", lambda c: c.basecommand.jobs.run(**kwargs).id))

    def list_jobs(self, labels: list[str]) -> list[dict[str, Any]]:
        end, duration = list_window(self.options.list_duration)
        span = timedelta(seconds=parse_duration(duration))
        jobs = self.call("basecommand.jobs.list",
                          lambda c: c.basecommand.jobs.list(labels=list(labels), end_time=end, duration=span))
        return [job.toDict() for job in jobs or []]

    def job(self, job_id: str) -> dict[str, Any]:
        job, _history = self.call("basecommand.jobs.info", lambda c: c.basecommand.jobs.info(int(job_id)))
        return job.toDict()

    def log(self, job_id: str, replica: int | None, tail: int | None) -> str:
        lines = self.call("basecommand.jobs.log", lambda c: list(c.basecommand.jobs.log(
            int(job_id), replica_id=replica, tail=bool(tail) or None, lines=tail or None)))
        return "".join(lines)

    def kill(self, job_id: str) -> None:
        # kill_job, not jobs.kill: the latter prints its errors instead of raising them.
        self.call("basecommand.jobs.kill", lambda c: c.basecommand.jobs.kill_job(
            self.options.org or c.config.org_name, int(job_id), team_name=self.options.team or c.config.team_name))

    def preempt(self, job_id: str) -> None:
        self.call("basecommand.jobs.preempt", lambda c: c.basecommand.jobs.preempt(int(job_id)))

    def resume(self, job_id: str) -> None:
        self.call("basecommand.jobs.resume", lambda c: c.basecommand.jobs.resume(int(job_id)))

    def upload(self, workspace: str, source: Path, destination: str, exclude: tuple[str, ...]) -> None:
        self.call("basecommand.workspace.upload", lambda c: c.basecommand.workspace.upload(
            workspace, source=str(source), destination=destination, exclude=list(exclude)))

    def ace(self, name: str) -> dict[str, Any]:
        return self.call("basecommand.aces.info", lambda c: c.basecommand.aces.info(name).toDict())


LIST_WINDOW_AHEAD = timedelta(days=1)


def list_window(duration: str, now: datetime | None = None) -> tuple[datetime, str]:
    """(end, duration) of a `job list` window that covers `duration` back from now and a day ahead of this
    machine's clock: the service stamps a job's createdDate with its own clock, and ngcsdk's window otherwise ends
    at ours, so a server clock running ahead would hide a job just created (and a resumed orchestrator would
    submit a duplicate). The end is naive UTC, the form ngcsdk formats with a `Z`."""
    now = now or datetime.now(timezone.utc)
    end = now.astimezone(timezone.utc).replace(tzinfo=None, microsecond=0) + LIST_WINDOW_AHEAD
    return end, format_duration(parse_duration(duration) + int(LIST_WINDOW_AHEAD.total_seconds()))


# NVIDIA's client words an HTTP failure as "Client Error: 429 Response: ..." / "Server Error: 503 ..." (NgcAPIError),
# "Error (unexpected format) : 429 : ..." (the token exchange), "Error 429 Response: ..." or requests' own
# "429 Client Error: Too Many Requests for url: ..."; a refused key as "Invalid apikey".
_STATUS_PATTERNS = (re.compile(r"\b(?:Client|Server) Error: (\d{3})\b"),
                    re.compile(r"\bError \(unexpected format\) : (\d{3})\b"),
                    re.compile(r"\bError (\d{3}) Response\b"),
                    re.compile(r"\b(\d{3}) (?:Client|Server) Error\b"))
_UNREACHABLE = re.compile(r"is not reachable|Max retries exceeded|Connection (?:refused|reset|aborted)|"
                          r"timed out|Read timeout|Name or service not known|RemoteDisconnected", re.IGNORECASE)


def http_status_in(text: str) -> int | None:
    """The HTTP status NVIDIA's client reported in an error text; None when it names none."""
    for pattern in _STATUS_PATTERNS:
        found = pattern.search(text)
        if found:
            return int(found.group(1))
    return 401 if "Invalid apikey" in text else None


def unreachable_in(text: str) -> bool:
    return bool(_UNREACHABLE.search(text))


def sdk_http_status(exc: BaseException, message: str) -> int | None:
    """The HTTP status behind an ngcsdk exception: NgcAPIError's status_code (its response's), else its class
    (AuthenticationException is raised without a response for "Invalid apikey"), else its text."""
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(status, int):
        return status
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "AuthenticationException" in names:
        return 401
    if "AccessDeniedException" in names:
        return 403
    return http_status_in(message)


def sdk_unreachable(exc: BaseException, message: str) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"ConnectionError", "Timeout", "TimeoutError"}) or unreachable_in(message)


def sdk_run_kwargs(spec: JobSpec) -> dict[str, Any]:
    """`Client().basecommand.jobs.run(**kwargs)` for `spec`: the same JobCreateRequest as the CLI's argv.

    The CLI's parser turns flags into these types (durations to timedelta, secrets to tuples) and always
    coschedules replicas (minAvailability = replicas); the Python API leaves that to us.
    """
    kwargs: dict[str, Any] = {
        "name": spec.name, "image": spec.image, "instance": spec.instance, "result": spec.result,
        "commandline": spec.commandline, "workspace": list(spec.workspaces) or None,
        "preempt": spec.preempt, "priority": spec.priority, "order": spec.order,
        "label": list(spec.labels) or None, "secret": [tuple(s.split(":")) for s in spec.secrets] or None,
        "env_var": list(spec.env) or None, "org": spec.org, "team": spec.team, "ace": spec.ace,
    }
    if spec.replicas > 1:
        kwargs.update(replicas=spec.replicas, array_type=spec.array_type, coscheduling=True)
    for key, value in (("total_runtime", spec.total_runtime), ("min_timeslice", spec.min_timeslice)):
        if value:
            kwargs[key] = timedelta(seconds=parse_duration(value))
    return kwargs


# -- choosing one ----------------------------------------------------------------------------------------------
def sdk_available() -> bool:
    return importlib.util.find_spec("ngcsdk") is not None and importlib.util.find_spec("basecommand") is not None


def cli_available(options: BcpOptions) -> bool:
    return shutil.which(options.ngc) is not None


def choose_transport(options: BcpOptions) -> str:
    """`cli` or `sdk` for `options.transport`; a ConfigError that says how to get one when neither is there."""
    wanted = options.transport
    if wanted in ("cli", "auto") and cli_available(options):
        return "cli"
    if wanted in ("sdk", "auto") and sdk_available():
        return "sdk"
    if wanted == "cli":
        raise ConfigError(f"backends.bcp.transport is cli, but the ngc CLI {options.ngc!r} is not on PATH; "
                          f"{INSTALL_HINT} (and set transport: sdk or auto)")
    if wanted == "sdk":
        raise ConfigError(f"backends.bcp.transport is sdk, but ngcsdk {SDK_VERSION} cannot be imported: "
                          f"pip install \"bcp-pipeline[bcp]\"")
    raise ConfigError(f"the BCP backend needs NVIDIA's ngc CLI or ngcsdk {SDK_VERSION}, and neither is here: "
                      f"{INSTALL_HINT}")


def make_transport(options: BcpOptions) -> Transport:
    return CliTransport(options) if choose_transport(options) == "cli" else SdkTransport(options)


NOTHING_DONE = "Nothing was submitted or recorded"  # how `run` ends a refusal made before a run is recorded
SCOPED_KEY_PREFIX = "nvapi-"  # personal and service keys (ngcbase.constants): the bearer itself, one org each


def check_credentials(options: BcpOptions, environ: dict[str, str] | None = None,
                      transport: Transport | None = None) -> None:
    """Before a run is recorded: an API key and an ACE must be configured (names what is missing, and where).

    A personal or service key (`nvapi-...`) works in the one org it was made for, so with one the org is checked
    too, by one call through `transport` (default: the configured one): NVIDIA's error, then which org the key
    belongs to and where this run's org came from."""
    env = os.environ if environ is None else environ
    config = read_ngc_config(env)
    missing = []
    key = configured_api_key(env)
    if not key:
        missing.append("an API key (NGC_CLI_API_KEY, or `ngc config set`)")
    org = _setting(options.org, "backends.bcp.org", env, "NGC_CLI_ORG", config, "org")
    ace = _setting(options.ace, "backends.bcp.ace", env, "NGC_CLI_ACE", config, "ace")
    if not org:
        missing.append("an org (backends.bcp.org, NGC_CLI_ORG, or `ngc config set`)")
    if not ace:
        missing.append("an ACE (backends.bcp.ace, NGC_CLI_ACE, or `ngc config set`)")
    if missing:
        raise ConfigError("the BCP backend is missing " + "; ".join(missing) + f". {NOTHING_DONE}")
    if key.startswith(SCOPED_KEY_PREFIX):
        _check_key_org(transport or make_transport(options), key, org, ace[0])


def configured_api_key(environ: Mapping[str, str]) -> str:
    """The API key NVIDIA's client will use (NGC_CLI_API_KEY, else ngc's config file); "" when none. For deciding
    what kind of key it is: never to be shown, logged or passed on."""
    return environ.get("NGC_CLI_API_KEY") or read_ngc_config(dict(environ)).get("apikey") or ""


def _setting(value: str | None, name: str, env: dict[str, str], env_name: str, config: dict[str, str],
             config_key: str) -> tuple[str, str] | None:
    """(value, where it was set) in NGC's order of precedence for our calls: pipelines.yaml, env, `ngc config`."""
    for found, where in ((value, name), (env.get(env_name), env_name), (config.get(config_key), "ngc config")):
        if found:
            return found, where
    return None


def _check_key_org(transport: Transport, key: str, org: tuple[str, str], ace: str) -> None:
    try:
        transport.ace(ace)
    except BackendCallError as exc:
        key_org = scoped_key_org(key)
        if key_org is None or key_org == org[0]:
            raise
        raise ConfigError(f"{exc}\n  The NGC API key (an nvapi- key) belongs to org {key_org!r}, but this run uses "
                          f"org {org[0]!r} (set in {org[1]}). Set backends.bcp.org: {key_org} in pipelines.yaml "
                          f"(or NGC_CLI_ORG={key_org}), or use a key made in org {org[0]!r}. {NOTHING_DONE}"
                          ) from None


def scoped_key_org(key: str) -> str | None:
    """The org an nvapi- key belongs to, as NVIDIA's client asks it (`/v3/keys/get-caller-info`, through ngcsdk);
    None when ngcsdk is not here or cannot tell."""
    if not sdk_available():
        return None
    try:
        import ngcsdk  # pylint: disable=import-outside-toplevel

        with contextlib.redirect_stdout(io.StringIO()):
            return str(ngcsdk.Client().authentication.get_sak_key_details(key).orgName or "") or None
    except Exception:  # pylint: disable=broad-except  # only a better message is at stake
        return None


def read_ngc_config(environ: dict[str, str]) -> dict[str, str]:
    """The `[CURRENT]` section of NGC's config file (`$NGC_CLI_HOME/.ngc/config`, else `~/.ngc/config`)."""
    home = Path(environ.get("NGC_CLI_HOME") or Path.home())
    parser = configparser.ConfigParser()
    try:
        parser.read(home / ".ngc" / "config")
    except configparser.Error:
        return {}
    return dict(parser["CURRENT"]) if parser.has_section("CURRENT") else {}


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


def retry_policy(options: BcpOptions) -> RetryPolicy:
    """How the calls that must survive a busy API (uploads, a driver's start and hand-over) are retried."""
    return RetryPolicy(attempts=options.retry_attempts, backoff=options.retry_backoff_seconds,
                       max_wait=max(options.retry_backoff_seconds, 60.0))
