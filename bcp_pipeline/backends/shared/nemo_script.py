"""The script a NeMo pretrain job runs on BCP (pure: text in, text out; `plan` prints it beside the `ngc` command).

Why a script of our own around NVIDIA's launcher (NVIDIA/NeMo-Framework-Launcher's
nemo_launcher/core/launchers.py, class BCPLauncher, at the 23.11 tag; measured by running it there): run as the
guide runs it,
`main.py cluster_type=bcp` writes `<results>/<run>/<run>_submission.sh` and runs it itself, with
- its output captured and never printed: the training's lines reach only a `log-*.out` file in the workspace,
  never the job log (so `logs`, `status` and the report would see nothing), and
- the script's last line `bcprun ... 2>&1 | tee -a log-*.out` without pipefail: a training that crashes exits 0,
  and BCP reports FINISHED_SUCCESS.
So the job has the launcher only write that script (`NEMO_LAUNCHER_DEBUG=1`: it prints a fake job id and runs
nothing), runs it under pipefail, and tees its output to the job log (live) and to a log in the job's result folder,
which is there even when BCP kills the job at its runtime. The job ends with the training's status.

The script takes the workspace's and the result folder's mount points as its two arguments (on BCP
`/mount_workspace` and `/results`), and every path in it is written from them. It is uploaded to the workspace
under a name made from its content, so the job's `--commandline` is one short line.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass

# Stand-ins for the shell variables the script defines, placed in values before they are substituted into paths;
# `shell_word` turns them back into "$workspace" etc. NUL never occurs in a config value.
WORKSPACE, RESULTS, NODES = "\0workspace\0", "\0results\0", "\0nodes\0"
_VARIABLES = {WORKSPACE: "$workspace", RESULTS: "$results", NODES: "${NGC_ARRAY_SIZE:-1}"}
_PIECES = re.compile("(" + "|".join(re.escape(v) for v in _VARIABLES) + ")")
_SAFE_IN_DOUBLE_QUOTES = re.compile(r'^[^"\\$`!]*$')


def shell_word(text: str) -> str:
    """One shell word for `text`, in which the stand-ins above expand as their shell variables and nothing else
    does (a Hydra interpolation `${...}` in an override stays literal)."""
    pieces = [piece for piece in _PIECES.split(text) if piece]
    if not any(piece in _VARIABLES for piece in pieces):
        return shlex.quote(text)
    if all(piece in _VARIABLES or _SAFE_IN_DOUBLE_QUOTES.match(piece) for piece in pieces):
        return '"' + "".join(_VARIABLES.get(piece, piece) for piece in pieces) + '"'
    return "".join(f'"{_VARIABLES[piece]}"' if piece in _VARIABLES else shlex.quote(piece) for piece in pieces)


@dataclass(frozen=True, kw_only=True)
class TrainingJob:
    """What the script needs, with paths already written with the WORKSPACE / RESULTS stand-ins."""

    title: str  # e.g. "stage pretrain of pipeline slimpajama-8b, run RUN"
    launcher_dir: str
    overrides: list[str]  # the launcher's Hydra overrides, the node count as NODES, without the data list
    data_list_argv: list[str]  # builds the data list into data_list_file
    data_list_file: str
    results_dir: str  # base_results_dir
    run_name: str  # training.run.name
    log_file: str  # the training's output, in the job's result folder
    replicas: int


def render(job: TrainingJob) -> str:
    """The script's text."""
    run_dir = f"{job.results_dir}/{job.run_name}"
    submission = f"{run_dir}/{job.run_name}_submission.sh"
    lines = [
        "#!/usr/bin/env bash",
        f"# bcp-pipeline: {job.title}: NVIDIA's NeMo launcher, then its training under pipefail.",
        "# Rendered by bcp_pipeline/backends/shared/nemo_script.py (`bcp-pipeline plan` prints it); arguments: the",
        "# workspace's and the job result folder's mount points.",
        "set -euo pipefail",
        "workspace=${1:?usage: SCRIPT WORKSPACE_MOUNT RESULT_MOUNT} results=${2:?usage: SCRIPT WORKSPACE_MOUNT "
        "RESULT_MOUNT}",
    ]
    if job.replicas > 1:
        lines += [
            "# The launcher runs on replica 0; its bcprun starts the ranks of every node.",
            'if [ "${NGC_ARRAY_INDEX:-0}" != 0 ]; then',
            '  echo "replica ${NGC_ARRAY_INDEX}: the launcher runs on replica 0"',
            "  exit 0",
            "fi",
        ]
    lines += [
        "",
        "# The data list: every .bin/.idx pair of the preprocess manifests, weighted by tokens.",
        " ".join(shell_word(word) for word in job.data_list_argv),
        "",
        "# The launcher only writes its submission script (NEMO_LAUNCHER_DEBUG): run by the launcher, the training's",
        "# output would never reach this job's log, and a crash would end the job with status 0.",
        *launcher_debug_step(job.overrides, job.data_list_file, job.launcher_dir, submission),
        "",
        "# The training, under pipefail: its output to this job's log and to the result folder as it comes, and its",
        "# exit status this job's.",
        "status=0",
        f"bash -o pipefail {shell_word(submission)} 2>&1 | tee -a {shell_word(job.log_file)} || status=$?",
        "",
        "# The run's configs and logs (not its checkpoints, which stay in the workspace) beside the job's results.",
        f"tar -C {shell_word(job.results_dir)} --exclude=checkpoints -cf - {shlex.quote(job.run_name)} "
        f'| tar -C "$results" -xf - || echo "could not copy the run folder to $results" >&2',
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


def launcher_debug_step(
    overrides: list[str], data_list_file: str, launcher: str, written: str, inside: str = ""
) -> list[str]:
    """The launcher run in its debug mode (NEMO_LAUNCHER_DEBUG: it composes the training config and writes it and
    its submission script, and runs nothing): the overrides as a bash array, then the data list file's lines, each
    an override of its own (config/data_list_command.py: three for per-split data), and `written` (a file the launcher
    writes) removed first, so a launcher that fails leaves no stale one behind.
    `inside`: the shell word that runs a command where the launcher's paths are (Grid Engine: `in_image`, its
    container); the data list file is read where the script runs. Shared with backends/gridengine/nemo.py."""
    prefix = f"{inside} " if inside else ""
    return [
        f"mapfile -t data_list < {shell_word(data_list_file)}",
        "overrides=(",
        *[f"  {shell_word(override)}" for override in overrides],
        '  "${data_list[@]}"',
        ")",
        f"{prefix}rm -f {shell_word(written)}",
        f'NEMO_LAUNCHER_DEBUG=1 {prefix}python3 {shell_word(launcher + "/main.py")} "${{overrides[@]}}"',
    ]


def file_name(stage: str, text: str) -> str:
    """`STAGE-<content hash>.sh`: a changed script is a new file, so a running job's script is never rewritten."""
    return f"{stage}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.sh"
