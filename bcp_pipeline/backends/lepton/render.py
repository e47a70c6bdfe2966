"""A stage's job on DGX Cloud Lepton, rendered (pure): the `LeptonJob` JSON that the SDK's `client.job.create`
posts (leptonai.api.v2.types.job: `metadata` + `spec`, a `LeptonJobUserSpec`), and the `lep job create` line a
user could paste with it.

Every worker runs the same container command: WORKER_LAUNCHER starts `processes` processes of the stage program,
each with RANK = LEPTON_JOB_WORKER_INDEX x processes + LOCAL_RANK and WORLD_SIZE = LEPTON_JOB_TOTAL_WORKERS x
processes (the variables Lepton sets in each worker of a job), every line of theirs headed `[rankN]:` as torchrun
heads them, so one rank's lines can be taken out of its worker's log. A Megatron-Bridge training runs one torchrun
a worker instead, meeting at worker 0 as Lepton's own torchrun template has it (MASTER_ADDR
`$LEPTON_JOB_SERVICE_PREFIX-0.$LEPTON_SUBDOMAIN`, the workers' DNS names inside the job).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.shared import templates
from bcp_pipeline.backends.shared.bridge_command import data_list_argv as bridge_data_list_argv
from bcp_pipeline.backends.shared.bridge_command import data_list_file, gpus_per_node, trains_with_bridge
from bcp_pipeline.backends.shared.bridge_command import rank_argv as bridge_rank_argv
from bcp_pipeline.backends.shared.command import placeholder_values, resolved_env, shell_join, stage_command
from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.resources import LeptonOptions, LeptonResources
from bcp_pipeline.errors import SubmissionError

LABEL_RUN, LABEL_STAGE, LABEL_KIND, LABEL_MANAGED = (
    "bcp-pipeline.run",
    "bcp-pipeline.stage",
    "bcp-pipeline.kind",
    "managed-by",
)
MANAGED_BY = "bcp-pipeline"
NAME_MAX = 36  # the SDK's validate_job_name (job_validation.py MAX_JOB_NAME_LENGTH)
LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")
NAME_UNSAFE = re.compile(r"[^a-z0-9-]+")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TRAINING_SHM_MIB = 65536  # NeMo-Run's LeptonExecutor default: NCCL and the data loaders' shared tensors
TORCHRUN_PREFIX = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:"}

# The workers' own variables -> the ranks, each rank's lines prefixed (worker_launcher.sh says how).
WORKER_LAUNCHER = templates.load(__package__, "worker_launcher.sh", one_line=True)
MASTER_ADDR = "${LEPTON_JOB_SERVICE_PREFIX}-0.${LEPTON_SUBDOMAIN}"


@dataclass(frozen=True, kw_only=True)
class Shape:
    """A stage's job after deriving unset fields from the BCP section and the backend options."""

    workers: int
    processes: int
    resource_shape: str
    node_group: str | None
    image: str


def shape(request: JobRequest, options: LeptonOptions) -> Shape:
    res: LeptonResources = request.resources("lepton")
    layout = request.rank_layout("lepton")
    processes = gpus_per_node(request, "lepton") if trains_with_bridge(request, "lepton") else layout.per_node
    image = res.image or request.stage.bcp.image or options.image
    if not image:
        raise SubmissionError(
            f"{request.label}: no image: set lepton.image (or bcp.image) on the stage, or backends.lepton.image"
        )
    trained_on = TRAINING_SHAPES.get(request.stage.bcp.instance or "") if request.stage.engine else None
    resource_shape = res.resource_shape or trained_on
    return Shape(
        workers=layout.nodes,
        processes=processes,
        resource_shape=resource_shape or options.resource_shape,
        node_group=res.node_group or options.node_group,
        image=image,
    )


# A training's shape where its lepton section names none: the GPU node its BCP instance is (a data stage keeps the
# backend's default shape: on BCP it takes a whole DGX for CPU work, which on Lepton would be a GPU node idling).
# Names as Lepton's GPU shapes are spelled (gpu.8xh100-sxm); `check` confirms the workspace offers the one used.
TRAINING_SHAPES = {
    **{f"dgxa100.80g.{g}.norm": f"gpu.{g}xa100-80gb" for g in (1, 2, 4, 8)},
    "dgxa100.40g.8.norm": "gpu.8xa100-40gb",
    "dgxh100.80g.8.norm": "gpu.8xh100-sxm",
}


