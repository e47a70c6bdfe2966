"""`bcp-pipeline check`: the checks of one backend, their result saved as a profile in the state folder."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bcp_pipeline.backends.profile import profile_key, save_profile
from bcp_pipeline.config.pipelines import Config
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.errors import ConfigError
from bcp_pipeline.check.context import CheckContext
from bcp_pipeline.check.result import CheckResult


@dataclass(kw_only=True)
class CheckRequest:
    config_file: Path
    state_root: Path
    pipeline: str | None = None
    backend: str | None = None
    jobs: bool = True
    detach: bool = False
    overrides: list[str] = field(default_factory=list)  # --set, as `run` takes them


def backend_for(config: Config, request: CheckRequest) -> str:
    if request.backend:
        return request.backend
    if request.pipeline:
        return config.pipeline(request.pipeline).backend
    raise ConfigError("name a pipeline (`bcp-pipeline check PIPELINE`) or a backend (`--backend bcp|slurm|gridengine|kubernetes|local`)")


def run_check(request: CheckRequest, environ: Mapping[str, str],
              announce: Callable[[str], None] = lambda line: None) -> tuple[CheckResult, Path]:
    """Every check of the backend; the result, and where its profile was saved (atomically). `announce` hears
    what a probe job costs before it is submitted."""
    if request.overrides and not request.pipeline:
        raise ConfigError("--set needs a pipeline: `bcp-pipeline check PIPELINE --set STAGE.KEY=VALUE`")
    config = load_and_check(request.config_file, overrides=request.overrides, pipeline=request.pipeline)
    backend = backend_for(config, request)
    if request.detach and backend != "bcp":
        raise ConfigError(f"--detach judges the ACE for a BCP driver job: it needs --backend bcp, not {backend!r}")
    ctx = CheckContext(config=config, pipeline=config.pipeline(request.pipeline) if request.pipeline else None,
                       backend_name=backend, state_root=request.state_root, environ=environ, jobs=request.jobs,
                       detach=request.detach, announce=announce)
    started = time.time()
    if backend == "local":
        from bcp_pipeline.check.local import check_local, local_key

        target_parts = local_key()
        rows, facts = check_local(ctx)
        target = {"host": target_parts[1]}
    elif backend == "slurm":
        from bcp_pipeline.check.slurm import check_slurm

        target, rows, facts, notes = check_slurm(ctx)
        target_parts = ("slurm", target["cluster"])
    elif backend == "gridengine":
        from bcp_pipeline.check.gridengine import check_gridengine

        target, rows, facts, notes = check_gridengine(ctx)
        target_parts = ("gridengine", target["cell"].replace("/", "-"))
    elif backend == "kubernetes":
        from bcp_pipeline.check.kubernetes import check_kubernetes

        target, rows, facts, notes = check_kubernetes(ctx)
        target_parts = ("kubernetes", target["cluster"])
    elif backend == "bcp":
        from bcp_pipeline.check.bcp import check_bcp

        target, rows, facts, notes = check_bcp(ctx)
        target_parts = (target["org"], target["ace"])
    else:
        raise ConfigError(f"unknown backend {backend!r}; choose one of bcp, slurm, gridengine, kubernetes, local")
    key = profile_key(*target_parts)
    result = CheckResult(backend=backend, key=key, target=target, pipeline=request.pipeline, checked_at=started,
                         rows=rows, facts=facts, notes=notes if backend != "local" else [])
    path = save_profile(request.state_root, key, result.as_json())
    return result, path
