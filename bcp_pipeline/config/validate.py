"""What loading checks of a pipeline beyond its keys' types: stage needs and programs, placeholders, each backend
section's own rules (its `validate` hook), counts, verification counts, continuation and estimates, each refused at
the line (or --set) that wrote it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bcp_pipeline.config.env_secrets import refuse_secret_env
from bcp_pipeline.config.model import ESTIMATE_SIZES, Check, Continuation, PipelineConfig, StageConfig
from bcp_pipeline.config.needs import validate_streamed
from bcp_pipeline.config.placeholders import BUILTIN_PLACEHOLDERS, PLACEHOLDER, resolve_int
from bcp_pipeline.config.programs import program_sha256
from bcp_pipeline.config.resources import RESOURCE_TYPES
from bcp_pipeline.config.typed import Where


def validate_pipeline(pipeline: PipelineConfig, stages_raw: dict, where: Where, stages_dir: Path) -> None:
    """A bad value made of vars given by --set (`pipeline.var_origins`) is blamed on the --set."""
    from bcp_pipeline.config.dag import find_cycle

    names = set(pipeline.stages)
    for name, stage in pipeline.stages.items():
        stage_where = where.child(name, stages_raw)
        body = stages_raw[name]
        for index, need in enumerate(stage.needs):
            if need not in names:
                raise (
                    stage_where.child("needs", body)
                    .child(index, body["needs"])
                    .error(f"unknown stage {need!r} in needs; stages of this pipeline: {', '.join(pipeline.stages)}")
                )
        if stage.streamed:
            validate_streamed(stage, pipeline.stages, stage_where.child("needs", body))
        if not (stages_dir / stage.program).is_file():
            raise stage_where.child("program", body).error(f"stage program {stage.program!r} not found in {stages_dir}")
        stage.program_sha256 = program_sha256(stages_dir, stage.program)
        _validate_placeholders(pipeline, stage, body, stage_where)
        refuse_secret_env(stage, body, stage_where)
        _validate_sections(stage, body, stage_where)
        _validate_counts(stage, body, stage_where)
        if stage.continuation:
            validate_continuation(pipeline, stage.continuation, stage_where.child("continuation", body))
        if isinstance(body, dict) and "stall_guard" in body:
            validate_stall_guard(stage, body["stall_guard"], stage_where.child("stall_guard", body))
        for index, check in enumerate(stage.verify):
            _validate_check(pipeline, stage, check, stage_where.child("verify", body).child(index, body["verify"]))
    cycle = find_cycle({name: stage.needs for name, stage in pipeline.stages.items()})
    if cycle:
        first = cycle[0]
        raise where.child(first, stages_raw).error(f"the stages form a cycle: {' -> '.join(cycle)}")


def _validate_placeholders(pipeline: PipelineConfig, stage: StageConfig, body: dict, where: Where) -> None:
    known = set(BUILTIN_PLACEHOLDERS) | set(pipeline.vars)
    texts = [("args", a) for a in stage.args] + [("outputs", o) for o in stage.outputs]
    texts += [("verify", c.glob) for c in stage.verify] + [("verify", str(c.expect)) for c in stage.verify]
    if stage.continuation:
        continuation = stage.continuation
        texts += [("continuation", continuation.checkpoints), ("continuation", str(continuation.target_steps))]
    if stage.engine:
        section = getattr(stage, stage.engine)
        texts += [
            (stage.engine, text)
            for text in (section.data_dir, section.bpe_dir, section.results_dir, *section.overrides)
        ]
    for backend in RESOURCE_TYPES:
        resources = stage.resources(backend)
        texts += [(backend, a) for a in (resources.command or [])] + [(backend, v) for v in resources.env.values()]
    for key, text in texts:
        for name in PLACEHOLDER.findall(text):
            if name not in known:
                raise where.child(key, body).error(
                    f"unknown placeholder ${{{name}}} in {text!r}; known: {', '.join(sorted(known))} "
                    "(upper-case ${NAME} is left for the job's shell)"
                )


def _validate_sections(stage: StageConfig, body: Any, where: Where) -> None:
    """Each backend section's own rules (its `validate` hook: BCP's job rules, what Kubernetes' keys mean together),
    refused at the key's line (or --set), else the section's or the stage's."""
    for backend in RESOURCE_TYPES:
        section = body.get(backend) if isinstance(body, dict) else None

        def at(key: str | None, backend: str = backend, section: Any = section) -> Where:
            if key is None:
                return where.child(backend, body) if isinstance(body, dict) and backend in body else where
            if isinstance(section, dict) and key in section:
                return where.child(backend, body).child(key, section)
            return where

        stage.resources(backend).validate(stage, at)


def _validate_counts(stage: StageConfig, body: Any, where: Where) -> None:
    """The counts of processes, nodes and CPUs a backend's section declares (its `counts`) are >= 1 where set
    (BCP's: its own `validate`), named at their line or --set."""
    for backend, resource_type in RESOURCE_TYPES.items():
        keys = resource_type.counts
        resources = stage.resources(backend)
        section = body.get(backend) if isinstance(body, dict) else None
        section_where = where.child(backend, body) if isinstance(section, dict) else where
        for key in keys:
            value = getattr(resources, key)
            if value is not None and value < 1:
                at = section_where.child(key, section) if isinstance(section, dict) and key in section else where
                raise at.error(
                    f"{backend}.{key} must be >= 1, got {value}" if at is where else f"must be >= 1, got {value}"
                )


