"""How a job's program is spelled for any backend: the ${...} values, the stage's command, its environment, and
shell words (a command line a POSIX shell splits back into the same argv)."""

from __future__ import annotations

import re
import shlex
from typing import Any

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.config.placeholders import substitute
from bcp_pipeline.config.resources import RankLayout
from bcp_pipeline.errors import SubmissionError

SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
OUTPUT_DIGEST_ENV = "BCP_PIPELINE_OUTPUT_DIGEST"  # stages/_common.py reads these two under the same names
OTHER_OUTPUTS_ENV = "BCP_PIPELINE_OTHER_OUTPUTS"
STREAM_DIGESTS_ENV = "BCP_PIPELINE_STREAM_DIGESTS"  # stages/_streamed_inputs.py: the upstreams' output digests


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
    builtins = {
        "workspace": workspace,
        "results": results,
        "code": code,
        "python": python,
        "run_id": request.run_id,
        "stage": request.stage.name,
    }
    return {**builtins, **{k: substitute(v, builtins) for k, v in request.pipeline.vars.items()}}


def resolved_env(request: JobRequest, backend: str, values: dict[str, str]) -> dict[str, str]:
    """The job's environment from the config, and (a data stage's job) what defines its outputs."""
    env = {key: substitute(value, values) for key, value in request.resources(backend).env.items()}
    if request.output_digest is not None:  # read by stages/_common.py claim_outputs, under these names
        env |= {OUTPUT_DIGEST_ENV: request.output_digest, OTHER_OUTPUTS_ENV: request.other_outputs}
    if request.stream_digests:  # a streamed edge: the program takes its inputs as the upstream completes them
        env[STREAM_DIGESTS_ENV] = ",".join(request.stream_digests)
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
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": master_port,
        "WORLD_SIZE": layout.world_size,
        "nodes": layout.nodes,
        "per_node": layout.per_node,
    }


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
