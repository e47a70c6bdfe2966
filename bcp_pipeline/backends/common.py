"""Pieces every backend shares: placeholder values, the stage command, log-line parsing, log tails."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from ..config.pipelines import substitute
from ..config.resources import RankLayout
from .contract import JobProgress, JobRequest

LINE_PREFIX = "##bcp-pipeline "  # the stage programs' machine-readable lines (stages/_common.py)
OUTPUT_DIGEST_ENV = "BCP_PIPELINE_OUTPUT_DIGEST"  # stages/_common.py reads these two under the same names
OTHER_OUTPUTS_ENV = "BCP_PIPELINE_OTHER_OUTPUTS"


def folder_writer_lock(workspace: Path) -> Path:
    """The writer lock of a folder that stands in for the workspace (local, Slurm): beside it, so two orchestrators
    of different config files or state folders that share the folder share the lock (on Slurm, on the shared file
    system the folder must be on)."""
    return workspace.parent / f".{workspace.name}.writer.lock"


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


def progress_from_logs(texts: list[str]) -> JobProgress | None:
    """Sum the last progress line of each rank's log: items done of total across the job."""
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
