"""The shape of `run --detach`'s driver job (instance, image, runtime, priority), pure.

The ACE's limits apply to the driver as to any job, so `run` and `plan` check this shape with the stage jobs
(admission.py) before anything is submitted; detach/jobs.py adds what only a real driver has (its commandline, the
run's labels, the secret holding the key) to the same shape, so the job checked is the job submitted.
"""

from __future__ import annotations

from bcp_pipeline.backends.bcp.render import JobSpec
from bcp_pipeline.config.durations import format_duration, parse_duration
from bcp_pipeline.config.model import PipelineConfig
from bcp_pipeline.config.resources import BcpOptions
from bcp_pipeline.errors import ConfigError

DRIVER_STAGE = "(driver)"  # how a driver job is named where a stage's name would stand (limits, check rows)
DRIVER_FIX_PREFIX = "--set backends.bcp.driver."


def driver_job_shape(options: BcpOptions, pipeline: PipelineConfig) -> JobSpec:
    """The driver job of `pipeline` without its commandline: ConfigError (exit 2) when it has no instance or
    image, or hands over no earlier than it ends."""
    driver, verification = options.driver, pipeline.verification.bcp
    instance, image = driver.instance or verification.instance, driver.image or verification.image
    if not instance or not image:
        raise ConfigError(
            f"pipeline {pipeline.name}: the --detach driver job needs an instance and an image: "
            f"{DRIVER_FIX_PREFIX}instance=INSTANCE and {DRIVER_FIX_PREFIX}image=IMAGE (or set them "
            "in the pipeline's verification: bcp: section)"
        )
    runtime, before = parse_duration(driver.total_runtime), parse_duration(driver.handover_before)
    if before >= runtime:
        raise ConfigError(
            f"backends.bcp.driver.handover_before ({driver.handover_before}) must be shorter than its "
            f"total_runtime ({driver.total_runtime}): {DRIVER_FIX_PREFIX}handover_before="
            f"{format_duration(max(runtime // 3, 60))}"
        )
    return JobSpec(
        name=f"{pipeline.name}.driver",
        image=image,
        instance=instance,
        result="/results",
        commandline="",
        total_runtime=format_duration(runtime),
        priority=driver.priority,
        org=options.org,
        team=options.team,
        ace=options.ace,
    )
