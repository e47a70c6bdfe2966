"""pipelines.yaml loaded: merged defaults, --set overrides applied, validated, as typed pipelines (model.py).

Layout of the file:

    version: 1
    stages_dir: stages            # stage programs, relative to this file
    backends: {local: {...}, bcp: {...}, slurm: {...}, ...}  # backend-wide options (sections/*.py *Options)
    pipelines:
      NAME:
        workspace: {name: nemo-framework, mount: /mount_workspace}
        vars: {files: 59166}      # ${files} in args, globs and expected counts
        defaults: {bcp: {...}, slurm: {...}, local: {...}}    # merged under every stage's sections
        verification: {bcp: {...}, ...}                       # resources of the verification jobs
        estimates: {tokens: ..., mfu: 0.4, ...}                # declared figures for the estimates (Estimates)
        stages:
          STAGE: {program: x.py, args: [...], needs: [...], verify: [...], bcp: {...}, local: {...}, slurm: {...}}

Top-level keys starting with `x-` are ignored, so they can hold YAML anchors.

This module checks the file on its own terms (keys, types, placeholders, the DAG). What needs knowledge of a
stage's program, such as a NeMo training config against its nodes, is checked afterwards by preflight.py;
commands load through `preflight.load_and_check`.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from bcp_pipeline.config.bounds import check_job_bounds, check_option_bounds
from bcp_pipeline.config.model import Config, PipelineConfig, StageConfig, VerificationResources
from bcp_pipeline.config.needs import split_needs
from bcp_pipeline.config.overrides import OPTIONS_PREFIX, apply_option_overrides, apply_overrides, set_origins
from bcp_pipeline.config.resources import OPTION_TYPES, RESOURCE_TYPES
from bcp_pipeline.config.sections.bcp import SECRET_PART
from bcp_pipeline.config.typed import Where, build, field_names, shown
from bcp_pipeline.config.validate import validate_estimates, validate_pipeline
from bcp_pipeline.config.yaml_lines import ExpansionError, LineDict, load_yaml_with_lines
from bcp_pipeline.errors import ConfigError

DEFAULT_CONFIG_FILE = Path("pipelines.yaml")  # what every command reads without --config
STAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,40}$")
# A BCP workspace name (also the local and Slurm workspace folder's name) and a pipeline name (the start of every
# run id and run folder): letters, digits, '.', '_', '-', not starting with '.', so no name is ever a path that
# leaves its folder (`../../etc`), has a space, or a ':' that would split BCP's `--workspace NAME:MOUNT:MODE`.
FOLDER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
FOLDER_NAME_RULE = "1-64 letters, digits, '.', '_' and '-', starting with a letter or digit"


def load_config(path: str | Path, overrides: list[str] | None = None, pipeline: str | None = None) -> Config:
    """Load and validate `path`; `overrides` (`STAGE.KEY=VALUE`, `vars.NAME=VALUE`) apply to `pipeline`.

    The NeMo preflight is not part of this: `preflight.load_and_check` runs both.
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(
            "file not found; pass --config FILE or run from the folder holding pipelines.yaml", file=str(file)
        )
    try:
        raw = load_yaml_with_lines(file)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = str(getattr(exc, "problem", None) or exc)
        if "'\\t'" in problem:
            problem += " (YAML indents with spaces only: replace the tab)"
        raise ConfigError(
            problem if isinstance(exc, ExpansionError) else f"invalid YAML: {problem}",
            file=str(file),
            line=mark.line + 1 if mark else None,
        ) from None
    top = Where(str(file))
    if not isinstance(raw, dict):
        raise top.error("expected a mapping with keys version, stages_dir, backends, pipelines")
    _check_top_keys(raw, top)
    stages_dir = (file.parent / str(raw.get("stages_dir", "stages"))).resolve()
    option_overrides = [item for item in overrides or [] if item.strip().startswith(OPTIONS_PREFIX)]
    overrides = [item for item in overrides or [] if item not in option_overrides]
    if option_overrides:
        raw["backends"] = apply_option_overrides(raw.get("backends") or LineDict(), option_overrides, str(file))
    options = _load_options(raw.get("backends") or {}, top.child("backends", raw))
    pipelines_raw = raw.get("pipelines")
    where_pipelines = top.child("pipelines", raw)
    if not isinstance(pipelines_raw, dict) or not pipelines_raw:
        raise where_pipelines.error("expected a mapping of pipeline names to pipelines")
    if overrides:
        if pipeline is None or pipeline not in pipelines_raw:
            raise ConfigError(f"--set needs a known pipeline, got {pipeline!r}", file=str(file))
        # On a copy: YAML anchors alias one mapping in several pipelines (`pretrain: *pretrain-8b`), and a --set for
        # this pipeline must not change the others.
        pipelines_raw[pipeline] = apply_overrides(copy.deepcopy(pipelines_raw[pipeline]), overrides, str(file))
    pipelines = {
        name: _load_pipeline(name, body, where_pipelines.child(name, pipelines_raw), stages_dir, options)
        for name, body in pipelines_raw.items()
    }
    return Config(file=file, stages_dir=stages_dir, options=options, pipelines=pipelines)


