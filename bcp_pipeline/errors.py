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
    """A call to a backend's service failed (an external command, or an API call through a client library)."""


class CommandError(BackendCallError):
    """An external command (ngc, sbatch, ...) failed; carries its argv, exit code and stderr."""

    def __init__(self, argv: list[str], returncode: int, stderr: str, hint: str = ""):
        self.argv, self.returncode, self.stderr = argv, returncode, stderr
        tail = _error_text(stderr)[-2000:]
        message = f"`{argv[0]}` exited {returncode}: {tail or '(no stderr)'}"
        if hint:
            message += f"\n  {hint}"
        super().__init__(message)


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
