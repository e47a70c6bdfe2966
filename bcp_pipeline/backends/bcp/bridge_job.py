"""A Megatron-Bridge pretrain on BCP: the script its job runs (pure: text in, text out; `plan` prints it beside the
`ngc` command, and it is uploaded under a name made from its content).

The script writes the data list (data_list.py, from the preprocess manifests) into the run's folder in the workspace,
then starts the ranks under `bcprun --nnodes ${NGC_ARRAY_SIZE} --npernode G -no_redirect` (NVIDIA's own spelling of
the flag that keeps rank output on the launching replica's stdout), or under torchrun on a one-replica job, which
needs no bcprun. Like the stage jobs it is right under both ways BCP may run a multi-replica commandline: once, on
replica 0, whose bcprun starts every node's ranks, or on every replica, each bcprun starting its own node's.
Output goes, under pipefail, to the job's log and to a log in the job's result folder; the job ends with the
training's exit status. Bridge's step line comes from the LAST rank only: in replica 0's log in the first model, in
the last replica's in the second; the backend's `training_log` reads whichever has it, and `check` shows which.
Each rank starts through stages/rank_start.py, which binds it to its GPU's NUMA node and, on the later replicas of
a multi-node job, first waits for the rendezvous at replica 0 to answer (NVIDIA's launcher's BCP step).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bcp_pipeline.backends.bcp.paths import code_destination
from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.shared.bridge_command import data_list_argv, gpus_per_node, rank_argv
from bcp_pipeline.backends.shared.command import placeholder_values
from bcp_pipeline.backends.shared.nemo_script import RESULTS, WORKSPACE, shell_word
from bcp_pipeline.config import bridge
from bcp_pipeline.config.resources import BcpOptions

NO_REDIRECT = "-no_redirect"  # NVIDIA's launcher's spelling; a `check` profile may show this ACE's bcprun wants another
# A multi-node job's ranks on the later replicas first wait (at most this long) for the rendezvous at replica 0 to
# answer, as NVIDIA's launcher's BCP step pause_and_prime_dns_connections does (its 300 s): a replica's DNS name of
# the master can lag its start (stages/rank_start.py).
RENDEZVOUS_WAIT_SECONDS = 300


@dataclass(frozen=True, kw_only=True)
class BridgeJob:
    """What the script needs, every path written with the WORKSPACE / RESULTS stand-ins."""

    title: str
    python: str
    rank_argv: list[str]  # one rank's command: python3 -u ENTRY --recipe R --overrides-file FILE OVERRIDES...
    data_list_argv: list[str]  # writes the data list override into the run's folder
    run_dir: str  # the run's folder in the workspace
    log_file: str  # the training's output, in the job's result folder
    replicas: int
    gpus_per_node: int
    no_redirect: str = NO_REDIRECT


def bridge_job(request: JobRequest, options: BcpOptions, stages_dir: Path, no_redirect: str = NO_REDIRECT) -> BridgeJob:
    """The script's inputs for the stage's request; SubmissionError naming the stage when its section cannot be."""
    stage, resources = request.stage, request.resources("bcp")
    code = f"{WORKSPACE}/{code_destination(options, stages_dir)}"
    values = placeholder_values(request, workspace=WORKSPACE, results=RESULTS, code=code, python=options.python)
    replicas = request.rank_layout("bcp").nodes
    wait = RENDEZVOUS_WAIT_SECONDS if replicas > 1 else None
    return BridgeJob(
        title=f"stage {stage.name} of pipeline {request.pipeline.name}, run {request.run_id}",
        python=options.python,
        rank_argv=rank_argv(request, "bcp", values, resources.total_runtime, wait_for_master=wait),
        data_list_argv=data_list_argv(request, values),
        run_dir=bridge.run_dir(stage, values, request.run_id),
        log_file=f"{RESULTS}/{bridge.run_name(stage, request.run_id)}.log",
        replicas=replicas,
        gpus_per_node=gpus_per_node(request, "bcp"),
        no_redirect=no_redirect,
    )


def render(job: BridgeJob) -> str:
    """The script's text."""
    head = job.rank_argv.index("--overrides-file") + 2  # the program and its options on one line, an override a line
    lines = [
        "#!/usr/bin/env bash",
        f"# bcp-pipeline: {job.title}: Megatron-Bridge, its ranks started by bcprun, under pipefail.",
        "# Rendered by bcp_pipeline/backends/bcp/bridge_job.py (`bcp-pipeline plan` prints it); arguments: the",
        "# workspace's and the job result folder's mount points.",
        "set -euo pipefail",
        "workspace=${1:?usage: SCRIPT WORKSPACE_MOUNT RESULT_MOUNT} results=${2:?usage: SCRIPT WORKSPACE_MOUNT "
        "RESULT_MOUNT}",
    ]
    if job.replicas > 1:
        lines += [
            "# Wherever BCP runs this commandline (once, on replica 0, or on every replica), bcprun starts the ranks",
            "# it has to: every node's from replica 0, or each replica its own node's. Each replica that runs this",
            "# writes the same data list (atomically), so no rank reads it before its own replica wrote it.",
        ]
    lines += [
        f"mkdir -p {shell_word(job.run_dir)}",
        "",
        "# The data list: every .bin/.idx pair of the preprocess manifests, weighted by tokens, as the override",
        f"# {bridge.DATA_PATH_KEY}=[weight,prefix,...] in the run's folder, where every rank reads it.",
        " ".join(shell_word(word) for word in job.data_list_argv),
        "",
        "# Each rank's command: this project's entry program (stages/bridge_pretrain.py), the recipe, the overrides,",
        "# started by stages/rank_start.py (its NUMA binding; on a later replica, first the wait for the rendezvous).",
        "rank=(",
        "  " + " ".join(shell_word(word) for word in job.rank_argv[:head]),
        *[f"  {shell_word(word)}" for word in job.rank_argv[head:]],
        ")",
        "",
        "# The ranks, their output to this job's log and to the result folder as it comes; the job's exit status is",
        "# the training's.",
        "status=0",
        f"{launch(job)} 2>&1 | tee -a {shell_word(job.log_file)} || status=$?",
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


def launch(job: BridgeJob) -> str:
    """What starts the ranks: bcprun over the job's replicas (their count as BCP tells it), or torchrun on its one
    node (`--standalone`: a rendezvous on this node; the rank's command past `python3 -u`)."""
    if job.replicas > 1:
        return (
            f'bcprun --nnodes "${{NGC_ARRAY_SIZE:-1}}" --npernode {job.gpus_per_node} {job.no_redirect} '
            '--cmd "${rank[*]@Q}"'
        )
    return (
        f"{shell_word(job.python)} -m torch.distributed.run --standalone --nproc-per-node {job.gpus_per_node} "
        '"${rank[@]:2}"'
    )