def _check_top_keys(raw: dict, top: Where) -> None:
    valid = ("version", "stages_dir", "backends", "pipelines")
    for key in raw:
        if key not in valid and not str(key).startswith("x-"):
            raise top.child(key, raw).error(
                f"unknown key {key!r}; valid keys: {', '.join(valid)} (and x-* for anchors)"
            )
    if raw.get("version", 1) != 1:
        raise top.child("version", raw).error(f"unsupported version {raw.get('version')!r}; this tool reads version 1")


def _load_options(raw: Any, where: Where) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise where.error(f"expected a mapping of backend names ({', '.join(OPTION_TYPES)}) to options")
    for key in raw:
        if key not in OPTION_TYPES:
            raise where.child(key, raw).error(f"unknown backend {key!r}; valid: {', '.join(OPTION_TYPES)}")
    options = {name: build(cls, raw.get(name), where.child(name, raw)) for name, cls in OPTION_TYPES.items()}
    for name, section in options.items():
        _check_poll_intervals(section, where.child(name, raw), raw.get(name))
    check_option_bounds(options, where, raw)
    driver, where_bcp = options["bcp"].driver, where.child("bcp", raw)
    bcp = options["bcp"]
    for key, least in (("lookup_grace_seconds", 0), ("retry_backoff_seconds", 0), ("retry_attempts", 1)):
        if getattr(bcp, key) < least:
            raise where_bcp.error(f"{key} must be >= {least}, got {getattr(bcp, key)}")
    for key in ("secret", "secret_key"):
        if not SECRET_PART.match(getattr(driver, key)):
            raise where_bcp.error(
                f"driver.{key} {getattr(driver, key)!r}: a secret name or key is 1-63 of A-Z a-z 0-9 . _ -"
            )
    return options


def _check_poll_intervals(section: Any, where: Where, raw: Any) -> None:
    """Every `poll_*seconds` is > 0: none would poll the service in a busy loop, and a negative one stops the
    loop's sleep with an error mid-run."""
    for key in field_names(type(section)):
        value = getattr(section, key)
        if key.startswith("poll_") and key.endswith("seconds") and value <= 0:
            at = where.child(key, raw) if isinstance(raw, dict) and key in raw else where
            raise at.error(f"{key} must be > 0 seconds, got {value:g}")


