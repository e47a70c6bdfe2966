"""The exception hierarchy. Every message names the bad value, where it came from, and what to do next."""

from __future__ import annotations

import re


class PipelineError(Exception):
    """Base class: the CLI prints these without a traceback and exits non-zero."""

    exit_code = 1


class ConfigError(PipelineError):
    """pipelines.yaml (or a --set override) is invalid."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None, key: str | None = None):
        self.file, self.line, self.key = file, line, key
        where = ""
        if file is not None:
            where = f"{file}:{line}: " if line is not None else f"{file}: "
        if key:
            where += f"{key}: "
        super().__init__(f"{where}{message}")


class StateError(PipelineError):
    """A run's state file is missing, corrupt, or does not fit the request (e.g. re-sharding)."""


class BackendCallError(PipelineError):
    """A call to a backend's service failed (an external command, or an API call through a client library).

    `http_status`: the HTTP status the service answered, where the transport could tell (None: no answer, or not
    known); `unreachable`: the service gave no answer at all (connection refused, timed out)."""

    def __init__(self, message: str = "", *, http_status: int | None = None, unreachable: bool = False):
        self.http_status, self.unreachable = http_status, unreachable
        super().__init__(message)


TRANSIENT_STATUSES = frozenset({408, 429})  # and every 5xx: the service may answer the same call later


def is_transient(exc: BaseException) -> bool:
    """A failed call that may succeed if made again: rate-limited (429), a server error (5xx), a timeout, or no
    answer at all. Never a 401/403 (a wrong or expired key stays wrong) or another 4xx (a bad request)."""
    if not isinstance(exc, BackendCallError):
        return False
    status = exc.http_status
    if status is not None:
        return status in TRANSIENT_STATUSES or 500 <= status <= 599
    return exc.unreachable


# NVIDIA's words for a refused key or org where no HTTP status comes with them: ngcsdk refuses a configured org
# before any call ("Invalid org. Choose from [...]", an nvapi- key's "Provided organization: ..., doesn't match
# organization for which API Key has permissions"), and a status in a wording the transports do not parse.
_REFUSED_TEXT = re.compile(
    r"\b40[13]\b|invalid api ?key|unauthori[sz]ed|forbidden|invalid org|"
    r"doesn't match organization",
    re.IGNORECASE,
)
_NOT_FOUND_TEXT = re.compile(r"\b404\b|not found|could not be found|does not exist", re.IGNORECASE)


def is_refused_credentials(exc: BaseException) -> bool:
    """The service refused the key itself (401) or what it may do (403), or NVIDIA's client refused the key's org
    before asking. The HTTP status decides where the transport knew it (so a 429 is never a refused key, whatever
    its text says); NVIDIA's wording only where no status came back."""
    if not isinstance(exc, BackendCallError):
        return False
    if exc.http_status is not None:
        return exc.http_status in (401, 403)
    return not exc.unreachable and bool(_REFUSED_TEXT.search(str(exc)))


def is_not_found(exc: BaseException) -> bool:
    """What was asked for does not exist: a 404, or NVIDIA's client saying so in words ("could not be found", ...).
    Never a call that may succeed if made again (a 429, a 5xx, no answer)."""
    if not isinstance(exc, BackendCallError) or is_transient(exc):
        return False
    return exc.http_status == 404 or bool(_NOT_FOUND_TEXT.search(str(exc)))


class CommandError(BackendCallError):
    """An external command (ngc, sbatch, ...) failed; carries its argv, exit code and stderr."""

    def __init__(
        self,
        argv: list[str],
        returncode: int,
        stderr: str,
        hint: str = "",
        *,
        http_status: int | None = None,
        unreachable: bool = False,
    ):
        self.argv, self.returncode, self.stderr = argv, returncode, stderr
        tail = _error_text(stderr)[-2000:]
        message = f"`{argv[0]}` exited {returncode}: {tail or '(no stderr)'}"
        if hint:
            message += f"\n  {hint}"
        super().__init__(message, http_status=http_status, unreachable=unreachable)


def _error_text(stderr: str) -> str:
    """ngc prints errors as {"error": "..."}: show the message, not the JSON around it."""
    import json

    try:
        payload = json.loads(stderr)
    except ValueError:
        return " ".join(stderr.split())
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        return str(payload["error"])
    return " ".join(stderr.split())


class BackendUnreachable(PipelineError):
    """The backend's service has not answered a status query for longer than its `status_outage_limit`: the run
    stops waiting, and leaves its jobs as they are (they may well be running)."""

    exit_code = 75  # EX_TEMPFAIL (sysexits.h): the same command may succeed later


class SubmissionError(PipelineError):
    """A backend refused a job, or it could not be rendered for that backend."""


class ReportError(PipelineError):
    """The run report cannot be made: its optional extra is missing, or its file cannot be written."""
