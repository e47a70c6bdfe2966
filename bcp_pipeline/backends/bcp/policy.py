"""The ACE's policy against a pipeline's rendered jobs: a pure check, before anything is submitted.

An ACE (`ngc base-command ace info ACE`, or ngcsdk's `Client().basecommand.aces.info(ACE).toDict()`; the fields of
ngcsdk 4.19.1's `Ace` and `AceInstance` data classes) limits what a job may ask: its instances, the longest
`--total-runtime` (maxRuntimeSeconds; NVIDIA's client refuses more before it sends anything), the most replicas
(maxAllowedReplicas), whether an instance allows multi-node jobs (allowMultinode, allowMultinodePreemptable) and
which array types (multiNodeSupportedArrayTypes), and how many jobs of a user may be active at once
(maxActiveJobsPerUser: a streamed edge's two jobs, and the --detach driver, are active at once). A field the ACE
leaves out is no limit.

`violations(ace, jobs)` lists every job that breaks one, each with the `--set` that fixes it. `run` and `plan`
read the ACE and call it through ace.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bcp_pipeline.backends.bcp.driver import DRIVER_STAGE
from bcp_pipeline.backends.bcp.render import JobSpec
from bcp_pipeline.backends.contract import JobRequest, job_label
from bcp_pipeline.config.durations import format_duration, parse_duration

PREEMPTABLE = frozenset({"RESUMABLE", "RESTARTABLE"})  # preempt classes the scheduler may preempt
PREFERRED_ARRAY_TYPE = "PYTORCH"  # what the stage programs' rank variables need (render.py check_stage)


@dataclass(frozen=True, kw_only=True)
class PlannedJob:
    """One job a run submits: its stage, kind (`stage`, `verify`, or `driver` for `run --detach`'s) and JobSpec."""

    stage: str  # DRIVER_STAGE for the driver
    kind: str
    spec: JobSpec
    continues: bool = False  # a stage that continues from its checkpoint in a further job (NeMo pretraining)
    streams_from: tuple[str, ...] = ()  # streamed needs (config/needs.py): this job runs beside theirs

    @property
    def label(self) -> str:
        return "the driver (--detach)" if self.kind == "driver" else job_label(self.stage, self.kind)


@dataclass(frozen=True, kw_only=True)
class Violation:
    """One job asking more than the ACE allows: which limit, what the job asks, what the ACE allows, the fix."""

    stage: str
    kind: str
    limit: str  # the ACE field, e.g. maxRuntimeSeconds
    value: str  # what the job asks
    allowed: str  # what the ACE allows
    fix: str  # e.g. `--set pretrain.bcp.total_runtime=1D`

    def __str__(self) -> str:
        job = "the --detach driver job" if self.kind == "driver" else job_label(self.stage, self.kind)
        return f"{job}: {self.value}, but the ACE's {self.limit} allows {self.allowed}; {self.fix}"


def planned_jobs(jobs: Iterable[tuple[JobRequest, JobSpec]], driver: JobSpec | None = None) -> list[PlannedJob]:
    """The jobs (each request with its rendered JobSpec) and the `--detach` driver's, where one is given."""
    planned = [PlannedJob(stage=request.stage.name, kind=request.kind, spec=spec,
                          continues=request.kind == "stage" and request.stage.continuation is not None,
                          streams_from=tuple(request.stage.streamed) if request.kind == "stage" else ())
               for request, spec in jobs]
    return planned + ([PlannedJob(stage=DRIVER_STAGE, kind="driver", spec=driver)] if driver is not None else [])


def rendered_jobs(submissions: Iterable[Any]) -> list[tuple[JobRequest, JobSpec]]:
    """Each rendered Submission of the BCP backend with its JobSpec (payload["spec"])."""
    return [(s.request, JobSpec(**s.payload["spec"])) for s in submissions]


def violations(ace: Mapping[str, Any], jobs: Sequence[PlannedJob], *, detach: bool = False) -> list[Violation]:
    """Every limit of `ace` that a job of `jobs` breaks, in job order. `detach`: the orchestrator itself runs as a
    job (`run --detach`), so it and one stage job must both be active at once."""
    found: list[Violation] = []
    instances = {str(i.get("name")): i for i in ace.get("instances") or [] if isinstance(i, Mapping)}
    for job in jobs:
        found += _job_violations(ace, instances, job)
    limit = ace.get("maxActiveJobsPerUser")
    if detach and isinstance(limit, int) and limit < 2:
        found.append(Violation(stage="(driver)", kind="driver", limit="maxActiveJobsPerUser",
                               value="`run --detach` needs the driver job and one stage job active at once",
                               allowed=f"{limit} active job(s) per user",
                               fix="run without --detach (the orchestrator then runs here), or use an ACE that "
                                   "allows at least 2 active jobs per user"))
    for job in jobs:  # a streamed edge's two jobs run at once; past the limit the second waits, and nothing overlaps
        together = 1 + len(job.streams_from) + (1 if detach else 0)
        if job.streams_from and isinstance(limit, int) and limit < together:
            upstream = ", ".join(job.streams_from)
            found.append(Violation(
                stage=job.stage, kind=job.kind, limit="maxActiveJobsPerUser",
                value=f"it streams from {upstream} (needs with stream: true), so {together} jobs are active at once"
                      + (" with the --detach driver" if detach else ""),
                allowed=f"{limit} active job(s) per user",
                fix=f"drop `stream: true` from {job.stage}'s needs (it then starts after {upstream}), or use an ACE "
                    f"that allows at least {together} active jobs per user"))
    return found


def _job_violations(ace: Mapping[str, Any], instances: Mapping[str, Mapping[str, Any]],
                    job: PlannedJob) -> list[Violation]:
    spec, found = job.spec, []

    def add(limit: str, value: str, allowed: str, key: str, new: str, why: str = "") -> None:
        found.append(Violation(stage=job.stage, kind=job.kind, limit=limit, value=value, allowed=allowed,
                               fix=_fix(job, key, new) + why))

    instance = instances.get(spec.instance)
    if instances and instance is None:
        same = _similar_instance(spec.instance, instances)
        add("instances", f"instance {spec.instance}", ", ".join(sorted(instances)), "instance", same)
    runtime = parse_duration(spec.total_runtime) if spec.total_runtime else None
    max_runtime = ace.get("maxRuntimeSeconds")
    if runtime and isinstance(max_runtime, (int, float)) and runtime > max_runtime:
        add("maxRuntimeSeconds", f"total_runtime {spec.total_runtime} ({runtime:.0f} s)",
            f"{format_duration(int(max_runtime))} ({max_runtime:.0f} s)", "total_runtime",
            format_duration(int(max_runtime)),
            " (the stage then continues from its checkpoint in a further job)" if job.continues else
            " (the driver hands the run to a new driver job before that ends)" if job.kind == "driver" else "")
    max_replicas = ace.get("maxAllowedReplicas")
    if isinstance(max_replicas, int) and spec.replicas > max_replicas:
        add("maxAllowedReplicas", f"replicas {spec.replicas}", str(max_replicas), "replicas", str(max_replicas))
    if spec.replicas > 1 and instance is not None:
        if instance.get("allowMultinode") is False:
            other = [name for name, i in sorted(instances.items()) if i.get("allowMultinode")]
            add("allowMultinode", f"replicas {spec.replicas} on instance {spec.instance}",
                f"one replica on {spec.instance}", *(("instance", other[0]) if other else ("replicas", "1")))
        elif instance.get("allowMultinodePreemptable") is False and spec.preempt in PREEMPTABLE:
            add("allowMultinodePreemptable", f"a preemptable ({spec.preempt}) multi-node job on {spec.instance}",
                "multi-node jobs that are not preemptable", "preempt", "RUNONCE")
        types = instance.get("multiNodeSupportedArrayTypes")
        if isinstance(types, list) and spec.array_type not in types:
            better = PREFERRED_ARRAY_TYPE if PREFERRED_ARRAY_TYPE in types else (types[0] if types else None)
            add("multiNodeSupportedArrayTypes", f"array_type {spec.array_type} on {spec.instance}",
                ", ".join(types) or "none", *(("array_type", better) if better else ("replicas", "1")))
    return found


def _fix(job: PlannedJob, key: str, value: str) -> str:
    if job.kind == "driver":  # backend-wide options (config/resources.py DriverOptions), not a stage's
        return f"--set backends.bcp.driver.{key}={value}"
    if job.kind == "verify":  # verification jobs take their resources from the pipeline's `verification:`
        return f"set verification.bcp.{key}: {value} in pipelines.yaml"
    return f"--set {job.stage}.bcp.{key}={value}"


def _similar_instance(wanted: str, instances: Mapping[str, Mapping[str, Any]]) -> str:
    """An instance of the ACE with as many GPUs as `wanted`'s name says (dgxa100.80g.8.norm: 8), else the first."""
    parts = wanted.split(".")
    gpus = parts[2] if len(parts) > 2 else None
    for name in sorted(instances):
        if gpus is not None and name.split(".")[2:3] == [gpus]:
            return name
    return sorted(instances)[0]
