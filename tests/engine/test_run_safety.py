"""Runs that never block or lie, on the local backend: a corrupt state file blocks only its own run, one
workspace has one writer, a cancelled job is not shown running, `verify` keeps a stage's elapsed time, a stage
cancelled while being verified is not run again, and no name leaves its folder.

The orchestrators that must hold a lock while a test looks are real subprocesses (pipeline_fixtures), stalled by
the test program's STALL marker; a second writer is a real subprocess too, with a timeout, so code that let it
write would show as that second run hanging on the stall, not as a test hanging.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import cli
from support.pipeline_fixtures import CHAIN_CONFIG, stall_stage, start_orchestrator, wait_for, write_chain_project

from bcp_pipeline.engine.selection import RunRequest, Selection, choose_run, continue_run
from bcp_pipeline.engine.state import RUN_ID, RunStore, StageStatus, new_run_id, store_for

TWO_PIPELINES = (
    CHAIN_CONFIG
    + """\
  other:
    workspace: {name: elsewhere}
    stages:
      only:
        program: items.py
        args: [--out, "${workspace}/only", --count, "2", --name, only]
        verify:
          - {glob: "${workspace}/only/item-*.txt", expect: 2}
"""
)


def second_writer(config: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`bcp-pipeline --config CONFIG ARGS` as its own process: refused at once, or still running at `timeout`."""
    return subprocess.run(
        [sys.executable, "-m", "bcp_pipeline", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def store(config: Path) -> RunStore:
    return RunStore(config.parent / ".bcp-pipeline")


def recorded_job(config: Path, stage: str, native: str) -> dict | None:
    """The stage's last job once the state file records it with this native state."""
    for path in sorted((config.parent / ".bcp-pipeline/runs").glob("*/state.json")):
        try:
            jobs = json.loads(path.read_text())["stages"][stage]["jobs"]
        except (ValueError, KeyError):
            continue
        if jobs and jobs[-1]["native"] == native:
            return jobs[-1]
    return None


# -- Break 1: one corrupt state file ------------------------------------------------------------------------
def test_a_corrupt_run_is_set_aside_once_and_blocks_nothing_else(tmp_path, capsys):
    config = write_chain_project(tmp_path, TWO_PIPELINES)
    assert cli(config, "run", "chain", "--only", "first") == 0
    old = store(config).latest()
    state_path = store(config).state_path(old.run_id)
    text = state_path.read_text()[:300]  # `head -c 300`
    state_path.write_text(text)
    capsys.readouterr()

    assert cli(config, "run", "chain", "--only", "first", "--restart") == 0  # the fix the old message named
    assert cli(config, "run", "other") == 0  # another pipeline
    err = capsys.readouterr().err
    aside = next(state_path.parent.glob("state.corrupt-*.json"))
    assert aside.read_text() == text and not state_path.exists()  # kept byte for byte, under a name that says so
    assert err.count(f"run {old.run_id} is corrupt") == 1 and str(aside) in err

    assert cli(config, "status") == 0  # the latest readable run
    assert cli(config, "list") == 0
    out, err = capsys.readouterr()
    assert f"run {old.run_id} is corrupt" not in err  # reported once, when it was found
    row = next(line for line in out.splitlines() if line.startswith(old.run_id))
    assert "corrupt (state set aside as" in row and str(aside) in row
    assert cli(config, "status", old.run_id) == 1
    assert f"run {old.run_id} is corrupt" in capsys.readouterr().err
    assert cli(config, "list", "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["run_id"] for c in listed["corrupt_runs"]] == [old.run_id]
    assert aside.read_text() == text


def test_continuing_a_pipeline_whose_last_run_is_corrupt_is_refused_not_guessed(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    assert cli(config, "run", "chain", "--only", "first") == 0  # an older run, unfinished (second and third skipped)
    assert cli(config, "run", "chain", "--only", "second", "--restart") == 0
    newest = store(config).latest()
    store(config).state_path(newest.run_id).write_text("{ not json")
    capsys.readouterr()
    assert cli(config, "run", "chain") == 1
    err = capsys.readouterr().err
    assert f"the last run of chain ({newest.run_id}) is corrupt" in err and "--restart" in err
    assert cli(config, "run", "chain", "--restart", "--only", "first") == 0


def test_run_ids_sort_in_creation_order_within_one_second():
    """Run ids are compared to find a pipeline's newest run (a corrupt one has only its id): runs made within one
    second must sort as they were made. With a random suffix the test above failed when its two runs shared a
    second and the older one's suffix sorted last."""
    base = 1_795_000_000.0  # any second
    moments = [base + f for f in (0.0, 0.000016, 0.25, 0.5, 0.999, 0.99999, 1.0, 1.5)]
    ids = [new_run_id("chain", now) for now in moments]
    assert sorted(ids) == ids and len(set(ids)) == len(ids)
    assert all(RUN_ID.match(run_id) for run_id in ids)
    assert ids[0].endswith("-0000") and ids[3].endswith("-8000") and ids[5].endswith("-ffff")


# -- Break 2: two writers of one workspace --------------------------------------------------------------------
def test_a_second_writer_of_a_workspace_is_refused_whatever_the_flag_until_the_first_is_killed(tmp_path):
    config = write_chain_project(tmp_path)
    stall = stall_stage(tmp_path / "ws/main", "first")
    first = start_orchestrator(config, "run", "chain")
    try:
        wait_for(lambda: recorded_job(config, "first", "running"), what="the first run's job running")
        holder = store(config).latest().run_id
        other_state = tmp_path / "elsewhere-state"  # another orchestrator's runs, the same workspace folder
        for args in (
            ["run", "chain", "--restart"],
            ["run", "chain", "--restart", "--only", "third"],
            ["run", "chain", "--state-dir", str(other_state)],
        ):
            refused = second_writer(config, *args)
            assert refused.returncode == 1, (args, refused.stdout, refused.stderr)
            assert f"workspace main (local) is being written by run {holder}" in refused.stderr, refused.stderr
            assert "bcp-pipeline cancel" in refused.stderr
        assert [r.run_id for r in store(config).runs()] == [holder]  # a refused run leaves nothing behind
        assert not list(other_state.glob("runs/*/state.json"))
    finally:
        first.send_signal(signal.SIGKILL)  # the lock goes with its process
        first.wait()
        stall.unlink()
    assert second_writer(config, "run", "chain", "--restart").returncode == 0


# -- Mislead 8: a cancelled job shown running ----------------------------------------------------------------------
def test_status_shows_a_job_cancelled_after_ctrl_c_as_cancelled_then_and_after_resume(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    stall = stall_stage(tmp_path / "ws/main", "first")
    first = start_orchestrator(config, "run", "chain")
    wait_for(lambda: recorded_job(config, "first", "running"), what="the first stage's job running")
    first.send_signal(signal.SIGINT)
    first.wait(timeout=60)
    run_id = store(config).latest().run_id
    assert cli(config, "cancel", run_id) == 0
    capsys.readouterr()
    assert cli(config, "status") == 0
    out = capsys.readouterr().out
    assert "first.1(cancelled)" in out and "(running)" not in out
    job = store(config).latest().stages["first"].jobs[-1]
    assert job.state == "cancelled" and job.detail.startswith("cancelled here while running")
    stall.unlink()
    assert cli(config, "resume", run_id) == 0
    capsys.readouterr()
    assert cli(config, "status") == 0
    out = capsys.readouterr().out
    assert "first.1(cancelled)" in out and "(running)" not in out


# -- Mislead 9: verify rewrites a finished stage's elapsed time ------------------------------------------------
def test_verify_of_a_finished_stage_keeps_when_its_work_ended(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    assert cli(config, "run", "chain", "--only", "first") == 0
    state = store(config).latest()
    stage = state.stages["first"]
    stage.started_at -= 24 * 60  # as if the run had finished 24 minutes ago
    stage.finished_at -= 24 * 60
    store(config).save(state)
    assert cli(config, "verify", state.run_id, "first") == 0
    again = store(config).latest().stages["first"]
    assert (again.started_at, again.finished_at) == (stage.started_at, stage.finished_at)
    assert [j.kind for j in again.jobs] == ["stage", "verify", "verify"]


# -- A stage cancelled during its verification ----------------------------------------------------------------------
def test_a_stage_cancelled_while_verified_is_verified_again_not_run_again(tmp_path):
    config = write_chain_project(tmp_path)
    chosen = choose_run(RunRequest(pipeline="chain", config_file=config), store_for(config))
    first = chosen.state.stages["first"]
    first.status, first.attempts = StageStatus.VERIFYING, 1
    chosen.state.mark_cancelled()
    assert first.status is StageStatus.CANCELLED
    selected = continue_run(chosen.state, chosen.pipeline, Selection())
    assert "first" in selected and first.status is StageStatus.VERIFYING and first.attempts == 1
    assert chosen.state.stages["second"].status is StageStatus.PENDING
    # Asked for explicitly, the stage is run again, as --only always does.
    first.status = StageStatus.CANCELLED
    continue_run(chosen.state, chosen.pipeline, Selection(only=["first"]))
    assert first.status is StageStatus.PENDING


# -- Names that would leave their folder --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../etc", "a b", ".hidden", "ws:main"])
def test_a_workspace_name_bcp_would_not_accept_is_refused_by_its_line(tmp_path, capsys, name):
    config = write_chain_project(
        tmp_path, CHAIN_CONFIG.replace("workspace: {name: main,", f"workspace: {{name: {json.dumps(name)},")
    )
    assert cli(config, "plan", "chain") == 2
    err = capsys.readouterr().err
    line = CHAIN_CONFIG.splitlines().index("    workspace: {name: main, mount: /mount_workspace}") + 1
    assert f"pipelines.yaml:{line}" in err and f"workspace name {name!r}" in err
    assert cli(config, "run", "chain", "--set", "first.args=[--out, x, --count, '1']") == 2
    assert not (tmp_path / "etc").exists() and not (tmp_path / ".bcp-pipeline").exists()


def test_a_run_id_that_is_a_path_is_refused(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    assert cli(config, "run", "chain", "--only", "first") == 0
    capsys.readouterr()
    for verb in ("status", "logs", "verify", "cancel"):
        args = [verb, "../../etc"] + (["first"] if verb in ("logs", "verify") else [])
        assert cli(config, *args) == 1
        assert "'../../etc' is not a run id" in capsys.readouterr().err


def test_a_run_that_never_submitted_a_job_does_not_block_another_backend(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    chosen = choose_run(RunRequest(pipeline="chain", config_file=config), store_for(config))
    chosen.state.backend = "bcp"  # recorded, then refused before its first submission (the old missing-workspace path)
    chosen.store.save(chosen.state)
    assert cli(config, "run", "chain") == 0
    runs = store(config).runs()
    assert [r.backend for r in runs] == ["bcp", "local"] and runs[-1].status == "succeeded"
