"""`bcp-pipeline check`: the checks of one backend, their result saved as a profile in the state folder.

This wing builds what a backend's check reads (backends/checks.py CheckInput) with the parts only the wings above
the backends have: the jobs a run submits (the engine's planned requests, rendered as `plan` renders them), the
bytes they leave (the report's estimates) and `run --detach`'s driver job (detach/). The checks themselves are
the backend's (`Backend.check_service`, in its folder), reached through the registry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.checks import CheckInput, Row, Verdict
from bcp_pipeline.backends.profile import load_profile, profile_key, save_profile
from bcp_pipeline.backends.registry import backend_class, backend_names, make_backend
from bcp_pipeline.config.instances import instances_table
from bcp_pipeline.config.model import Config, PipelineConfig
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.engine.submitter import planned_requests
from bcp_pipeline.errors import ConfigError
from bcp_pipeline.report.estimates import estimate_pipeline

CHECK_RUN_ID = "{pipeline}-CHECK"  # the run id the rendered jobs carry (never submitted under it)


@dataclass(kw_only=True)
class CheckRequest:
    config_file: Path
    state_root: Path
    pipeline: str | None = None
    backend: str | None = None
    jobs: bool = True
    detach: bool = False
    overrides: list[str] = field(default_factory=list)  # --set, as `run` takes them


@dataclass(kw_only=True)
class CheckResult:
    """Everything one `check` found; saved as the profile `key` in the state folder."""

    backend: str
    key: str  # the profile's name: org-ace, slurm-cluster, local-host
    target: dict[str, str]  # what was checked, e.g. {"org": ..., "ace": ...}
    pipeline: str | None
    checked_at: float
    rows: list[Row] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # what the backend may adapt to (backends/profile.py)
    notes: list[str] = field(default_factory=list)  # printed before the table (e.g. what probe jobs cost)

    def count(self, verdict: Verdict) -> int:
        return sum(1 for row in self.rows if row.verdict is verdict)

    def as_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "key": self.key,
            "target": self.target,
            "pipeline": self.pipeline,
            "checked_at": self.checked_at,
            "rows": [row.as_json() for row in self.rows],
            "facts": self.facts,
            "notes": self.notes,
            "summary": {v.value: self.count(v) for v in Verdict},
        }


def backend_for(config: Config, request: CheckRequest) -> str:
    if request.backend:
        return request.backend
    if request.pipeline:
        return config.pipeline(request.pipeline).backend
    raise ConfigError(
        f"name a pipeline (`bcp-pipeline check PIPELINE`) or a backend (`--backend {'|'.join(backend_names())}`)"
    )


def run_check(
    request: CheckRequest, environ: Mapping[str, str], announce: Callable[[str], None] = lambda line: None
) -> tuple[CheckResult, Path]:
    """Every check of the backend; the result, and where its profile was saved (atomically). `announce` hears
    what a probe job costs before it is submitted."""
    if request.overrides and not request.pipeline:
        raise ConfigError("--set needs a pipeline: `bcp-pipeline check PIPELINE --set STAGE.KEY=VALUE`")
    config = load_and_check(request.config_file, overrides=request.overrides, pipeline=request.pipeline)
    name = backend_for(config, request)
    kind = backend_class(name)
    if request.detach and not kind.detachable:
        raise ConfigError(
            f"--detach judges the service for a driver job, which only a backend that can host its "
            f"runs has ({', '.join(n for n in backend_names() if backend_class(n).detachable)}): "
            f"not {name!r}"
        )
    pipeline = config.pipeline(request.pipeline) if request.pipeline else None
    given = check_input(config, pipeline, name, request, environ, announce)
    started = time.time()
    outcome = kind.check_service(given)
    key = profile_key(*outcome.profile_parts)
    result = CheckResult(
        backend=name,
        key=key,
        target=outcome.target,
        pipeline=request.pipeline,
        checked_at=started,
        rows=outcome.rows,
        facts=outcome.facts,
        notes=outcome.notes,
    )
    if not request.jobs:
        result = with_earlier_findings(result, load_profile(request.state_root, key))
    path = save_profile(request.state_root, key, result.as_json())
    return result, path


def with_earlier_findings(result: CheckResult, earlier: dict[str, Any] | None) -> CheckResult:
    """A check without jobs, keeping what an earlier check found that this one could not (its probe jobs' rows and
    the facts `run` adapts to: bcprun, list lag, kill timing, preemption): a free check never unlearns them."""
    if not earlier:
        return result
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(earlier.get("checked_at") or 0))
    checked = {row.topic for row in result.rows if row.verdict is not Verdict.UNCHECKED}
    found_then = [
        row
        for row in earlier.get("rows", [])
        if row["topic"] not in checked and row["verdict"] != Verdict.UNCHECKED.value
    ]
    kept_rows = [
        Row(
            topic=row["topic"],
            assumes=row["assumes"],
            showed=f"{row['showed']} (as of the check of {when})",
            verdict=Verdict(row["verdict"]),
            meaning=row.get("meaning", ""),
        )
        for row in found_then
    ]
    kept_topics = {row.topic for row in kept_rows}
    rows = [row for row in result.rows if row.topic not in kept_topics] + kept_rows
    kept_facts = {
        key: value for key, value in earlier["facts"].items() if value is not None and result.facts.get(key) is None
    }
    notes = list(result.notes)
    if kept_rows or kept_facts:
        notes.append(
            f"kept {len(kept_rows)} finding(s) of the check of {when} that --no-jobs cannot make "
            f"({', '.join(sorted(kept_topics | set(kept_facts)))}); `check` without --no-jobs renews them"
        )
    return replace(result, rows=rows, facts={**result.facts, **kept_facts}, notes=notes)


def check_input(
    config: Config,
    pipeline: PipelineConfig | None,
    name: str,
    request: CheckRequest,
    environ: Mapping[str, str],
    announce: Callable[[str], None],
) -> CheckInput:
    """What the backend's check reads; the jobs, the backend and the sizes are made only when it asks."""
    run_id = CHECK_RUN_ID.format(pipeline=pipeline.name) if pipeline else ""
    run_dir = request.state_root / "runs" / run_id

    def render_jobs() -> list:
        backend = make_backend(name, config, pipeline, run_dir)
        return [backend.render(r) for r in planned_requests(pipeline, run_id)]

    def sizes() -> tuple[float, list[str]]:
        estimate = estimate_pipeline(pipeline, instances_table(config.options["bcp"].instances))
        sized = [(s.stage, s.bytes_out) for s in estimate.stages if s.bytes_out]
        return float(sum(b for _, b in sized)), [stage for stage, _ in sized]

    driver = None
    if request.detach and pipeline is not None:
        from bcp_pipeline.detach.jobs import driver_spec

        driver = driver_spec(config, pipeline, "CHECK", environ)
    return CheckInput(
        config=config,
        pipeline=pipeline,
        backend_name=name,
        state_root=request.state_root,
        environ=environ,
        jobs=request.jobs,
        detach=request.detach,
        detach_driver=driver,
        announce=announce,
        make_backend=(lambda: make_backend(name, config, pipeline, run_dir)) if pipeline else None,
        render_jobs=render_jobs,
        sizes=sizes,
    )
