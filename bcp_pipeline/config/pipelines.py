"""pipelines.yaml: load, merge defaults, apply --set overrides, validate, and expose typed pipelines.

Layout of the file:

    version: 1
    stages_dir: stages            # stage programs, relative to this file
    backends: {local: {...}, bcp: {...}, slurm: {...}, gridengine: {...}, kubernetes: {...}}  # backend-wide options (resources.py *Options)
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
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from bcp_pipeline.errors import ConfigError
from bcp_pipeline.config.resources import (OPTION_TYPES, RESOURCE_TYPES, BcpResources, GridEngineResources,
    KubernetesResources, LocalResources, SlurmResources)
from bcp_pipeline.config.resources import ENV_KEY, LABEL_PATTERN, SECRET_PART
from bcp_pipeline.config.typed import Duration, Where, build, field_names, shown
from bcp_pipeline.config.yaml_lines import LineDict, load_yaml_with_lines

DEFAULT_CONFIG_FILE = Path("pipelines.yaml")  # what every command reads without --config

PLACEHOLDER = re.compile(r"\$\{([a-z_][a-z0-9_]*)\}")
BUILTIN_PLACEHOLDERS = ("workspace", "results", "code", "run_id", "stage", "python")
STAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,40}$")
OPTIONS_PREFIX = "backends."  # `--set backends.bcp.driver.total_runtime=1H`: backend-wide options, not a stage
# A BCP workspace name (also the local and Slurm workspace folder's name) and a pipeline name (the start of every
# run id and run folder): letters, digits, '.', '_', '-', not starting with '.', so no name is ever a path that
# leaves its folder (`../../etc`), has a space, or a ':' that would split BCP's `--workspace NAME:MOUNT:MODE`.
FOLDER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
FOLDER_NAME_RULE = "1-64 letters, digits, '.', '_' and '-', starting with a letter or digit"


@dataclass(kw_only=True)
class Check:
    """One verification: count files matching `glob` and compare with a fixed or derived number."""

    glob: str  # under ${workspace}; hidden temporaries never match
    expect: int | str | None = None  # a number, or "${var}"
    expect_from: str | None = None  # derive from an upstream stage's (first) check ...
    per: int = 1  # ... times `per` (one .jsonl per .zst: 1; a .bin and an .idx per chunk: 1 each)
    group: int | str | None = None  # ... or divided by `group` (a number or "${var}"), rounded up: 800 per chunk


@dataclass(kw_only=True)
class Continuation:
    """Resubmit a stage that ended before its work was done (training that hit its runtime or was preempted).

    After each end listed in `resubmit_on`, a small verification job reads the highest `step=N` among the names in
    `checkpoints`; below `target_steps` the same job is submitted again (NeMo resumes from its `-last`
    checkpoint), up to `max_attempts`. Two attempts in a row without progress stop the stage.
    """

    checkpoints: str  # folder whose entries are named ...step=N... (NeMo's and the local smoke pretrain's)
    target_steps: int | str  # a number or "${var}"
    max_attempts: int = 10
    resubmit_on: list[Literal["succeeded", "timed_out", "lost", "failed"]] = field(
        default_factory=lambda: ["succeeded", "timed_out", "lost"])


@dataclass(kw_only=True)
class NemoTraining:
    """Pretraining with NVIDIA's NeMo launcher (on BCP and Slurm; on Grid Engine the launcher composes the config
    and torchrun runs NeMo's training script; the local and Kubernetes backends run `program` instead).

    The launcher's data list is built inside the job from the preprocess manifests under `data_dir`. Loading
    checks only the section's shape; preflight.py checks it against the nodes and runtime and derives the stage's
    continuation from it.
    """

    model: str  # training config, e.g. gpt3/7b_improved or gpt3/126m
    run_name: str  # the NeMo run is named RUN_NAME-<run id>: each bcp-pipeline run trains its own (nemo.py)
    data_dir: str  # preprocess outputs (.bin/.idx + manifests), as the job sees them
    bpe_dir: str  # vocab.json + merges.txt
    results_dir: str  # base_results_dir; checkpoints go to RESULTS/<NeMo run>/results/checkpoints
    launcher_dir: str | None = None  # default: where the image's release keeps it (nemo.KNOWN_LAUNCHER_DIRS)
    nemo_dir: str = "/opt/NeMo"  # NeMo in the image, where the launcher's training command has it; Grid Engine's
    # torchrun runs its examples/nlp/language_modeling/megatron_gpt_pretraining.py (nemo.py)
    time_margin: Duration = Duration("45m")  # each job trains for its runtime minus this, then saves and stops
    continue_run: str | None = None  # take over this NeMo run (its folder under results_dir) and its checkpoints
    # instead of starting this run's own; several bcp-pipeline runs then train the same model (nemo.py)
    gpus_per_node: int | None = None  # default: from the instance name (dgxa100.80g.8.norm -> 8)
    max_steps: int | None = None  # default: the model's
    tensor_parallel: int | None = None  # required for a model, or an image release, without known facts (nemo.py);
    # like the next three and max_steps. Given, they are passed to the launcher.
    pipeline_parallel: int | None = None
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    max_attempts: int = 10  # continuation: resubmissions until max_steps
    checkpoints: bool = True  # false: one job that saves no checkpoint, done when it exits 0 (no continuation is
    # derived; `bcp-pipeline profile` sets it)
    overrides: list[str] = field(default_factory=list)  # more Hydra overrides, verbatim


@dataclass(kw_only=True)
class Workspace:
    """The workspace every stage mounts; `${workspace}` in args is its path as the job sees it."""

    name: str
    mount: str = "/mount_workspace"


@dataclass(kw_only=True)
class StageConfig:
    """One stage: a program from stages/, its dependencies, outputs, verification and per-backend resources."""

    program: str
    args: list[str] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)
    description: str = ""
    outputs: list[str] = field(default_factory=list)
    verify: list[Check] = field(default_factory=list)
    reshardable: bool = False  # may resume with a different replicas x processes than it started with
    # Outputs found in the stage's output folders that another config made (engine/output_digest.py): redone
    # (set aside first, never deleted), refused (the stage fails and names this setting), or reused as they are.
    other_outputs: Literal["redo", "refuse", "reuse"] = "redo"
    continuation: Continuation | None = None  # with `nemo:` and none given, preflight.py derives it
    nemo: NemoTraining | None = None
    bcp: BcpResources = field(default_factory=BcpResources)
    local: LocalResources = field(default_factory=LocalResources)
    slurm: SlurmResources = field(default_factory=SlurmResources)
    gridengine: GridEngineResources = field(default_factory=GridEngineResources)
    kubernetes: KubernetesResources = field(default_factory=KubernetesResources)
    name: str = field(default="", metadata={"internal": True})
    line: int | None = field(default=None, metadata={"internal": True})
    program_sha256: str = field(default="", metadata={"internal": True})  # of stages/PROGRAM, read when loaded
    # Where each key was written (file:line, or the --set that gave it; a key left out points at the stage), so
    # the checks that run after loading (preflight.py) name the same place the loader's own errors do.
    locations: dict[str, Where] = field(default_factory=dict, repr=False, metadata={"internal": True})

    def resources(self, backend: str) -> Any:
        return getattr(self, backend)

    def where(self, key: str) -> Where:
        """Where `key` of this stage came from, for errors raised after loading."""
        return self.locations[key]


@dataclass(kw_only=True)
class VerificationResources:
    """Resources of the small jobs that count a stage's outputs (merged over the pipeline defaults)."""

    bcp: BcpResources = field(default_factory=BcpResources)
    local: LocalResources = field(default_factory=LocalResources)
    slurm: SlurmResources = field(default_factory=SlurmResources)
    gridengine: GridEngineResources = field(default_factory=GridEngineResources)
    kubernetes: KubernetesResources = field(default_factory=KubernetesResources)


