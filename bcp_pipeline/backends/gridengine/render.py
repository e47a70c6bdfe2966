"""Pure rendering of a stage into a Grid Engine job script (no I/O), golden-tested in tests/golden/gridengine/.

A stage job is one `qsub` script with its resources as `#$` lines. Each node of the stage (an array task, or a
host of the parallel environment) runs one launcher that starts the node's `processes_per_node` ranks with RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR and MASTER_PORT set, and waits for all of them:

- independent replicas (`distributed: false`): an array job, `-t 1-NODES`, node rank `SGE_TASK_ID - 1`; one
  node: a plain job;
- a distributed stage: one job over a parallel environment (`-pe NAME NODES`). The job script runs on the first
  host; it reads the hosts from `$PE_HOSTFILE` (MASTER_ADDR is the first, or what `master_addr_command` prints
  there), copies itself next to the logs and starts itself on every host as `SCRIPT --node K MASTER_ADDR
  MASTER_PORT`, by `qrsh -inherit` (`start_hosts: qrsh`, Grid Engine's tight integration: the ranks are the job's
  own tasks, accounted and killed with it) or by Open MPI's `mpirun -npernode 1 -hostfile logs/ID/hostfile`
  (`start_hosts: mpirun`, TSUBAME4's way: K is the Open MPI rank; Open MPI itself starts the other hosts through
  `qrsh -inherit` under Grid Engine).

A distributed stage with `launcher: torchrun` starts each host's ranks with one torchrun instead (c10d rendezvous at
the first host; each rank logs to its own file), as a pretrain stage (`nemo:` or `megatron_bridge:`) always does:
its whole script is training.py's (the data list, the engine's set-up, then torchrun of its training on every
host), one rank a GPU.

With `backends.gridengine.container: apptainer` and an image, every rank runs as `apptainer exec --nv --bind
WORKSPACE:/mount_workspace,... IMAGE PROGRAM...`: the workspace is at /mount_workspace inside (as on BCP), stages/
and the run folder at their own paths; Apptainer passes the launcher's environment through, except PATH and
LD_LIBRARY_PATH, which are the image's (set those with APPTAINERENV_PREPEND_PATH). Files of job ID in
the run folder (on a real cell: a shared file system):

    logs/sge-ID.log, logs/sge-ID.TASK.log   the job script's output (-j y), one per array task
    logs/ID/rank-NNNNN.log                  stdout and stderr of each rank, as the local backend writes them
    logs/ID/job.sh                          a distributed job's script, as each host's part runs it
    logs/ID/hostfile                        mpirun's hostfile, from $PE_HOSTFILE (start_hosts: mpirun)
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.gridengine import records
from bcp_pipeline.backends.gridengine import training as hosts_training
from bcp_pipeline.backends.shared import templates
from bcp_pipeline.backends.shared.batch import Paths, job_name
from bcp_pipeline.backends.shared.bridge_command import data_list_argv as bridge_data_list_argv
from bcp_pipeline.backends.shared.bridge_command import data_list_file, gpus_per_node, trains_with_bridge
from bcp_pipeline.backends.shared.bridge_command import rank_argv as bridge_rank_argv
from bcp_pipeline.backends.shared.command import (
    apptainer_argv,
    placeholder_values,
    rendezvous,
    shell_exports,
    shell_join,
    stage_command,
)
from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.placeholders import substitute
from bcp_pipeline.config.resources import GridEngineOptions, GridEngineResources, RankLayout
from bcp_pipeline.errors import ConfigError, SubmissionError

CONTAINER_WORKSPACE = "/mount_workspace"  # where a container sees the workspace, as BCP mounts it
# The job's rendezvous port from its id (and array task), so two jobs sharing a host do not collide.
MASTER_PORT_EXPR = "20000 + (JOB_ID * 7 + ${SGE_TASK_ID/undefined/0}) % 20000"
# Characters qsub's `#$` line parser would split or expand in a path.
UNSAFE_IN_DIRECTIVE = frozenset(" \t\n'\"\\$`")


@dataclass(frozen=True, kw_only=True)
class Shape:
    """A job's resources after deriving unset fields from the BCP section and the backend options."""

    nodes: int
    per_node: int
    distributed: bool
    h_rt: str | None  # a Duration, e.g. 1h
    parallel_environment: str | None
    project: str | None
    queue: str | None

    @property
    def array(self) -> bool:
        return not self.distributed and self.nodes > 1


