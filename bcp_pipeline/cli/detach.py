"""The command line's side of `run --detach` (detach/ is the rest): hand a run to a driver job, take it back, and
what `plan --detach` shows of the driver."""

from __future__ import annotations

import os

from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.instances import instances_table
from bcp_pipeline.config.model import Config, PipelineConfig
from bcp_pipeline.detach.laptop import DetachedRun
from bcp_pipeline.engine.selection import ChosenRun
from bcp_pipeline.engine.workspace_lock import hold_workspace


def detach(chosen: ChosenRun) -> int:
    """Hand the run to a driver job on BCP and return: the laptop may close."""
    state = chosen.state
    run = detached_run(chosen)
    # The driver job becomes the workspace's writer: its record stays in the lock file after this process ends.
    with hold_workspace(run.backend, chosen.pipeline.workspace.name, state, chosen.store, detached=True):
        job_id, resumed = run.start(os.environ)
    url = run.backend.job_url(job_id)
    print(
        f"run {state.run_id} ({chosen.pipeline.name}) is detached: driver job {job_id} "
        f"{'resumed' if resumed else 'submitted'}" + (f" ({url})" if url else "")
    )
    run_id = state.run_id
    print(f"  follow it:  bcp-pipeline status {run_id}    (a stage's log: bcp-pipeline logs {run_id} STAGE)")
    print(f"  stop it:    bcp-pipeline cancel {run_id}    (bring it back here: bcp-pipeline resume {run_id})")
    return 0


def detached_run(chosen: ChosenRun) -> DetachedRun:
    backend = make_backend(
        chosen.state.backend, chosen.config, chosen.pipeline, chosen.store.run_dir(chosen.state.run_id)
    )
    return DetachedRun(
        config=chosen.config, pipeline=chosen.pipeline, store=chosen.store, state=chosen.state, backend=backend
    )


def take_back(chosen: ChosenRun) -> None:
    """A detached run, stopped on BCP to continue here (its driver's last state becomes the local one)."""
    stopped = detached_run(chosen).take_back()
    print(
        f"run {chosen.state.run_id} taken back from its driver job(s) {', '.join(stopped) or '(none running)'}: "
        "it continues here"
    )


def driver_cost_line(config: Config, pipeline: PipelineConfig, estimate) -> str:
    """What the detached driver adds: one small instance for the whole run (queueing not counted)."""
    instance = config.options["bcp"].driver.instance or pipeline.verification.bcp.instance
    gpus = instances_table(config.options["bcp"].instances).get(instance)
    hours = estimate.seconds / 3600
    gpu_hours = hours * gpus.gpus if gpus else None
    share = (
        f", {100 * gpu_hours / estimate.gpu_hours:.1f} % of the run's GPU-hours"
        if gpu_hours and estimate.gpu_hours
        else ""
    )
    return f"driver (--detach): 1 x {instance} for the whole run: {hours:,.0f} node-hours" + (
        f", {gpu_hours:,.0f} GPU-hours{share}" if gpu_hours is not None else ""
    )
