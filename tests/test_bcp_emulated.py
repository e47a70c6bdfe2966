"""The BCP backend end to end against the ngc EMULATOR (tests/fakes/ngc: a fake, named so).

The emulator accepts exactly what NVIDIA's parser accepts (it parses `job run` with ngcsdk 4.19.1), runs jobs as
local processes with a local bcprun, and answers job info/list/log/kill/resume and workspace upload with the
real JSON shapes. It can fail, preempt or hold jobs and fail CLI calls, which these tests use.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import ngc_parser
from bcp_pipeline.cli import main
from bcp_pipeline.config import load_config
from bcp_pipeline.state import RunStore, StageStatus
from golden_files import REPO
from pipeline_fixtures import CHAIN_CONFIG, start_orchestrator, wait_for, write_chain_project

sys.path.insert(0, str(REPO / "tests" / "fakes"))
from ngc_control import FakeNgc  # noqa: E402

pytestmark = pytest.mark.skipif(not ngc_parser.available(), reason="ngcsdk[telemetry]==4.19.1 not installed")

BCP_SECTIONS = """\
    defaults:
      bcp: {image: "nvcr.io/nvaie/nemo-framework-training:23.11", instance: dgxa100.80g.8.norm, total_runtime: 1h,
            workspaces: [{name: main, mount: /mount_workspace, mode: RW}]}
    verification:
      bcp: {instance: dgxa100.80g.1.norm, workspaces: [{name: main, mount: /mount_workspace, mode: RO}]}