def shape(request: JobRequest, options: GridEngineOptions) -> Shape:
    res: GridEngineResources = request.resources("gridengine")
    layout = request.rank_layout("gridengine")
    if min(layout.nodes, layout.per_node) < 1:
        raise config_error(
            request,
            "gridengine",
            f"gridengine nodes and processes_per_node must be >= 1, got "
            f"{layout.nodes} x {layout.per_node}; set them in the stage's gridengine: section",
        )
    return Shape(
        nodes=layout.nodes,
        per_node=layout.per_node,
        distributed=res.distributed,
        h_rt=res.h_rt or request.resources("bcp").total_runtime,
        parallel_environment=res.parallel_environment or options.parallel_environment,
        project=res.project or options.project,
        queue=res.queue or options.queue,
    )


def h_rt(duration: str) -> str:
    """`1h30m` -> `1:30:00`, `2D` -> `48:00:00` (Grid Engine's hours:minutes:seconds; hours may exceed 24)."""
    seconds = parse_duration(duration)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def in_container(request: JobRequest, options: GridEngineOptions) -> bool:
    image = request.resources("gridengine").container_image
    if image and options.container == "none":  # never run a stage outside the image it names
        raise config_error(
            request,
            "gridengine",
            f"gridengine.container_image is {image!r} but backends."
            "gridengine.container is none; set it to apptainer (or drop the stage's container_image)",
        )
    return bool(image)


def job_values(request: JobRequest, options: GridEngineOptions, paths: Paths) -> dict[str, str]:
    contained = in_container(request, options)
    python = paths.python or ("python3" if contained else paths.orchestrator_python)
    return placeholder_values(
        request,
        workspace=CONTAINER_WORKSPACE if contained else paths.workspace,
        code=paths.code,
        python=python,
        results=f"{paths.run_dir}/results/{request.stage.name}",
    )


def rank_argv(request: JobRequest, options: GridEngineOptions, paths: Paths) -> list[str]:
    """The argv each rank runs: the stage program, in its container where one is configured."""
    return container_prefix(request, options, paths) + program_argv(request, options, paths)


def program_argv(request: JobRequest, options: GridEngineOptions, paths: Paths) -> list[str]:
    """The stage program (in a container: through stages/bootstrap.sh, as on BCP, which installs missing packages)."""
    res: GridEngineResources = request.resources("gridengine")
    program = stage_command(request, "gridengine", job_values(request, options, paths))
    if in_container(request, options) and not (request.kind == "stage" and res.command):
        program = ["bash", f"{paths.code}/bootstrap.sh", *program]
    return program


def container_prefix(request: JobRequest, options: GridEngineOptions, paths: Paths) -> list[str]:
    return container_argv(request, paths) if in_container(request, options) else []


def container_argv(request: JobRequest, paths: Paths) -> list[str]:
    """`apptainer exec --nv --bind WORKSPACE:/mount_workspace,STAGES:STAGES,RUN:RUN[,container_binds] IMAGE`."""
    res: GridEngineResources = request.resources("gridengine")
    binds = [
        f"{paths.workspace}:{CONTAINER_WORKSPACE}",
        f"{paths.code}:{paths.code}",
        f"{paths.run_dir}:{paths.run_dir}",
        *res.container_binds,
    ]
    # ${workspace} in the image's path is the workspace where the hosts see it (a .sif built into it once).
    return apptainer_argv(substitute(str(res.container_image), {"workspace": paths.workspace}), binds)