@dataclass(kw_only=True)
class Estimates:
    """`estimates:` of a pipeline: the declared figures `plan` and `status` estimate from (estimates.py).

    Data-set sizes are numbers or `${var}` (YAML reads `895e9` as text; it is taken as a number here). README
    ("Where the estimate figures come from") says where each default comes from.
    """

    compressed_bytes: float | str | None = None  # what download fetches (.jsonl.zst)
    text_bytes: float | str | None = None  # the same uncompressed (.jsonl)
    documents: float | str | None = None  # adds the .idx bytes (20 per document) when given
    tokens: float | str | None = None  # in the training tokenizer's count
    download_mb_per_s_per_node: float | None = None  # declared, never measured here; no figure: no download time
    storage_mb_per_s_per_node: float | None = None  # declared workspace read or write rate per node; caps the
    # data stages (no figure: their times are CPU-bound only)
    mfu: float = 0.40  # model FLOPs utilisation of pretraining (declared; the README says why 0.40)
    cpu_peak_tflops: float | None = None  # declared peak of one CPU process, the only peak MFU on CPU is held
    # against (report/mfu.py); none: a CPU run shows no MFU
    per_core: dict[str, float] = field(default_factory=dict)  # PROGRAM: per-core figure replacing the benchmark's
    # (extract.py, concat.py: MB/s written; preprocess.py: tokens/s)

    def number(self, key: str, variables: dict[str, str]) -> float | None:
        """A data-set size as a number, `${var}` resolved; ValueError naming the text otherwise."""
        value = getattr(self, key)
        if value is None or isinstance(value, float):
            return value
        resolved = substitute(value, variables)
        try:
            return float(resolved)
        except ValueError:
            raise ValueError(f"{value!r} is not a number" + (f" (it is {resolved!r})" if resolved != value else "")) \
                from None


