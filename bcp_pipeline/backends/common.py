"""Pieces every backend shares: placeholder values, the stage command, log-line parsing, log tails; and what the
batch-scheduler backends (Slurm, Grid Engine) share: job names and the job-side paths."""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.pipelines import substitute
from bcp_pipeline.config.resources import RankLayout
from bcp_pipeline.errors import SubmissionError
from bcp_pipeline.backends.contract import JobProgress, JobRequest
from bcp_pipeline.training_log import last_progress

LINE_PREFIX = "##bcp-pipeline "  # the stage programs' machine-readable lines (stages/_common.py)
NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def outage_seconds(limit: str | None) -> float | None:
    """A backend's `status_outage_limit` (validated on load) in seconds; None: no limit."""
    return None if limit is None else float(parse_duration(limit))


@dataclass(frozen=True, kw_only=True)
class Paths:
    """Where things are as a cluster's nodes see them (the same paths as on the submit host)."""

    workspace: str
    code: str  # the stages/ folder
    run_dir: str  # holds logs/
    python: str | None  # None: the default (the orchestrator's interpreter, python3 in a container)
    orchestrator_python: str

    @property
    def logs(self) -> str:
        return f"{self.run_dir}/logs"


def job_name(run_id: str, stage: str, kind: str) -> str:
    """`RUN.STAGE` or `RUN.STAGE.verify` (stage names never hold '.'), safe for `squeue --name`, `qsub -N` and
    file names."""
    return NAME_UNSAFE.sub("_", f"{run_id}.{stage}" + (".verify" if kind == "verify" else ""))


def paths_for(options: Any, *, config_dir: Path, stages_dir: Path, run_dir: Path, workspace_name: str,
              orchestrator_python: str) -> Paths:
    """The job-side paths: the workspace folder (relative to the config file), stages/ and the run folder."""
    workspace = (config_dir / options.workspace_dir / workspace_name).resolve()
    return Paths(workspace=str(workspace), code=str(stages_dir), run_dir=str(run_dir), python=options.python,
                 orchestrator_python=orchestrator_python)


OUTPUT_DIGEST_ENV = "BCP_PIPELINE_OUTPUT_DIGEST"  # stages/_common.py reads these two under the same names
OTHER_OUTPUTS_ENV = "BCP_PIPELINE_OTHER_OUTPUTS"


def user_writer_lock(service: str, workspace: str) -> Path:
    """The writer lock of a workspace that is no folder here (a BCP workspace, a Kubernetes volume claim): in this
    user's state folder ($XDG_STATE_HOME, else ~/.local/state), keyed by the service (an org, a cluster and
    namespace) and the workspace's name, so every orchestrator on this machine sees it, whatever its config file or
    --state-dir."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "bcp-pipeline" / "workspace-locks" / safe_file_name(service) / f"{safe_file_name(workspace)}.lock"


def safe_file_name(name: str) -> str:
    """A name as one path component: characters other than letters, digits, `-`, `_`, `.` become `_`."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return cleaned if cleaned.strip(".") else "_"


def stage_command(request: JobRequest, backend: str, values: dict[str, str]) -> list[str]:
    """argv of the job's program: the backend section's `command`, else `PYTHON ${code}/PROGRAM ARGS`."""
    resources = request.resources(backend)
    if request.kind == "stage" and resources.command:
        raw = list(resources.command)
    else:
        raw = ["${python}", f"${{code}}/{request.program}", *request.args]
    return [substitute(part, values) for part in raw]


def placeholder_values(request: JobRequest, *, workspace: str, results: str, code: str, python: str) -> dict[str, str]:
    """Values for ${...} as the job sees them; pipeline vars may themselves use the built-ins."""
    builtins = {"workspace": workspace, "results": results, "code": code, "python": python,
                "run_id": request.run_id, "stage": request.stage.name}
    return {**builtins, **{k: substitute(v, builtins) for k, v in request.pipeline.vars.items()}}


def resolved_env(request: JobRequest, backend: str, values: dict[str, str]) -> dict[str, str]:
    """The job's environment from the config, and (a data stage's job) what defines its outputs."""
    env = {key: substitute(value, values) for key, value in request.resources(backend).env.items()}
    if request.output_digest is not None:  # read by stages/_common.py claim_outputs, under these names
        env |= {OUTPUT_DIGEST_ENV: request.output_digest, OTHER_OUTPUTS_ENV: request.other_outputs}
    return env


