"""Base Command Platform's sections of pipelines.yaml: `backends.bcp` (with the detached driver's) and a stage's
`bcp:`, the section every other backend's unset counts, image and runtime are taken from. Keys map 1:1 to fields;
the field comments are the reference for pipelines.yaml."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from bcp_pipeline.config.instances import InstanceType
from bcp_pipeline.config.sections.hooks import RankLayout, Resources
from bcp_pipeline.config.typed import Duration, Where

LABEL_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
SECRET_PART = re.compile(r"^[A-Za-z0-9_.-]{1,63}$")
ENV_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,63}$")


@dataclass(kw_only=True)
class Mount:
    """A BCP workspace mounted into the job: `NAME:MOUNT:MODE`."""

    name: str
    mount: str
    mode: Literal["RW", "RO"] = "RW"


@dataclass(kw_only=True)
class DriverOptions:
    """`backends.bcp.driver`: the small job that runs the orchestrator inside BCP (`run --detach`)."""

    instance: str | None = None  # default: the instance of the pipeline's verification jobs (its smallest)
    image: str | None = None  # default: the image of the pipeline's verification jobs
    total_runtime: Duration = Duration("5D")  # the driver's own --total-runtime ...
    handover_before: Duration = Duration("30M")  # ... it submits its successor this long before that ends
    secret: str = "bcp-pipeline-ngc"  # the BCP secret (`ngc user secret create`) that holds the NGC API key ...
    secret_key: str = "api_key"  # ... under this key; it reaches the driver as NGC_CLI_API_KEY, nowhere else
    install_ngcsdk: bool = True  # pip install ngcsdk (and PyYAML) in the driver when its image lacks them
    python: str | None = None  # the driver's interpreter (default: backends.bcp.python)
    priority: Literal["HIGH", "NORMAL", "LOW"] = "NORMAL"


@dataclass(kw_only=True)
class BcpOptions:
    """`backends.bcp`: how to reach Base Command Platform."""

    transport: Literal["auto", "cli", "sdk"] = "auto"  # how to reach BCP: the ngc CLI, ngcsdk 4.19.1 in-process, or
    # auto (the CLI when `ngc` is on PATH, else ngcsdk)
    ngc: str = "ngc"  # path of the ngc CLI
    org: str | None = None  # else NGC_CLI_ORG or ~/.ngc/config
    team: str | None = None
    ace: str | None = None
    python: str = "python3"  # interpreter inside the container
    code_dir: str = ".bcp-pipeline/code"  # under the pipeline workspace: stages/ uploaded once per content hash
    jobs_dir: str = ".bcp-pipeline/jobs"  # under the pipeline workspace: job scripts (a NeMo pretrain's), per run
    poll_min_seconds: float = 10.0
    poll_max_seconds: float = 60.0
    status_outage_limit: Duration | None = None  # as on the clusters, but waiting for ever by default: a detached
    # driver that stopped would leave its run undriven until someone resumes it, and NGC outages are short
    training_log_seconds: float = 60.0  # a running training's progress (steps, loss) is read from its log this often
    telemetry_seconds: float | None = 300.0  # a training's GPU use, a `job telemetry` call per replica; null: never
    list_duration: Duration = Duration("30D")  # `job list --duration`: ngc's default 7-day window misses long runs
    lookup_grace_seconds: float = 60.0  # a stage found "submitting" after a restart is looked up in `job list`
    # this long before a job is submitted for it (the list may lag job creation)
    retry_attempts: int = 5  # calls made for an upload, a driver's start and hand-over when the API answers 429/5xx
    retry_backoff_seconds: float = 2.0  # first wait between them, doubling, with as much again of jitter
    ui_url: str | None = "https://bc.ngc.nvidia.com/jobs/{job_id}"  # job page shown by `status`; null to hide
    instances: dict[str, InstanceType] = field(default_factory=dict)  # instance types for estimates, added to or
    # replacing the known DGX ones (config/instances.py KNOWN_INSTANCES)
    driver: DriverOptions = field(default_factory=DriverOptions)  # `run --detach`: the orchestrator as a BCP job


@dataclass(kw_only=True)
class BcpResources(Resources):
    """One `ngc base-command job run`: every field renders to one flag."""

    instance: str | None = None  # --instance, e.g. dgxa100.80g.8.norm
    image: str | None = None  # --image, e.g. nvcr.io/nvaie/nemo-framework-training:23.11
    replicas: int = 1  # --replicas (nodes); > 1 adds --array-type and a bcprun launcher
    processes: int = 1  # processes per replica, started by `bcprun --npernode`
    array_type: Literal["PYTORCH", "MPI", "PARALLEL", "HOROVOD"] = "PYTORCH"
    total_runtime: Duration | None = None  # --total-runtime; required by ngc when replicas > 1
    min_timeslice: Duration | None = None  # --min-timeslice
    preempt: Literal["RUNONCE", "RESUMABLE", "RESTARTABLE"] = "RUNONCE"
    priority: Literal["HIGH", "NORMAL", "LOW"] = "NORMAL"
    order: int = 50  # --order, 1..99
    workspaces: list[Mount] = field(default_factory=list)  # --workspace NAME:MOUNT:MODE
    result: str = "/results"  # --result
    secrets: list[str] = field(default_factory=list)  # --secret NAME or NAME:KEY:ENV (values never in argv)
    env: dict[str, str] = field(default_factory=dict)  # --env-var KEY:VALUE
    labels: list[str] = field(default_factory=list)  # --label (run and stage labels are added)
    on_preempted: Literal["resume", "wait"] = "resume"  # PREEMPTED: `ngc job resume` it, or wait for someone to
    launcher: Literal["bcprun", "none"] = "bcprun"  # none: the command starts its own ranks (NeMo launcher)
    command: list[str] | None = None  # run this instead of `python3 ${code}/PROGRAM ARGS`
    numa_binding: bool = True  # a Megatron-Bridge rank's CPUs, and its memory where numactl may, on its GPU's NUMA node
    # (stages/rank_start.py; off: as the image and bcprun leave them)

    counts: ClassVar[tuple[str, ...]] = ()  # replicas and processes: checked by BCP's own rules (validate)
    image_field: ClassVar[str | None] = "image"  # the field naming the stage's container image (output digest)
    gpus_field: ClassVar[str | None] = None  # the field giving a training's GPUs (ranks) a node: the instance's here
    instance_field: ClassVar[str | None] = "instance"

    def rank_layout(self, bcp: BcpResources) -> RankLayout:
        return RankLayout(nodes=self.replicas, per_node=self.processes)

    def validate(self, stage: Any, at: Callable[[str | None], Where]) -> None:
        """BCP's own rules for a job (what ngc would refuse), at the section's line."""
        where = at(None)
        if self.replicas < 1 or self.processes < 1:
            raise where.error(f"replicas and processes must be >= 1, got {self.replicas} x {self.processes}")
        if self.replicas > 1 and self.total_runtime is None:
            raise where.error("replicas > 1 needs total_runtime (ngc requires --total-runtime for multi-node jobs)")
        if not 1 <= self.order <= 99:
            raise where.error(f"order {self.order} is outside 1..99")
        for label in self.labels:
            if not LABEL_PATTERN.match(label) or label.startswith("_x"):
                raise where.error(f"label {label!r} must match [A-Za-z_][A-Za-z0-9_]* (<= 256 chars, not _x...)")
        for secret in self.secrets:
            parts = secret.split(":")
            if len(parts) not in (1, 3) or not all(SECRET_PART.match(p) for p in parts):
                raise where.error(f"secret {secret!r} must be NAME or NAME:KEY:ENVVAR ([A-Za-z0-9_.-], <= 63 chars)")
        for key, value in self.env.items():
            if not ENV_KEY.match(key) or len(value) > 2048:
                raise where.error(f"env var {key!r} must match [A-Za-z0-9_.-]{{1,63}} with a value <= 2048 chars")