def validate_estimates(pipeline: PipelineConfig, raw: dict, where: Where) -> None:
    estimates = pipeline.estimates
    for key in ESTIMATE_SIZES:
        try:
            value = estimates.number(key, pipeline.vars)
        except ValueError as exc:
            raise where.child(key, raw).error(str(exc)) from None
        if value is not None and value <= 0:
            raise where.child(key, raw).error(f"must be > 0, got {value:g}")
    if not 0 < estimates.mfu <= 1:
        raise where.child("mfu", raw).error(f"mfu is a fraction of peak in (0, 1], got {estimates.mfu:g}")
    if estimates.cpu_peak_tflops is not None and estimates.cpu_peak_tflops <= 0:
        raise where.child("cpu_peak_tflops", raw).error(
            f"cpu_peak_tflops is one CPU process's peak in TFLOP/s, > 0; got {estimates.cpu_peak_tflops:g}"
        )
    for key in ("download_mb_per_s_per_node", "storage_mb_per_s_per_node"):
        if getattr(estimates, key) is not None and getattr(estimates, key) <= 0:
            raise where.child(key, raw).error(f"must be > 0, got {getattr(estimates, key):g}")
    programs = sorted({stage.program for stage in pipeline.stages.values()})
    for program, value in estimates.per_core.items():
        key_where = where.child("per_core", raw).child(program, raw.get("per_core") or {})
        if program not in programs:
            raise key_where.error(f"no stage of this pipeline runs {program!r}; its programs: {', '.join(programs)}")
        if value <= 0:
            raise key_where.error(f"must be > 0, got {value:g}")


def validate_continuation(
    pipeline: PipelineConfig, continuation: Continuation, where: Where, stage: StageConfig | None = None
) -> None:
    """Refuse a target or attempt count below 1 (public: preflight.py checks the continuation it derives from the
    `stage`'s training section, whose --set values are then blamed)."""
    blamed_where = blamed(where, str(continuation.target_steps), pipeline, stage)
    try:
        target = resolve_int(str(continuation.target_steps), pipeline.vars)
    except ValueError as exc:
        raise blamed_where.error(f"target_steps: {exc}") from None
    if target < 1 or continuation.max_attempts < 1:
        raise blamed_where.error(f"target_steps ({target}) and max_attempts ({continuation.max_attempts}) must be >= 1")


def validate_stall_guard(stage: StageConfig, raw: Any, where: Where) -> None:
    """A stall guard watches step lines: only a training stage has them (its durations are positive by type)."""
    if not stage.trains:
        raise where.error(
            "stall_guard watches a training's step lines: give it to a training stage (one with "
            "nemo:, megatron_bridge: or continuation:), or leave it out"
        )
    if stage.stall_guard.max_restarts < 0:
        raise where.child("max_restarts", raw).error(f"must be >= 0, got {stage.stall_guard.max_restarts}")


def blamed(where: Where, text: str, pipeline: PipelineConfig, stage: StageConfig | None = None) -> Where:
    """Where to blame a bad value written as (or explained by) `text`: the --set of a var it is made of
    (`${steps}`), or of a key of the stage it names (`bcp.image`), if any; else `where`, a line of the file."""
    given = [pipeline.var_origins[name] for name in PLACEHOLDER.findall(text) if name in pipeline.var_origins]
    if stage is not None:
        given += [
            origin
            for path, origin in stage.set_values.items()
            if re.search(rf"(?<![\w.]){re.escape(path)}(?![\w])", text)
        ]
        if not given and stage.set_values and where.line is not None:
            # A check of many keys at once (a training's parallel sizes, its derived step count) that names none:
            # the file's line, and the --set values that changed the stage, which are the likely cause.
            return Where(
                f"{where.file}:{where.line} (with {', '.join(dict.fromkeys(stage.set_values.values()))})",
                where.key,
                None,
            )
    return Where(given[0], where.key, None) if given else where


def _validate_check(pipeline: PipelineConfig, stage: StageConfig, check: Check, where: Where) -> None:
    if (check.expect is None) == (check.expect_from is None):
        raise where.error("give exactly one of expect (a number) or expect_from (an upstream stage)")
    if check.expect_from is not None:
        if check.expect_from not in pipeline.stages:
            raise where.error(f"expect_from: unknown stage {check.expect_from!r}")
        if not pipeline.stages[check.expect_from].verify:
            raise where.error(f"expect_from: stage {check.expect_from!r} has no verification to derive a count from")
    if check.per < 1:
        raise where.error(f"per must be >= 1, got {check.per}")
    for key in ("expect", "group"):
        value = getattr(check, key)
        if value is not None:
            at = blamed(where, str(value), pipeline)
            try:
                number = resolve_int(str(value), pipeline.vars)
            except ValueError as exc:
                raise at.error(f"{key}: {exc}") from None
            if number < (0 if key == "expect" else 1):
                raise at.error(f"{key} {value} must be >= {0 if key == 'expect' else 1}, got {number}")
