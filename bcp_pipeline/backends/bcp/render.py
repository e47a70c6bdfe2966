"""Pure rendering of `ngc base-command job run` command lines (no I/O besides hashing stages/).

Every stage field maps to one flag; the job's commandline is a shell string built with shlex.quote on every
value. Multi-node stages start under `bcprun --nnodes N --npernode P -no_redirect --cmd '...'` (the spelling
NVIDIA's own launcher uses), which sets RANK/WORLD_SIZE; a one-node multi-process stage starts its processes
itself, so it does not depend on bcprun being in a one-replica job (which public sources dispute).

Where the commandline runs in a multi-replica job is not known offline: once per replica, or once on the
launcher node (replica 0) with bcprun fanning out. A bcprun launch is right under both (each node's bcprun starts
its share, or the launcher's starts all); what must run once (the NeMo launcher) is guarded to replica 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bcp_pipeline.backends.bcp import bridge_job
from bcp_pipeline.backends.bcp.bridge_job import NO_REDIRECT
from bcp_pipeline.backends.bcp.nemo_job import training_job
from bcp_pipeline.backends.bcp.paths import UPLOAD_EXCLUDES, job_values
from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.shared import nemo_script as training_script
from bcp_pipeline.backends.shared import templates
from bcp_pipeline.backends.shared.command import rendezvous, resolved_env, shell_join, stage_command
from bcp_pipeline.config.bridge import training_layout
from bcp_pipeline.config.durations import format_duration, parse_duration
from bcp_pipeline.config.model import PipelineConfig, StageConfig
from bcp_pipeline.config.resources import BcpOptions, BcpResources, RankLayout
from bcp_pipeline.errors import ConfigError, SubmissionError

LABEL_PREFIX = "bcpp"
# A one-replica job's own ranks meet on loopback at a port from the job id (29500 is torchrun's default), so
# concurrent jobs sharing a machine (the emulator's, a shared node) do not collide.
LOCAL_MASTER_PORT_EXPR = "29500 + ${NGC_JOB_ID:-0} % 1000"
LOCAL_RANKS = templates.load(__package__, "local_ranks.sh", one_line=True)  # a job's ranks on its one node


def label(kind: str, value: str) -> str:
    """A valid ngc label (`[A-Za-z_][A-Za-z0-9_]*`) that finds this run's or stage's jobs again."""
    return f"{LABEL_PREFIX}_{kind}_{re.sub(r'[^A-Za-z0-9_]', '_', value)}"[:256]


def job_labels(request: JobRequest) -> list[str]:
    return [label("run", request.run_id), label("stage", request.stage.name), label("kind", request.kind)]


def trains(request: JobRequest) -> str | None:
    """The training engine this job runs (`nemo` or `megatron_bridge`): a stage job with one and no command."""
    if request.kind == "stage" and not request.resources("bcp").command:
        return request.stage.engine
    return None


def job_files(
    request: JobRequest, options: BcpOptions, stages_dir: Path, *, no_redirect: str = NO_REDIRECT
) -> dict[str, str]:
    """Files the job needs in the workspace besides stages/ (path under the workspace -> text): a training's
    script, under a name made from its content; {} for any other job."""
    engine = trains(request)
    if engine == "nemo":
        text = training_script.render(training_job(request, options, stages_dir))
    elif engine == "megatron_bridge":
        text = bridge_job.render(bridge_job.bridge_job(request, options, stages_dir, no_redirect))
    else:
        return {}
    folder = f"{options.jobs_dir.strip('/')}/{request.run_id}"
    return {f"{folder}/{training_script.file_name(request.stage.name, text)}": text}


def commandline(request: JobRequest, options: BcpOptions, stages_dir: Path, *, no_redirect: str = NO_REDIRECT) -> str:
    """The job's shell command: the bootstrap, then the program, under bcprun when it has several ranks."""
    values = job_values(request, options, stages_dir)
    resources: BcpResources = request.resources("bcp")
    files = job_files(request, options, stages_dir, no_redirect=no_redirect)
    if files:  # a training: its script, given the workspace's and the result folder's mount points
        mount = request.pipeline.workspace.mount.rstrip("/")
        return shell_join(["bash", f"{mount}/{next(iter(files))}", mount, resources.result])
    program = stage_command(request, "bcp", values)
    if not (request.kind == "stage" and resources.command):
        program = ["bash", f"{values['code']}/bootstrap.sh", *program]
    inner = shell_join(program)
    layout = request.rank_layout("bcp")
    if resources.launcher == "bcprun" and layout.nodes > 1:
        return shell_join(
            ["bcprun", "--nnodes", str(layout.nodes), "--npernode", str(layout.per_node), no_redirect, "--cmd", inner]
        )
    if resources.launcher == "bcprun" and layout.per_node > 1:
        return local_ranks(inner, layout.per_node)
    return inner


