"""Continuation of a stage that ends before its work is done (training hitting its runtime), on the local backend.

The stage program is a stand-in trainer: each attempt advances a few steps from the last `step=N` checkpoint
and exits 0, as NeMo does when `trainer.max_time` is reached before `max_steps`.
"""

from __future__ import annotations

from support.pipeline_fixtures import TRAINER, write_chain_project

from bcp_pipeline.cli.main import main
from bcp_pipeline.engine.state import RunStore, StageStatus

CONFIG = """\
version: 1
stages_dir: stages
backends:
  local: {workspace_dir: ws, poll_seconds: 0.05}
pipelines:
  train:
    workspace: {name: main}
    vars: {target: "10"}
    stages:
      pretrain:
        program: trainer.py
        args: ["${workspace}/ckpt", "ADVANCE", "${target}"]
        continuation: {checkpoints: "${workspace}/ckpt", target_steps: "${target}", max_attempts: MAX}
"""


def project(tmp_path, advance: int, max_attempts: int = 10):
    config = write_chain_project(tmp_path, CONFIG.replace("ADVANCE", str(advance)).replace("MAX", str(max_attempts)))
    (config.parent / "stages/trainer.py").write_text(TRAINER)
    return config


def latest(config):
    return RunStore(config.parent / ".bcp-pipeline").latest()


def test_resubmits_until_target_steps(tmp_path, capsys):
    config = project(tmp_path, advance=4)
    assert main(["--config", str(config), "run", "train"]) == 0
    stage = latest(config).stages["pretrain"]
    assert stage.status is StageStatus.SUCCEEDED
    assert stage.attempts == 3
    assert stage.extra["steps_after_attempt"] == [4, 8]
    assert stage.verification["steps"] == 10 and stage.verification["ok"] is True
    assert [j.job_id for j in stage.jobs if j.kind == "stage"] == ["pretrain.1", "pretrain.2", "pretrain.3"]
    out = capsys.readouterr().out
    assert "at step 4 of 10 after attempt 1; resubmitting" in out


def test_two_attempts_without_progress_stop_the_stage(tmp_path, capsys):
    config = project(tmp_path, advance=0)
    assert main(["--config", str(config), "run", "train"]) == 1
    stage = latest(config).stages["pretrain"]
    assert stage.status is StageStatus.FAILED
    assert stage.attempts == 2
    assert stage.error.startswith("no progress in the last two attempts (still at step 0 of 10)")


def test_max_attempts_caps_resubmissions(tmp_path):
    config = project(tmp_path, advance=1, max_attempts=3)
    assert main(["--config", str(config), "run", "train"]) == 1
    stage = latest(config).stages["pretrain"]
    assert stage.attempts == 3
    assert stage.error.startswith(
        "reached max_attempts (3) at step 3 of 10; raise it and run again to continue "
        "(--set pretrain.continuation.max_attempts=6)"
    ), stage.error
    # Raising the cap and running again continues the same run from its checkpoint.
    assert main(["--config", str(config), "run", "train", "--set", "pretrain.continuation.max_attempts=20"]) == 0
    assert latest(config).stages["pretrain"].verification["steps"] == 10