"""


def bcp_chain_config() -> str:
    text = CHAIN_CONFIG.replace("  local: {workspace_dir: ws, poll_seconds: 0.05}\n",
                                "  local: {workspace_dir: ws, poll_seconds: 0.05}\n"
                                "  bcp: {poll_min_seconds: 0.1, poll_max_seconds: 0.3}\n")
    text = text.replace("    vars: {count: \"6\"}\n", "    vars: {count: \"6\"}\n" + BCP_SECTIONS)
    # The bcp sharding mirrors the local one: 2 replicas x 1 process, then 1 x 3 (under bcprun).
    text = text.replace("local: {replicas: 2, processes: 1}", "local: {replicas: 2, processes: 1}\n"
                        "        bcp: {replicas: 2, processes: 1}")
    return text.replace("local: {replicas: 1, processes: 3}", "local: {replicas: 1, processes: 3}\n"
                        "        bcp: {replicas: 1, processes: 3}")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    ngc = FakeNgc(tmp_path / "ngc-home")
    ngc.create_workspace("main")
    for key, value in ngc.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("NGC_CLI_API_KEY", "emulated-key-not-a-secret")
    yield ngc
    ngc.shutdown()


@pytest.fixture
def project(tmp_path):
    return write_chain_project(tmp_path / "project", bcp_chain_config())


def run(config: Path, *args: str) -> int:
    return main(["--config", str(config), *args])


def latest(config: Path):
    return RunStore(config.parent / ".bcp-pipeline").latest()


def jobs_by_stage(fake: FakeNgc) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for record in fake.jobs().values():
        grouped.setdefault(record["job"]["jobDefinition"]["name"], []).append(record["job"])
    return grouped


def test_chain_runs_on_emulated_bcp_with_verification_jobs(fake, project, capsys):
    assert run(project, "run", "chain", "--backend", "bcp") == 0
    state = latest(project)
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())
    ws = fake.workspace_path("main")
    # bcprun gave 3 ranks on one node for `second`: RANK/WORLD_SIZE reached the program.
    assert (ws / "second/item-0002.txt").read_text() == "item-0002.txt by rank 2 of 3\n"
    assert (ws / "first/item-0001.txt").read_text() == "item-0001.txt by rank 1 of 2\n"
    assert state.stages["third"].verification["checks"][0]["found"] == 3
    # The stage programs were uploaded once, and every job was labelled with the run and stage.
    assert len(fake.calls("workspace upload")) == 1
    names = sorted(jobs_by_stage(fake))
    assert names == ["chain.first", "chain.first-verify", "chain.second", "chain.second-verify", "chain.third",
                     "chain.third-verify"]
    labels = fake.jobs()[int(state.stages["second"].jobs[0].job_id)]["job"]["labels"]["userLabels"]["values"]
    assert "bcpp_stage_second" in labels and any(l.startswith("bcpp_run_chain_") for l in labels)
    # Verification jobs mount the workspace read-only on the small instance.
    verify_job = fake.jobs()[int(state.stages["first"].jobs[1].job_id)]["job"]["jobDefinition"]
    assert verify_job["resources"]["name"] == "dgxa100.80g.1.norm"
    assert verify_job["workspaceMounts"][0]["mountMode"] == "RO"
    capsys.readouterr()
    assert run(project, "status", "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert status["status"] == "succeeded"
    assert status["stages"]["first"]["jobs"][0]["native"] == "FINISHED_SUCCESS"
    # No secret reached a command line, a job definition, a log or the state file.
    for path in [*project.parent.rglob("state.json"), fake.home / "calls.jsonl"]:
        assert "emulated-key-not-a-secret" not in path.read_text()


def test_a_poll_cycle_costs_one_cli_call_whatever_the_number_of_jobs(fake, project):
    from bcp_pipeline.backends import make_backend
    from bcp_pipeline.jobs import JobRequest

    config = load_config(project)
    pipeline = config.pipeline("chain")
    fake.hold_queued(times=None)  # keep every job queued: only status calls happen
    counts = {}
    for jobs in (1, 6):
        backend = make_backend("bcp", config, pipeline, project.parent / f".bcp-pipeline/runs/chain-poll-{jobs}")
        stage = pipeline.stages["first"]
        ids = [backend.submit(backend.render(JobRequest(run_id=f"chain-poll-{jobs}", pipeline=pipeline, stage=stage,
                                                        kind="stage", program=stage.program, args=tuple(stage.args))))
               for _ in range(jobs)]
        fake.clear_calls()
        statuses = backend.poll(ids)
        assert set(statuses) == set(ids) and all(s.native == "QUEUED" for s in statuses.values())
        counts[jobs] = len(fake.calls())
    assert counts == {1: 1, 6: 1}
    fake.release()


def stage_state(project: Path, stage: str) -> dict | None:
    states = sorted((project.parent / ".bcp-pipeline/runs").glob("*/state.json"))
    if not states:
        return None
    try:
        return json.loads(states[-1].read_text())["stages"][stage]
    except (ValueError, KeyError):
        return None






def test_sigkill_after_submit_then_resume_submits_no_duplicate(fake, project):
    fake.hold_queued(name="chain.second", times=1)
    process = start_orchestrator(project, "run", "chain", "--backend", "bcp")
    wait_for(lambda: (stage_state(project, "second") or {}).get("status") == "running")
    process.kill()
    process.wait()
    job_id = int(stage_state(project, "second")["jobs"][0]["job_id"])
    assert fake.status(job_id) == "QUEUED"
    resumed = start_orchestrator(project, "resume")
    time.sleep(1.0)
    assert resumed.poll() is None
    fake.release(job_id)
    output, _ = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, output
    assert {name: len(jobs) for name, jobs in jobs_by_stage(fake).items()} == {
        "chain.first": 1, "chain.first-verify": 1, "chain.second": 1, "chain.second-verify": 1,
        "chain.third": 1, "chain.third-verify": 1}


def test_crash_between_submit_and_record_finds_the_job_by_label(fake, project, monkeypatch):
    from bcp_pipeline.backends.bcp import BcpBackend

    fake.hold_queued(name="chain.first", times=1)
    real_submit = BcpBackend.submit

    def submit_then_die(self, submission):
        real_submit(self, submission)
        raise KeyboardInterrupt

    monkeypatch.setattr(BcpBackend, "submit", submit_then_die)
    assert run(project, "run", "chain", "--backend", "bcp") == 130
    assert latest(project).stages["first"].status is StageStatus.SUBMITTING
    monkeypatch.setattr(BcpBackend, "submit", real_submit)
    fake.release()
    assert run(project, "resume") == 0
    assert len(jobs_by_stage(fake)["chain.first"]) == 1
    assert latest(project).stages["first"].attempts == 1


def test_failed_job_then_rerun_continues_from_that_stage(fake, project, capsys):
    fake.inject("FAILED", name="chain.second", details="Replica 0 exited with code 7")
    assert run(project, "run", "chain", "--backend", "bcp") == 1
    state = latest(project)
    assert state.stages["second"].status is StageStatus.FAILED
    assert "ended FAILED: Replica 0 exited with code 7" in state.stages["second"].error
    assert state.stages["third"].status is StageStatus.PENDING
    capsys.readouterr()
    assert run(project, "run", "chain", "--backend", "bcp") == 0
    assert "continuing run" in capsys.readouterr().out
    counts = {name: len(jobs) for name, jobs in jobs_by_stage(fake).items()}
    assert counts["chain.first"] == 1 and counts["chain.second"] == 2 and counts["chain.third"] == 1


def test_preempted_job_is_resumed(fake, project, capsys):
    fake.inject("PREEMPTED", name="chain.second", after_seconds=0.2)
    assert run(project, "run", "chain", "--backend", "bcp") == 0
    job_id = latest(project).stages["second"].jobs[0].job_id
    assert len(fake.calls("job resume")) == 1
    assert f"second: job {job_id} was preempted; resumed it" in capsys.readouterr().out
    assert len(jobs_by_stage(fake)["chain.second"]) == 1


def test_transient_cli_errors_do_not_fail_stages(fake, project, capsys):
    fake.fail_calls(4, match="*job list*", message="Service Unavailable (503)")
    assert run(project, "run", "chain", "--backend", "bcp") == 0
    assert [c["exit"] for c in fake.calls("job list")][:4] == [1, 1, 1, 1]
    assert "submitting its stage job failed (`ngc` exited 1: Service Unavailable (503)" in capsys.readouterr().out
    # Failing status calls while jobs run: the orchestrator keeps polling and says so.
    fake.hold_queued(name="chain.first", times=1)
    process = start_orchestrator(project, "run", "chain", "--backend", "bcp", "--restart")
    wait_for(lambda: len(jobs_by_stage(fake)["chain.first"]) == 2)  # the new run's job is held queued
    fake.fail_calls(5, match="*job list*", message="Gateway Timeout (504)")
    wait_for(lambda: sum(c["exit"] == 1 for c in fake.calls("job list")) >= 9)
    fake.release()
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    assert "failed 3 times in a row, still retrying: `ngc` exited 1: Gateway Timeout (504)" in output


def test_cancel_kills_the_active_job(fake, project, capsys):
    fake.hold_queued(name="chain.first", times=1)
    process = start_orchestrator(project, "run", "chain", "--backend", "bcp")
    wait_for(lambda: (stage_state(project, "first") or {}).get("status") == "running")
    run_id = latest(project).run_id
    assert run(project, "cancel", run_id) == 0
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1, output
    job_id = int(latest(project).stages["first"].jobs[0].job_id)
    assert fake.status(job_id) == "KILLED_BY_USER"
    assert latest(project).stages["first"].status is StageStatus.CANCELLED


def test_logs_come_from_ngc_job_log(fake, project, capsys):
    assert run(project, "run", "chain", "--backend", "bcp") == 0
    run_id = latest(project).run_id
    capsys.readouterr()
    assert run(project, "logs", run_id, "first", "--verify") == 0
    assert "##bcp-pipeline verify" in capsys.readouterr().out
