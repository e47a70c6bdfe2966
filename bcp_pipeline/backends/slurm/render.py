"""Pure rendering of a stage into a Slurm batch script (no I/O), golden-tested in tests/golden/slurm/.

A stage job is one `sbatch` script: resources as `#SBATCH` lines, then one `srun` that starts nodes x
ntasks_per_node tasks of the stage program. Every task exports RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and
NODE_RANK from Slurm's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE and SLURM_NODEID (so a
stale RANK in the submitting shell cannot leak into a job), and the batch script exports MASTER_ADDR (the first
node) and a per-job MASTER_PORT. Files of job ID in the run folder (on real clusters: a shared file system):

    logs/slurm-ID.log          the batch script's output: srun's own messages, e.g. "task 1: Exited with exit code 3"
    logs/ID/rank-NNNNN.log     stdout and stderr of each task, as the local backend writes them
    logs/slurm-ID.exit         srun's exit status, written last: the result once Slurm has forgotten the job

A stage with a `nemo:` section runs NVIDIA's NeMo launcher on the submit host with `cluster_type=bcm`: the
launcher writes and `sbatch`es its own job (named JOB_NAME.nemo.RUN_NAME), whose id is then tracked like any other.
A stage with a `megatron_bridge:` section is a batch script like a stage program's, with one task a GPU (each runs
stages/bridge_pretrain.py) after a one-task step that writes the data list (shared/bridge_command.py).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.shared.batch import Paths, job_name
from bcp_pipeline.backends.shared.bridge_command import data_list_argv, gpus_per_node, rank_argv, trains_with_bridge
from bcp_pipeline.backends.shared.command import (
    apptainer_argv,
    placeholder_values,
    rendezvous,
    shell_exports,
    shell_join,
    stage_command,
)
from bcp_pipeline.config import bridge
from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.instances import KNOWN_INSTANCES
from bcp_pipeline.config.resources import RankLayout, SlurmOptions, SlurmResources
from bcp_pipeline.errors import SubmissionError

# Each task records its own exit status (TASK_EXITS/rank-R.exit) when its program ends: srun may exit 0 for a job
# whose node was lost (NODE_FAIL), and the batch script then holds every rank to its own record.
TASK_WRAPPER = (
    "export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
    'LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE NODE_RANK=$SLURM_NODEID; "$@"; code=$?; '
    'printf \'%s\\n\' "$code" > "$BCP_PIPELINE_TASK_EXITS/rank-$RANK.exit"; exit "$code"'
)
NEMO_SUFFIX = ".nemo."  # JOB_NAME.nemo.RUN_NAME: the name of the job the NeMo launcher submits
# The batch script runs on the job's first node: its host name is the rendezvous address of every task, and the
# port comes from the job id, so two jobs sharing a node do not collide (stages/_common.rendezvous falls back to the
# same formula for tasks that lack the variable).
MASTER_PORT_EXPR = "20000 + SLURM_JOB_ID % 20000"
TRAINING_CORES_PER_GPU = 16  # a DGX A100's share (128 cores, 8 GPUs), where the node's cores are not known


@dataclass(frozen=True, kw_only=True)
class Shape:
    """A job's resources after deriving unset fields from the BCP section and the backend options."""

    nodes: int
    ntasks_per_node: int
    cpus_per_task: int
    time: str | None  # a Duration, e.g. 1h
    partition: str | None
    account: str | None
    exclusive: bool  # --exclusive and (unless `mem` says otherwise) --mem=0