def apptainer_argv(image: str, binds: list[str]) -> list[str]:
    """`apptainer exec --nv --bind SRC:DST,... IMAGE` (Apptainer's own grammar: one comma-separated --bind), the
    prefix of each rank's command where a Slurm or Grid Engine stage runs in an Apptainer image."""
    return ["apptainer", "exec", "--nv", "--bind", ",".join(binds), image]


def shell_exports(request: JobRequest, backend: str, values: dict[str, str], where: str) -> list[str]:
    """`export KEY=VALUE` lines of the backend section's env for a job script; a key no shell could set is refused."""
    env = resolved_env(request, backend, values)
    for key in env:
        if not SHELL_NAME.match(key):
            raise SubmissionError(f"{where}: {backend} env name {key!r} is not a shell variable name")
    return [f"export {key}={shlex.quote(value)}" for key, value in env.items()]


def rendezvous(layout: RankLayout, master_addr: str, master_port: str) -> dict[str, Any] | None:
    """What `plan` shows of where a multi-rank job's ranks meet (None for one rank): the values, or how the job
    derives them where only the running job knows them (a node name, a job id)."""
    if layout.world_size == 1:
        return None
    return {"MASTER_ADDR": master_addr, "MASTER_PORT": master_port, "WORLD_SIZE": layout.world_size,
            "nodes": layout.nodes, "per_node": layout.per_node}


def parse_lines(text: str, kind: str) -> list[dict[str, Any]]:
    """Every `##bcp-pipeline KIND {json}` payload in `text`, in order (bad JSON is ignored: logs get cut)."""
    found = []
    marker = f"{LINE_PREFIX}{kind} "
    for line in text.splitlines():
        index = line.find(marker)
        if index < 0:
            continue
        try:
            found.append(json.loads(line[index + len(marker):]))
        except ValueError:
            continue
    return found


def progress_from_logs(texts: list[str], *, training: bool = False) -> JobProgress | None:
    """Sum the last progress line of each rank's log: items done of total across the job. For a training job,
    rank 0's (the first text's) steps and loss, from its training lines, where they are found."""
    if training and texts and (found := training_progress(texts[0])) is not None:
        return found
    done = total = 0
    unit = "items"
    seen = False
    for text in texts:
        lines = parse_lines(text, "progress")
        if lines:
            last = lines[-1]
            done += int(last.get("done", 0))
            total += int(last.get("total", 0))
            unit = str(last.get("unit", unit))
            seen = True
    return JobProgress(done=done, total=total, unit=unit) if seen else None


def training_progress(text: str) -> JobProgress | None:
    """A training job's steps done (of its total, where the log says) and last loss, from its rank 0 log."""
    found = last_progress(text)
    if found is None:
        return None
    return JobProgress(done=found.steps_done, total=found.total or 0, unit="steps", loss=found.loss,
                       step_seconds=found.step_seconds)


def joined_logs(paths: list[Path], tail: int | None) -> str:
    """Log files as one text (each headed `==> NAME <==` where there are several); `tail` keeps each one's last
    lines. What `logs` shows on the backends whose logs are files here."""
    parts = []
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        text = last_lines(text, tail) if tail else text
        parts.append(text if len(paths) == 1 else f"==> {path.name} <==\n{text}")
    return "\n".join(parts)


def read_tail(path: Path, max_bytes: int = 65536) -> str:
    """The end of a (possibly huge) log file."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            return handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def last_lines(text: str, count: int) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-count:])


_DOUBLE_QUOTE_SPECIAL = frozenset('$`"\\!')


def shell_quote(text: str) -> str:
    """shlex.quote, except that a value holding single quotes and nothing a double-quoted string would expand is
    double-quoted, so nested command lines read like the guide's: `--commandline "bcprun ... --cmd 'python3 ...'"`."""
    quoted = shlex.quote(text)
    if quoted != text and "'" in text and not _DOUBLE_QUOTE_SPECIAL.intersection(text):
        return f'"{text}"'
    return quoted


def shell_join(argv: list[str]) -> str:
    """A command line a POSIX shell splits back into exactly `argv`."""
    return " ".join(shell_quote(a) for a in argv)
