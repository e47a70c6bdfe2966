"""Would BCP refuse this run? What `run` asks of a BCP pipeline before it records a run (the backend's
`check_ready` and `check_limits` hooks), and what `plan` shows of the same (`describe_limits`), in four parts:

1. the policy: the ACE's limits against the rendered jobs, a pure check (`violations`) that names each broken limit
   with the `--set` that fixes it; `check` holds the ACE it reads against it too;
2. the live ACE (`check_ace`), read once from the service: `run` refuses a pipeline the ACE would refuse (or, with
   --detach, deadlock) before it records a run; `plan` shows the same check when the credentials are there, and
   says it did not check when they are not (plan needs nothing);
3. a saved `check` profile's refusals (`profile_refusals`): jobs under a bcprun the probe found missing, NeMo stages
   whose exact composition the NeMo probe saw refused or left with a mandatory value unset, and every limit of the
   ACE it saw that a job breaks;
4. the hooks: every job has an instance and an image and breaks none of BCP's own rules, a transport and
   credentials are there, the workspaces exist, and the ACE's limits fit the jobs (with `--detach`, the driver's).

An ACE (`ngc base-command ace info ACE`, or ngcsdk's `Client().basecommand.aces.info(ACE).toDict()`; the fields of
ngcsdk 4.19.1's `Ace` and `AceInstance` data classes) limits what a job may ask: its instances, the longest
`--total-runtime` (maxRuntimeSeconds; NVIDIA's client refuses more before it sends anything), the most replicas
(maxAllowedReplicas), whether an instance allows multi-node jobs (allowMultinode, allowMultinodePreemptable) and
which array types (multiNodeSupportedArrayTypes), and how many jobs of a user may be active at once
(maxActiveJobsPerUser: a streamed edge's two jobs, and the --detach driver, are active at once). A field the ACE
leaves out is no limit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.bcp.connect import (
    NOTHING_DONE,
    check_credentials,
    check_workspaces_exist,
    choose_transport,
    make_transport,
    read_ngc_config,
)
from bcp_pipeline.backends.bcp.driver import DRIVER_STAGE, driver_job_shape
from bcp_pipeline.backends.bcp.nemo_job import nemo_launcher_overrides, nemo_overrides_digest
from bcp_pipeline.backends.bcp.render import JobSpec, check_stage_resources, job_spec
from bcp_pipeline.backends.bcp.transport import Transport, retry_policy
from bcp_pipeline.backends.contract import JobRequest, Submission, job_label
from bcp_pipeline.backends.retries import RetryPolicy, with_retries
from bcp_pipeline.config.durations import format_duration, parse_duration
from bcp_pipeline.config.model import Config, PipelineConfig
from bcp_pipeline.config.resources import BcpOptions
from bcp_pipeline.errors import BackendCallError, ConfigError

PREEMPTABLE = frozenset({"RESUMABLE", "RESTARTABLE"})  # preempt classes the scheduler may preempt
PREFERRED_ARRAY_TYPE = "PYTORCH"  # what the stage programs' rank variables need (render.py check_stage)
PLAN_RETRIES = RetryPolicy(attempts=2, backoff=1.0, max_wait=2.0)  # `plan`'s look-up of the ACE


# -- 1. the policy: the ACE's limits against the rendered jobs (pure) ------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PlannedJob:
    """One job a run submits: its stage, kind (`stage`, `verify`, or `driver` for `run --detach`'s) and JobSpec."""

    stage: str  # DRIVER_STAGE for the driver
    kind: str
    spec: JobSpec
    continues: str = ""  # what a stage continued in a further job goes on from (StageConfig.resumes_from), or ""
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
    planned = [
        PlannedJob(
            stage=request.stage.name,
            kind=request.kind,
            spec=spec,
            continues=request.stage.resumes_from if request.kind == "stage" else "",
            streams_from=tuple(request.stage.streamed) if request.kind == "stage" else (),
        )
        for request, spec in jobs
    ]
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
        found.append(
            Violation(
                stage="(driver)",
                kind="driver",
                limit="maxActiveJobsPerUser",
                value="`run --detach` needs the driver job and one stage job active at once",
                allowed=f"{limit} active job(s) per user",
                fix="run without --detach (the orchestrator then runs here), or use an ACE that "
                "allows at least 2 active jobs per user",
            )
        )
    for job in jobs:  # a streamed edge's two jobs run at once; past the limit the second waits, and nothing overlaps
        together = 1 + len(job.streams_from) + (1 if detach else 0)
        if job.streams_from and isinstance(limit, int) and limit < together:
            upstream = ", ".join(job.streams_from)
            found.append(
                Violation(
                    stage=job.stage,
                    kind=job.kind,
                    limit="maxActiveJobsPerUser",
                    value=f"it streams from {upstream} (needs with stream: true), so {together} jobs are active at once"
                    + (" with the --detach driver" if detach else ""),
                    allowed=f"{limit} active job(s) per user",
                    fix=f"drop `stream: true` from {job.stage}'s needs (it then starts after {upstream}), "
                    f"or use an ACE that allows at least {together} active jobs per user",
                )
            )
    return found


def _job_violations(
    ace: Mapping[str, Any], instances: Mapping[str, Mapping[str, Any]], job: PlannedJob
) -> list[Violation]:
    spec, found = job.spec, []

    def add(limit: str, value: str, allowed: str, key: str, new: str, why: str = "") -> None:
        found.append(
            Violation(
                stage=job.stage, kind=job.kind, limit=limit, value=value, allowed=allowed, fix=_fix(job, key, new) + why
            )
        )

    instance = instances.get(spec.instance)
    if instances and instance is None:
        same = _similar_instance(spec.instance, instances)
        add("instances", f"instance {spec.instance}", ", ".join(sorted(instances)), "instance", same)
    runtime = parse_duration(spec.total_runtime) if spec.total_runtime else None
    max_runtime = ace.get("maxRuntimeSeconds")
    if runtime and isinstance(max_runtime, (int, float)) and runtime > max_runtime:
        add(
            "maxRuntimeSeconds",
            f"total_runtime {spec.total_runtime} ({runtime:.0f} s)",
            f"{format_duration(int(max_runtime))} ({max_runtime:.0f} s)",
            "total_runtime",
            format_duration(int(max_runtime)),
            f" (the stage then continues from {job.continues} in a further job)"
            if job.continues
            else " (the driver hands the run to a new driver job before that ends)"
            if job.kind == "driver"
            else "",
        )
    max_replicas = ace.get("maxAllowedReplicas")
    if isinstance(max_replicas, int) and spec.replicas > max_replicas:
        add("maxAllowedReplicas", f"replicas {spec.replicas}", str(max_replicas), "replicas", str(max_replicas))
    if spec.replicas > 1 and instance is not None:
        if instance.get("allowMultinode") is False:
            other = [name for name, i in sorted(instances.items()) if i.get("allowMultinode")]
            add(
                "allowMultinode",
                f"replicas {spec.replicas} on instance {spec.instance}",
                f"one replica on {spec.instance}",
                *(("instance", other[0]) if other else ("replicas", "1")),
            )
        elif instance.get("allowMultinodePreemptable") is False and spec.preempt in PREEMPTABLE:
            add(
                "allowMultinodePreemptable",
                f"a preemptable ({spec.preempt}) multi-node job on {spec.instance}",
                "multi-node jobs that are not preemptable",
                "preempt",
                "RUNONCE",
            )
        types = instance.get("multiNodeSupportedArrayTypes")
        if isinstance(types, list) and spec.array_type not in types:
            better = PREFERRED_ARRAY_TYPE if PREFERRED_ARRAY_TYPE in types else (types[0] if types else None)
            add(
                "multiNodeSupportedArrayTypes",
                f"array_type {spec.array_type} on {spec.instance}",
                ", ".join(types) or "none",
                *(("array_type", better) if better else ("replicas", "1")),
            )
    return found


def _fix(job: PlannedJob, key: str, value: str) -> str:
    if job.kind == "driver":  # backend-wide options (config/sections/bcp.py DriverOptions), not a stage's
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


# -- 2. the live ACE, read once from the service ---------------------------------------------------------------------


@dataclass(kw_only=True)
class AceCheck:
    """What checking a pipeline's jobs against the ACE found; `checked` False: why not, in `reason`."""

    ace: str | None
    checked: bool
    reason: str = ""
    violations: list[Violation] = field(default_factory=list)

    def as_json(self) -> dict:
        return {
            "ace": self.ace,
            "checked": self.checked,
            "reason": self.reason or None,
            "violations": [str(v) for v in self.violations],
        }

    def lines(self) -> list[str]:
        """For people: one line when all is well or nothing was checked, else one per violation."""
        if not self.checked:
            return [f"ACE limits not checked: {self.reason}"]
        if not self.violations:
            return [f"ACE {self.ace}: every job fits its limits"]
        return [
            f"ACE {self.ace} does not allow {len(self.violations)} of what this pipeline asks:",
            *(f"  {v}" for v in self.violations),
        ]


def configured_ace(options: BcpOptions, environ: Mapping[str, str] | None = None) -> str | None:
    """The ACE jobs go to: pipelines.yaml, else NGC_CLI_ACE, else `ngc config`'s."""
    env = dict(os.environ if environ is None else environ)
    return options.ace or env.get("NGC_CLI_ACE") or read_ngc_config(env).get("ace") or None


def check_ace(
    options: BcpOptions,
    stages_dir: Path,
    requests: Iterable[JobRequest],
    *,
    detach: bool,
    driver: JobSpec | None = None,
    transport: Transport | None = None,
    policy: RetryPolicy | None = None,
) -> AceCheck:
    """Read the ACE (retried while the API is busy) and check every job against it, the --detach `driver` job
    too. BackendCallError when the ACE cannot be read: `job run` reads it too before it submits, so a run could
    not start either."""
    name = configured_ace(options)
    if not name:
        return AceCheck(ace=None, checked=False, reason="no ACE is configured")
    jobs = planned_jobs([(r, job_spec(r, options, stages_dir)) for r in requests], driver)
    client = transport or make_transport(options)
    ace = with_retries(lambda: client.ace(name), f"reading the limits of ACE {name}", policy or retry_policy(options))
    return AceCheck(ace=name, checked=True, violations=violations(ace, jobs, detach=detach))


def refuse_violations(check: AceCheck, pipeline: str) -> None:
    """A ConfigError naming each job the ACE would refuse, its limit and the `--set` that fixes it."""
    if check.violations:
        raise ConfigError(f"pipeline {pipeline}: " + "\n".join(check.lines()) + f"\n{NOTHING_DONE}")


def plan_check(
    options: BcpOptions,
    stages_dir: Path,
    requests: Iterable[JobRequest],
    *,
    detach: bool,
    driver: JobSpec | None = None,
) -> AceCheck:
    """`plan`'s view: the check when a transport and credentials are there, else why it was not made."""
    try:
        choose_transport(options)
        check_credentials(options)
        # One quick retry only: a plan is a preview, and one that waits out run's whole back-off for an API that
        # cannot be reached says no more than "not checked" a few seconds sooner would.
        return check_ace(options, stages_dir, requests, detach=detach, driver=driver, policy=PLAN_RETRIES)
    except (ConfigError, BackendCallError) as exc:
        # `run`'s refusals end in "Nothing was submitted or recorded"; plan never submits, so that says nothing here
        reason = " ".join(str(exc).replace(f". {NOTHING_DONE}", "").split())
        return AceCheck(ace=configured_ace(options), checked=False, reason=reason)


# -- 3. what a saved `check` profile rules out -----------------------------------------------------------------------


def profile_refusals(
    profile: dict[str, Any],
    submissions: list[Submission],
    options: BcpOptions,
    stages_dir: Path,
    driver: JobSpec | None,
    *,
    detach: bool = False,
) -> list[str]:
    """Each job the profile rules out, named with the difference and the check that found it."""
    where = f"the check of {profile.get('key')} ({checked_when(profile)})"
    found = []
    if (((profile.get("facts") or {}).get("probe") or {}).get("bcprun") or {}).get("present") is False:
        for submission in submissions:
            spec = submission.payload.get("spec") or {}
            if str(spec.get("commandline", "")).startswith("bcprun "):
                found.append(
                    f"{submission.request.label} starts under bcprun, which {where} found missing in jobs here"
                )
    found += nemo_refusals(profile, submissions, options, stages_dir, where)
    ace = (profile.get("facts") or {}).get("ace")
    if isinstance(ace, dict):
        found += [
            f"{violation} (as {where} saw the ACE)"
            for violation in violations(ace, planned_jobs(rendered_jobs(submissions), driver), detach=detach)
        ]
    return found


def nemo_refusals(
    profile: dict[str, Any], submissions: list[Submission], options: BcpOptions, stages_dir: Path, where: str
) -> list[str]:
    """NeMo stages whose exact composition (image and overrides) the profile's NeMo probe saw refused, or left with
    a mandatory value unset: the job would fail as it starts. A changed stage is not judged."""
    seen = {
        fact.get("digest"): fact for fact in (profile.get("facts") or {}).get("nemo") or [] if isinstance(fact, dict)
    }
    found: list[str] = []
    if not seen:
        return found
    for submission in submissions:
        request = submission.request
        if request.kind != "stage" or request.stage.nemo is None or request.resources("bcp").command:
            continue
        image = (submission.payload.get("spec") or {}).get("image", "")
        fact = seen.get(nemo_overrides_digest(image, nemo_launcher_overrides(request, options, stages_dir)))
        if fact and fact.get("composed") is False:
            found.append(
                f"{request.label}: the NeMo launcher in {image} refused its overrides when {where} "
                f"composed them: {fact.get('error') or '(no message)'}"
            )
        elif fact and fact.get("missing"):
            found.append(
                f"{request.label}: the NeMo launcher in {image} leaves {', '.join(fact['missing'])} unset "
                f"(???) with its overrides, as {where} composed them"
            )
    return found


def checked_when(profile: dict[str, Any]) -> str:
    checked = profile.get("checked_at")
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(checked)) if isinstance(checked, (int, float)) else "?"