ESTIMATE_SIZES = ("compressed_bytes", "text_bytes", "documents", "tokens")


@dataclass(kw_only=True)
class PipelineConfig:
    """A DAG of stages with shared workspace, variables and defaults."""

    workspace: Workspace
    stages: dict[str, StageConfig]
    description: str = ""
    backend: Literal["local", "bcp", "slurm", "gridengine", "kubernetes"] = "local"  # used when --backend is not given
    vars: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    verification: VerificationResources = field(default_factory=VerificationResources)
    estimates: Estimates = field(default_factory=Estimates)
    name: str = field(default="", metadata={"internal": True})

    def order(self) -> list[str]:
        """Stage names in a topological order (file order among independent stages)."""
        from bcp_pipeline.config.dag import topological_order

        return topological_order({name: stage.needs for name, stage in self.stages.items()})


@dataclass(kw_only=True)
class Config:
    """A whole pipelines.yaml."""

    file: Path
    stages_dir: Path
    options: dict[str, Any]
    pipelines: dict[str, PipelineConfig]

    def pipeline(self, name: str) -> PipelineConfig:
        if name not in self.pipelines:
            raise ConfigError(f"no pipeline {name!r}; pipelines here: {', '.join(self.pipelines) or '(none)'}",
                              file=str(self.file))
        return self.pipelines[name]