def directives(request: JobRequest, size: Shape, paths: Paths) -> list[str]:
    """The `#$` lines: name, shell, working folder, joined log, runtime, array or parallel environment, requests."""
    res: GridEngineResources = request.resources("gridengine")
    for label, path in (("workspace", paths.workspace), ("run folder", paths.run_dir)):
        if UNSAFE_IN_DIRECTIVE.intersection(path):
            raise SubmissionError(
                f"{request.label}: the {label} {path!r} holds a space, quote or `$`, which a "
                "`#$` line cannot carry; use a path without them"
            )
    log = f"{paths.logs}/sge-$JOB_ID" + (".$TASK_ID" if size.array else "") + ".log"
    lines = [
        f"-N {job_name(request.run_id, request.stage.name, request.kind)}",
        "-S /bin/bash",
        f"-wd {paths.workspace}",
        "-j y",
        f"-o {log}",
    ]
    if size.h_rt:
        lines.append(f"-l h_rt={h_rt(size.h_rt)}")
    if size.array:
        lines.append(f"-t 1-{size.nodes}")
    if size.distributed and size.parallel_environment:
        lines.append(f"-pe {size.parallel_environment} {size.nodes}")
    lines += [f"-P {size.project}"] * bool(size.project) + [f"-q {size.queue}"] * bool(size.queue)
    if res.priority is not None:
        if not -1023 <= res.priority <= 1024:
            raise config_error(
                request,
                "gridengine",
                f"gridengine.priority {res.priority} is outside Grid "
                "Engine's -1023..1024 (users may only lower theirs: 0 or less)",
            )
        lines.append(f"-p {res.priority}")
    lines += ["-R y"] * res.reserve + [f"-ar {res.advance_reservation}"] * bool(res.advance_reservation)
    if res.array_concurrency and size.array:
        lines.append(f"-tc {res.array_concurrency}")
    lines += [f"-l {request_}" for request_ in res.resources] + list(res.extra_args)
    return [f"#$ {line}" for line in lines]


# gridengine.node_scratch: Grid Engine's per-job folder on the host's own disk (node_scratch.sh says more).
NODE_SCRATCH = templates.load(__package__, "node_scratch.sh")
# In Apptainer the folder is bound at its own path (APPTAINER_BIND: the host's folder is known only in the job).
SCRATCH_BIND = 'export APPTAINER_BIND="$scratch${APPTAINER_BIND:+,$APPTAINER_BIND}"'


def node_scratch(request: JobRequest, options: GridEngineOptions) -> list[str]:
    """The lines giving the stage node-local scratch, where it asks for it (every host runs them)."""
    if not request.resources("gridengine").node_scratch:
        return []
    return [*NODE_SCRATCH.splitlines(), *[SCRATCH_BIND] * in_container(request, options)]


def site_setup(request: JobRequest) -> list[str]:
    """The stage's `gridengine.setup` lines, verbatim, where it has them: run on every host before its ranks."""
    lines = request.resources("gridengine").setup
    return ["# The site's set-up (gridengine.setup), on every host:", *lines] if lines else []


# One node's ranks, each with its own log, all waited for (launch_node.sh).
LAUNCH_NODE = templates.load(__package__, "launch_node.sh")


def qsub_argv(options: GridEngineOptions, *flags: str) -> list[str]:
    """`qsub FLAGS SUBMIT_ARGS` (the script on stdin): every submission and verification goes through it."""
    return ["qsub", *flags, *options.submit_args]


