"""The BCP backend end to end on both transports (the ngc CLI's code, ngcsdk in-process), each NVIDIA's own client
talking to the NGC API EMULATOR on loopback (tests/fakes/ngc_api.py: a fake, named so).

The emulator answers the REST calls and the gRPC upload NVIDIA's client makes, runs jobs as local processes with a
local bcprun, and can fail, preempt, hold or lose jobs and fail or delay API requests, which these tests use. A
killed orchestrator's held job re-attached by `resume`, one `job list` a poll and the demo's data stages, as on every
backend: tests/e2e/test_backend_conformance.py (`TestBcp`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.bcp_emulation import jobs_by_stage, needs_ngcsdk
from support.cli import cli, latest
from support.pipeline_fixtures import bcp_chain_config, start_orchestrator, wait_for, write_chain_project

from bcp_pipeline.backends.profile import profile_key, save_profile
from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.load import load_config
from bcp_pipeline.engine.state import StageStatus
from bcp_pipeline.errors import BackendCallError

pytestmark = needs_ngcsdk


@pytest.fixture
def project(tmp_path, fake):
    return write_chain_project(tmp_path / "project", bcp_chain_config(fake.transport))


@pytest.mark.both_transports
def test_chain_runs_on_emulated_bcp_with_verification_jobs(fake, project, capsys):
    assert cli(project, "run", "chain", "--backend", "bcp") == 0
    state = latest(project)
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
    ws = fake.workspace_path("main")
    # bcprun gave 3 ranks on one node for `second`: RANK/WORLD_SIZE reached the program.
    assert (ws / "second/item-0002.txt").read_text() == "item-0002.txt by rank 2 of 3\n"
    assert (ws / "first/item-0001.txt").read_text() == "item-0001.txt by rank 1 of 2\n"
    assert state.stages["third"].verification["checks"][0]["found"] == 3
    # The stage programs were uploaded once, through NVIDIA's gRPC upload (no __pycache__), and every job was
    # labelled with the run and stage.
    code = [p for p in (ws / ".bcp-pipeline/code").rglob("*") if p.is_file()]
    assert code and not any("__pycache__" in str(p) for p in code)
    assert len(fake.requests("GRPC", "DataSetService/Put")) == len(code)
    names = sorted(jobs_by_stage(fake))
    assert names == [
        "chain.first",
        "chain.first-verify",
        "chain.second",
        "chain.second-verify",
        "chain.third",
        "chain.third-verify",
    ]
    labels = fake.jobs()[int(state.stages["second"].jobs[0].job_id)]["job"]["labels"]["userLabels"]["values"]
    assert "bcpp_stage_second" in labels and any(label.startswith("bcpp_run_chain_") for label in labels)
    # Verification jobs mount the workspace read-only on the small instance.
    verify_job = fake.jobs()[int(state.stages["first"].jobs[1].job_id)]["job"]["jobDefinition"]
    assert verify_job["resources"]["name"] == "dgxa100.80g.1.norm"
    assert verify_job["workspaceMounts"][0]["mountMode"] == "RO"
    capsys.readouterr()
    assert cli(project, "status", "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert status["status"] == "succeeded"
    assert status["stages"]["first"]["jobs"][0]["native"] == "FINISHED_SUCCESS"
    # The API key reached no command line, job definition, log, state file or workspace file.
    leaks = [
        p
        for p in [*project.parent.rglob("*"), *fake.home.rglob("*")]
        if p.is_file() and fake.api_key.encode() in p.read_bytes()
    ]
    assert leaks == []


def stage_state(project: Path, stage: str) -> dict | None:
    states = sorted((project.parent / ".bcp-pipeline/runs").glob("*/state.json"))
    if not states:
        return None
    try:
        return json.loads(states[-1].read_text())["stages"][stage]
    except (ValueError, KeyError):
        return None


@pytest.mark.both_transports
def test_killed_while_the_submit_answer_is_on_its_way_then_resume_finds_the_job_by_label(fake, project):
    """The service created the job, but the orchestrator died before the answer (and so the job id) reached it."""
    fake.hold_queued(name="chain.first", times=1)
    fake.delay_requests(30, method="POST", path="/v2/org/*/jobs", after=True)
    process = start_orchestrator(project, "run", "chain", "--backend", "bcp")
    wait_for(lambda: "chain.first" in jobs_by_stage(fake))
    process.kill()
    process.wait()
    assert latest(project).stages["first"].status is StageStatus.SUBMITTING
    resumed = start_orchestrator(project, "resume")
    wait_for(lambda: (stage_state(project, "first") or {}).get("status") == "running")  # re-attached, still held
    fake.release()
    output, _ = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, output
    assert "first: re-attached to stage job" in output
    assert len(jobs_by_stage(fake)["chain.first"]) == 1
    assert latest(project).stages["first"].attempts == 1


def test_failed_job_then_rerun_continues_from_that_stage(fake, project, capsys):
    fake.inject("FAILED", name="chain.second", details="Replica 0 exited with code 7")
    assert cli(project, "run", "chain", "--backend", "bcp") == 1
    state = latest(project)
    assert state.stages["second"].status is StageStatus.FAILED
    assert "ended FAILED: Replica 0 exited with code 7" in state.stages["second"].error
    assert state.stages["third"].status is StageStatus.PENDING
    capsys.readouterr()
    assert cli(project, "run", "chain", "--backend", "bcp") == 0
    assert "continuing run" in capsys.readouterr().out
    counts = {name: len(jobs) for name, jobs in jobs_by_stage(fake).items()}
    assert counts["chain.first"] == 1 and counts["chain.second"] == 2 and counts["chain.third"] == 1


def test_a_failing_replica_fails_the_stage_with_its_log_and_a_rerun_continues(fake, project):
    first = fake.workspace_path("main") / "first"
    first.mkdir(parents=True)
    (first / "FAIL-item-0001.txt").touch()  # item 1 belongs to rank 1 of 2: the second replica
    assert cli(project, "run", "chain", "--backend", "bcp") == 1
    error = latest(project).stages["first"].error
    assert "ended FAILED: Replica 1 exited with code 1" in error
    assert "last lines of replica 1's log:" in error and "item-0001.txt: told to fail by a FAIL- marker" in error
    (first / "FAIL-item-0001.txt").unlink()
    assert cli(project, "run", "chain", "--backend", "bcp") == 0
    assert latest(project).stages["first"].attempts == 2


def test_a_lost_job_fails_its_stage_and_a_rerun_submits_it_again(fake, project):
    fake.inject("TASK_LOST", name="chain.first", after_seconds=0, details="node went away")
    assert cli(project, "run", "chain", "--backend", "bcp") == 1
    assert "ended TASK_LOST: node went away" in latest(project).stages["first"].error
    assert cli(project, "run", "chain", "--backend", "bcp") == 0
    assert [j["jobStatus"]["status"] for j in jobs_by_stage(fake)["chain.first"]] == ["TASK_LOST", "FINISHED_SUCCESS"]


def test_preempted_job_is_resumed(fake, project, capsys):
    fake.inject("PREEMPTED", name="chain.second", after_seconds=0.2)
    assert cli(project, "run", "chain", "--backend", "bcp") == 0
    job_id = latest(project).stages["second"].jobs[0].job_id
    assert len(fake.requests("PATCH", f"/v2/org/*/jobs/{job_id}/resume")) == 1
    assert f"second: job {job_id} was preempted; resumed it" in capsys.readouterr().out
    assert len(jobs_by_stage(fake)["chain.second"]) == 1


def test_a_failing_resume_of_a_preempted_job_is_tried_again_next_cycle(fake, project, capsys):
    fake.inject("PREEMPTED", name="chain.second", after_seconds=0.2)
    fake.fail_requests(3, method="PATCH", path="/v2/org/*/jobs/*/resume", status=500, message="Resume Refused")
    assert cli(project, "run", "chain", "--backend", "bcp") == 0
    job_id = latest(project).stages["second"].jobs[0].job_id
    assert [r["status"] for r in fake.requests("PATCH", f"/v2/org/*/jobs/{job_id}/resume")] == [500, 500, 500, 200]
    out = capsys.readouterr().out
    assert f"second: resuming preempted job {job_id} failed 3 times in a row, still retrying: " in out
    assert "Resume Refused" in out and f"second: job {job_id} was preempted; resumed it" in out
    assert len(jobs_by_stage(fake)["chain.second"]) == 1


@pytest.mark.parametrize("fake", ["sdk"], indirect=True)  # the poller's path; both transports: tests/check
@pytest.mark.emulator(variants={"runonce_preemption": "not_resumable"})
def test_a_preempted_runonce_job_is_submitted_again_where_check_found_bcp_will_not_resume_it(fake, project, capsys):
    """The profile `check` saves on such a service (tests/backends/bcp/test_check_preemption.py makes one the real way):
    the backend asks no `job resume`, the poller kills the preempted job and the submitter submits the stage again."""
    save_profile(
        project.parent / ".bcp-pipeline",
        profile_key("bcpp-test-org", "bcpp-test-ace"),
        {
            "key": "bcpp-test-org-bcpp-test-ace",
            "checked_at": 0.0,
            "rows": [],
            "facts": {"probe": {"runonce_preemption": "not_resumable"}},
        },
    )
    fake.inject("PREEMPTED", name="chain.second", after_seconds=0.2)
    fake.inject("PREEMPTED", name="chain.third-verify", after_seconds=0.2)  # a verification job: the same
    assert cli(project, "run", "chain", "--backend", "bcp") == 0
    third = latest(project).stages["third"]
    assert [j.kind for j in third.jobs] == ["stage", "verify", "verify"] and third.attempts == 1
    assert [fake.status(int(j.job_id)) for j in third.jobs[1:]] == ["KILLED_BY_USER", "FINISHED_SUCCESS"]
    assert third.verification["ok"]
    second = latest(project).stages["second"]
    preempted, again = second.jobs[0].job_id, second.jobs[1].job_id
    assert [j.kind for j in second.jobs] == ["stage", "stage", "verify"] and second.attempts == 2
    assert fake.requests("PATCH", "/v2/org/*/jobs/*/resume") == []
    assert [fake.status(int(j)) for j in (preempted, again)] == ["KILLED_BY_USER", "FINISHED_SUCCESS"]
    out = capsys.readouterr().out
    assert (
        f"second: job {preempted} was preempted and cannot be resumed here; killed it, submitting the stage job "
        "again" in out
    )
    assert (
        f"third: job {third.jobs[1].job_id} was preempted and cannot be resumed here; killed it, submitting the "
        "verification job again" in out
    )


@pytest.mark.both_transports
def test_transient_api_errors_do_not_fail_stages(fake, project, capsys):
    # 500s: NVIDIA's client waits 5 s after a 502/503/504 before it gives up
    # (tests/fakes/test_ngc_emulator.py has those).
    fake.fail_requests(4, method="GET", path="/v2/org/*/jobs", status=500, message="Internal Server Error")
    assert cli(project, "run", "chain", "--backend", "bcp") == 0
    assert [r["status"] for r in fake.requests("GET", "/v2/org/*/jobs")][:4] == [500, 500, 500, 500]
    out = capsys.readouterr().out
    assert "submitting its stage job failed (" in out and "Server Error: 500 Response: Internal Server Error" in out
    # Failing status calls while jobs run: the orchestrator keeps polling and says so.
    fake.hold_queued(name="chain.first", times=1)
    process = start_orchestrator(project, "run", "chain", "--backend", "bcp", "--restart")
    wait_for(lambda: len(jobs_by_stage(fake)["chain.first"]) == 2)  # the new run's job is held queued
    fake.fail_requests(5, method="GET", path="/v2/org/*/jobs", status=500, message="Bad Day")
    wait_for(lambda: sum(r["status"] == 500 for r in fake.requests("GET", "/v2/org/*/jobs")) >= 9)
    fake.release()
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    assert "failed 3 times in a row, still retrying:" in output
    assert "Server Error: 500 Response: Bad Day" in output


@pytest.mark.both_transports
def test_cancel_kills_the_active_job(fake, project, capsys):
    fake.hold_queued(name="chain.first", times=1)
    process = start_orchestrator(project, "run", "chain", "--backend", "bcp")
    wait_for(lambda: (stage_state(project, "first") or {}).get("status") == "running")
    run_id = latest(project).run_id
    assert cli(project, "cancel", run_id) == 0
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1, output
    job_id = int(latest(project).stages["first"].jobs[0].job_id)
    assert fake.status(job_id) == "KILLED_BY_USER"
    assert latest(project).stages["first"].status is StageStatus.CANCELLED
    # A kill BCP refuses (the job has ended) is an error on both transports, not silence (`ngc job kill` exits 0
    # with its error on stderr); cancel, reading the job again, finds it ended and that is no failure of it.
    config = load_config(project)
    backend = make_backend("bcp", config, config.pipeline("chain"), project.parent / ".bcp-pipeline/runs" / run_id)
    with pytest.raises(BackendCallError, match=f"job {job_id} is KILLED_BY_USER"):
        backend.transport.kill(str(job_id))
    backend.cancel([str(job_id)])
    assert fake.status(job_id) == "KILLED_BY_USER"


@pytest.mark.both_transports
def test_logs_come_from_ngc_job_log(fake, project, capsys):
    assert cli(project, "run", "chain", "--backend", "bcp") == 0
    run_id = latest(project).run_id
    capsys.readouterr()
    assert cli(project, "logs", run_id, "first", "--verify") == 0
    assert "##bcp-pipeline verify" in capsys.readouterr().out


# -- other plausible variants of the service (tests/fakes/README.md "Variants") ------------------------------------

NVAPI_KEY = "nvapi-emulated-personal-key-not-a-secret"


def with_org_team_ace_in_yaml(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """org/team/ACE only in pipelines.yaml, as the README says is enough: none in the environment."""
    for name in ("NGC_CLI_ORG", "NGC_CLI_ACE", "NGC_CLI_TEAM"):
        monkeypatch.delenv(name, raising=False)
    config.write_text(
        config.read_text().replace(
            "  bcp: {transport:", "  bcp: {org: bcpp-test-org, team: bcpp-test-team, ace: bcpp-test-ace, transport:"
        )
    )


@pytest.mark.both_transports
@pytest.mark.emulator(api_key=NVAPI_KEY)
def test_org_team_and_ace_only_in_pipelines_yaml_with_an_nvapi_key(fake, project, monkeypatch, capsys):
    with_org_team_ace_in_yaml(project, monkeypatch)
    fake.inject("FAILED", name="chain.third", details="Replica 0 exited with code 9")  # after its log is written
    assert cli(project, "run", "chain", "--backend", "bcp") == 1
    state = latest(project)
    assert [state.stages[s].status for s in ("first", "second")] == [StageStatus.SUCCEEDED] * 2
    # every job log read (verification counts, the failure's tail) went to the configured org
    assert state.stages["second"].verification["checks"][0]["found"] == 6
    assert "(job log unavailable" not in (state.stages["third"].error or "")
    capsys.readouterr()
    assert cli(project, "logs", state.run_id, "first", "--verify") == 0
    assert "##bcp-pipeline verify" in capsys.readouterr().out
    if fake.transport == "cli":
        logs = fake.calls("job log")
        assert logs and all("--org" in c["argv"] and "--ace" in c["argv"] for c in logs), logs[:1]
    assert fake.requests("POST", "/v3/keys/get-caller-info") and not fake.requests("GET", "/token")


@pytest.mark.both_transports
@pytest.mark.emulator(api_key=NVAPI_KEY, variants={"key_org": "the-keys-own-org"})
def test_an_nvapi_key_of_another_org_is_refused_naming_its_org(fake, project, monkeypatch, capsys):
    with_org_team_ace_in_yaml(project, monkeypatch)
    assert cli(project, "run", "chain", "--backend", "bcp") != 0
    err = capsys.readouterr().err
    nvidia = "doesn't match organization" if fake.transport == "sdk" else "403"
    assert nvidia in err, err
    assert "belongs to org 'the-keys-own-org'" in err and "set in backends.bcp.org" in err
    assert "backends.bcp.org: the-keys-own-org" in err
    assert fake.jobs() == {} and not (project.parent / ".bcp-pipeline" / "runs").exists()


@pytest.mark.emulator(variants={"commandline": "launcher", "bcprun_in_single_replica_jobs": False})
def test_chain_when_the_commandline_runs_once_and_one_replica_jobs_have_no_bcprun(fake, project):
    assert cli(project, "run", "chain", "--backend", "bcp") == 0
    ws = fake.workspace_path("main")
    assert (ws / "second/item-0002.txt").read_text() == "item-0002.txt by rank 2 of 3\n"
    assert (ws / "first/item-0001.txt").read_text() == "item-0001.txt by rank 1 of 2\n"
    assert latest(project).stages["third"].verification["checks"][0]["found"] == 3


@pytest.mark.emulator(variants={"ace": {"terminationGracePeriodSeconds": 2}})
def test_cancel_kills_only_this_runs_jobs_and_waits_out_the_termination_grace(fake, project):
    config = load_config(project)
    backend = make_backend("bcp", config, config.pipeline("chain"), project.parent / ".bcp-pipeline/runs/chain-x")
    ours, foreign = (
        json.loads(
            fake.ngc(
                "base-command",
                "job",
                "run",
                "--name",
                name,
                "--image",
                "nvcr.io/nvaie/nemo-framework-training:23.11",
                "--instance",
                "dgxa100.80g.1.norm",
                "--result",
                "/results",
                "--commandline",
                "exec sleep 60",
                "--label",
                label,
                "--format_type",
                "json",
            ).stdout
        )["job"]["id"]
        for name, label in (("ours", "bcpp_run_chain_x"), ("foreign", "someone_elses"))
    )
    for job_id in (ours, foreign):
        fake.wait_for(job_id, {"RUNNING"})
    started = time.monotonic()
    with pytest.raises(
        BackendCallError, match=f"job {foreign}: not killed: it does not carry this run's label bcpp_run_chain_x"
    ):
        backend.cancel([str(ours), str(foreign)])
    # The kill went through PENDING_TERMINATION for the ACE's 2 s, and cancel returned only once it had ended.
    assert fake.status(ours) == "KILLED_BY_USER" and time.monotonic() - started > 1.5
    assert "PENDING_TERMINATION" in [h["status"] for h in fake.jobs()[ours]["jobStatusHistory"]]
    assert fake.status(foreign) == "RUNNING"