def code_folder(options: LeptonOptions, mount: str, code_hash: str) -> str:
    return f"{mount.rstrip('/')}/{options.code_dir.strip('/')}/{code_hash}"


def job_values(request: JobRequest, options: LeptonOptions, code_hash: str) -> dict[str, str]:
    mount = request.pipeline.workspace.mount.rstrip("/")
    return placeholder_values(
        request,
        workspace=mount,
        code=code_folder(options, mount, code_hash),
        python=options.python,
        results=f"{mount}/.bcp-pipeline/results/{request.run_id}/{request.stage.name}",
    )


def label_value(text: str) -> str:
    return LABEL_VALUE.sub("_", text)[:63].strip("._-") or "x"


def job_labels(request: JobRequest) -> dict[str, str]:
    """The stage's own labels, then the backend's (what it lists by), which they cannot replace."""
    return {
        **request.resources("lepton").labels,
        LABEL_MANAGED: MANAGED_BY,
        LABEL_RUN: label_value(request.run_id),
        LABEL_STAGE: label_value(request.stage.name),
        LABEL_KIND: request.kind,
    }


def label_query(run_id: str, stage: str | None = None, kind: str | None = None) -> str:
    """The list call's label selector (`query`): the run's jobs, or one stage's of one kind."""
    pairs = [(LABEL_MANAGED, MANAGED_BY), (LABEL_RUN, label_value(run_id))]
    pairs += [(LABEL_STAGE, label_value(stage))] if stage else []
    pairs += [(LABEL_KIND, kind)] if kind else []
    return ",".join(f"{key}={value}" for key, value in pairs)


def job_id(request: JobRequest) -> str:
    """A name the SDK accepts (lowercase, digits, '-', at most 36, starting with a letter), unique per run, stage,
    kind and attempt: a second create of the same attempt is refused by the service (409), never a second job."""
    digest = hashlib.sha256(f"{request.run_id}\0{request.stage.name}\0{request.kind}\0{request.attempt}".encode())
    readable = NAME_UNSAFE.sub("-", f"{request.stage.name}{'-v' if request.kind == 'verify' else ''}".lower())
    readable = readable.strip("-")[: NAME_MAX - 12].strip("-")
    return f"bp-{readable}-{digest.hexdigest()[:8]}" if readable else f"bp-{digest.hexdigest()[:8]}"


def envs(request: JobRequest, options: LeptonOptions, size: Shape, code_hash: str) -> list[dict[str, Any]]:
    """The job's environment: what the launcher needs, the stage's env, each secret by name (never a value)."""
    res: LeptonResources = request.resources("lepton")
    given = {
        "BCP_PIPELINE_RUN_ID": request.run_id,
        "BCP_PIPELINE_STAGE": request.stage.name,
        "BCP_PIPELINE_PROCESSES": str(size.processes),
        "MASTER_PORT": str(options.master_port),
    }
    if trains_with_bridge(request, "lepton"):
        given |= TORCHRUN_PREFIX
    given |= resolved_env(request, "lepton", job_values(request, options, code_hash))
    out: list[dict[str, Any]] = []
    for key, value in given.items():
        if not ENV_NAME.match(key):
            raise SubmissionError(f"{request.label}: lepton env name {key!r} is not a valid variable name")
        out.append({"name": key, "value": value})
    for spec in res.secrets:
        secret, _, variable = spec.partition(":")
        if not secret or not ENV_NAME.match(variable):
            raise SubmissionError(
                f"{request.label}: lepton secret {spec!r} must be SECRET:ENV (a workspace secret "
                "by name, exposed as the variable ENV)"
            )
        out.append({"name": variable, "value_from": {"secret_name_ref": secret}})
    return out