def job_script(request: JobRequest, options: GridEngineOptions, paths: Paths) -> str:
    """The whole `qsub` script of a stage or verification job."""
    if is_nemo(request):
        return hosts_training.render(nemo_job(request, options, paths))
    if trains_with_bridge(request, "gridengine"):
        return hosts_training.render(bridge_job(request, options, paths))
    size = shape(request, options)
    world = size.nodes * size.per_node
    what = "verification of stage" if request.kind == "verify" else "stage"
    how = "hosts of a parallel environment" if size.distributed else "array tasks" if size.array else "node"
    lines = [
        "#!/bin/bash",
        f"# bcp-pipeline run {request.run_id}, {what} {request.stage.name}: {size.nodes} {how} x "
        f"{size.per_node} rank(s) = RANK 0..{world - 1} of WORLD_SIZE {world}",
        *directives(request, size, paths),
        f"logs={shlex.quote(paths.logs)} nodes={size.nodes} per_node={size.per_node} world={world}",
        *records.script(size.nodes if size.array else 1),
        f"export BCP_PIPELINE_RUN_ID={shlex.quote(request.run_id)} "
        f"BCP_PIPELINE_STAGE={shlex.quote(request.stage.name)}",
        *shell_exports(request, "gridengine", job_values(request, options, paths), request.label),
        *node_scratch(request, options),
        *site_setup(request),
        *node_launcher(request, options, paths, size),
    ]
    port = f'"$(({MASTER_PORT_EXPR}))"'
    if size.distributed:
        start, addr = start_hosts(request, options)
        lines += [
            *hosts_training.host_part(start, 'export MASTER_ADDR="$3" MASTER_PORT="$4"', "launch_node NODE"),
            hosts_training.fan_out_to_hosts(MASTER_PORT_EXPR, start, addr),
        ]
    else:
        lines += [
            f'export MASTER_ADDR="$(hostname)" MASTER_PORT={port}',
            'launch_node "$(( ${SGE_TASK_ID/undefined/1} - 1 ))"',
        ]
    return "\n".join(lines) + "\n"


def start_hosts(request: JobRequest, options: GridEngineOptions) -> tuple[str, str | None]:
    """How a job over several hosts starts each host's part (`qrsh` or `mpirun`) and the shell command whose output
    is MASTER_ADDR (None: the first host): the stage's gridengine settings, else backends.gridengine's."""
    res: GridEngineResources = request.resources("gridengine")
    command = res.master_addr_command or options.master_addr_command
    if command is not None and not command.strip():
        raise config_error(
            request,
            "gridengine",
            "gridengine.master_addr_command is empty; give a shell command "
            "that prints the first host's address, or drop the key (MASTER_ADDR: the first host)",
        )
    return res.start_hosts or options.start_hosts, command


def is_nemo(request: JobRequest) -> bool:
    """A NeMo pretrain job (the stage's nemo: section, no command of its own): nemo.py's script."""
    return request.kind == "stage" and bool(request.stage.nemo) and not request.resources("gridengine").command


def training_shape(request: JobRequest, options: GridEngineOptions) -> Shape:
    """A training is one job over all its hosts (a parallel one from two hosts on, never an array); Bridge's has one
    rank a GPU (processes_per_node, else the BCP instance's GPUs)."""
    size = shape(request, options)
    if trains_with_bridge(request, "gridengine"):
        size = replace(size, per_node=gpus_per_node(request, "gridengine"))
    return replace(size, distributed=size.nodes > 1)


def require_container(request: JobRequest, options: GridEngineOptions, engine: str) -> None:
    if not in_container(request, options):
        # The spelling that supplies it on the command line, with the pipeline's own NeMo image where it has one.
        image = f"docker://{request.stage.bcp.image}" if request.stage.bcp.image else "docker://nvcr.io/nvidia/nemo:TAG"
        sets = [f"--set {request.stage.name}.gridengine.container_image={image}"]
        if options.container != "apptainer":
            sets.append("--set backends.gridengine.container=apptainer")
        raise config_error(
            request,
            "gridengine",
            f"{engine} on Grid Engine runs in the NeMo container through "
            "Apptainer: set the stage's gridengine.container_image (a .sif of the NeMo image, or its "
            "docker:// reference) and backends.gridengine.container: apptainer; on the command line: " + " ".join(sets),
        )


