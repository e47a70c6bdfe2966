"""The exception hierarchy. Every message names the bad value, where it came from, and what to do next."""

from __future__ import annotations


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


def is_refused_credentials(exc: BaseException) -> bool:
    """The service refused the key itself (401) or what it may do (403)."""
    return isinstance(exc, BackendCallError) and exc.http_status in (401, 403)


class CommandError(BackendCallError):
    """An external command (ngc, sbatch, ...) failed; carries its argv, exit code and stderr."""

    def __init__(self, argv: list[str], returncode: int, stderr: str, hint: str = "", *,
                 http_status: int | None = None, unreachable: bool = False):
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
        return payload["error"]
    return " ".join(stderr.split())


class SubmissionError(PipelineError):
    """A backend refused a job, or it could not be rendered for that backend."""


class StageFailed(PipelineError):
    """A stage's job ended unsuccessfully."""


class VerificationFailed(StageFailed):
    """A stage's verification found a different number of outputs than expected."""


class ReportError(PipelineError):
    """The run report cannot be made: its optional extra is missing, or its file cannot be written."""
