"""The `qsub` script of a pretrain stage on Grid Engine, the TSUBAME way (pure: values in, text out; `plan` prints
it, golden-tested in tests/golden/gridengine/): torchrun on every host, in the stage's Apptainer image.

NVIDIA's TSUBAME4 guide runs NeMo without its launcher: `apptainer run --nv -B DIR $NEMO_IMAGE torchrun
--nproc_per_node=$NGPU /opt/NeMo/examples/nlp/language_modeling/<script>.py <hydra overrides>`. So the job runs, in
the stage's Apptainer image:

1. the data list from the preprocess manifests (stages/data_list.py), as on BCP;
2. the engine's set-up: for the NeMo launcher, the launcher in its debug mode (NEMO_LAUNCHER_DEBUG=1: the BCP job
   script's step, shared/nemo_script.launcher_debug_step), which writes the composed config
   `<results>/<run>/<run>_hydra.yaml` and runs nothing; Megatron-Bridge needs none;
3. on every host of the job (`$PE_HOSTFILE`; one host: this one), through `qrsh -inherit` as the backend's other
   parallel jobs do, one `torchrun --nnodes N --nproc_per_node P --rdzv-backend c10d --rdzv-endpoint MASTER:PORT`
   of the training: NeMo's `megatron_gpt_pretraining.py --config-path=<results>/<run> --config-name=<run>_hydra.yaml`,
   or this project's stages/bridge_pretrain.py with its recipe and overrides (config/bridge.py).

The overrides are config/nemo.py's, as on BCP: this run's own NeMo run name (so a continuation resumes from its
`-last` checkpoint), `+training.exp_manager.max_time_per_run` (the runtime minus nemo.time_margin: each job trains
and saves before `h_rt`), `trainer.num_nodes` x `trainer.devices` = rank_layout's nodes x processes_per_node.
Failure: the script runs under `set -euo pipefail`; a host's torchrun fails when one of its ranks does, and the job
when one host does. Output: each rank's lines go to `logs/ID/rank-<RANK>.log` (rank 0's holds NeMo's training
progress; Bridge's last rank's holds its step lines: where `logs`, `status` and the report read them on this backend);
torchrun's own lines, a failed rank's name, the launcher's and the data list's go to the job log.
"""

from __future__ import annotations

from dataclasses import dataclass

from bcp_pipeline.backends.shared import templates
from bcp_pipeline.backends.shared.nemo_script import launcher_debug_step, shell_word


@dataclass(frozen=True, kw_only=True)
class HostsTraining:
    """What the script needs: every path as the container sees it, the `#$` lines and exports already rendered."""

    title: str  # e.g. "run RUN, stage pretrain"
    what: str  # the engine, in words, for the script's first line
    directives: list[str]  # the `#$` lines
    exports: list[str]  # `export` lines (the run's and the stage's env)
    logs: str  # the run's log folder
    nodes: int
    per_node: int
    container: list[str]  # `apptainer exec --nv --bind ... IMAGE`
    data_list_argv: list[str]  # builds the data list into data_list_file
    data_list_file: str
    setup: list[str]  # shell lines after the data list, before the training (the engine's)
    program: str  # shell text: what each torchrun worker runs (the training, with its arguments)
    master_port: str  # a shell arithmetic expression
    start_hosts: str = "qrsh"  # how the other hosts start: qrsh or mpirun (fan_out_to_hosts)
    master_addr_command: str | None = None  # shell text whose output is MASTER_ADDR (None: the first host)


def nemo_setup(
    launcher_dir: str, overrides: list[str], data_list_file: str, config_dir: str, config_name: str
) -> list[str]:
    """The NeMo launcher's set-up: the training config as it composes it for the stage (debug mode: written,
    nothing run), checked to be there."""
    config = f"{config_dir}/{config_name}"
    return [
        "# The training config as NVIDIA's launcher composes it for the stage (debug mode: written, nothing run).",
        *launcher_debug_step(overrides, data_list_file, launcher_dir, config, inside="in_image"),
        f"in_image test -s {shell_word(config)} || "
        f"{{ echo {shell_word(f'bcp-pipeline: the NeMo launcher wrote no {config}')} >&2; exit 1; }}",
        "",
    ]


def nemo_program(trainer: str, config_dir: str, config_name: str) -> str:
    """NeMo's training script with the composed config."""
    return "python3 -u " + " ".join(
        shell_word(word) for word in (trainer, f"--config-path={config_dir}", f"--config-name={config_name}")
    )


# What each torchrun worker runs before the program: c10d assigns the ranks (by host name, not by the order of
# $PE_HOSTFILE), so each worker writes its own log, rank-<RANK>.log, as the backend's other jobs do, and a worker that
# fails names itself on the job log (`failure_detail` reads that line and shows the tail of that rank's log).
WORKER_LOG = (
    'log="$0/rank-$(printf %05d "$RANK").log"; "$@" >> "$log" 2>&1 || '
    '{ code=$?; echo "bcp-pipeline: rank $RANK on $HOSTNAME exited $code" >&2; exit "$code"; }'
)


def torchrun_call(runner: str, endpoint: str, program: str) -> str:
    """One host's `RUNNER --nnodes $nodes --nproc_per_node $per_node --rdzv-backend c10d --rdzv-endpoint ENDPOINT
    --rdzv-id $JOB_ID --no-python bash -c WORKER_LOG LOGDIR PROGRAM` (shell text; RUNNER runs torchrun, in the
    container where there is one). Also the Grid Engine backend's `launcher: torchrun` (render.py)."""
    return (
        f'{runner} --nnodes "$nodes" --nproc_per_node "$per_node" --rdzv-backend c10d --rdzv-endpoint '
        f'{endpoint} \\\n    --rdzv-id "$JOB_ID" --no-python bash -c {shell_word(WORKER_LOG)} \\\n'
        f'    "$logs/$JOB_ID" {program}'
    )


