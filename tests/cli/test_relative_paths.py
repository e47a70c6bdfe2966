"""Path options typed relative to the current folder (issue 38): a run's jobs work in other folders, so the command
line makes them absolute; and a local job whose supervisor died before starting any rank says why in its failure."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from support.cli import cli
from support.pipeline_fixtures import write_chain_project

from bcp_pipeline.engine.state import RunStore


@pytest.fixture
def chain(tmp_path: Path) -> Path:
    return write_chain_project(tmp_path / "project")


def test_a_relative_state_dir_runs_the_jobs_and_keeps_the_runs_there(chain, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli(chain, "run", "chain", "--only", "first", "--state-dir", "st-rel") == 0, capsys.readouterr().err
    runs = RunStore(tmp_path / "st-rel").runs()
    assert [run.status for run in runs] == ["succeeded"]
    assert not (chain.parent / ".bcp-pipeline").exists()
    # Later commands with the same relative spelling, from the same folder, find the run.
    capsys.readouterr()
    assert cli(chain, "status", "--state-dir", "st-rel") == 0
    assert f"run {runs[0].run_id}" in capsys.readouterr().out


def test_a_relative_report_out_is_written_where_it_was_typed(chain, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli(chain, "run", "chain", "--only", "first") == 0
    assert cli(chain, "report", "--out", "page.html") == 0
    assert (tmp_path / "page.html").is_file()
    assert str(tmp_path / "page.html") in capsys.readouterr().out


def test_a_supervisor_that_dies_before_any_rank_shows_its_log_in_the_failure(chain, tmp_path, monkeypatch, capsys):
    # The supervisor is started with sys.executable: an interpreter that cannot start stands in for any early death.
    broken = tmp_path / "python-that-dies"
    broken.write_text("#!/bin/sh\necho 'supervisor: cannot read spec.json: No such file or directory' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sys, "executable", str(broken))
    assert cli(chain, "run", "chain", "--only", "first") == 1
    captured = capsys.readouterr()
    assert "the job's supervisor exited before starting any rank" in captured.out
    assert "supervisor.log:" in captured.out
    assert "supervisor: cannot read spec.json: No such file or directory" in captured.out
    # status says it again, from the run's state.
    assert cli(chain, "status") == 0
    assert "supervisor: cannot read spec.json" in capsys.readouterr().out