# -- 4. the hooks ----------------------------------------------------------------------------------------------------


def check_ready(config: Config, pipeline: PipelineConfig | None) -> None:
    """The stages' BCP resources (instance, image, BCP's own rules), a transport, credentials, and (with a pipeline)
    its workspaces: a ConfigError naming what is missing."""
    if pipeline is not None:
        check_stage_resources(pipeline)
    options = config.options["bcp"]
    choose_transport(options)
    check_credentials(options)
    if pipeline is not None:
        check_workspaces_exist(options, pipeline)


def check_limits(
    config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *, detach: bool = False
) -> None:
    """The ACE's limits (instances, runtime, replicas, multi-node, array types; with `detach`, room for the driver
    and a stage job) against the jobs; a ConfigError naming each stage, the limit and the `--set` that fixes it."""
    if requests or detach:
        driver = driver_job_shape(config.options["bcp"], pipeline) if detach else None
        refuse_violations(
            check_ace(config.options["bcp"], config.stages_dir, requests, detach=detach, driver=driver), pipeline.name
        )


def describe_limits(
    config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *, detach: bool = False
) -> Any:
    """check_limits for `plan` (an AceCheck: made when credentials are there, else why not)."""
    driver = driver_job_shape(config.options["bcp"], pipeline) if detach else None
    return plan_check(config.options["bcp"], config.stages_dir, requests, detach=detach, driver=driver)
