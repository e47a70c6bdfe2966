"""The BCP backend under the service variants that decide whether a first real run starts and survives a crash
(tests/fakes/README.md "Variants"): an ACE whose limits a pipeline breaks, a `job list` that lags behind job
creation, and a server clock ahead of or behind ours. NVIDIA's own client (the ngc CLI's code, or ngcsdk
in-process) talks to the NGC API EMULATOR on loopback (tests/fakes/ngc_api.py: a fake, named so).

Kept cheap: one-stage runs (`--only first`) where a whole chain would add nothing, and the lag variant on one
transport (what it tests is the engine's look-up, the same above both).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.bcp_emulation import jobs_by_stage, needs_ngcsdk
from support.cli import cli, latest
from support.pipeline_fixtures import bcp_chain_config, start_orchestrator, wait_for, write_chain_project

from bcp_pipeline.backends.contract import JobRequest
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.load import load_config
from bcp_pipeline.engine.state import StageStatus

pytestmark = needs_ngcsdk


@pytest.fixture
def project(tmp_path, fake):
    return write_chain_project(tmp_path / "project", bcp_chain_config(fake.transport))


def no_run_recorded(project: Path) -> bool:
    return not (project.parent / ".bcp-pipeline" / "runs").exists()


# -- the ACE's limits ------------------------------------------------------------------------------------------
@pytest.mark.emulator(variants={"ace": {"maxRuntimeSeconds": 1800, "maxAllowedReplicas": 1}})
def test_a_pipeline_the_ace_would_refuse_is_refused_before_a_run_is_recorded(fake, project, capsys):
    assert cli(project, "run", "chain", "--backend", "bcp") == 2
    err = capsys.readouterr().err
    assert "pipeline chain: ACE bcpp-test-ace does not allow" in err, err
    assert (
        "\n  stage first: total_runtime 1H (3600 s), but the ACE's maxRuntimeSeconds allows 30M (1800 s); "
        "--set first.bcp.total_runtime=30M\n"
    ) in err
    assert "stage first: replicas 2, but the ACE's maxAllowedReplicas allows 1; --set first.bcp.replicas=1" in err
    assert "stage third (verification): total_runtime 1H" in err and "verification.bcp.total_runtime: 30M" in err
    assert "Nothing was submitted or recorded" in err
    assert fake.jobs() == {} and no_run_recorded(project)
    # plan makes the same check when the credentials are there, and fails as run would
    assert cli(project, "plan", "chain", "--backend", "bcp") == 1
    assert "--set first.bcp.total_runtime=30M" in capsys.readouterr().err
    # ... and the fixes it names are enough
    project.write_text(
        project.read_text()
        .replace("total_runtime: 1h", "total_runtime: 30M")
        .replace("bcp: {replicas: 2, processes: 1}", "bcp: {replicas: 1, processes: 2}")
    )
    assert cli(project, "plan", "chain", "--backend", "bcp") == 0
    assert "ACE bcpp-test-ace: every job fits its limits" in capsys.readouterr().err
    assert fake.jobs() == {} and no_run_recorded(project)


@pytest.mark.emulator(variants={"ace": {"maxActiveJobsPerUser": 1}})
def test_detach_is_refused_when_the_ace_leaves_no_room_for_the_driver_and_a_stage_job(fake, project, capsys):
    assert cli(project, "run", "chain", "--backend", "bcp", "--detach") == 2
    err = capsys.readouterr().err
    assert "maxActiveJobsPerUser allows 1 active job(s) per user" in err and "run without --detach" in err, err
    assert fake.jobs() == {} and no_run_recorded(project)
    assert cli(project, "plan", "chain", "--backend", "bcp") == 0  # without --detach one active job is enough


@pytest.mark.emulator(variants={"ace": {"maxRuntimeSeconds": 5400}})
def test_the_detach_driver_is_checked_against_the_ace_and_its_fix_is_a_set(fake, project, capsys):
    """The driver's default --total-runtime (5D) breaks an ACE of 90 minutes: plan and run say so, with the
    --set that fixes it; that --set is enough (the stage jobs, 1H, fit)."""
    refusal = (
        "the --detach driver job: total_runtime 5D (432000 s), but the ACE's maxRuntimeSeconds allows 1H30M "
        "(5400 s); --set backends.bcp.driver.total_runtime=1H30M"
    )
    assert cli(project, "plan", "chain", "--backend", "bcp", "--detach") == 1
    assert refusal in capsys.readouterr().err
    assert cli(project, "run", "chain", "--backend", "bcp", "--detach") == 2
    err = capsys.readouterr().err
    assert refusal in err and "credentials" not in err and "API key" not in err, err
    assert fake.jobs() == {} and no_run_recorded(project)
    fix = ("--set", "backends.bcp.driver.total_runtime=1H30M")
    assert cli(project, "plan", "chain", "--backend", "bcp", "--detach", *fix) == 0
    assert "ACE bcpp-test-ace: every job fits its limits" in capsys.readouterr().err
    assert cli(project, "plan", "chain", "--backend", "bcp") == 0  # without --detach there is no driver to fit


def test_plan_without_any_credentials_says_it_did_not_check_the_ace(fake, project, monkeypatch, capsys):
    monkeypatch.delenv("NGC_CLI_API_KEY")
    assert cli(project, "plan", "chain", "--backend", "bcp") == 0
    captured = capsys.readouterr()
    assert "ngc base-command job run" in captured.out
    assert "ACE limits not checked: the BCP backend is missing an API key" in captured.err
    assert "submitted" not in captured.err  # plan never submits: `run`'s "Nothing was submitted" is not its to say
    assert not fake.requests("GET", "/v2/org/*/aces/*")


# -- a job just created, not listed yet -------------------------------------------------------------------------
def submit_first(backend, project: Path, run_id: str) -> str:
    pipeline = load_config(project).pipeline("chain")
    stage = pipeline.stages["first"]
    return backend.submit(
        backend.render(
            JobRequest(
                run_id=run_id,
                pipeline=pipeline,
                stage=stage,
                kind="stage",
                program=stage.program,
                args=tuple(stage.args),
            )
        )
    )


@pytest.mark.parametrize("skew", [7200, -7200])
@pytest.mark.emulator(variants={})
def test_a_job_just_created_is_found_by_label_whichever_way_the_server_clock_is_off(fake, project, skew):
    """ngcsdk's list window ends at the client's clock: a server 2 h ahead stamps a new job in our future."""
    fake.set_variants(clock_skew_seconds=skew)
    fake.hold_queued(times=None)
    config = load_config(project)
    backend = make_backend("bcp", config, config.pipeline("chain"), project.parent / ".bcp-pipeline/runs/chain-x")
    job_id = submit_first(backend, project, "chain-x")
    assert backend.find_submitted("chain-x", "first", "stage") == [job_id]
    fake.release()


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)
@pytest.mark.emulator(variants={"list_lag_calls": 3, "clock_skew_seconds": 3600})
def test_killed_right_after_the_submit_then_resumed_while_the_job_is_not_listed_yet(fake, project):
    """The service created the job; the orchestrator died before it learnt the id; the list does not show the job
    for the resumed orchestrator's first looks (lag), whose clock is also an hour behind the server's. It looks
    again for backends.bcp.lookup_grace_seconds, finds the job, and submits no second one."""
    project.write_text(
        project.read_text().replace("poll_max_seconds: 0.3", "poll_max_seconds: 0.3, lookup_grace_seconds: 30")
    )
    fake.delay_requests(30, method="POST", path="/v2/org/*/jobs", after=True)
    process = start_orchestrator(project, "run", "chain", "--backend", "bcp", "--only", "first")
    wait_for(lambda: "chain.first" in jobs_by_stage(fake))
    process.kill()
    process.wait()
    assert latest(project).stages["first"].status is StageStatus.SUBMITTING
    resumed = start_orchestrator(project, "resume")
    output, _ = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, output
    assert "first: no stage job listed for it yet; looking again for up to 30 s" in output
    assert "first: re-attached to stage job" in output
    assert len(jobs_by_stage(fake)["chain.first"]) == 1
    assert latest(project).stages["first"].attempts == 1