def load_config(path: str | Path, overrides: list[str] | None = None, pipeline: str | None = None) -> Config:
    """Load and validate `path`; `overrides` (`STAGE.KEY=VALUE`, `vars.NAME=VALUE`) apply to `pipeline`.

    The NeMo preflight is not part of this: `preflight.load_and_check` runs both.
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError("file not found; pass --config FILE or run from the folder holding pipelines.yaml",
                          file=str(file))
    try:
        raw = load_yaml_with_lines(file)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = str(getattr(exc, "problem", None) or exc)
        if "'\\t'" in problem:
            problem += " (YAML indents with spaces only: replace the tab)"
        raise ConfigError(f"invalid YAML: {problem}", file=str(file),
                          line=mark.line + 1 if mark else None) from None
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
    pipelines = {name: _load_pipeline(name, body, where_pipelines.child(name, pipelines_raw), stages_dir)
                 for name, body in pipelines_raw.items()}
    return Config(file=file, stages_dir=stages_dir, options=options, pipelines=pipelines)


def _check_top_keys(raw: dict, top: Where) -> None:
    valid = ("version", "stages_dir", "backends", "pipelines")
    for key in raw:
        if key not in valid and not str(key).startswith("x-"):
            raise top.child(key, raw).error(f"unknown key {key!r}; valid keys: {', '.join(valid)} (and x-* for anchors)")
    if raw.get("version", 1) != 1:
        raise top.child("version", raw).error(f"unsupported version {raw.get('version')!r}; this tool reads version 1")


def _load_options(raw: Any, where: Where) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise where.error("expected a mapping of backend names (local, bcp, slurm, gridengine, kubernetes) to options")
    for key in raw:
        if key not in OPTION_TYPES:
            raise where.child(key, raw).error(f"unknown backend {key!r}; valid: {', '.join(OPTION_TYPES)}")
    options = {name: build(cls, raw.get(name), where.child(name, raw)) for name, cls in OPTION_TYPES.items()}
    driver, where_bcp = options["bcp"].driver, where.child("bcp", raw)
    bcp = options["bcp"]
    for key, least in (("lookup_grace_seconds", 0), ("retry_backoff_seconds", 0), ("retry_attempts", 1)):
        if getattr(bcp, key) < least:
            raise where_bcp.error(f"{key} must be >= {least}, got {getattr(bcp, key)}")
    for key in ("secret", "secret_key"):
        if not SECRET_PART.match(getattr(driver, key)):
            raise where_bcp.error(f"driver.{key} {getattr(driver, key)!r}: a secret name or key is 1-63 of "
                                  "A-Z a-z 0-9 . _ -")
    return options


def _load_pipeline(name: str, raw: Any, where: Where, stages_dir: Path) -> PipelineConfig:
    if not isinstance(raw, dict):
        raise where.error("expected a mapping with keys workspace, stages, ...")
    if not FOLDER_NAME.match(str(name)):
        raise where.error(f"pipeline name {name!r}: a pipeline name starts every run id and run folder, so it is "
                          f"{FOLDER_NAME_RULE}")
    workspace = raw.get("workspace")
    if isinstance(workspace, dict) and not FOLDER_NAME.match(str(workspace.get("name", "x"))):
        where_workspace = where.child("workspace", raw)
        raise where_workspace.child("name", workspace).error(
            f"workspace name {workspace.get('name')!r}: BCP accepts {FOLDER_NAME_RULE} (it is also the local and "
            "Slurm workspace folder's name, which must stay inside workspace_dir)")
    defaults = raw.get("defaults") or {}
    where_defaults = where.child("defaults", raw)
    if not isinstance(defaults, dict):
        raise where_defaults.error("expected a mapping of backend names to resources")
    for backend, section in defaults.items():
        if backend not in RESOURCE_TYPES:
            raise where_defaults.child(backend, defaults).error(
                f"unknown backend {backend!r}; valid: {', '.join(RESOURCE_TYPES)}")
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
        locations = {key: stage_where.child(key, body) for key in field_names(StageConfig)}
        stages[stage_name] = build(StageConfig, merged, stage_where, name=stage_name, line=stage_where.line,
                                   locations=locations)
    verification_raw = _merge_backend_sections(raw.get("verification") or {}, defaults, where.child("verification", raw))
    body = {k: v for k, v in raw.items() if k not in ("stages", "verification")}
    pipeline = build(PipelineConfig, body, where, name=name, stages=stages,
                     verification=build(VerificationResources, verification_raw, where.child("verification", raw)))
    _validate_pipeline(pipeline, stages_raw, where_stages, stages_dir, getattr(raw.get("vars"), "key_origins", {}))
    _validate_estimates(pipeline, raw.get("estimates") or {}, where.child("estimates", raw))
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


def apply_overrides(pipeline_raw: Any, overrides: list[str], file: str) -> Any:
    """Apply `--set STAGE.KEY[.KEY]=VALUE` (or `vars.NAME=VALUE`); VALUE is parsed as YAML."""
    for item in overrides:
        parts, value = _parse_override(item)
        stages = pipeline_raw.get("stages") or {}
        if parts[0] == "vars":
            container = pipeline_raw.setdefault("vars", LineDict())
        elif parts[0] in stages:
            container = stages[parts[0]]
        else:
            raise ConfigError(f"no stage {parts[0]!r}; stages: {', '.join(stages)} (or vars.NAME, or "
                              f"{OPTIONS_PREFIX}BACKEND.KEY)", file=f"--set {item}")
        _set_at(container, parts[1:], value, item)
    return pipeline_raw


def apply_option_overrides(backends_raw: Any, overrides: list[str], file: str) -> Any:
    """Apply `--set backends.BACKEND.KEY[.KEY]=VALUE` to the file's `backends:` section (e.g. the --detach
    driver's `backends.bcp.driver.total_runtime`)."""
    if not isinstance(backends_raw, dict):
        raise ConfigError("backends: expected a mapping of backend names to options", file=file)
    for item in overrides:
        parts, value = _parse_override(item)
        if len(parts) < 3 or parts[1] not in OPTION_TYPES:
            raise ConfigError(f"expected backends.BACKEND.KEY=VALUE with BACKEND one of {', '.join(OPTION_TYPES)}",
                              file=f"--set {item}")
        section = backends_raw.get(parts[1])
        if section is None:
            section = backends_raw[parts[1]] = LineDict()
        if not isinstance(section, dict):
            raise ConfigError(f"backends.{parts[1]} is not a mapping in the file", file=f"--set {item}")
        _set_at(section, parts[2:], value, item)
    return backends_raw


