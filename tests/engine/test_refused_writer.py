"""A second writer of a workspace, refused, names no run it never made and leaves no folder (issue 50, item 12d:
`so run demo-... is refused` named a run never created, and left its empty folder with only orchestrator.lock)."""

from __future__ import annotations

from support.cli import cli
from support.pipeline_fixtures import write_chain_project

from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.engine.selection import RunRequest, choose_run
from bcp_pipeline.engine.state import store_for
from bcp_pipeline.engine.workspace_lock import hold_workspace


def test_a_refused_new_run_names_no_run_and_leaves_no_folder(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    store = store_for(config)
    holder = choose_run(RunRequest(pipeline="chain", config_file=config), store)
    backend = make_backend("local", holder.config, holder.pipeline, store.run_dir(holder.state.run_id))
    with hold_workspace(backend, "main", holder.state, store):  # as an orchestrator driving it holds it
        assert cli(config, "run", "chain", "--restart") == 1
    err = capsys.readouterr().err
    assert f"is being written by run {holder.state.run_id}" in err
    assert "so this run is refused (nothing of it was recorded): wait for it to end" in err, err
    assert not store.runs_dir.exists() or list(store.runs_dir.iterdir()) == []
