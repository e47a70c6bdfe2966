"""A run nobody drives (issue 38): after its orchestrator is SIGKILLed, its state still says running; `status` and
`list` tell it from a driven one by the run's lock (the kernel drops a dead process's lock) and say how to go on."""

from __future__ import annotations

import json

from support.cli import cli
from support.pipeline_fixtures import stage_status, stall_stage, start_orchestrator, wait_for, write_chain_project


def test_status_and_list_say_a_killed_orchestrators_run_has_no_driver_and_a_driven_one_none(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    stall = stall_stage(tmp_path / "ws/main", "second")
    orchestrator = start_orchestrator(config, "run", "chain")
    try:
        run_dir = wait_for(
            lambda: next((tmp_path / ".bcp-pipeline/runs").glob("*/state.json"), None), what="the run's state"
        ).parent
        run_id = run_dir.name
        wait_for(lambda: stage_status(run_dir, "second") == "running", what="stage second to run")
        capsys.readouterr()
        # Driven: plain "running", in both.
        assert cli(config, "status") == 0
        out = capsys.readouterr().out
        assert f"run {run_id}  pipeline chain  backend local  status running\n" in out and "no driver" not in out
        assert cli(config, "list", "--json") == 0
        assert json.loads(capsys.readouterr().out)["runs"][0]["driven"] is True
    finally:
        orchestrator.kill()  # SIGKILL: the jobs live on, the state says running
        orchestrator.communicate()
    hint = f"running (no driver: `bcp-pipeline resume {run_id}`)"
    assert cli(config, "status") == 0
    assert f"status {hint}\n" in capsys.readouterr().out
    assert cli(config, "status", "--json") == 0
    payload = json.loads(capsys.readouterr().out)
    assert (payload["status"], payload["driven"]) == ("running", False)
    assert cli(config, "list") == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(run_id))
    assert row.split(None, 3)[1:] == ["chain", "local", hint]
    assert cli(config, "list", "--json") == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["driven"] is False
    # `resume` as told: the run is driven again, and ends as a finished run that needs no hint.
    stall.unlink()
    assert cli(config, "resume", run_id) == 0
    capsys.readouterr()
    assert cli(config, "list") == 0
    out = capsys.readouterr().out
    assert "succeeded" in out and "no driver" not in out
