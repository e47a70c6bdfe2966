"""`bcp-pipeline remove RUN [--dry-run]`: a finished run's state and the outputs named after it go (its checkpoints);
the data every run shares stays; a dry run deletes nothing; a run still going is refused."""

from __future__ import annotations

import shutil

from support.cli import cli, latest
from support.golden_files import REPO

from bcp_pipeline.engine.state import RunStore, StageStatus


def finished_run(tmp_path):
    shutil.copytree(REPO / "stages", tmp_path / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pipelines.yaml", tmp_path / "pipelines.yaml")
    config = tmp_path / "pipelines.yaml"
    assert cli(config, "run", "demo", "--only", "sample") == 0
    run_id = latest(config).run_id
    workspace = tmp_path / ".bcp-pipeline" / "workspaces" / "demo"
    checkpoints = workspace / "results" / f"demo-gpt-{run_id}" / "checkpoints"  # where the demo's pretrain saves
    checkpoints.mkdir(parents=True)
    (checkpoints / "step=000060-last.pt").write_bytes(b"x" * 4096)
    return config, run_id, workspace, checkpoints.parent


def test_a_dry_run_lists_what_would_go_and_deletes_nothing(tmp_path, capsys):
    config, run_id, workspace, results = finished_run(tmp_path)
    capsys.readouterr()
    assert cli(config, "remove", run_id, "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    state_dir = tmp_path / ".bcp-pipeline" / "runs" / run_id
    assert out == [f"would remove {results} (0.0 MB)", f"would remove {state_dir} (0.0 MB)"], out
    assert results.is_dir() and state_dir.is_dir()


def test_remove_takes_the_runs_outputs_and_state_and_keeps_the_shared_data(tmp_path, capsys):
    config, run_id, workspace, results = finished_run(tmp_path)
    mirror = sorted(p for p in (workspace / "mirror").rglob("*") if p.is_file())
    assert mirror  # the sample stage's output, shared by every run of the pipeline
    assert cli(config, "remove", run_id) == 0
    assert f"removed run {run_id}" in capsys.readouterr().out
    assert not results.exists() and not (tmp_path / ".bcp-pipeline" / "runs" / run_id).exists()
    assert sorted(p for p in (workspace / "mirror").rglob("*") if p.is_file()) == mirror
    assert cli(config, "status", run_id) != 0


def test_a_run_still_going_is_refused(tmp_path, capsys):
    config, run_id, workspace, results = finished_run(tmp_path)
    store = RunStore(tmp_path / ".bcp-pipeline")
    state = store.load(run_id)
    state.stages["sample"].status = StageStatus.RUNNING
    store.save(state)
    capsys.readouterr()
    assert cli(config, "remove", run_id) != 0
    err = capsys.readouterr().err
    assert f"run {run_id} is running: `bcp-pipeline cancel {run_id}` first" in err, err
    assert results.is_dir()
