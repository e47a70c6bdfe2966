"""`run --only STAGE` of a run with other stages cancelled or failed runs STAGE (issue 50, item 11: it submitted
nothing and exited 1 with "fix the cause above" and nothing above), and where STAGE needs a stage it does not run,
it says so."""

from __future__ import annotations

from support.cli import cli, latest
from support.pipeline_fixtures import write_chain_project

from bcp_pipeline.engine.selection import RunRequest, choose_run
from bcp_pipeline.engine.state import StageStatus, store_for


def cancelled_run(config) -> str:
    """A run of the chain cancelled before any job (what `cancel` records of a run with nothing active)."""
    store = store_for(config)
    chosen = choose_run(RunRequest(pipeline="chain", config_file=config), store)
    chosen.state.mark_cancelled()
    store.save(chosen.state)
    return chosen.state.run_id


def test_run_only_a_stage_of_a_cancelled_run_runs_it(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    run_id = cancelled_run(config)
    assert cli(config, "run", "chain", "--only", "first") == 0, capsys.readouterr()
    state = latest(config)
    assert state.run_id == run_id and state.stages["first"].status is StageStatus.SUCCEEDED
    assert state.stages["second"].status is StageStatus.CANCELLED  # not asked for: left as it was


def test_run_only_a_stage_whose_need_it_does_not_run_says_why_nothing_started(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    run_id = cancelled_run(config)
    assert cli(config, "run", "chain", "--only", "second") == 1
    out = capsys.readouterr().out
    assert (
        f"second: not started: it needs first (cancelled), which this invocation does not run; add --only first, "
        f"or `bcp-pipeline resume {run_id}` runs the stages the run was started with"
    ) in out, out
    assert latest(config).stages["second"].jobs == []