def hosts_training_job(
    request: JobRequest,
    options: GridEngineOptions,
    paths: Paths,
    size: Shape,
    what: str,
    data_list: tuple[list[str], str],
    setup: list[str],
    program: str,
) -> hosts_training.HostsTraining:
    """The parts of a training's script every engine has; `data_list`: its argv and the file it writes."""
    values = job_values(request, options, paths)
    start, addr = start_hosts(request, options)
    return hosts_training.HostsTraining(
        title=f"run {request.run_id}, stage {request.stage.name}",
        what=what,
        directives=directives(request, size, paths),
        exports=[
            *records.script(1),  # a training is one job (over its hosts), never an array
            f"export BCP_PIPELINE_RUN_ID={shlex.quote(request.run_id)} "
            f"BCP_PIPELINE_STAGE={shlex.quote(request.stage.name)}",
            *shell_exports(request, "gridengine", values, request.label),
            *node_scratch(request, options),
            *site_setup(request),
        ],
        logs=paths.logs,
        nodes=size.nodes,
        per_node=size.per_node,
        container=container_argv(request, paths),
        data_list_argv=data_list[0],
        data_list_file=data_list[1],
        setup=setup,
        program=program,
        master_port=MASTER_PORT_EXPR,
        start_hosts=start,
        master_addr_command=addr,
    )


def bridge_job(request: JobRequest, options: GridEngineOptions, paths: Paths) -> hosts_training.HostsTraining:
    """A Megatron-Bridge pretrain: the data list, then stages/bridge_pretrain.py under torchrun on every host."""
    require_container(request, options, "Megatron-Bridge pretraining")
    size = training_shape(request, options)
    check_training_hosts(request, size)
    values = job_values(request, options, paths)
    program = shell_join(bridge_rank_argv(request, "gridengine", values, size.h_rt))
    return hosts_training_job(
        request,
        options,
        paths,
        size,
        "Megatron-Bridge pretraining",
        (bridge_data_list_argv(request, values), data_list_file(request, values)),
        [],
        program,
    )


def check_training_hosts(request: JobRequest, size: Shape) -> None:
    """A training over several hosts asks the cell for them (a parallel environment, or a whole-node request such as
    TSUBAME4's node_f=N, which makes a job parallel there) and runs from a .sif every host reads: a docker://
    reference would be pulled and converted on every host of every job, inside h_rt and before training starts."""
    if size.nodes < 2:
        return
    res: GridEngineResources = request.resources("gridengine")
    if not res.resources and not size.parallel_environment:
        raise config_error(
            request,
            "gridengine",
            f"Megatron-Bridge on {size.nodes} hosts x {size.per_node} GPUs "
            "asks the cell for nothing: set gridengine.resources (the hosts' request, e.g. "
            f"[node_f={size.nodes}] on TSUBAME4, [gpu={size.per_node}] with a parallel environment) "
            "and, where the site needs one, gridengine.parallel_environment (an allocation_rule 1 PE)",
        )
    image = str(res.container_image)
    if "://" in image:  # docker://, oras://, library://: pulled; a path (a .sif, a sandbox folder) is read
        raise config_error(
            request,
            "gridengine",
            f"Megatron-Bridge on {size.nodes} hosts runs its image "
            f"{image}, which every host would pull and convert inside the job's h_rt: build a .sif "
            f"once on the shared file system (apptainer build nemo.sif {image}) and set "
            "gridengine.container_image to its path (${workspace}/... is the workspace)",
        )


