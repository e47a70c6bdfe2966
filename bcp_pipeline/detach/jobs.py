"""A detached run's driver jobs on BCP: the job spec, finding them by label, and the lease that lets one drive.

Driver jobs carry the run's label and `bcpp_kind_driver`, so one labelled `job list` finds them all; that is also
how a second driver for the same run is refused.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from bcp_pipeline.atomic import atomic_write_json
from bcp_pipeline.backends.bcp.connect import read_ngc_config
from bcp_pipeline.backends.bcp.driver import driver_job_shape
from bcp_pipeline.backends.bcp.render import JobSpec, job_run_argv, label, upload_argv
from bcp_pipeline.backends.bcp.states import labels_of, status_of
from bcp_pipeline.backends.bcp.transport import Transport
from bcp_pipeline.backends.retries import with_retries
from bcp_pipeline.backends.shared.command import shell_join
from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.model import Config, PipelineConfig
from bcp_pipeline.detach.protocol import DRIVER_FOLDER, DRIVER_KIND, workspace_run_path
from bcp_pipeline.errors import StateError

LEASE_POLL_SECONDS = 2.0


def driver_spec(config: Config, pipeline: PipelineConfig, run_id: str, environ: Mapping[str, str]) -> JobSpec:
    """The driver job of run `run_id`: no key anywhere in it, only the name of the secret that holds one."""
    options = config.options["bcp"]
    driver = options.driver
    shape = driver_job_shape(options, pipeline)
    runtime, before = parse_duration(driver.total_runtime), parse_duration(driver.handover_before)
    mount = pipeline.workspace.mount.rstrip("/")
    program = [
        driver.python or options.python,
        "-m",
        "bcp_pipeline.detach.driver",
        "--workspace-root",
        mount,
        "--run",
        run_id,
        "--hand-over-after",
        str(runtime - before),
        *(["--install"] if driver.install_ngcsdk else []),
    ]
    folder = f"{mount}/{workspace_run_path(run_id)}/{DRIVER_FOLDER}"
    settings = ngc_settings(options.org, options.team, options.ace, environ)
    return replace(
        shape,
        commandline=f"cd {shlex.quote(folder)} && exec {shell_join(program)}",
        workspaces=(f"{pipeline.workspace.name}:{mount}:RW",),
        labels=(label("run", run_id), label("kind", DRIVER_KIND)),
        secrets=(f"{driver.secret}:{driver.secret_key}:NGC_CLI_API_KEY",),
        env=tuple(f"{key}:{value}" for key, value in settings.items()),
    )


def ngc_settings(org: str | None, team: str | None, ace: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """Org, team and ACE for the driver's ngcsdk, as plain settings: pipelines.yaml, else this machine's NGC ones."""
    saved = read_ngc_config(dict(environ))
    values = {
        "NGC_CLI_ORG": org or environ.get("NGC_CLI_ORG") or saved.get("org"),
        "NGC_CLI_TEAM": team or environ.get("NGC_CLI_TEAM") or saved.get("team"),
        "NGC_CLI_ACE": ace or environ.get("NGC_CLI_ACE") or saved.get("ace"),
    }
    return {key: value for key, value in values.items() if value and value != "no-team"}


def runtime_used(job: dict[str, Any]) -> float:
    """Seconds of its --total-runtime a job had spent RUNNING before its current run (0 for a first run).

    ngcsdk's JobStatus carries `aggregatedPreviousRunTimeSeconds` (the time run before a preemption) and
    `totalRuntimeSeconds` (the job's runtime so far, which may count the current run too). Either may be absent;
    the larger is taken, so a driver hands over early rather than past its limit.
    """
    status = job.get("jobStatus") or {}
    values = [status.get(key) for key in ("aggregatedPreviousRunTimeSeconds", "totalRuntimeSeconds")]
    return float(max((v for v in values if isinstance(v, (int, float))), default=0))


def active_drivers(transport: Transport, run_id: str) -> list[dict[str, Any]]:
    return [job for job in driver_jobs(transport, run_id) if not status_of(job).state.finished]


def driver_jobs(transport: Transport, run_id: str) -> list[dict[str, Any]]:
    """Every driver job of the run, oldest first (one labelled `job list`)."""
    wanted = label("kind", DRIVER_KIND)
    jobs = [job for job in transport.list_jobs([label("run", run_id)]) if wanted in labels_of(job)]
    return sorted(jobs, key=lambda job: int(str(job.get("id"))) if str(job.get("id")).isdigit() else 0)


class Lease:
    """`driver.lease` in the run folder: the job id of the driver that drives the run.

    A driver takes it only when it is free, its own, or held by a job that has ended; until then it waits (up to
    its own hand-over deadline). Jobs end for good on BCP, so a lease cannot be taken from a live driver.
    """

    def __init__(self, path: Path, job_id: str) -> None:
        self.path = path
        self.job_id = job_id

    def holder(self) -> str | None:
        try:
            return str(json.loads(self.path.read_text(encoding="utf-8"))["job_id"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise StateError(
                f"{self.path}: unreadable driver lease ({exc}); remove it once no driver job of this run is running"
            ) from None

    def take(self, backend, deadline: float, sleep=time.sleep) -> None:
        while (holder := self.holder()) not in (None, self.job_id):
            status = status_of(
                with_retries(
                    lambda: backend.transport.job(holder),
                    f"looking up driver job {holder}",
                    backend.retry_policy,
                    sleep=sleep,
                )
            )
            if status.state.finished:
                break
            if time.monotonic() >= deadline:
                raise StateError(
                    f"driver job {holder} still drives this run ({status.native}); this driver "
                    f"({self.job_id}) gave up waiting for it to end"
                )
            print(f"driver job {self.job_id}: waiting for driver job {holder} ({status.native}) to end", flush=True)
            sleep(LEASE_POLL_SECONDS)
        atomic_write_json(self.path, {"job_id": self.job_id, "taken_at": time.time()})


def planned_driver(config: Config, pipeline: PipelineConfig, run_id: str, environ: Mapping[str, str]) -> dict:
    """The upload and the driver job `run --detach` would make, as `plan --detach` shows them (pure but for
    reading NGC's settings)."""
    spec = driver_spec(config, pipeline, run_id, environ)
    upload = upload_argv(config.options["bcp"], pipeline.workspace.name, Path("BUNDLE"), workspace_run_path(run_id))
    argv = job_run_argv(spec)
    return {"upload": shell_join(upload), "printable": shell_join(argv), "argv": argv}
