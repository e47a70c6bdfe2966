"""What `run` checks of BCP before a run is recorded (the backend's `check_ready` and `check_limits` hooks), and
what `plan` shows of the same (`describe_limits`): every job has an instance and an image and breaks none of BCP's
own rules, a transport and credentials are there, the workspaces exist, and the ACE's limits fit the jobs (and,
with `--detach`, the driver job)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bcp_pipeline.backends.bcp.ace import check_ace, plan_check, refuse_violations
from bcp_pipeline.backends.bcp.connect import check_credentials, check_workspaces_exist, choose_transport
from bcp_pipeline.backends.bcp.driver import driver_job_shape
from bcp_pipeline.backends.bcp.render import check_stage_resources
from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.config.model import Config, PipelineConfig


def check_ready(config: Config, pipeline: PipelineConfig | None) -> None:
    if pipeline is not None:
        check_stage_resources(pipeline)
    options = config.options["bcp"]
    choose_transport(options)
    check_credentials(options)
    if pipeline is not None:
        check_workspaces_exist(options, pipeline)


def check_limits(config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *,
                 detach: bool = False) -> None:
    """The ACE's limits (instances, runtime, replicas, multi-node, array types; with `detach`, room for the driver
    and a stage job) against the jobs; a ConfigError naming each stage, the limit and the `--set` that fixes it."""
    if requests or detach:
        driver = driver_job_shape(config.options["bcp"], pipeline) if detach else None
        refuse_violations(check_ace(config.options["bcp"], config.stages_dir, requests, detach=detach,
                                    driver=driver), pipeline.name)


def describe_limits(config: Config, pipeline: PipelineConfig, requests: Sequence[JobRequest], *,
                    detach: bool = False) -> Any:
    """The same check for `plan` (an AceCheck: made when credentials are there, else why not)."""
    driver = driver_job_shape(config.options["bcp"], pipeline) if detach else None
    return plan_check(config.options["bcp"], config.stages_dir, requests, detach=detach, driver=driver)
