"""`cancel` stops a run whatever instant it lands in (issue 50, item 7): a job that ended just before the cancel is
recorded as it ended (not "cancelled"), and the orchestrator driving the run submits nothing after it."""

from __future__ import annotations

import json

from support.cli import cli, latest
from support.pipeline_fixtures import stall_stage, start_orchestrator, wait_for, write_chain_project

from bcp_pipeline.engine.cancelling import CANCEL_REQUEST, request_cancel
from bcp_pipeline.engine.drive import drive_run
from bcp_pipeline.engine.selection import RunRequest, choose_run
from bcp_pipeline.engine.state import CANCELLED_WHILE, StageStatus, store_for


class CancelWhenFirstSucceeds:
    """A Progress that asks for a cancel the moment `first` succeeds: the run is between two stages, no job of
    it active, as a `cancel` typed then finds it."""

    def __init__(self, run_dir_of) -> None:
        self.run_dir_of = run_dir_of
        self.events: list[str] = []

    def started(self, state, state_file) -> None:
        self.state = state

    def event(self, text: str) -> None:
        self.events.append(text)
        if text.startswith("first: succeeded"):
            request_cancel(self.run_dir_of(self.state))

    def update(self, state, final: bool = False) -> None:
        pass


def test_a_cancel_between_two_stages_stops_the_run_before_the_next_submission(tmp_path):
    config = write_chain_project(tmp_path)
    store = store_for(config)
    chosen = choose_run(RunRequest(pipeline="chain", config_file=config), store)
    progress = CancelWhenFirstSucceeds(lambda state: store.run_dir(state.run_id))
    assert drive_run(chosen, progress) is False
    state = store.load(chosen.state.run_id)
    assert state.stages["first"].status is StageStatus.SUCCEEDED
    assert state.stages["second"].jobs == [] and state.stages["third"].jobs == [], progress.events
    assert state.status == "cancelled" and state.stages["second"].status is StageStatus.CANCELLED
    run_dir = store.run_dir(state.run_id)
    assert not (run_dir / CANCEL_REQUEST).exists()
    assert json.loads((run_dir / "cancel-done.json").read_text()) == {"stopped": [], "ended": {}, "unasked": None}


def test_a_cancel_landing_after_the_job_ended_records_it_as_it_ended_and_stops_the_run(tmp_path, capsys):
    """The saved state still calls first.1 running (the orchestrator polls every 5 s), but the job has succeeded:
    the cancel must neither call it cancelled nor let the run go on."""
    config = write_chain_project(tmp_path)
    config.write_text(config.read_text().replace("poll_seconds: 0.05", "poll_seconds: 5"))
    stall = stall_stage(config.parent / "ws/main", "first")
    orchestrator = start_orchestrator(config, "run", "chain")
    try:
        run_id = wait_for(
            lambda: (s := latest(config)) and s.stages["first"].status is StageStatus.RUNNING and s.run_id,
            what="first running",
        )
        job_status = config.parent / ".bcp-pipeline/runs" / run_id / "jobs/first.1/status.json"
        wait_for(
            lambda: job_status.is_file() and json.loads(job_status.read_text())["state"] == "running",
            what="first.1's ranks running",
        )
        stall.unlink()
        wait_for(lambda: json.loads(job_status.read_text())["state"] == "succeeded", what="first.1 succeeded")
        assert latest(config).stages["first"].jobs[-1].ended_at is None  # the orchestrator has not polled it yet
        capsys.readouterr()
        assert cli(config, "cancel", run_id) == 0
        out = capsys.readouterr().out
        output, _ = orchestrator.communicate(timeout=60)
    finally:
        orchestrator.kill()
    assert orchestrator.returncode == 1, output
    assert (
        f"cancelled run {run_id} by the orchestrator driving it: no job was still running; first.1 had already "
        "ended (succeeded)" in out
    ), out
    state = latest(config)
    first = state.stages["first"]
    assert first.jobs[-1].state == "succeeded" and "cancelled" not in first.jobs[-1].detail
    # Its work is done: a resume verifies it again, no more.
    assert first.status is StageStatus.CANCELLED and first.extra[CANCELLED_WHILE] == "verifying"
    assert state.stages["second"].jobs == [] and state.status == "cancelled"
