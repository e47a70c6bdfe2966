"""What `run`, `cancel` and Ctrl-C say about a run (issue 38): a continued run's last state as it was (a failed
stage is not "pending"), a cancel of a finished run stops nothing and says so, and Ctrl-C names the run."""

from __future__ import annotations

import signal

from support.cli import cli, latest
from support.pipeline_fixtures import stall_stage, start_orchestrator, wait_for, write_chain_project

from bcp_pipeline.engine.state import RunStore


def test_continuing_a_run_whose_stage_failed_says_failed(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    marker = tmp_path / "ws/main/second/FAIL-item-0001.txt"  # items.py fails this item while the marker exists
    marker.parent.mkdir(parents=True)
    marker.touch()
    assert cli(config, "run", "chain") == 1
    run_id = latest(config).run_id
    marker.unlink()
    capsys.readouterr()
    assert cli(config, "run", "chain") == 0
    out = capsys.readouterr().out
    assert f"continuing run {run_id} (its last state: second failed); pass --restart to start over" in out, out


def test_cancel_of_a_finished_run_says_it_had_finished_and_changes_nothing(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    assert cli(config, "run", "chain") == 0
    state_file = RunStore(tmp_path / ".bcp-pipeline").state_path(latest(config).run_id)
    before = state_file.read_bytes()
    capsys.readouterr()
    run_id = latest(config).run_id
    assert cli(config, "cancel", run_id) == 0
    assert capsys.readouterr().out == f"run {run_id} had already finished (succeeded): nothing to stop\n"
    assert state_file.read_bytes() == before


def test_ctrl_c_names_the_run_it_interrupted(tmp_path):
    config = write_chain_project(tmp_path)
    stall = stall_stage(tmp_path / "ws/main", "first")
    orchestrator = start_orchestrator(config, "run", "chain")
    try:
        wait_for(
            lambda: (state := latest(config)) and state.stages["first"].status.value == "running",
            what="the first stage running",
        )
        orchestrator.send_signal(signal.SIGINT)
        output, _ = orchestrator.communicate(timeout=60)
    finally:
        orchestrator.kill()
    run_id = latest(config).run_id
    assert orchestrator.returncode == 130
    assert (
        f"bcp-pipeline: interrupted run {run_id}. Jobs already submitted keep running; `bcp-pipeline resume "
        f"{run_id}` re-attaches to them, `bcp-pipeline cancel {run_id}` stops them."
    ) in output, output
    stall.unlink()
    assert cli(config, "cancel", run_id) == 0
