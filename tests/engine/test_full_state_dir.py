"""A full --state-dir stops the run with one line naming the folder and the cause, and the next `run`, once there
is room, continues it (issue 50, item 9: a traceback, then the stage failed as "lost")."""

from __future__ import annotations

import errno

from support.cli import cli
from support.pipeline_fixtures import write_chain_project

from bcp_pipeline.engine.state import RunStore
from bcp_pipeline.report.text import Reporter


def fill(folder) -> None:
    """Write into `folder` until its file system is full (a real ENOSPC, on a small tmpfs)."""
    with open(folder / "filler", "wb") as handle:
        try:
            while True:
                handle.write(b"x" * 65536)
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_a_full_state_folder_is_one_line_and_the_next_run_continues(tmp_path, tmpfs, capsys, monkeypatch):
    state_dir = tmpfs(tmp_path / "state", "4m")
    config = write_chain_project(tmp_path / "project")

    class FillsTheDiskWhenFirstSucceeds(Reporter):
        def event(self, text: str) -> None:
            super().event(text)
            if text.startswith("first: succeeded"):
                fill(state_dir)

    monkeypatch.setattr("bcp_pipeline.cli.common.Reporter", FillsTheDiskWhenFirstSucceeds)
    assert cli(config, "run", "chain", "--state-dir", str(state_dir)) == 1
    err = capsys.readouterr().err
    [run] = RunStore(state_dir).runs()
    assert err.strip().splitlines() == [
        f"bcp-pipeline: error: cannot save the state of run {run.run_id} in {state_dir}/runs/{run.run_id}: No space "
        f"left on device; its last saved state is kept. Free space there (or fix the folder), then `bcp-pipeline "
        f"resume {run.run_id}` continues it"
    ], err
    monkeypatch.undo()
    (state_dir / "filler").unlink()
    assert cli(config, "run", "chain", "--state-dir", str(state_dir)) == 0
    out = capsys.readouterr().out
    assert f"continuing run {run.run_id}" in out
    [run] = RunStore(state_dir).runs()
    assert run.status == "succeeded"
    assert [len(s.jobs) for s in run.stages.values()] == [2, 2, 2]  # nothing submitted twice


def test_a_local_jobs_supervisor_outlasts_a_full_disk_and_records_its_result_once_there_is_room(
    tmp_path, tmpfs, monkeypatch
):
    """Died of it, the supervisor left its job "lost", which failed the stage on the next run."""
    import threading

    from bcp_pipeline.backends.local import supervisor

    folder = tmpfs(tmp_path / "state", "1m")
    monkeypatch.setattr(supervisor, "FULL_DISK_RETRY_SECONDS", 0.05)
    fill(folder)
    writer = threading.Thread(target=supervisor.write_status, args=(folder / "status.json", {"state": "succeeded"}))
    writer.start()
    writer.join(0.5)
    assert writer.is_alive() and not (folder / "status.json").exists()  # waiting for room, not dead
    (folder / "filler").unlink()
    writer.join(5)
    assert not writer.is_alive() and (folder / "status.json").read_text().strip().startswith("{")
