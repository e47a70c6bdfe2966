"""`cancel` on BCP through NVIDIA's client against the NGC API EMULATOR (tests/fakes/ngc_api.py): a job that ends
between the run's last look and its kill is refused by BCP (`job N is FINISHED_SUCCESS`, HTTP 400), and that is
no failure of the cancel; a kill refused while the job still runs is one, naming the job."""

from __future__ import annotations

import json
from dataclasses import replace

import ngc_control
import pytest
from support.bcp_emulation import needs_ngcsdk

from bcp_pipeline.backends.bcp.backend import BcpBackend
from bcp_pipeline.backends.bcp.render import label
from bcp_pipeline.config.resources import BcpOptions
from bcp_pipeline.errors import BackendCallError

pytestmark = [needs_ngcsdk, pytest.mark.both_transports]

RUN_ID = "r"


def running_job(fake) -> str:
    result = fake.ngc(
        "base-command", "job", "run", "--name", "cancel-probe", "--image", "nvidia/pytorch:24.01-py3",
        "--instance", "dgxa100.80g.1.norm", "--result", "/results", "--commandline", "sleep 60",
        "--label", label("run", RUN_ID), "--total-runtime", "1h", "--format_type", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    job_id = str(json.loads(result.stdout)["job"]["id"])
    fake.wait_for(int(job_id), ["RUNNING"], timeout=30)
    return job_id


def backend(fake, tmp_path) -> BcpBackend:
    options = replace(BcpOptions(), transport=fake.transport)
    return BcpBackend(
        options,
        pipeline=None,
        config_dir=tmp_path,
        stages_dir=tmp_path,  # type: ignore[arg-type]
        run_dir=tmp_path / "runs" / RUN_ID,
        workspace_name="main",
    )


def test_a_job_that_finishes_just_before_its_kill_is_no_failure_of_the_cancel(fake, tmp_path):
    job_id = running_job(fake)
    bcp = backend(fake, tmp_path)
    real_kill = bcp.transport.kill

    def finish_then_kill(killed: str) -> None:
        ngc_control.stop_job(fake.home, killed, "FINISHED_SUCCESS", grace=False)  # it ends as the kill is sent
        real_kill(killed)

    bcp.transport.kill = finish_then_kill  # type: ignore[method-assign]
    with pytest.raises(BackendCallError, match="FINISHED_SUCCESS"):
        finish_then_kill(running_job(fake))  # BCP does refuse it
    bcp.cancel([job_id])
    assert fake.status(int(job_id)) == "FINISHED_SUCCESS"


def test_a_kill_refused_while_the_job_runs_fails_the_cancel_naming_the_job(fake, tmp_path):
    job_id = running_job(fake)
    bcp = backend(fake, tmp_path)

    def refused(killed: str) -> None:
        raise BackendCallError(f"ngcsdk basecommand.jobs.kill: Client Error: 403 Response: job {killed} is not yours")

    bcp.transport.kill = refused  # type: ignore[method-assign]
    with pytest.raises(BackendCallError, match=rf"could not kill every job:\n  job {job_id}: .*403"):
        bcp.cancel([job_id])
    assert fake.status(int(job_id)) == "RUNNING"
    ngc_control.stop_job(fake.home, job_id, "KILLED_BY_USER", grace=False)
