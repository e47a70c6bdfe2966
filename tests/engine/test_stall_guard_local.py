"""The stall guard on the local backend: a training that stops printing steps (but keeps running) is cancelled,
its reason and last lines kept for `status`, and submitted again; once its restarts are spent the stage fails.

The stage program is a stand-in trainer that stops printing steps and sleeps (support/pipeline_fixtures.py
STALLING_TRAINER).
"""

from __future__ import annotations

import json
import signal
import time

from support.pipeline_fixtures import STALLING_TRAINER, start_orchestrator, wait_for, write_chain_project

from bcp_pipeline.cli.main import main
from bcp_pipeline.engine.state import STALL_RESTARTS, RunStore, StageStatus

CONFIG = """\
version: 1
stages_dir: stages
backends:
  local: {workspace_dir: ws, poll_seconds: 0.05}
pipelines:
  train:
    workspace: {name: main}
    stages:
      pretrain:
        program: trainer.py
        args: ["${workspace}/ckpt", "8", "STALL_AT"]
        continuation: {checkpoints: "${workspace}/ckpt", target_steps: 8}
        stall_guard: {at_least: 1s, first_step: 2s, max_restarts: RESTARTS}
"""


def project(tmp_path, *, stall_at: int, stalls: int, restarts: int = 2):
    config = write_chain_project(tmp_path, CONFIG.replace("STALL_AT", str(stall_at)).replace("RESTARTS", str(restarts)))
    (config.parent / "stages/trainer.py").write_text(STALLING_TRAINER)
    (tmp_path / "ws/main").mkdir(parents=True)
    (tmp_path / "ws/main/stalls").write_text(str(stalls))
    return config


def latest(config):
    return RunStore(config.parent / ".bcp-pipeline").latest()


def test_a_stalled_training_is_cancelled_and_submitted_again(tmp_path, capsys):
    config = project(tmp_path, stall_at=3, stalls=1)
    assert main(["--config", str(config), "run", "train"]) == 0
    stage = latest(config).stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED
    assert stage.verification["steps"] == 8
    jobs = [job for job in stage.jobs if job.kind == "stage"]
    assert [job.state for job in jobs] == ["stalled", "succeeded"]
    first = jobs[0]
    assert first.steps_seen == 3 and first.slowest_step is not None
    assert first.stall["reason"].startswith("no new step for ") and "after step 3" in first.stall["reason"]
    # The limit: 3x the longest wait between two step lines the polls saw, at least stall_guard.at_least.
    assert (
        "(limit: stall_guard.at_least 1s" in first.stall["reason"]
        or "(limit: 3x its slowest step so far (" in first.stall["reason"]
    )
    assert any("waiting in all_reduce after step 3" in line for line in first.stall["last_lines"])
    assert stage.extra[STALL_RESTARTS] == 1
    out = capsys.readouterr().out
    assert "pretrain: job pretrain.1 stalled (no new step for" in out
    assert "submitting it again (stall restart 1 of 2)" in out

    assert main(["--config", str(config), "status"]) == 0
    shown = capsys.readouterr().out
    assert "pretrain: job pretrain.1 stalled: no new step for" in shown
    assert "waiting in all_reduce after step 3" in shown
    assert "step 3/8 loss" in shown  # the last step line before it hung
    # What is kept of the log is redacted: a secret printed by the training never reaches the state file.
    assert "hf_secretvalue123" not in shown
    assert "GPU utilization" not in shown  # the local backend measures none: its hook says nothing
    state_file = config.parent / ".bcp-pipeline/runs" / latest(config).run_id / "state.json"
    assert "hf_secretvalue123" not in state_file.read_text()