# qrsh by its path in the cell ($SGE_ROOT/bin/ARCH): a site's job environment need not have it on PATH (shell text,
# setting $qrsh). Also the `check` probe's (check.py).
FIND_QRSH = r"""qrsh=qrsh
if [ -n "${SGE_ROOT:-}" ]; then
  arch=$("$SGE_ROOT/util/arch" 2>/dev/null || true)
  if [ -x "$SGE_ROOT/bin/$arch/qrsh" ]; then qrsh="$SGE_ROOT/bin/$arch/qrsh"; fi
fi"""
# A job over several hosts (fan_out_to_hosts): the hosts of $PE_HOSTFILE (hosts.sh, with gridengine.master_addr_command
# in master_addr_command.sh), then one host's part started on each by `qrsh -inherit` (start_by_qrsh.sh) or Open
# MPI's mpirun (start_by_mpirun.sh; the part checks its rank in from_mpirun.sh). The templates say why each line is.
HOSTS = templates.load(__package__, "hosts.sh")
MASTER_ADDR_COMMAND = templates.load(__package__, "master_addr_command.sh")
QRSH = templates.load(__package__, "start_by_qrsh.sh")
MPIRUN = templates.load(__package__, "start_by_mpirun.sh")
FROM_MPIRUN = templates.load(__package__, "from_mpirun.sh")
START_HOSTS = ("qrsh", "mpirun")


def host_part(start_hosts: str, *body: str) -> list[str]:
    """The script's first lines when it runs as one host's part (`--node NODE ADDRESS PORT`, started by
    fan_out_to_hosts): BODY, its `NODE` the host's node rank ("$2"; from Open MPI for mpirun's); the part exits
    with BODY's status."""
    if start_hosts == "mpirun":
        lines = [
            "if [ \"${1:-}\" = --node ]; then  # one host's part, started below by Open MPI's mpirun",
            *(f"  {line}" for line in FROM_MPIRUN.splitlines()),
        ]
        node = '"$node"'
    else:
        lines = ['if [ "${1:-}" = --node ]; then  # one host\'s part, started below by `qrsh -inherit`']
        node = '"$2"'
    return [*lines, *(f"  {line.replace('NODE', node)}" for line in body), "  exit $?", "fi"]


def fan_out_to_hosts(port_expression: str, start_hosts: str = "qrsh", master_addr_command: str | None = None) -> str:
    """The batch script's part of a job over several hosts (shell text): the hosts of $PE_HOSTFILE, one per node,
    then this script again on each as `--node NODE ADDRESS PORT` (host_part), by `qrsh -inherit` (tight
    integration) or Open MPI's mpirun (`start_hosts`); the first host's name (or what `master_addr_command`
    prints there) and PORT_EXPRESSION's value the rendezvous; the job fails where any host's part does. Also the
    Grid Engine backend's distributed stages (render.py)."""
    assert start_hosts in START_HOSTS, start_hosts
    addr = templates.fill(MASTER_ADDR_COMMAND, COMMAND=master_addr_command.strip()) if master_addr_command else ""
    head = templates.fill(HOSTS, PORT_EXPRESSION=port_expression, MASTER_ADDR_COMMAND=addr, FIND_QRSH=FIND_QRSH)
    return f"{head}\n{MPIRUN if start_hosts == 'mpirun' else QRSH}"


def render(job: HostsTraining) -> str:
    """The whole `qsub` script."""
    world = job.nodes * job.per_node
    lines = [
        "#!/bin/bash",
        f"# bcp-pipeline {job.title}: {job.what} the TSUBAME way, {job.nodes} host(s) x {job.per_node} GPU(s) = "
        f"WORLD_SIZE {world}: torchrun on every host, in the Apptainer image "
        "(bcp_pipeline/backends/gridengine/training.py).",
        *job.directives,
        "set -euo pipefail",
        f"logs={shell_word(job.logs)} nodes={job.nodes} per_node={job.per_node}",
        *job.exports,
        f'in_image() {{ {" ".join(shell_word(word) for word in job.container)} "$@"; }}',
        "train_host() {  # MASTER_ADDR MASTER_PORT: this host's torchrun, its ranks' logs their own",
        '  mkdir -p "$logs/$JOB_ID"',
        f"  {torchrun_call('in_image torchrun', chr(34) + '$1:$2' + chr(34), job.program)}",
        "}",
        *(host_part(job.start_hosts, 'train_host "$3" "$4"') if job.nodes > 1 else []),
        'mkdir -p "$logs/$JOB_ID"',
        "",
        "# The data list: every .bin/.idx pair of the preprocess manifests, weighted by tokens.",
        f"mkdir -p {shell_word(job.data_list_file.rsplit('/', 1)[0])}",
        "in_image " + " ".join(shell_word(word) for word in job.data_list_argv),
        "",
        *job.setup,
        "# The training: one torchrun a host; the job's status is the worst host's.",
    ]
    if job.nodes > 1:
        lines.append(fan_out_to_hosts(job.master_port, job.start_hosts, job.master_addr_command))
    else:
        lines.append(f'train_host "$(hostname)" "$(({job.master_port}))"')
    return "\n".join(lines) + "\n"
