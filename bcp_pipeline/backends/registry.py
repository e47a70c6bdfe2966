"""Backends by name. Each lives in its own module and implements contract.Backend."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bcp_pipeline.config.pipelines import Config, PipelineConfig
from bcp_pipeline.errors import ConfigError
from bcp_pipeline.backends.contract import Backend, JobRequest

BACKENDS = ("local", "bcp", "slurm", "gridengine", "kubernetes")


def make_backend(name: str, config: Config, pipeline: PipelineConfig, run_dir: Path) -> Backend:
    """The backend `name`, bound to one run's folder (logs, local job records)."""
    options = config.options.get(name)
    common = {"config_dir": config.file.parent.resolve(), "stages_dir": config.stages_dir, "run_dir": run_dir,
              "workspace_name": pipeline.workspace.name}
    if name == "local":
        from bcp_pipeline.backends.local import LocalBackend

        return LocalBackend(options, **common)
    if name == "bcp":
        from bcp_pipeline.backends.bcp import BcpBackend, profile_key_of
        from bcp_pipeline.backends.profile import load_profile

        key = profile_key_of(options, os.environ)
        # run_dir is STATE/runs/RUN: the profiles of `check` are in STATE/checks
        profile = load_profile(run_dir.parent.parent, key) if key else None
        return BcpBackend(options, pipeline=pipeline, profile=profile, **common)
    if name == "slurm":
        from bcp_pipeline.backends.slurm import SlurmBackend

        return SlurmBackend(options, **common)
    if name == "gridengine":
        from bcp_pipeline.backends.gridengine import GridEngineBackend

        return GridEngineBackend(options, **common)
    if name == "kubernetes":
        from bcp_pipeline.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(options, **common)
    raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


def check_backend_ready(name: str, config: Config, pipeline: PipelineConfig | None = None) -> None:
    """What a backend needs before the first submission, checked before a run is recorded: raises a
    PipelineError naming what is missing and how to get it. `plan` does not call this: it needs nothing."""
    if name == "bcp":
        from bcp_pipeline.backends.bcp_render import check_stage_resources
        from bcp_pipeline.backends.bcp_transport import check_credentials, choose_transport

        if pipeline is not None:
            check_stage_resources(pipeline)
        options = config.options["bcp"]
        choose_transport(options)
        check_credentials(options)
        if pipeline is not None:
            from bcp_pipeline.backends.bcp_lookups import check_workspaces_exist

            check_workspaces_exist(options, pipeline)


def check_backend_limits(name: str, config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *,
                         detach: bool = False) -> None:
    """The service's own limits against the jobs this invocation may submit, before a run is recorded: on BCP the
    ACE's (instances, runtime, replicas, multi-node, array types; with `detach`, room for the driver and a stage
    job). Raises a ConfigError naming each stage, the limit and the `--set` that fixes it. After
    check_backend_ready: it needs the credentials that one checks."""
    if name == "bcp" and (requests or detach):
        from bcp_pipeline.backends.bcp_ace import check_ace, refuse_violations
        from bcp_pipeline.backends.bcp_driver import driver_job_shape

        driver = driver_job_shape(config.options["bcp"], pipeline) if detach else None
        refuse_violations(check_ace(config.options["bcp"], config.stages_dir, requests, detach=detach,
                                    driver=driver), pipeline.name)


def describe_backend_limits(name: str, config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *,
                            detach: bool = False) -> Any:
    """`plan`'s view of the same check (an AceCheck on BCP: made when credentials are there, else why not); None
    for a backend with no such limits."""
    if name != "bcp":
        return None
    from bcp_pipeline.backends.bcp_ace import plan_check
    from bcp_pipeline.backends.bcp_driver import driver_job_shape

    driver = driver_job_shape(config.options["bcp"], pipeline) if detach else None
    return plan_check(config.options["bcp"], config.stages_dir, requests, detach=detach, driver=driver)
