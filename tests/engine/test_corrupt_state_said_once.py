"""A corrupt state.json is said once, not as a warning and again as the error (issue 50, item 12h), and `status`
of a folder whose only run is corrupt says so rather than "no runs yet"."""

from __future__ import annotations

from support.cli import cli
from support.pipeline_fixtures import write_chain_project

from bcp_pipeline.engine.selection import RunRequest, choose_run
from bcp_pipeline.engine.state import store_for


def corrupt_run(tmp_path):
    config = write_chain_project(tmp_path)
    store = store_for(config)
    chosen = choose_run(RunRequest(pipeline="chain", config_file=config), store)
    store.save(chosen.state)
    store.state_path(chosen.state.run_id).write_text("{ bad")
    return config, chosen.state.run_id


def test_status_of_a_corrupt_run_says_it_once(tmp_path, capsys):
    config, run_id = corrupt_run(tmp_path)
    assert cli(config, "status", run_id) == 1
    err = capsys.readouterr().err
    assert err.count(f"run {run_id} is corrupt") == 1 and err.startswith("bcp-pipeline: error: "), err


def test_status_of_a_folder_whose_only_run_is_corrupt_names_it(tmp_path, capsys):
    config, run_id = corrupt_run(tmp_path)
    assert cli(config, "status") == 1
    err = capsys.readouterr().err
    assert "no runs yet" not in err and f"run {run_id} is corrupt, its state set aside as " in err, err
