"""The orchestrator on the local backend, end to end: DAG order, verification gates, failure and resume.

Stages run as real local processes (tests/support/pipeline_fixtures.py `items.py`); the orchestrator runs as a real
subprocess where a test kills it. An orchestrator SIGKILLed mid-stage and resumed, as on every backend:
tests/e2e/test_backend_conformance.py (`TestLocal`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from support.cli import cli
from support.pipeline_fixtures import CHAIN_CONFIG, stall_stage, start_orchestrator, wait_for, write_chain_project

from bcp_pipeline.cli.main import main
from bcp_pipeline.engine.state import RunStore, StageStatus


def state_of(config: Path):
    return RunStore(config.parent / ".bcp-pipeline").latest()


def workspace_files(config: Path) -> dict[str, str]:
    root = config.parent / "ws" / "main"
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("item-*.txt"))}


def stage_status(config: Path, stage: str) -> str | None:
    path_root = config.parent / ".bcp-pipeline" / "runs"
    states = sorted(path_root.glob("*/state.json")) if path_root.is_dir() else []
    if not states:
        return None
    try:
        return json.loads(states[-1].read_text())["stages"][stage]["status"]
    except (ValueError, KeyError):
        return None


def test_chain_runs_in_order_and_verifies(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    assert cli(config, "run", "chain") == 0
    state = state_of(config)
    assert [s.status for s in state.stages.values()] == [StageStatus.SUCCEEDED] * 3
    assert state.stages["first"].sharding == {"replicas": 2, "processes": 1}
    assert state.stages["second"].sharding == {"replicas": 1, "processes": 3}
    assert state.stages["third"].verification["checks"][0] == {
        "glob": str(tmp_path / "ws/main/third/item-*.txt"),
        "expected": 3,
        "found": 3,
        "bytes": state.stages["third"].verification["checks"][0]["bytes"],
    }
    files = workspace_files(config)
    assert len(files) == 15
    # Ranks got RANK/WORLD_SIZE the way bcprun sets them: 2 replicas x 1 process shard the first stage by 2.
    assert files["first/item-0000.txt"] == "item-0000.txt by rank 0 of 2\n"
    assert files["first/item-0001.txt"] == "item-0001.txt by rank 1 of 2\n"
    assert files["second/item-0002.txt"] == "item-0002.txt by rank 2 of 3\n"
    out = capsys.readouterr().out
    assert "first: succeeded (verified: 6/6 item-*.txt)" in out
    # A second `run` of a succeeded pipeline starts a new run (whose stages skip their finished outputs).
    assert cli(config, "run", "chain") == 0
    assert len(RunStore(config.parent / ".bcp-pipeline").runs()) == 2


def test_rank_environment_matches_bcprun(tmp_path):
    text = CHAIN_CONFIG.replace(
        'items.py\n        args: [--out, "${workspace}/first"', 'env.py\n        args: [--out, "${workspace}/first"'
    )
    config = write_chain_project(tmp_path, text)
    (config.parent / "stages" / "env.py").write_text(
        "import json, os, sys\nfrom pathlib import Path\n"
        "out = Path(sys.argv[sys.argv.index('--out') + 1]); out.mkdir(parents=True, exist_ok=True)\n"
        "keys = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'NGC_ARRAY_INDEX', 'NGC_ARRAY_SIZE']\n"
        "rank = int(os.environ['RANK'])\n"
        '(out / f"item-{rank:04d}.txt").write_text(json.dumps({k: os.environ[k] for k in keys}))\n'
    )
    main(
        [
            "--config",
            str(config),
            "run",
            "chain",
            "--only",
            "first",
            "--set",
            "first.local.processes=3",
            "--set",
            "vars.count=6",
        ]
    )
    seen = [json.loads(p.read_text()) for p in sorted((config.parent / "ws/main/first").glob("item-*.txt"))]
    assert seen == [
        {
            "RANK": str(r),
            "WORLD_SIZE": "6",
            "LOCAL_RANK": str(r % 3),
            "NGC_ARRAY_INDEX": str(r // 3),
            "NGC_ARRAY_SIZE": "2",
        }
        for r in range(6)
    ]


def test_failed_replica_fails_stage_and_run_continues_from_it(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    second = config.parent / "ws/main/second"
    second.mkdir(parents=True)
    (second / "FAIL-item-0004.txt").touch()  # item 4 belongs to rank 1 of 3
    assert cli(config, "run", "chain") == 1
    state = state_of(config)
    assert state.stages["first"].status is StageStatus.SUCCEEDED
    assert state.stages["second"].status is StageStatus.FAILED
    assert state.stages["third"].status is StageStatus.PENDING  # the DAG stopped
    assert "rank 1 exited 1" in state.stages["second"].error
    assert "item-0004.txt: told to fail by a FAIL- marker" in state.stages["second"].error  # the log tail
    capsys.readouterr()
    assert cli(config, "status") == 0
    status_out = capsys.readouterr().out
    assert "second: job second.1 ended failed: rank 1 exited 1" in status_out
    assert "item-0004.txt: told to fail by a FAIL- marker" in status_out
    first_jobs = list(state.stages["first"].jobs)
    (second / "FAIL-item-0004.txt").unlink()
    assert cli(config, "run", "chain") == 0
    state = state_of(config)
    assert len(RunStore(config.parent / ".bcp-pipeline").runs()) == 1  # the same run continued
    assert [j.job_id for j in state.stages["first"].jobs] == [j.job_id for j in first_jobs]  # not redone
    assert [j.job_id for j in state.stages["second"].jobs if j.kind == "stage"] == ["second.1", "second.2"]
    assert state.stages["second"].attempts == 2
    assert all(s.status is StageStatus.SUCCEEDED for s in state.stages.values())


def test_verification_shortfall_fails_with_expected_vs_found_and_stops(tmp_path, capsys):
    config = write_chain_project(
        tmp_path, CHAIN_CONFIG.replace('--count, "${count}", --name, second', '--count, "5", --name, second')
    )
    assert cli(config, "run", "chain") == 1
    state = state_of(config)
    second = state.stages["second"]
    assert second.status is StageStatus.FAILED
    assert second.error == (f"verification failed: {tmp_path}/ws/main/second/item-*.txt: expected 6, found 5")
    assert state.stages["third"].status is StageStatus.PENDING and not state.stages["third"].jobs
    assert "expected 6, found 5" in capsys.readouterr().out


def test_crash_between_submit_and_record_adopts_the_live_job(tmp_path, monkeypatch):
    from bcp_pipeline.backends.local.backend import LocalBackend

    config = write_chain_project(tmp_path)
    stall = stall_stage(config.parent / "ws/main", "first")
    real_submit = LocalBackend.submit

    def submit_then_die(self, submission):
        real_submit(self, submission)
        raise KeyboardInterrupt  # the orchestrator dies before it records the job id

    monkeypatch.setattr(LocalBackend, "submit", submit_then_die)
    assert cli(config, "run", "chain") == 130
    assert state_of(config).stages["first"].status is StageStatus.SUBMITTING
    monkeypatch.setattr(LocalBackend, "submit", real_submit)
    stall.unlink()
    assert cli(config, "resume") == 0
    state = state_of(config)
    assert [j.job_id for j in state.stages["first"].jobs] == ["first.1", "first.verify.1"]  # adopted, not resubmitted
    assert state.stages["first"].attempts == 1


def test_crash_between_submit_and_record_adopts_the_job_even_after_it_ended(tmp_path, monkeypatch):
    from bcp_pipeline.backends.local.backend import LocalBackend

    config = write_chain_project(tmp_path)
    real_submit = LocalBackend.submit
    submitted = []

    def submit_then_die(self, submission):
        submitted.append(real_submit(self, submission))
        raise KeyboardInterrupt  # the orchestrator dies before it records the job id

    monkeypatch.setattr(LocalBackend, "submit", submit_then_die)
    assert cli(config, "run", "chain") == 130
    run_dir = next((config.parent / ".bcp-pipeline/runs").iterdir())
    wait_for(
        lambda: (
            json.loads((run_dir / "jobs/first.1/status.json").read_text()).get("state") == "succeeded"
            if (run_dir / "jobs/first.1/status.json").is_file()
            else False
        ),
        what="the orphan job to end",
    )
    monkeypatch.setattr(LocalBackend, "submit", real_submit)
    assert cli(config, "resume") == 0
    state = state_of(config)
    assert [job.job_id for job in state.stages["first"].jobs if job.kind == "stage"] == submitted == ["first.1"]
    assert state.stages["first"].attempts == 1 and state.status == "succeeded"
    assert not (run_dir / "jobs/first.2").exists()  # adopted, not run twice


def test_a_restart_waits_the_lookup_grace_only_for_a_job_that_a_submit_call_may_have_created(
    tmp_path, monkeypatch, capsys
):
    """A stage awaiting its verification job when the orchestrator stopped (a driver handing over between two
    cycles) gets it at once; only a verification whose submit call was under way is looked for over the grace."""
    from bcp_pipeline.backends.local.backend import LocalBackend
    from bcp_pipeline.engine.submitter import Submitter

    config = write_chain_project(tmp_path)
    monkeypatch.setattr(LocalBackend, "lookup_grace_seconds", 30.0)
    real_submit = Submitter.submit

    def stop_before_verifying(self, name, kind):
        if kind == "verify":
            raise KeyboardInterrupt  # stopped before any submit call for the verification
        return real_submit(self, name, kind)

    monkeypatch.setattr(Submitter, "submit", stop_before_verifying)
    assert cli(config, "run", "chain") == 130
    assert state_of(config).stages["first"].status is StageStatus.VERIFYING
    monkeypatch.setattr(Submitter, "submit", real_submit)
    started = time.monotonic()
    capsys.readouterr()
    assert cli(config, "resume") == 0
    assert "looking again" not in capsys.readouterr().out and time.monotonic() - started < 25
    # The same stop, but inside the submit call: the job may exist, so the resumed orchestrator looks for it first.
    monkeypatch.setattr(LocalBackend, "lookup_grace_seconds", 1.0)
    real_backend_submit = LocalBackend.submit

    def die_in_the_call(self, submission):
        if submission.request.kind == "verify":
            raise KeyboardInterrupt
        return real_backend_submit(self, submission)

    monkeypatch.setattr(LocalBackend, "submit", die_in_the_call)
    assert cli(config, "run", "chain", "--restart") == 130
    assert state_of(config).stages["first"].submit_call == "verify"
    monkeypatch.setattr(LocalBackend, "submit", real_backend_submit)
    capsys.readouterr()
    assert cli(config, "resume") == 0
    assert "first: no verify job listed for it yet; looking again for up to 1 s" in capsys.readouterr().out
    assert state_of(config).stages["first"].submit_call is None


def test_resharding_is_refused_unless_the_stage_allows_it(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    second = config.parent / "ws/main/second"
    second.mkdir(parents=True)
    (second / "FAIL-item-0004.txt").touch()
    assert cli(config, "run", "chain") == 1
    (second / "FAIL-item-0004.txt").unlink()
    capsys.readouterr()
    assert cli(config, "run", "chain", "--set", "second.local.processes=2") == 1
    err = capsys.readouterr().err
    assert "stage 'second' started with 1 replica(s) x 3 process(es)" in err
    assert "now configured for 1 replica(s) x 2 process(es)" in err and "reshardable: true" in err
    assert cli(config, "run", "chain", "--set", "second.local.processes=2", "--set", "second.reshardable=true") == 0
    assert state_of(config).stages["second"].sharding == {"replicas": 1, "processes": 2}


def test_from_and_only_select_stages(tmp_path):
    config = write_chain_project(tmp_path)
    assert cli(config, "run", "chain", "--only", "first") == 0
    state = state_of(config)
    assert state.stages["first"].status is StageStatus.SUCCEEDED
    assert state.stages["second"].status is StageStatus.SKIPPED
    assert cli(config, "run", "chain", "--restart", "--from", "second") == 0
    state = state_of(config)
    assert state.stages["first"].status is StageStatus.SKIPPED and not state.stages["first"].jobs
    assert state.stages["second"].status is StageStatus.SUCCEEDED
    assert state.stages["third"].status is StageStatus.SUCCEEDED


def test_cancel_stops_running_jobs(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    stall_stage(config.parent / "ws/main", "first")  # never released: the stage is cancelled while it waits
    orchestrator = start_orchestrator(config, "run", "chain")
    wait_for(lambda: stage_status(config, "first") == "running", what="stage first to run")
    run_id = state_of(config).run_id
    assert cli(config, "cancel", run_id) == 0
    output, _ = orchestrator.communicate(timeout=30)
    assert orchestrator.returncode == 1, output
    state = state_of(config)
    assert state.stages["first"].status is StageStatus.CANCELLED, output
    assert state.status == "cancelled"


def test_logs_command_shows_a_rank(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    assert cli(config, "run", "chain") == 0
    run_id = state_of(config).run_id
    capsys.readouterr()
    assert cli(config, "logs", run_id, "first", "--rank", "1") == 0
    assert '"rank": 1' in capsys.readouterr().out
    assert cli(config, "logs", run_id, "first", "--verify") == 0
    assert "##bcp-pipeline verify" in capsys.readouterr().out
    assert cli(config, "logs", run_id, "nope") == 1
    assert "no stage 'nope'" in capsys.readouterr().err


def test_verify_command_rechecks_a_stage(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    assert cli(config, "run", "chain") == 0
    run_id = state_of(config).run_id
    (config.parent / "ws/main/second/item-0003.txt").unlink()
    assert cli(config, "verify", run_id, "second") == 1
    assert state_of(config).stages["second"].error.endswith("expected 6, found 5")
    assert cli(config, "run", "chain") == 0  # continues from the stage the re-verification failed
    assert state_of(config).stages["second"].verification["ok"] is True


def test_corrupt_state_file_is_an_error_not_a_guess(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    assert cli(config, "run", "chain", "--only", "first") == 0
    state_path = next((config.parent / ".bcp-pipeline/runs").glob("*/state.json"))
    state_path.write_text("{ not json")
    capsys.readouterr()
    assert cli(config, "status") == 1  # the only run is corrupt: there is no run to show
    err = capsys.readouterr().err
    assert "is corrupt: its state file could not be read" in err and "--restart" in err
    assert next(state_path.parent.glob("state.corrupt-*.json")).read_text() == "{ not json"


def test_status_lists_stages_in_pipeline_order(tmp_path, capsys):
    config = write_chain_project(
        tmp_path,
        CHAIN_CONFIG.replace("      first:", "      zfirst:")
        .replace("needs: [first]", "needs: [zfirst]")
        .replace("expect_from: first", "expect_from: zfirst"),
    )
    assert cli(config, "run", "chain") == 0
    capsys.readouterr()
    assert cli(config, "status") == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[3:6]]
    assert rows == ["zfirst", "second", "third"]


def test_resume_of_a_run_started_with_only_keeps_the_other_stages_skipped(tmp_path):
    # Found by tests/chaos: `resume` after a failure reset the stages left out with --only and ran them.
    config = write_chain_project(tmp_path)
    first = config.parent / "ws/main/first"
    first.mkdir(parents=True)
    (first / "FAIL-item-0001.txt").touch()
    assert cli(config, "run", "chain", "--only", "first") == 1
    (first / "FAIL-item-0001.txt").unlink()
    assert cli(config, "resume") == 0
    state = state_of(config)
    assert state.stages["first"].status is StageStatus.SUCCEEDED and state.stages["first"].attempts == 2
    for name in ("second", "third"):
        assert state.stages[name].status is StageStatus.SKIPPED and not state.stages[name].jobs
    assert not (config.parent / "ws/main/second").exists()
    # `run` continuing the same run keeps to it too; naming stages again selects them.
    assert cli(config, "run", "chain", "--only", "second") == 0
    assert state_of(config).stages["third"].status is StageStatus.SKIPPED


def test_a_cancelled_local_job_whose_ranks_were_not_reaped_yet_reads_as_cancelled(tmp_path):
    """The supervisor of a cancelled job records its ranks' exit codes at once: a rank not reaped yet is None
    there. Polling that status once crashed the orchestrator (found by test_cancel_stops_running_jobs under load)."""
    from bcp_pipeline.backends.registry import make_backend
    from bcp_pipeline.config.preflight import load_and_check

    config = load_and_check(write_chain_project(tmp_path))
    backend = make_backend("local", config, config.pipeline("chain"), tmp_path / "run")
    job = tmp_path / "run" / "jobs" / "first.1"
    job.mkdir(parents=True)
    (job / "spec.json").write_text("{}")
    (job / "status.json").write_text(json.dumps({"state": "cancelled", "pid": os.getpid(), "exit_codes": [None, -15]}))
    status = backend.poll(["first.1"])["first.1"]
    assert status.state.value == "cancelled" and status.exit_code == -15 and status.detail == "rank 1 exited -15"