def _load_pipeline(name: str, raw: Any, where: Where, stages_dir: Path, options: dict[str, Any]) -> PipelineConfig:
    if not isinstance(raw, dict):
        raise where.error("expected a mapping with keys workspace, stages, ...")
    if not FOLDER_NAME.match(str(name)):
        raise where.error(
            f"pipeline name {name!r}: a pipeline name starts every run id and run folder, so it is {FOLDER_NAME_RULE}"
        )
    workspace = raw.get("workspace")
    if isinstance(workspace, dict) and not FOLDER_NAME.match(str(workspace.get("name", "x"))):
        where_workspace = where.child("workspace", raw)
        raise where_workspace.child("name", workspace).error(
            f"workspace name {workspace.get('name')!r}: BCP accepts {FOLDER_NAME_RULE} (it is also the local and "
            "Slurm workspace folder's name, which must stay inside workspace_dir)"
        )
    defaults = raw.get("defaults") or {}
    where_defaults = where.child("defaults", raw)
    if not isinstance(defaults, dict):
        raise where_defaults.error("expected a mapping of backend names to resources")
    for backend, section in defaults.items():
        if backend not in RESOURCE_TYPES:
            raise where_defaults.child(backend, defaults).error(
                f"unknown backend {backend!r}; valid: {', '.join(RESOURCE_TYPES)}"
            )
        build(RESOURCE_TYPES[backend], section, where_defaults.child(backend, defaults))  # errors at their own line
    stages_raw = raw.get("stages")
    where_stages = where.child("stages", raw)
    if not isinstance(stages_raw, dict) or not stages_raw:
        raise where_stages.error("expected a mapping of stage names to stages")
    stages = {}
    for stage_name, body in stages_raw.items():
        stage_where = where_stages.child(stage_name, stages_raw)
        if not STAGE_NAME.match(str(stage_name)):
            raise stage_where.error("stage names are lower-case letters, digits, '-' and '_' (<= 41 chars)")
        merged = _merge_backend_sections(body, defaults, stage_where)
        streamed: list[str] = []
        if isinstance(merged, dict) and "needs" in merged:
            merged["needs"], streamed = split_needs(merged["needs"], stage_where.child("needs", body))
        locations = {key: stage_where.child(key, body) for key in field_names(StageConfig)}
        stages[stage_name] = build(
            StageConfig,
            merged,
            stage_where,
            name=stage_name,
            line=stage_where.line,
            locations=locations,
            set_values=set_origins(body),
            streamed=streamed,
        )
        check_job_bounds(stages[stage_name], merged, stage_where, options)
    verification_raw = _merge_backend_sections(
        raw.get("verification") or {}, defaults, where.child("verification", raw)
    )
    verification = build(VerificationResources, verification_raw, where.child("verification", raw))
    check_job_bounds(verification, verification_raw, where.child("verification", raw), options)
    body = {k: v for k, v in raw.items() if k not in ("stages", "verification")}
    pipeline = build(
        PipelineConfig,
        body,
        where,
        name=name,
        stages=stages,
        verification=verification,
        var_origins=dict(getattr(raw.get("vars"), "key_origins", {})),
    )
    if pipeline.backend not in RESOURCE_TYPES:
        raise where.child("backend", raw).error(
            f"{pipeline.backend!r} is not one of {', '.join(repr(name) for name in RESOURCE_TYPES)}"
        )
    validate_pipeline(pipeline, stages_raw, where_stages, stages_dir)
    validate_estimates(pipeline, raw.get("estimates") or {}, where.child("estimates", raw))
    return pipeline


def _merge_backend_sections(body: Any, defaults: dict, where: Where) -> Any:
    """Merge the pipeline's `defaults.BACKEND` under each `BACKEND:` section of `body` (stage wins)."""
    if not isinstance(body, dict):
        return body
    # A copy: YAML anchors (`<<: *stages`) hand several pipelines the same dict, and one pipeline's defaults
    # must not reach the others' stages.
    merged = copy.copy(body) if isinstance(body, LineDict) else LineDict(body)
    for backend, default_section in defaults.items():
        own = body.get(backend)
        if own is not None and not isinstance(own, dict):
            raise where.child(backend, body).error(f"expected a mapping of {backend} resources, got {shown(own)}")
        merged[backend] = deep_merge(default_section or {}, own or {})
    return merged


def deep_merge(base: dict, top: dict) -> LineDict:
    """Mapping merge where `top` wins; nested mappings merge, lists are replaced. Keeps YAML line numbers."""
    result = LineDict()
    result.line = getattr(top, "line", 0) or getattr(base, "line", 0)
    result.key_lines = {**getattr(base, "key_lines", {}), **getattr(top, "key_lines", {})}
    result.key_origins = {**getattr(base, "key_origins", {}), **getattr(top, "key_origins", {})}
    for key in [*base, *(k for k in top if k not in base)]:
        if key in top and key in base and isinstance(top[key], dict) and isinstance(base[key], dict):
            result[key] = deep_merge(base[key], top[key])
        else:
            result[key] = copy.copy(top[key] if key in top else base[key])
    return result
