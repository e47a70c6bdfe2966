"""The BCP transport through ngcsdk 4.19.1's `Client().basecommand`, in this process: no CLI download, one import
for the whole run; its exceptions read for the HTTP status and reachability behind them."""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.bcp.render import JobSpec
from bcp_pipeline.backends.bcp.transport import CONFIG_HINT, Transport, as_dict, list_window
from bcp_pipeline.backends.bcp.transport_cli import http_status_in, unreachable_in
from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.resources import BcpOptions
from bcp_pipeline.errors import BackendCallError


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
        client.configure(
            org_name=self.options.org or client.config.org_name, team_name=self.options.team, ace_name=self.options.ace
        )
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
            raise BackendCallError(
                f"ngcsdk {what}: {message}\n  {CONFIG_HINT}",
                http_status=status,
                unreachable=status is None and sdk_unreachable(exc, message),
            ) from None

    def submit(self, spec: JobSpec) -> str:
        kwargs = sdk_run_kwargs(spec)
        return str(self.call("basecommand.jobs.run", lambda c: c.basecommand.jobs.run(**kwargs).id))

    def list_jobs(self, labels: list[str]) -> list[dict[str, Any]]:
        end, duration = list_window(self.options.list_duration)
        span = timedelta(seconds=parse_duration(duration))
        jobs = self.call(
            "basecommand.jobs.list", lambda c: c.basecommand.jobs.list(labels=list(labels), end_time=end, duration=span)
        )
        return [job.toDict() for job in jobs or []]

    def job(self, job_id: str) -> dict[str, Any]:
        job, _history = self.call("basecommand.jobs.info", lambda c: c.basecommand.jobs.info(int(job_id)))
        return job.toDict()

    def log(self, job_id: str, replica: int | None, tail: int | None) -> str:
        lines = self.call(
            "basecommand.jobs.log",
            lambda c: list(
                c.basecommand.jobs.log(int(job_id), replica_id=replica, tail=bool(tail) or None, lines=tail or None)
            ),
        )
        return "".join(lines)

    def telemetry(
        self, job_id: str, replica: int, types: list[str], interval_unit: str, interval_time: int
    ) -> list[dict[str, Any]]:
        measurements, _job = self.call(
            "basecommand.jobs.telemetry",
            lambda c: c.basecommand.jobs.telemetry(
                job_id=int(job_id),
                replica_id=replica,
                types=list(types),
                interval_unit=interval_unit,
                interval_time=interval_time,
            ),
        )
        return [as_dict(item) for item in measurements or [] if item is not None]

    def kill(self, job_id: str) -> None:
        # kill_job, not jobs.kill: the latter prints its errors instead of raising them.
        self.call(
            "basecommand.jobs.kill",
            lambda c: c.basecommand.jobs.kill_job(
                self.options.org or c.config.org_name, int(job_id), team_name=self.options.team or c.config.team_name
            ),
        )

    def preempt(self, job_id: str) -> None:
        self.call("basecommand.jobs.preempt", lambda c: c.basecommand.jobs.preempt(int(job_id)))

    def resume(self, job_id: str) -> None:
        self.call("basecommand.jobs.resume", lambda c: c.basecommand.jobs.resume(int(job_id)))

    def upload(self, workspace: str, source: Path, destination: str, exclude: tuple[str, ...]) -> None:
        self.call(
            "basecommand.workspace.upload",
            lambda c: c.basecommand.workspace.upload(
                workspace, source=str(source), destination=destination, exclude=list(exclude)
            ),
        )

    def ace(self, name: str) -> dict[str, Any]:
        return self.call("basecommand.aces.info", lambda c: c.basecommand.aces.info(name).toDict())

    def who(self) -> dict[str, Any]:
        return as_dict(self.call("users.who", lambda c: c.users.who()) or {})

    def image(self, name: str) -> dict[str, Any]:
        name = name.removeprefix("nvcr.io/")
        return self.call("registry.image.info", lambda c: c.registry.image.info(name)[0].toDict())

    def workspace(self, name: str) -> dict[str, Any]:
        return self.call("basecommand.workspace.info", lambda c: as_dict(c.basecommand.workspace.info(name)))

    def secret_list(self) -> Any:
        return self.call("organization.secrets.list", lambda c: c.organization.secrets.list().toDict())

    def client_version(self) -> str:
        return f"ngcsdk {importlib.metadata.version('ngcsdk')}"

    def job_statuses(self, job_id: str) -> list[dict[str, Any]]:
        _job, history = self.call("basecommand.jobs.info", lambda c: c.basecommand.jobs.info(int(job_id)))
        return [as_dict(item) for item in history or []]

    def storage_quota(self) -> list[dict[str, Any]]:
        def quota(c: Any) -> Any:
            return c.users.storage_quota(user_id=c.users.user_who().user.id)[0]

        return [as_dict(item) for item in self.call("users.storage_quota", quota) or [] if item is not None]


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
        "name": spec.name,
        "image": spec.image,
        "instance": spec.instance,
        "result": spec.result,
        "commandline": spec.commandline,
        "workspace": list(spec.workspaces) or None,
        "preempt": spec.preempt,
        "priority": spec.priority,
        "order": spec.order,
        "label": list(spec.labels) or None,
        "secret": [tuple(s.split(":")) for s in spec.secrets] or None,
        "env_var": list(spec.env) or None,
        "org": spec.org,
        "team": spec.team,
        "ace": spec.ace,
    }
    if spec.replicas > 1:
        kwargs.update(replicas=spec.replicas, array_type=spec.array_type, coscheduling=True)
    for key, value in (("total_runtime", spec.total_runtime), ("min_timeslice", spec.min_timeslice)):
        if value:
            kwargs[key] = timedelta(seconds=parse_duration(value))
    return kwargs
