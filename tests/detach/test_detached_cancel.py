"""`cancel` of a detached run on the emulated BCP (tests/fakes/ngc_api.py, an EMULATOR of the NGC API, named so)
asks the service how each job the driver's last state calls active ended, before recording anything (issue 50,
item 3): a job that succeeded on BCP stays succeeded, and a resume verifies its stage rather than running it again.
The run's report then has the commands the driver submitted, as recorded (item 4: "not recorded at submission").
"""

from __future__ import annotations

import importlib.util
import json
import time

import pytest
from support.bcp_emulation import needs_ngcsdk
from support.cli import cli, latest
from support.pipeline_fixtures import bcp_chain_config, stall_stage, wait_for, write_chain_project

from bcp_pipeline.engine.state import CANCELLED_WHILE, StageStatus

pytestmark = [needs_ngcsdk, pytest.mark.parametrize("fake", ["sdk"], indirect=True)]

SECRET = "bcp-pipeline-ngc"  # the BCP secret a driver job reads its API key from


def driver_jobs(fake) -> list[dict]:
    return sorted(
        (r["job"] for r in fake.jobs().values() if "bcpp_kind_driver" in _labels(r["job"])), key=lambda job: job["id"]
    )


def _labels(job: dict) -> list[str]:
    return job.get("labels", {}).get("userLabels", {}).get("values", []) or job["jobDefinition"].get("userLabels", [])


def job_named(fake, name: str) -> dict | None:
    return next((r["job"] for r in fake.jobs().values() if r["job"]["jobDefinition"]["name"] == name), None)


def workspace_stage(fake, run_id: str, stage: str) -> str | None:
    path = fake.workspace_path("main") / ".bcp-pipeline/runs" / run_id / "state.json"
    try:
        return json.loads(path.read_text())["stages"][stage]["status"]
    except (FileNotFoundError, ValueError, KeyError):
        return None


def test_cancel_records_a_job_that_succeeded_on_bcp_as_succeeded(fake, tmp_path, capsys):
    import ngc_control

    fake.set_secret(SECRET, {"api_key": fake.api_key})
    project = write_chain_project(
        tmp_path / "project",
        bcp_chain_config(fake.transport).replace(
            "poll_max_seconds: 0.3}", "poll_max_seconds: 0.3, driver: {total_runtime: 1h, handover_before: 10m}}"
        ),
    )
    stall = stall_stage(fake.workspace_path("main"), "second")
    assert cli(project, "run", "chain", "--backend", "bcp", "--detach") == 0
    run_id = latest(project).run_id
    wait_for(lambda: workspace_stage(fake, run_id, "second") == "running", 120, "second running")
    driver = driver_jobs(fake)[0]
    # The driver dies with `second` running; `second` then succeeds on BCP, which no driver sees.
    ngc_control.stop_job(fake.home, driver["id"], "KILLED_BY_SYSTEM", details="killed by the test")
    wait_for(lambda: fake.status(int(driver["id"])) == "KILLED_BY_SYSTEM", 30, "the driver killed")
    stall.unlink()
    second = wait_for(
        lambda: (job := job_named(fake, "chain.second")) and job["jobStatus"]["status"] == "FINISHED_SUCCESS" and job,
        60,
        "second's job finished",
    )
    capsys.readouterr()
    assert cli(project, "cancel", run_id) == 0
    out = capsys.readouterr().out
    assert f"{second['id']} had already ended (FINISHED_SUCCESS)" in out, out
    state = latest(project)
    job = state.stages["second"].jobs[-1]
    assert job.job_id == str(second["id"]) and job.state == "succeeded" and "cancelled" not in job.detail, job
    assert state.stages["second"].status is StageStatus.CANCELLED
    assert state.stages["second"].extra[CANCELLED_WHILE] == "verifying"  # a resume verifies it, no more
    assert fake.status(int(second["id"])) == "FINISHED_SUCCESS"
    # `resume` here: second is verified, not submitted again; third runs.
    started = time.monotonic()
    assert cli(project, "resume", run_id) == 0
    state = latest(project)
    assert state.status == "succeeded" and state.stages["second"].attempts == 1, time.monotonic() - started
    assert [r["job"]["jobDefinition"]["name"] for r in fake.jobs().values()].count("chain.second") == 1
    if importlib.util.find_spec("plotly"):
        assert cli(project, "report", run_id) == 0
        kept = project.parent / ".bcp-pipeline/runs" / run_id / "submitted" / f"{second['id']}.txt"
        assert "--name chain.second " in kept.read_text()  # submitted by the driver, read from its log
        html = (project.parent / ".bcp-pipeline/runs" / run_id / "report.html").read_text()
        assert "re-rendered from the config" not in html and fake.api_key not in html