def _parse_override(item: str) -> tuple[list[str], Any]:
    """`A.B.C=VALUE` as its key path and its YAML value; a ConfigError naming the --set when either is bad."""
    path_text, sep, value_text = item.partition("=")
    parts = [p for p in path_text.strip().split(".") if p]
    if not sep or len(parts) < 2:
        raise ConfigError("expected STAGE.KEY=VALUE, vars.NAME=VALUE or backends.BACKEND.KEY=VALUE",
                          file=f"--set {item}")
    try:
        return parts, (yaml.safe_load(value_text) if value_text.strip() else "")
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"VALUE {value_text!r} is not valid YAML ({problem}); quote it for the shell and YAML, "
                          "e.g. --set 'KEY=\"text: with colon\"'", file=f"--set {item}") from None


def _set_at(container: Any, keys: list[str], value: Any, item: str) -> None:
    """Set `value` at the key path `keys` under `container`, making mappings on the way; remembers that the value
    came from `--set item`, so an error about it names the --set, not a line of the file."""
    for part in keys[:-1]:
        nxt = container.get(part)
        if nxt is None:
            nxt = container[part] = LineDict()
        if not isinstance(nxt, dict):
            raise ConfigError(f"{part!r} is not a mapping", file=f"--set {item}")
        container = nxt
    if not hasattr(container, "key_origins"):
        container.key_origins = {}  # type: ignore[attr-defined]
    container[keys[-1]] = value
    container.key_origins[keys[-1]] = f"--set {item}"  # type: ignore[attr-defined]