def slurm_time(duration: str) -> str:
    """`1h30m` -> `01:30:00`, `5D` -> `5-00:00:00` (sbatch --time's days-hours:minutes:seconds)."""
    days, rest = divmod(parse_duration(duration), 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def shape(request: JobRequest, options: SlurmOptions) -> Shape:
    res: SlurmResources = request.resources("slurm")
    bcp = request.resources("bcp")
    layout = request.rank_layout("slurm")
    trains = trains_with_bridge(request, "slurm")
    if trains and res.ntasks_per_node is None:  # one task a GPU
        layout = RankLayout(nodes=layout.nodes, per_node=gpus_per_node(request, "slurm"))
    cpus = res.cpus_per_task or (training_cpus_per_task(request, layout.per_node) if trains else 1)
    result = Shape(
        nodes=layout.nodes,
        ntasks_per_node=layout.per_node,
        cpus_per_task=cpus,
        time=res.time or bcp.total_runtime,
        partition=res.partition or options.partition,
        account=res.account or options.account,
        exclusive=trains if res.exclusive is None else res.exclusive,
    )
    if min(result.nodes, result.ntasks_per_node, result.cpus_per_task) < 1:
        raise SubmissionError(
            f"{request.label}: slurm nodes, ntasks_per_node and cpus_per_task must be >= 1, got "
            f"{result.nodes} x {result.ntasks_per_node} x {result.cpus_per_task}"
        )
    return result


def training_cpus_per_task(request: JobRequest, ranks_per_node: int) -> int:
    """A Bridge rank's share of its node's cores (its dataloader workers, pinned-memory and NCCL threads need more
    than the one a task gets by default): slurm.cpus_per_node, else the cores of the stage's bcp.instance where it
    is a known DGX, else 16 a GPU (a DGX A100's share)."""
    res: SlurmResources = request.resources("slurm")
    known = KNOWN_INSTANCES.get(request.resources("bcp").instance or "")
    cores = res.cpus_per_node or (known.cpu_cores if known else TRAINING_CORES_PER_GPU * ranks_per_node)
    return max(1, cores // ranks_per_node)


def job_values(request: JobRequest, paths: Paths) -> dict[str, str]:
    res: SlurmResources = request.resources("slurm")
    python = paths.python or ("python3" if res.container_image else paths.orchestrator_python)
    return placeholder_values(
        request,
        workspace=paths.workspace,
        code=paths.code,
        python=python,
        results=f"{paths.run_dir}/results/{request.stage.name}",
    )


def batch_script(request: JobRequest, options: SlurmOptions, paths: Paths) -> str:
    """The whole `sbatch` script of a stage or verification job."""
    res: SlurmResources = request.resources("slurm")
    size = shape(request, options)
    values = job_values(request, paths)
    trains = trains_with_bridge(request, "slurm")
    program = rank_argv(request, "slurm", values, size.time) if trains else stage_command(request, "slurm", values)
    if res.container_image and not trains and not (request.kind == "stage" and res.command):
        # As on BCP: installs missing stage packages. Not for a Bridge rank, which needs none of them and whose
        # NeMo image must not get pinned packages installed over its own (as BCP and Grid Engine start it).
        program = ["bash", f"{paths.code}/bootstrap.sh", *program]
    apptainer = bool(res.container_image) and options.container == "apptainer"
    if apptainer:  # the same paths inside as outside, as Pyxis mounts them
        binds = [
            f"{paths.workspace}:{paths.workspace}",
            f"{paths.code}:{paths.code}",
            f"{paths.run_dir}:{paths.run_dir}",
            *res.container_mounts,
        ]
        program = apptainer_argv(str(res.container_image), binds) + program
    world = size.nodes * size.ntasks_per_node
    what = "verification of stage" if request.kind == "verify" else "stage"
    lines = [
        "#!/bin/bash",
        f"# bcp-pipeline run {request.run_id}, {what} {request.stage.name}: {size.nodes} node(s) x "
        f"{size.ntasks_per_node} task(s) = RANK 0..{world - 1} of WORLD_SIZE {world}",
    ]
    lines += [f"#SBATCH {flag}={shlex.quote(value)}" for flag, value in sbatch_flags(request, size, paths)]
    lines += ["#SBATCH --exclusive"] if size.exclusive else []
    lines += [f"#SBATCH {arg}" for arg in res.extra_args]
    lines += [
        f"logs={shlex.quote(paths.logs)}",
        f"export BCP_PIPELINE_RUN_ID={shlex.quote(request.run_id)} "
        f"BCP_PIPELINE_STAGE={shlex.quote(request.stage.name)}",
    ]
    lines += shell_exports(request, "slurm", values, request.label)
    task = f"bash -c {shlex.quote(TASK_WRAPPER)} bcp-pipeline-task"
    lines += [
        f'export MASTER_ADDR="$(hostname)" MASTER_PORT="$(({MASTER_PORT_EXPR}))"',
        'mkdir -p "$logs/$SLURM_JOB_ID"',
        'export BCP_PIPELINE_TASK_EXITS="$logs/$SLURM_JOB_ID"',
        'rm -f "$BCP_PIPELINE_TASK_EXITS"/rank-*.exit  # a requeued job starts over',
    ]
    if trains:
        lines += data_list_step(request, values, res, paths, apptainer)
    binding = (
        ["--cpu-bind=none"]
        if trains and res.numa_binding and not any(arg.startswith("--cpu-bind") for arg in res.srun_args)
        else []
    )  # the rank starter binds, by GPU locality
    lines += [
        "srun " + " \\\n  ".join([*srun_flags(res, paths, pyxis=not apptainer), *binding, task, shell_join(program)]),
        "code=$?",
        "# srun can exit 0 although a lost node's tasks never finished: every rank must have recorded 0.",
        f'if [ "$code" = 0 ]; then for rank in $(seq 0 {world - 1}); do '
        '{ read -r task_code < "$BCP_PIPELINE_TASK_EXITS/rank-$rank.exit"; } 2>/dev/null || task_code=none; '
        'if [ "$task_code" != 0 ]; then echo "bcp-pipeline: srun exited 0, but task $rank recorded exit '
        '$task_code (a lost node?): the job failed" >&2; code=1; fi; done; fi',
        "# Written last: the job's result even after Slurm has forgotten the job (MinJobAge, no sacct).",
        'printf \'%s\\n\' "$code" > "$logs/slurm-$SLURM_JOB_ID.exit.tmp" && '
        'mv -f "$logs/slurm-$SLURM_JOB_ID.exit.tmp" "$logs/slurm-$SLURM_JOB_ID.exit"',
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"


def data_list_step(
    request: JobRequest, values: dict[str, str], res: SlurmResources, paths: Paths, apptainer: bool
) -> list[str]:
    """The Bridge training's first step: one task, where the ranks will run, writes the data list."""
    argv = data_list_argv(request, values)
    if apptainer:
        argv = (
            apptainer_argv(
                str(res.container_image),
                [f"{paths.workspace}:{paths.workspace}", f"{paths.code}:{paths.code}", *res.container_mounts],
            )
            + argv
        )
    step_log = '"$logs/$SLURM_JOB_ID/data-list.log"'
    flags = [
        f"--nodes=1 --ntasks=1 --output={step_log} --error={step_log}",
        *srun_flags(res, paths, pyxis=not apptainer)[2:],
    ]
    return [
        "# The data list (dataset.data_path from the preprocess manifests), in the run's folder for every rank.",
        f"mkdir -p {shlex.quote(bridge.run_dir(request.stage, values, request.run_id))}",
        "srun " + " ".join([*flags, shell_join(argv)]) + ' || { code=$?; echo "bcp-pipeline: the data list '
        'could not be written (its log: $logs/$SLURM_JOB_ID/data-list.log)" >&2; exit "$code"; }',
    ]


def job_rendezvous(request: JobRequest, options: SlurmOptions) -> dict | None:
    """Where the job's tasks meet, as `plan` shows it (None for one task)."""
    size = shape(request, options)
    return rendezvous(
        RankLayout(nodes=size.nodes, per_node=size.ntasks_per_node),
        "$(hostname) of the job's first node (the batch script)",
        f"$(({MASTER_PORT_EXPR}))",
    )


def sbatch_flags(request: JobRequest, size: Shape, paths: Paths) -> list[tuple[str, str]]:
    res: SlurmResources = request.resources("slurm")
    batch_log = f"{paths.logs}/slurm-%j.log"
    # A Bridge training asks for a GPU a task where the section names no GPU count of its own.
    gpus = res.gpus_per_node or (size.ntasks_per_node if trains_with_bridge(request, "slurm") else None)
    flags = [
        ("--job-name", job_name(request.run_id, request.stage.name, request.kind)),
        ("--comment", f"bcp-pipeline run={request.run_id} stage={request.stage.name} kind={request.kind}"),
        ("--nodes", str(size.nodes)),
        ("--ntasks-per-node", str(size.ntasks_per_node)),
        ("--cpus-per-task", str(size.cpus_per_task)),
    ]
    trains = trains_with_bridge(request, "slurm")
    # A training's SIGTERM comes save_seconds before --time ends, to every task: Bridge's signal handler then saves.
    signal = f"TERM@{res.save_seconds}" if trains and size.time and res.save_seconds > 0 else None
    optional = [
        ("--time", slurm_time(size.time) if size.time else None),
        ("--partition", size.partition),
        ("--account", size.account),
        ("--gpus-per-node", gpus and str(gpus)),
        ("--mem", res.mem or ("0" if size.exclusive else None)),
        ("--signal", signal),
    ]
    flags += [(flag, value) for flag, value in optional if value]
    # Append, so a requeued job (preemption) keeps the output of its earlier start.
    return flags + [
        ("--chdir", paths.workspace),
        ("--output", batch_log),
        ("--error", batch_log),
        ("--open-mode", "append"),
    ]


def srun_flags(res: SlurmResources, paths: Paths, *, pyxis: bool = True) -> list[str]:
    rank_log = '"$logs/%j/rank-%5t.log"'  # %5t: the task's rank, zero-padded like the local backend's names
    # Every task runs to its end even if another fails, so a rerun has the least left to redo.
    flags = ["--kill-on-bad-exit=0 --open-mode=append", f"--output={rank_log} --error={rank_log}"]
    if res.container_image and pyxis:
        # The run folder too: each task's wrapper writes its exit file into its logs, inside the container.
        mounts = [
            f"{paths.workspace}:{paths.workspace}",
            f"{paths.code}:{paths.code}",
            f"{paths.run_dir}:{paths.run_dir}",
            *res.container_mounts,
        ]
        flags.append(
            " ".join(
                [
                    f"--container-image={shlex.quote(res.container_image)}",
                    f"--container-mounts={shlex.quote(','.join(mounts))}",
                    f"--container-workdir={shlex.quote(paths.workspace)}",
                ]
            )
        )
    if res.srun_args:
        flags.append(shell_join(res.srun_args))
    return flags


def nemo_job_name_prefix(request: JobRequest) -> str:
    """The launcher names its job PREFIX + training.run.name: `RUN.STAGE.nemo.RUN_NAME`."""
    return job_name(request.run_id, request.stage.name, "stage") + NEMO_SUFFIX


def nemo_rendezvous(request: JobRequest, options: SlurmOptions) -> dict | None:
    """The NeMo launcher's job: one rank per GPU on each node, meeting through the launcher's own torchrun/srun."""
    from bcp_pipeline.config.nemo import gpus_per_node

    res: SlurmResources = request.resources("slurm")
    try:
        gpus = res.gpus_per_node or gpus_per_node(request.stage, request.stage.bcp.instance)
    except ValueError as exc:
        raise SubmissionError(f"{request.label}: {exc}") from None
    layout = RankLayout(nodes=shape(request, options).nodes, per_node=gpus)
    return rendezvous(layout, "the NeMo launcher's own", "the NeMo launcher's own")


def nemo_launcher_overrides(request: JobRequest, options: SlurmOptions, paths: Paths) -> list[str]:
    """NeMo launcher Hydra overrides for a Slurm cluster (`cluster_type=bcm`), data_prefix excluded."""
    from bcp_pipeline.config.nemo import gpus_per_node, launcher_overrides

    res: SlurmResources = request.resources("slurm")
    stage = request.stage
    size = shape(request, options)
    values = job_values(request, paths)
    try:
        gpus = res.gpus_per_node or gpus_per_node(stage, stage.bcp.instance)
        overrides = launcher_overrides(
            stage, cluster_type="bcm", nodes=str(size.nodes), runtime=size.time, values=values, backend="slurm"
        )
    except ValueError as exc:
        raise SubmissionError(f"{request.label}: {exc}") from None
    overrides += [
        f"training.trainer.devices={gpus}",
        f"cluster.gpus_per_node={gpus}",
        f"cluster.job_name_prefix={nemo_job_name_prefix(request)}",
    ]
    overrides += [
        f"cluster.{key}={value}" for key, value in (("partition", size.partition), ("account", size.account)) if value
    ]
    if res.container_image:
        overrides.append(f"container={res.container_image}")
    mounts = [paths.workspace, *res.container_mounts]
    overrides.append(f"container_mounts=[{','.join(mounts)}]")
    return overrides


def nemo_launcher_script(
    request: JobRequest, options: SlurmOptions, paths: Paths, data_prefix: str | None = None
) -> str:
    """Shell script for the submit host: build the data list from the manifests, then run the launcher, which
    `sbatch`es the training job. `data_prefix` (a rendered `training.model.data.data_prefix=[...]`) replaces the
    list built at submit time, for tests and for users who pin one."""
    from bcp_pipeline.config.nemo import DATA_LIST, DATA_LIST_FILE, launcher_dir

    stage = request.stage
    assert stage.nemo is not None
    values = job_values(request, paths)
    list_file = f"{paths.run_dir}/{stage.name}-{DATA_LIST_FILE}"
    words = [shlex.quote(o) for o in nemo_launcher_overrides(request, options, paths)]
    lines = ["set -eo pipefail", f"mkdir -p {shlex.quote(paths.logs)}"]
    if data_prefix is None:
        lines.append(shell_join(DATA_LIST.argv(stage.nemo, values, python="python3", code=paths.code, out=list_file)))
        # One override a line (three for a held-out split's per-split data), each its own argument.
        lines.append(f"mapfile -t data_list < {shlex.quote(list_file)}")
        words.append('"${data_list[@]}"')
    else:
        words.append(shlex.quote(data_prefix))
    try:
        launcher = launcher_dir(stage, "slurm")
    except ValueError as exc:
        raise SubmissionError(f"{request.label}: {exc}") from None
    lines.append(
        " ".join(["python3", shlex.quote(f"{launcher}/main.py"), *words])
        + f" 2>&1 | tee -a {shlex.quote(f'{paths.logs}/{stage.name}-nemo-launcher.log')}"
    )
    return "\n".join(lines) + "\n"