def local_ranks(inner: str, processes: int) -> str:
    """`inner` as `processes` ranks on this one node, started by the job's shell (no bcprun needed): each gets
    RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE as bcprun would give them, and MASTER_ADDR/MASTER_PORT on loopback
    (all ranks share the node; without them a distributed program has no rendezvous); the job exits with the first
    failing rank's status, after every rank has ended (stage programs are idempotent: a rerun redoes only what is
    missing)."""
    script = templates.fill(
        LOCAL_RANKS,
        PORT_EXPRESSION=LOCAL_MASTER_PORT_EXPR,
        LAST_RANK=str(processes - 1),
        PROCESSES=str(processes),
        PROGRAM=inner,
    )
    return shell_join(["bash", "-c", script])


def job_rendezvous(request: JobRequest) -> dict | None:
    """Where the job's ranks meet, as `plan` shows it (None for one rank); it follows commandline()'s choice."""
    res: BcpResources = request.resources("bcp")
    layout = request.rank_layout("bcp")
    engine = trains(request)
    if engine == "nemo":
        from bcp_pipeline.config.nemo import gpus_per_node

        # The launcher starts one rank per GPU on each of the job's nodes, with its own torchrun rendezvous.
        try:
            layout = RankLayout(nodes=layout.nodes, per_node=gpus_per_node(request.stage, res.instance))
        except ValueError as exc:
            raise SubmissionError(f"stage {request.stage.name}: {exc}") from None
        return rendezvous(layout, "the NeMo launcher's own", "the NeMo launcher's own")
    if engine == "megatron_bridge":  # one rank per GPU: bcprun's variables, or torchrun's on one replica
        try:
            layout = RankLayout(*training_layout(request.stage, "bcp"))
        except ValueError as exc:
            raise SubmissionError(f"stage {request.stage.name}: {exc}") from None
        return rendezvous(
            layout,
            "set by bcprun" if layout.nodes > 1 else "127.0.0.1 (torchrun --standalone)",
            "set by bcprun" if layout.nodes > 1 else "torchrun's own",
        )
    if request.kind == "stage" and (res.command or res.launcher == "none"):
        return rendezvous(layout, "the command's own", "the command's own")
    if layout.nodes > 1:  # bcprun's variables; a replica without them has NGC_MASTER_ADDR (stages/_common.py)
        return rendezvous(layout, "set by bcprun (else NGC_MASTER_ADDR, launcher-svc-<job id>)", "set by bcprun")
    return rendezvous(layout, "127.0.0.1", f"$(({LOCAL_MASTER_PORT_EXPR}))")


def check_stage_resources(pipeline: PipelineConfig) -> None:
    """check_stage for every stage of the pipeline, and an instance and image for every job (before a run is
    recorded)."""
    for stage in pipeline.stages.values():
        res: BcpResources = stage.resources("bcp")
        if not res.instance or not res.image:
            raise missing_instance_error(f"stage {stage.name}", stage.name)
        check_stage(stage)
    if not pipeline.verification.bcp.instance or not pipeline.verification.bcp.image:
        raise missing_instance_error("the verification jobs", "verification")


def missing_instance_error(job: str, section: str) -> ConfigError:
    """A BCP job without an instance or image: a config error (exit 2) naming where to set them."""
    where = (
        "the pipeline's verification: bcp: section"
        if section == "verification"
        else f"defaults: bcp: or stage {section}'s bcp: (or --set {section}.bcp.instance=INSTANCE --set "
        f"{section}.bcp.image=IMAGE)"
    )
    return ConfigError(f"{job}: a BCP job needs an `instance` and an `image`: set them in pipelines.yaml under {where}")


def check_stage(stage: StageConfig) -> None:
    """What BCP (or NVIDIA's client) would refuse or get wrong, as a ConfigError naming the stage and the fix,
    before anything is submitted: not six retries of a "transient" submit error, nor ranks that all believe they
    are rank 0 of 1."""
    res: BcpResources = stage.resources("bcp")
    if res.replicas > 1 and res.preempt == "RESTARTABLE":
        raise _stage_error(
            stage,
            f"stage {stage.name}: preempt RESTARTABLE is refused for a job with replicas > 1 "
            "(ngc allows only RUNONCE or RESUMABLE for multi-node jobs); set "
            f"`--set {stage.name}.bcp.preempt=RESUMABLE` (or RUNONCE)",
        )
    if res.launcher == "none" and res.replicas > 1 and not stage.engine and not res.command:
        # Without bcprun no replica gets RANK/WORLD_SIZE, and deriving them from NGC_ARRAY_INDEX is wrong in one
        # of the two ways BCP may run the commandline: once on replica 0 only, rank 0 would wait for ranks that
        # never start. So a stage program on several replicas always starts under bcprun (right under both).
        raise _stage_error(
            stage,
            f"stage {stage.name}: launcher none with replicas > 1 runs {stage.program} with "
            "no rank variables (RANK/WORLD_SIZE come from bcprun), so every replica would "
            "take all items as rank 0 of 1, or only replica 0 would run; set "
            f"`--set {stage.name}.bcp.launcher=bcprun`, or a `command` that starts its ranks",
        )
    if res.array_type == "MPI" and res.replicas > 1 and res.launcher == "bcprun":
        raise _stage_error(
            stage,
            f"stage {stage.name}: array_type MPI is not supported: bcprun in an MPIJob gives "
            "its processes Open MPI's rank variables, not the RANK/WORLD_SIZE the stage "
            "programs read, so every process would take all items as rank 0 of 1; set "
            f"`--set {stage.name}.bcp.array_type=PYTORCH`",
        )


