"""The BCP transport through NVIDIA's `ngc` CLI: one subprocess per call, `--format_type json`, its errors read for
the HTTP status and reachability NVIDIA's client reports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.bcp.render import JobSpec, global_flags, job_run_argv, upload_argv
from bcp_pipeline.backends.bcp.transport import CONFIG_HINT, Transport, as_dict, first_json, job_object, list_window
from bcp_pipeline.errors import BackendCallError, CommandError
from bcp_pipeline.procs import run_command

NO_USER = "User not found in specified org/team."  # NVIDIA's printer, when `user who` has no user to show


# -- the ngc CLI ---------------------------------------------------------------------------------------------
class CliTransport(Transport):
    """NVIDIA's `ngc` CLI, one subprocess per call, `--format_type json`."""

    name = "cli"

    def run_ngc(self, args: list[str], timeout: float = 120) -> str:
        """Any ngc command's stdout (errors as BackendCallError): also what the read-only look-ups below use."""
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
            raise BackendCallError(
                f"`ngc base-command job run` printed no job id ({exc}); output: {output[:500]}"
            ) from None

    def list_jobs(self, labels: list[str]) -> list[dict[str, Any]]:
        end, duration = list_window(self.options.list_duration)
        args = ["base-command", "job", "list", "--end-time", end.strftime("%Y-%m-%d::%H:%M:%S"), "--duration", duration]
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
        return self.run_ngc(
            args + global_flags(self.options.org, self.options.team, self.options.ace, json_output=False)
        )

    def telemetry(
        self, job_id: str, replica: int, types: list[str], interval_unit: str, interval_time: int
    ) -> list[dict[str, Any]]:
        args = [
            "base-command",
            "job",
            "telemetry",
            f"{job_id}:{replica}",
            "--interval-unit",
            interval_unit,
            "--interval-time",
            str(interval_time),
        ]
        for name in types:
            args += ["--type", name]
        data = self._json(args)
        return [as_dict(item) for item in (data if isinstance(data, list) else [])]

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

    def _json(self, args: list[str]) -> Any:
        """`ngc ARGS` with --org/--team/--ace, its output as JSON."""
        return printed_json(self.run_ngc([*args, *self.global_flags()]), args)

    def who(self) -> dict[str, Any]:
        output = self.run_ngc(["user", "who", *self.global_flags()])
        return {} if output.strip() == NO_USER else printed_json(output, ["user", "who"])

    def image(self, name: str) -> dict[str, Any]:
        return self._json(["registry", "image", "info", name.removeprefix("nvcr.io/")])

    def workspace(self, name: str) -> dict[str, Any]:
        return self._json(["workspace", "info", name])

    def secret_list(self) -> Any:
        return self._json(["user", "secret", "list"])

    def client_version(self) -> str:
        return " ".join(self.run_ngc(["version", "info"], timeout=60).split())[:200]

    def job_statuses(self, job_id: str) -> list[dict[str, Any]]:
        data = self._json(["base-command", "job", "info", job_id])
        return list((data.get("jobStatusHistory") if isinstance(data, dict) else None) or [])

    def storage_quota(self) -> list[dict[str, Any]]:
        data = self._json(["user", "storage"])
        return [as_dict(item) for item in (data if isinstance(data, list) else [data]) if item is not None]


def printed_json(output: str, args: list[str]) -> Any:
    try:
        return first_json(output)
    except ValueError:  # NVIDIA's printer words some answers as a sentence even in JSON mode
        raise BackendCallError(f"`ngc {' '.join(args)}` printed no JSON: {' '.join(output.split())[:200]}") from None


# NVIDIA's client words an HTTP failure as "Client Error: 429 Response: ..." / "Server Error: 503 ..." (NgcAPIError),
# "Error (unexpected format) : 429 : ..." (the token exchange), "Error 429 Response: ..." or requests' own
# "429 Client Error: Too Many Requests for url: ..."; a refused key as "Invalid apikey".
_STATUS_PATTERNS = (
    re.compile(r"\b(?:Client|Server) Error: (\d{3})\b"),
    re.compile(r"\bError \(unexpected format\) : (\d{3})\b"),
    re.compile(r"\bError (\d{3}) Response\b"),
    re.compile(r"\b(\d{3}) (?:Client|Server) Error\b"),
)
_UNREACHABLE = re.compile(
    r"is not reachable|Max retries exceeded|Connection (?:refused|reset|aborted)|"
    r"timed out|Read timeout|Name or service not known|RemoteDisconnected",
    re.IGNORECASE,
)


def http_status_in(text: str) -> int | None:
    """The HTTP status NVIDIA's client reported in an error text; None when it names none."""
    for pattern in _STATUS_PATTERNS:
        found = pattern.search(text)
        if found:
            return int(found.group(1))
    return 401 if "Invalid apikey" in text else None


def unreachable_in(text: str) -> bool:
    return bool(_UNREACHABLE.search(text))