def _validate_pipeline(pipeline: PipelineConfig, stages_raw: dict, where: Where, stages_dir: Path,
                       var_origins: dict[str, str]) -> None:
    """`var_origins`: the vars given by --set (name -> `--set vars.NAME=VALUE`), which a bad value made of them
    is blamed on."""
    from bcp_pipeline.config.dag import find_cycle

    names = set(pipeline.stages)
    for name, stage in pipeline.stages.items():
        stage_where = where.child(name, stages_raw)
        body = stages_raw[name]
        for index, need in enumerate(stage.needs):
            if need not in names:
                raise stage_where.child("needs", body).child(index, body["needs"]).error(
                    f"unknown stage {need!r} in needs; stages of this pipeline: {', '.join(pipeline.stages)}")
        if not (stages_dir / stage.program).is_file():
            raise stage_where.child("program", body).error(
                f"stage program {stage.program!r} not found in {stages_dir}")
        stage.program_sha256 = hashlib.sha256((stages_dir / stage.program).read_bytes()).hexdigest()
        _validate_placeholders(pipeline, stage, body, stage_where)
        _validate_bcp(stage.bcp, stage_where.child("bcp", body) if "bcp" in body else stage_where)
        _validate_counts(stage, body, stage_where)
        if stage.continuation:
            validate_continuation(pipeline, stage.continuation, stage_where.child("continuation", body))
        for index, check in enumerate(stage.verify):
            _validate_check(pipeline, stage, check, stage_where.child("verify", body).child(index, body["verify"]),
                            var_origins)
    cycle = find_cycle({name: stage.needs for name, stage in pipeline.stages.items()})
    if cycle:
        first = cycle[0]
        raise where.child(first, stages_raw).error(f"the stages form a cycle: {' -> '.join(cycle)}")


def _validate_placeholders(pipeline: PipelineConfig, stage: StageConfig, body: dict, where: Where) -> None:
    known = set(BUILTIN_PLACEHOLDERS) | set(pipeline.vars)
    texts = [("args", a) for a in stage.args] + [("outputs", o) for o in stage.outputs]
    texts += [("verify", c.glob) for c in stage.verify] + [("verify", str(c.expect)) for c in stage.verify]
    if stage.continuation:
        texts += [("continuation", stage.continuation.checkpoints), ("continuation", str(stage.continuation.target_steps))]
    if stage.nemo:
        texts += [("nemo", text) for text in (stage.nemo.data_dir, stage.nemo.bpe_dir, stage.nemo.results_dir,
                                               *stage.nemo.overrides)]
    for backend in RESOURCE_TYPES:
        resources = stage.resources(backend)
        texts += [(backend, a) for a in (resources.command or [])] + [(backend, v) for v in resources.env.values()]
    for key, text in texts:
        for name in PLACEHOLDER.findall(text):
            if name not in known:
                raise where.child(key, body).error(
                    f"unknown placeholder ${{{name}}} in {text!r}; known: {', '.join(sorted(known))} "
                    "(upper-case ${NAME} is left for the job's shell)")


COUNTS = {"local": ("replicas", "processes"), "slurm": ("nodes", "ntasks_per_node", "cpus_per_task")}


def _validate_counts(stage: StageConfig, body: Any, where: Where) -> None:
    """Local and Slurm counts of processes, nodes and CPUs are >= 1 where set (BCP's: _validate_bcp), named at
    their line or --set."""
    for backend, keys in COUNTS.items():
        resources = stage.resources(backend)
        section = body.get(backend) if isinstance(body, dict) else None
        section_where = where.child(backend, body) if isinstance(section, dict) else where
        for key in keys:
            value = getattr(resources, key)
            if value is not None and value < 1:
                at = section_where.child(key, section) if isinstance(section, dict) and key in section else where
                raise at.error(f"{backend}.{key} must be >= 1, got {value}" if at is where else
                               f"must be >= 1, got {value}")