def _stage_error(stage: StageConfig, message: str) -> ConfigError:
    where = stage.locations.get("bcp")
    return where.error(message) if where is not None else ConfigError(message)


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One `job run`, transport-neutral: every field is one `ngc base-command job run` flag (or one keyword of
    ngcsdk's `Client().basecommand.jobs.run`). Both transports submit the same JobCreateRequest from it."""

    name: str
    image: str
    instance: str
    result: str
    commandline: str
    workspaces: tuple[str, ...] = ()  # NAME:MOUNT:MODE
    replicas: int = 1
    array_type: str | None = None  # with replicas > 1
    total_runtime: str | None = None  # canonical [nD][nH][nM][nS]
    min_timeslice: str | None = None
    preempt: str = "RUNONCE"
    priority: str = "NORMAL"
    order: int = 50
    labels: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()  # NAME or NAME:KEY:ENV (names only: ngc resolves the values)
    env: tuple[str, ...] = ()  # KEY:VALUE
    org: str | None = None
    team: str | None = None
    ace: str | None = None


def job_spec(request: JobRequest, options: BcpOptions, stages_dir: Path, *, no_redirect: str = NO_REDIRECT) -> JobSpec:
    """Pure: the job `request` becomes on BCP (without secrets' values, which ngc resolves). `no_redirect`: the
    spelling of bcprun's flag (from a `check` profile, else NVIDIA's launcher's)."""
    res: BcpResources = request.resources("bcp")
    where = request.label
    if not res.instance or not res.image:
        raise missing_instance_error(where, "verification" if request.kind == "verify" else request.stage.name)
    if res.replicas > 1 and res.total_runtime is None:
        raise SubmissionError(f"{where}: replicas > 1 needs total_runtime")
    if request.kind == "stage":
        check_stage(request.stage)
    values = job_values(request, options, stages_dir)
    return JobSpec(
        name=request.job_name,
        image=res.image,
        instance=res.instance,
        result=res.result,
        commandline=commandline(request, options, stages_dir, no_redirect=no_redirect),
        workspaces=tuple(f"{m.name}:{m.mount}:{m.mode}" for m in res.workspaces),
        replicas=(nodes := request.rank_layout("bcp").nodes),
        array_type=res.array_type if nodes > 1 else None,
        total_runtime=format_duration(parse_duration(res.total_runtime)) if res.total_runtime else None,
        min_timeslice=format_duration(parse_duration(res.min_timeslice)) if res.min_timeslice else None,
        preempt=res.preempt,
        priority=res.priority,
        order=res.order,
        labels=(*job_labels(request), *res.labels),
        secrets=tuple(res.secrets),
        env=tuple(f"{key}:{value}" for key, value in resolved_env(request, "bcp", values).items()),
        org=options.org,
        team=options.team,
        ace=options.ace,
    )


def job_run_argv(spec: JobSpec) -> list[str]:
    """The full argv of `ngc base-command job run` for `spec`."""
    argv = [
        "ngc",
        "base-command",
        "job",
        "run",
        "--name",
        spec.name,
        "--image",
        spec.image,
        "--instance",
        spec.instance,
        "--result",
        spec.result,
    ]
    for mount in spec.workspaces:
        argv += ["--workspace", mount]
    if spec.replicas > 1:
        argv += ["--replicas", str(spec.replicas), "--array-type", str(spec.array_type)]
    if spec.total_runtime:
        argv += ["--total-runtime", spec.total_runtime]
    if spec.min_timeslice:
        argv += ["--min-timeslice", spec.min_timeslice]
    argv += ["--preempt", spec.preempt, "--priority", spec.priority, "--order", str(spec.order)]
    for name in spec.labels:
        argv += ["--label", name]
    for secret in spec.secrets:
        argv += ["--secret", secret]
    for pair in spec.env:
        argv += ["--env-var", pair]
    argv += ["--commandline", spec.commandline]
    return argv + global_flags(spec.org, spec.team, spec.ace)


def global_flags(org: str | None, team: str | None, ace: str | None, *, json_output: bool = True) -> list[str]:
    """`--org/--team/--ace` where set (else ngc's own config or NGC_CLI_*), and JSON output."""
    flags = []
    for flag, value in (("--org", org), ("--team", team), ("--ace", ace)):
        if value:
            flags += [flag, value]
    return [*flags, "--format_type", "json"] if json_output else flags


def upload_argv(
    options: BcpOptions, workspace: str, source: Path, destination: str, exclude: tuple[str, ...] = UPLOAD_EXCLUDES
) -> list[str]:
    """`ngc workspace upload`: the contents of folder `source` to `destination` in the workspace."""
    argv = ["ngc", "workspace", "upload", workspace, "--source", str(source), "--destination", destination]
    for pattern in exclude:
        argv += ["--exclude", pattern]
    return argv + global_flags(options.org, options.team, options.ace)