def nemo_job(request: JobRequest, options: GridEngineOptions, paths: Paths) -> hosts_training.HostsTraining:
    """The NeMo pretrain script's inputs: the launcher's overrides for this job, in the stage's Apptainer image."""
    from bcp_pipeline.config.nemo import (
        DATA_LIST,
        DATA_LIST_FILE,
        PRETRAINING_SCRIPT,
        composed_config,
        launcher_dir,
        launcher_overrides,
        nemo_run_name,
    )

    stage = request.stage
    nemo = stage.nemo
    assert nemo is not None
    require_container(request, options, "NeMo pretraining")
    size = training_shape(request, options)
    values = job_values(request, options, paths)
    try:
        overrides = launcher_overrides(
            stage,
            cluster_type="bcp",
            nodes=str(size.nodes),
            runtime=size.h_rt,
            values=values,
            backend="gridengine",
            devices=str(size.per_node),
        )
        launcher = launcher_dir(stage, "gridengine")
    except ValueError as exc:
        raise SubmissionError(f"{request.label}: {exc}") from None
    run_name = nemo_run_name(stage, request.run_id)
    config_dir, config_name = composed_config(substitute(nemo.results_dir, values), run_name)
    data_list_file = f"{values['results']}/{DATA_LIST_FILE}"
    data_list_argv = DATA_LIST.argv(nemo, values, python="python3", code=values["code"], out=data_list_file)
    setup = hosts_training.nemo_setup(launcher, overrides, data_list_file, config_dir, config_name)
    program = hosts_training.nemo_program(f"{nemo.nemo_dir.rstrip('/')}/{PRETRAINING_SCRIPT}", config_dir, config_name)
    return hosts_training_job(
        request, options, paths, size, "NeMo pretraining", (data_list_argv, data_list_file), setup, program
    )


def node_launcher(request: JobRequest, options: GridEngineOptions, paths: Paths, size: Shape) -> list[str]:
    """`launch_node NODE`: the job script's ranks (LAUNCH_NODE), or, for a distributed stage with `launcher:
    torchrun`, one torchrun that starts the host's ranks and meets the other hosts' at MASTER_ADDR:MASTER_PORT (c10d;
    each rank logs to its own file, as nemo.py's NeMo training does)."""
    torchrun = request.resources("gridengine").launcher == "torchrun"
    if torchrun and not size.distributed:
        raise config_error(
            request,
            "gridengine",
            "gridengine.launcher torchrun starts the ranks of a distributed "
            "stage (one torchrun a host, meeting at the first); set distributed: true, or launcher: "
            "ranks for independent replicas",
        )
    if not torchrun:
        return [f"run_rank() {{ exec {shell_join(rank_argv(request, options, paths))}; }}", LAUNCH_NODE]
    python = job_values(request, options, paths)["python"]
    runner = shell_join([*container_prefix(request, options, paths), python, "-m", "torch.distributed.run"])
    call = hosts_training.torchrun_call(
        runner, '"$MASTER_ADDR:$MASTER_PORT"', shell_join(program_argv(request, options, paths))
    )
    return [
        "launch_node() {  # NODE: this host's torchrun (torch.distributed.run), its ranks' logs their own",
        '  mkdir -p "$logs/$JOB_ID"',
        f"  {call}",
        "}",
    ]


def job_rendezvous(request: JobRequest, options: GridEngineOptions) -> dict | None:
    """Where the job's ranks meet, as `plan` shows it (None for one rank)."""
    size = shape(request, options)
    layout = request.rank_layout("gridengine")
    if is_nemo(request) or trains_with_bridge(request, "gridengine"):
        trained = training_shape(request, options)
        return rendezvous(
            RankLayout(nodes=trained.nodes, per_node=trained.per_node),
            "torchrun's c10d rendezvous at the first host of $PE_HOSTFILE (one host: its own)",
            f"$(({MASTER_PORT_EXPR}))",
        )
    if size.distributed:
        start, addr = start_hosts(request, options)
        where = f"the output of `{addr.strip()}` on" if addr else ""
        return rendezvous(
            layout,
            f"{where or 'the'} first host of $PE_HOSTFILE (hosts started by {start})",
            f"$(({MASTER_PORT_EXPR}))",
        )
    return rendezvous(
        layout, "$(hostname) of each array task (its ranks are independent of other tasks')", f"$(({MASTER_PORT_EXPR}))"
    )


def config_error(request: JobRequest, key: str, message: str) -> ConfigError:
    """A ConfigError at the stage's `key` (file:line, or the --set that gave it), naming the job."""
    return request.stage.where(key).error(f"{request.label}: {message}")
