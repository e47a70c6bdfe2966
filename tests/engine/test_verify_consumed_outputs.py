"""`verify RUN STAGE` of a stage whose outputs a finished successor consumed (extract deletes each .zst once its
.jsonl is complete) changes nothing (issue 50, item 5): failed, the stage had `run` fetch everything again."""

from __future__ import annotations

from support.cli import cli, latest
from support.pipeline_fixtures import write_chain_project

from bcp_pipeline.engine.state import StageStatus


def test_verify_of_a_stage_whose_outputs_its_successor_consumed_leaves_the_run_as_it_was(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    assert cli(config, "run", "chain") == 0
    run = latest(config)
    first_finished = run.stages["first"].finished_at
    for item in (config.parent / "ws/main/first").glob("item-*.txt"):
        item.unlink()  # as a consuming successor leaves them
    capsys.readouterr()
    assert cli(config, "verify", run.run_id, "first") == 1
    out = capsys.readouterr().out
    assert (
        "first: none of its outputs is left, but second, which take(s) them as input, succeeded and may have "
        "consumed them"
    ) in out, out
    assert f"`bcp-pipeline verify {run.run_id} second` checks what was made of them" in out
    state = latest(config)
    assert state.status == "succeeded" and state.stages["first"].status is StageStatus.SUCCEEDED
    assert state.stages["first"].finished_at == first_finished and state.stages["first"].error is None
    assert state.stages["first"].jobs[-1].kind == "verify" and len(state.stages["first"].jobs) == 3  # on record
    assert "status succeeded" in out.split("checks what was made of them")[1], out  # the final table: as it was
    # Some gone, not all: a real loss, which fails the stage so that `run` redoes it (test_orchestrator_local.py
    # has it for a stage with a successor); and so does a stage nothing downstream consumes.
    for item in (config.parent / "ws/main/third").glob("item-*.txt"):
        item.unlink()
    assert cli(config, "verify", run.run_id, "third") == 1
    assert latest(config).stages["third"].status is StageStatus.FAILED