def _validate_bcp(res: BcpResources, where: Where) -> None:
    if res.replicas < 1 or res.processes < 1:
        raise where.error(f"replicas and processes must be >= 1, got {res.replicas} x {res.processes}")
    if res.replicas > 1 and res.total_runtime is None:
        raise where.error("replicas > 1 needs total_runtime (ngc requires --total-runtime for multi-node jobs)")
    if not 1 <= res.order <= 99:
        raise where.error(f"order {res.order} is outside 1..99")
    for label in res.labels:
        if not LABEL_PATTERN.match(label) or label.startswith("_x"):
            raise where.error(f"label {label!r} must match [A-Za-z_][A-Za-z0-9_]* (<= 256 chars, not _x...)")
    for secret in res.secrets:
        parts = secret.split(":")
        if len(parts) not in (1, 3) or not all(SECRET_PART.match(p) for p in parts):
            raise where.error(f"secret {secret!r} must be NAME or NAME:KEY:ENVVAR ([A-Za-z0-9_.-], <= 63 chars)")
    for key, value in res.env.items():
        if not ENV_KEY.match(key) or len(value) > 2048:
            raise where.error(f"env var {key!r} must match [A-Za-z0-9_.-]{{1,63}} with a value <= 2048 chars")


def _validate_estimates(pipeline: PipelineConfig, raw: dict, where: Where) -> None:
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
            f"cpu_peak_tflops is one CPU process's peak in TFLOP/s, > 0; got {estimates.cpu_peak_tflops:g}")
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


def validate_continuation(pipeline: PipelineConfig, continuation: Continuation, where: Where) -> None:
    """Refuse a target or attempt count below 1 (public: preflight.py checks the continuation it derives)."""
    try:
        target = resolve_int(str(continuation.target_steps), pipeline.vars)
    except ValueError as exc:
        raise where.error(f"target_steps: {exc}") from None
    if target < 1 or continuation.max_attempts < 1:
        raise where.error(f"target_steps ({target}) and max_attempts ({continuation.max_attempts}) must be >= 1")


def _blamed(where: Where, text: str, var_origins: dict[str, str]) -> Where:
    """Where to blame a bad value written as `text`: the --set of a var it is made of, if any, else `where`."""
    given = [var_origins[name] for name in PLACEHOLDER.findall(text) if name in var_origins]
    return Where(given[0], where.key, None) if given else where


def _validate_check(pipeline: PipelineConfig, stage: StageConfig, check: Check, where: Where,
                    var_origins: dict[str, str]) -> None:
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
            blamed = _blamed(where, str(value), var_origins)
            try:
                number = resolve_int(str(value), pipeline.vars)
            except ValueError as exc:
                raise blamed.error(f"{key}: {exc}") from None
            if number < (0 if key == "expect" else 1):
                raise blamed.error(f"{key} {value} must be >= {0 if key == 'expect' else 1}, got {number}")


def substitute(text: str, values: dict[str, str]) -> str:
    """Replace lower-case `${name}` placeholders; upper-case `${NAME}` is left for the job's shell."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)] if m.group(1) in values else m.group(0), text)


def resolve_int(text: str, variables: dict[str, str]) -> int:
    """`"42"` or `"${files}"` -> 42; ValueError naming the text otherwise."""
    resolved = substitute(text, dict(variables))
    try:
        return int(resolved)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number" + (f" (it is {resolved!r})" if resolved != text else "")) from None


def expected_count(pipeline: PipelineConfig, stage_name: str, check: Check, seen: tuple[str, ...] = ()) -> int:
    """The number of files `check` expects, derived through `expect_from` chains (pure, so `plan` can print it)."""
    if check.expect is not None:
        return resolve_int(str(check.expect), pipeline.vars)
    upstream = check.expect_from
    assert upstream is not None
    if upstream in seen:
        raise ConfigError(f"stage {stage_name!r}: expect_from loops through {' -> '.join((*seen, upstream))}")
    base = expected_count(pipeline, upstream, pipeline.stages[upstream].verify[0], (*seen, stage_name))
    if check.group is not None:
        return -(-base // resolve_int(str(check.group), pipeline.vars))
    return base * check.per
