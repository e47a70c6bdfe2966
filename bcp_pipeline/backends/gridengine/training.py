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


def nemo_setup(launcher_dir: str, overrides: list[str], data_list_file: str, config_dir: str,
               config_name: str) -> list[str]:
    """The NeMo launcher's set-up: the training config as it composes it for the stage (debug mode: written,
    nothing run), checked to be there."""
    config = f"{config_dir}/{config_name}"
    return ["# The training config as NVIDIA's launcher composes it for the stage (debug mode: written, nothing run).",
            *launcher_debug_step(overrides, data_list_file, launcher_dir, config, inside="in_image"),
            f"in_image test -s {shell_word(config)} || "
            f"{{ echo {shell_word(f'bcp-pipeline: the NeMo launcher wrote no {config}')} >&2; exit 1; }}", ""]


def nemo_program(trainer: str, config_dir: str, config_name: str) -> str:
    """NeMo's training script with the composed config."""
    return "python3 -u " + " ".join(shell_word(word) for word in (trainer, f"--config-path={config_dir}",
                                                                    f"--config-name={config_name}"))


# What each torchrun worker runs before the program: c10d assigns the ranks (by host name, not by the order of
# $PE_HOSTFILE), so each worker writes its own log, rank-<RANK>.log, as the backend's other jobs do, and a worker that
# fails names itself on the job log (`failure_detail` reads that line and shows the tail of that rank's log).
WORKER_LOG = ('log="$0/rank-$(printf %05d "$RANK").log"; "$@" >> "$log" 2>&1 || '
              '{ code=$?; echo "bcp-pipeline: rank $RANK on $HOSTNAME exited $code" >&2; exit "$code"; }')


def torchrun_call(runner: str, endpoint: str, program: str) -> str:
    """One host's `RUNNER --nnodes $nodes --nproc_per_node $per_node --rdzv-backend c10d --rdzv-endpoint ENDPOINT
    --rdzv-id $JOB_ID --no-python bash -c WORKER_LOG LOGDIR PROGRAM` (shell text; RUNNER runs torchrun, in the
    container where there is one). Also the Grid Engine backend's `launcher: torchrun` (render.py)."""
    return (f'{runner} --nnodes "$nodes" --nproc_per_node "$per_node" --rdzv-backend c10d --rdzv-endpoint '
            f'{endpoint} \\\n    --rdzv-id "$JOB_ID" --no-python bash -c {shell_word(WORKER_LOG)} \\\n'
            f'    "$logs/$JOB_ID" {program}')