def test_a_training_that_never_prints_a_step_gets_the_first_step_allowance_then_fails_once_restarts_are_spent(
    tmp_path, capsys
):
    config = project(tmp_path, stall_at=0, stalls=5, restarts=1)
    assert main(["--config", str(config), "run", "train"]) == 1
    state = latest(config)
    stage = state.stages["pretrain"]
    assert stage.status is StageStatus.FAILED
    jobs = [job for job in stage.jobs if job.kind == "stage"]
    assert [job.state for job in jobs] == ["stalled", "stalled"]
    for job in jobs:
        assert job.steps_seen is None
        assert job.stall["reason"].startswith("no step line in ")
        assert "(limit: stall_guard.first_step 2s)" in job.stall["reason"]
        assert job.ended_at - job.started_at >= 2
    assert stage.error.startswith("job pretrain.2 stalled: no step line in ")
    assert "after 1 restart(s) of stalled jobs (stall_guard.max_restarts: 1)" in stage.error
    capsys.readouterr()
    assert main(["--config", str(config), "status"]) == 0
    shown = capsys.readouterr().out
    assert "pretrain: job pretrain.2 stalled (stalled jobs: 2): no step line in" in shown
    assert "waiting in all_reduce after step 0" in shown
    # Stalled attempts do not count against the continuation's max_attempts, nor as attempts without progress.
    assert "max_attempts" not in stage.error and "no progress" not in stage.error
    saved = json.loads((config.parent / ".bcp-pipeline/runs" / state.run_id / "state.json").read_text())
    assert saved["stages"]["pretrain"]["jobs"][0]["stall"]["reason"] == jobs[0].stall["reason"]


def test_a_training_that_hangs_after_its_last_step_is_verified_done_not_run_again(tmp_path, capsys):
    config = project(tmp_path, stall_at=8, stalls=1)
    assert main(["--config", str(config), "run", "train"]) == 0
    stage = latest(config).stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED and stage.verification["steps"] == 8
    assert [job.state for job in stage.jobs if job.kind == "stage"] == ["stalled"]  # its checkpoints say it is done
    assert "stalled job pretrain.1 ended; checking how far it got" in capsys.readouterr().out


def test_running_again_after_the_restarts_were_spent_gets_them_afresh(tmp_path):
    config = project(tmp_path, stall_at=1, stalls=2, restarts=1)
    assert main(["--config", str(config), "run", "train"]) == 1
    assert latest(config).stages["pretrain"].extra[STALL_RESTARTS] == 1
    assert main(["--config", str(config), "run", "train"]) == 0
    stage = latest(config).stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED and stage.verification["steps"] == 8


def test_a_stall_guard_on_a_stage_that_does_not_train_is_refused(tmp_path, capsys):
    config = project(tmp_path, stall_at=0, stalls=0)
    text = config.read_text().replace('        continuation: {checkpoints: "${workspace}/ckpt", target_steps: 8}\n', "")
    config.write_text(text)
    assert main(["--config", str(config), "plan", "train"]) == 2
    err = capsys.readouterr().err
    assert "pipelines.yaml:12: pipelines.train.stages.pretrain.stall_guard" in err and "training stage" in err


def test_an_orchestrator_killed_while_its_training_hangs_is_resumed_and_the_guard_goes_on_from_the_state(tmp_path):
    """What the guard measured is on disk: a `resume` after a SIGKILL finds the hang at its first look, measured from
    the last advance the killed orchestrator saw, not from its own start."""
    config = project(tmp_path, stall_at=3, stalls=1)
    config.write_text(config.read_text().replace("at_least: 1s", "at_least: 4s"))
    orchestrator = start_orchestrator(config, "run", "train")
    run_dir = None
    try:

        def seen_step_3():
            nonlocal run_dir
            for state_file in (config.parent / ".bcp-pipeline/runs").glob("*/state.json"):
                run_dir = state_file.parent
                jobs = json.loads(state_file.read_text())["stages"]["pretrain"]["jobs"]
                return jobs and jobs[0].get("steps_seen") == 3 and jobs[0]
            return None

        job = wait_for(seen_step_3, timeout=60, what="the training's third step seen by the orchestrator")
    finally:
        orchestrator.send_signal(signal.SIGKILL)
        orchestrator.communicate(timeout=30)
    assert job["stall"] is None
    time.sleep(max(0.0, job["advanced_at"] + 5 - time.time()))  # past the limit, with no orchestrator running
    resumed_at = time.time()
    assert main(["--config", str(config), "resume", run_dir.name]) == 0
    stage = latest(config).stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED
    stalled = stage.jobs[0]
    assert stalled.state == "stalled" and stalled.advanced_at == job["advanced_at"]
    assert stalled.stall["at"] - resumed_at < 2.0  # at its first look: a guard measuring from its own start waits 4 s
    assert stalled.stall["reason"].startswith("no new step for ")
    assert "after step 3 (limit: " in stalled.stall["reason"]