def container_command(request: JobRequest, options: LeptonOptions, size: Shape, code_hash: str) -> list[str]:
    values = job_values(request, options, code_hash)
    workdir = f"cd {shlex.quote(values['workspace'])} && "
    if not trains_with_bridge(request, "lepton"):
        return [
            "bash",
            "-c",
            workdir + WORKER_LAUNCHER,
            "bcp-pipeline-worker",
            *stage_command(request, "lepton", values),
        ]
    runtime = request.stage.bcp.total_runtime
    entry = bridge_rank_argv(request, "lepton", values, str(runtime) if runtime else None)
    torchrun = [
        options.python,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={size.processes}",
        "--tee=3",
        f"--nnodes={size.workers}",
    ]
    rendezvous = '--node_rank="$LEPTON_JOB_WORKER_INDEX" --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT"'
    script = (
        f'{workdir}export MASTER_ADDR="{MASTER_ADDR}" && '
        f"mkdir -p {shlex.quote(data_list_file(request, values).rsplit('/', 1)[0])} && "
        f"{shell_join(bridge_data_list_argv(request, values))} && "
        f'exec {shell_join(torchrun)} {rendezvous} "$@"'
    )
    return ["bash", "-c", script, "bcp-pipeline-worker", *entry[2:]]  # past `python -u`: torchrun runs it


def job_spec(request: JobRequest, options: LeptonOptions, code_hash: str, storage_folder: str) -> dict[str, Any]:
    """The LeptonJob the SDK posts (its JSON names: `exclude_none`, `by_alias`, as `safe_json` sends it)."""
    res: LeptonResources = request.resources("lepton")
    size = shape(request, options)
    training = trains_with_bridge(request, "lepton")
    mount = request.pipeline.workspace.mount.rstrip("/")
    spec: dict[str, Any] = {
        "resource_shape": size.resource_shape,
        "container": {"image": size.image, "command": container_command(request, options, size, code_hash)},
        "completions": size.workers,
        "parallelism": size.workers,
        "max_failure_retry": res.max_failure_retry,
        "envs": envs(request, options, size, code_hash),
        "mounts": [
            {
                "path": storage_folder,
                "from": options.storage,
                "mount_path": mount,
                **({"mount_options": {"read_only": True}} if request.kind == "verify" else {}),
            }
        ],
        "image_pull_secrets": list(res.image_pull_secrets),
        "ttl_seconds_after_finished": parse_duration(res.ttl_after_finished or options.ttl_after_finished),
    }
    if size.node_group:
        spec["affinity"] = {"allowed_dedicated_node_groups": [size.node_group]}
    if size.workers > 1:  # the workers reach one another by name (torch.distributed, a rendezvous)
        spec["intra_job_communication"] = True
    if res.shared_memory_size or training:
        spec["shared_memory_size"] = res.shared_memory_size or TRAINING_SHM_MIB
    if res.priority_class or res.can_be_preempted or res.can_preempt:
        spec["queue_config"] = {
            key: value
            for key, value in (
                ("priority_class", res.priority_class),
                ("can_be_preempted", res.can_be_preempted or None),
                ("can_preempt", res.can_preempt or None),
            )
            if value is not None
        }
    name = job_id(request)
    return {"metadata": {"id": name, "name": name, "labels": job_labels(request)}, "spec": spec}


def printable(job: dict[str, Any]) -> str:
    """What a user pastes: the spec as `lep job create --file` reads it (a LeptonJobUserSpec), and the command; the
    labels the backend lists its jobs by travel with the SDK's create (`metadata`), shown as a comment."""
    name = job["metadata"]["id"]
    labels = ",".join(f"{k}={v}" for k, v in job["metadata"]["labels"].items())
    return (
        f"# labels: {labels}\ncat > {name}.json <<'JSON'\n{json.dumps(job['spec'], indent=2)}\nJSON\n"
        f"lep job create --name {name} --file {name}.json\n"
    )


def rendezvous(request: JobRequest, options: LeptonOptions) -> dict[str, Any] | None:
    size = shape(request, options)
    if size.workers * size.processes == 1:
        return None
    return {
        "MASTER_ADDR": f"{MASTER_ADDR} (worker 0)",
        "MASTER_PORT": options.master_port,
        "WORLD_SIZE": size.workers * size.processes,
        "nodes": size.workers,
        "per_node": size.processes,
        "RANK": "LEPTON_JOB_WORKER_INDEX x per_node + LOCAL_RANK",
    }