# qrsh by its path in the cell ($SGE_ROOT/bin/ARCH): a site's job environment need not have it on PATH (shell text,
# setting $qrsh). Also the `check` probe's (check.py).
FIND_QRSH = r'''qrsh=qrsh
if [ -n "${SGE_ROOT:-}" ]; then
  arch=$("$SGE_ROOT/util/arch" 2>/dev/null || true)
  if [ -x "$SGE_ROOT/bin/$arch/qrsh" ]; then qrsh="$SGE_ROOT/bin/$arch/qrsh"; fi
fi'''
# More than one host: the hosts of $PE_HOSTFILE, one per node, the rendezvous at the first; this script is copied
# next to the logs, and started again on each host (QRSH or MPIRUN below).
HOSTS = r'''mapfile -t hosts < <(awk '{print $1}' "$PE_HOSTFILE")
if [ "${#hosts[@]}" -ne "$nodes" ]; then
  echo "bcp-pipeline: \$PE_HOSTFILE lists ${#hosts[@]} host(s), the stage needs $nodes (one per node: a parallel environment with allocation_rule 1, or the site's whole-node request)" >&2
  exit 1
fi
master_addr="${hosts[0]}" master_port="$((PORT_EXPRESSION))"
MASTER_ADDR_COMMAND
mkdir -p "$logs/$JOB_ID" && cp "$0" "$logs/$JOB_ID/job.sh"
FIND_QRSH'''
# gridengine.master_addr_command, verbatim in a function (so the site's text may hold comments and quotes), run
# here: the batch script runs on the first host of $PE_HOSTFILE (the job's master host).
MASTER_ADDR_COMMAND = r'''master_addr_command() {  # gridengine.master_addr_command: the first word it prints is MASTER_ADDR
COMMAND
}
if ! said=$(master_addr_command) || ! read -r master_addr _ <<< "$said" || [ -z "$master_addr" ]; then
  echo "bcp-pipeline: gridengine.master_addr_command gave no address on $(hostname): ${said:-(nothing printed)}" >&2
  exit 1
fi'''
# qrsh: one `qrsh -inherit` a host (tight integration: each host's part is a task of the job, accounted and killed
# with it); the job fails where any host's part does.
QRSH = r'''code=0 pids=()
for node in "${!hosts[@]}"; do
  "$qrsh" -inherit -nostdin "${hosts[node]}" /bin/bash "$logs/$JOB_ID/job.sh" --node "$node" "$master_addr" "$master_port" &
  pids+=($!)
done
for node in "${!pids[@]}"; do
  wait "${pids[node]}" || { echo "bcp-pipeline: node $node (${hosts[node]}) failed" >&2; code=1; }
done
exit "$code"'''
# mpirun: Open MPI starts one process a host (`-npernode 1`) over a hostfile of the hosts in $PE_HOSTFILE's order,
# so its rank K runs on hosts[K]: node K (FROM_MPIRUN reads it). Where it sees Grid Engine (SGE_ROOT, ARC,
# PE_HOSTFILE and JOB_ID set, $SGE_ROOT/bin/$ARC/qrsh there) Open MPI starts its daemons on the other hosts by
# `qrsh -inherit` itself, so they are the job's tasks and `qdel` ends them; without, it would use ssh, outside Grid
# Engine: said on the job log. (Open MPI gives each process its own process group, which Grid Engine's kill of the
# first host's part missed on the test cell: FROM_MPIRUN ends it with its parent.) `--bind-to none`: Open MPI binds
# a process to one core by default, and each starts all of its host's ranks.
MPIRUN = r'''if [ -z "${ARC:-}" ] && [ -n "${arch:-}" ]; then export ARC="$arch"; fi
if [ -z "${SGE_ROOT:-}" ] || [ ! -x "$SGE_ROOT/bin/${ARC:-}/qrsh" ]; then
  echo "bcp-pipeline: warning: no \$SGE_ROOT/bin/\$ARC/qrsh here: Open MPI may start the other hosts with ssh, outside Grid Engine (qdel would not end them)" >&2
fi
printf '%s slots=1\n' "${hosts[@]}" > "$logs/$JOB_ID/hostfile"
code=0
mpirun -np "$nodes" -npernode 1 -hostfile "$logs/$JOB_ID/hostfile" --bind-to none \
  /bin/bash "$logs/$JOB_ID/job.sh" --node mpirun "$master_addr" "$master_port" "${hosts[0]}" || code=$?
if [ "$code" -ne 0 ]; then echo "bcp-pipeline: mpirun over ${hosts[*]} exited $code" >&2; fi
exit "$code"'''
# A host's part started by mpirun: its node rank is its Open MPI rank, checked (node 0 must run on the first host,
# where MASTER_ADDR is); the OMPI_COMM_WORLD_* variables are then dropped: they describe the host launchers, and
# a rank's library (Lightning, mpi4py) must not take them for its own rank.
FROM_MPIRUN = r'''node="${OMPI_COMM_WORLD_RANK:-}" this_host=$(hostname)
if [ -z "$node" ] || [ "${OMPI_COMM_WORLD_SIZE:-}" != "$nodes" ]; then
  echo "bcp-pipeline: $this_host: not started by mpirun over $nodes hosts (OMPI_COMM_WORLD_RANK=${OMPI_COMM_WORLD_RANK:-unset}, OMPI_COMM_WORLD_SIZE=${OMPI_COMM_WORLD_SIZE:-unset})" >&2
  exit 1
fi
if [ "$node" = 0 ] && [ "${5%%.*}" != "${this_host%%.*}" ]; then
  echo "bcp-pipeline: mpirun started node 0 on $this_host, not on the first host $5 (MASTER_ADDR's)" >&2
  exit 1
fi
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE \
  OMPI_COMM_WORLD_NODE_RANK
# Open MPI made this part a process group of its own, which the cell's kill of the job can miss (`qdel` left the
# first host's ranks running on the test cell): the group ends with its parent, mpirun or Open MPI's daemon
# (only where it is this part's own group, never the batch script's: /proc/PID/stat's 5th field).
parent=$PPID stat=($(< /proc/$$/stat))
if [ "${stat[4]:-}" = "$$" ]; then
  ( while kill -0 "$parent" 2>/dev/null; do sleep 1; done; kill -KILL 0 ) </dev/null >/dev/null 2>&1 &
fi'''
START_HOSTS = ("qrsh", "mpirun")


def host_part(start_hosts: str, *body: str) -> list[str]:
    """The script's first lines when it runs as one host's part (`--node NODE ADDRESS PORT`, started by
    fan_out_to_hosts): BODY, its `NODE` the host's node rank ("$2"; from Open MPI for mpirun's); the part exits
    with BODY's status."""
    if start_hosts == "mpirun":
        lines = ['if [ "${1:-}" = --node ]; then  # one host\'s part, started below by Open MPI\'s mpirun',
                 *(f"  {line}" for line in FROM_MPIRUN.splitlines())]
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
    head = HOSTS.replace("PORT_EXPRESSION", port_expression).replace("FIND_QRSH", FIND_QRSH)
    addr = MASTER_ADDR_COMMAND.replace("COMMAND", master_addr_command.strip()) if master_addr_command else ""
    head = head.replace("MASTER_ADDR_COMMAND\n", f"{addr}\n" if addr else "")
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
        'train_host() {  # MASTER_ADDR MASTER_PORT: this host\'s torchrun, its ranks\' logs their own',
        '  mkdir -p "$logs/$JOB_ID"',
        f'  {torchrun_call("in_image torchrun", chr(34) + "$1:$2" + chr(34), job.program)}',
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
