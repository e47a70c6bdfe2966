"""Run selection (engine/selection.py): the one place that decides what `run` and `resume` drive.

The runs here are chosen, never driven: each test sets stored state by hand and checks the choice.
"""

from __future__ import annotations

import pytest
from support.pipeline_fixtures import write_chain_project

from bcp_pipeline.engine.selection import ChosenRun, RunRequest, choose_resume, choose_run, open_run
from bcp_pipeline.engine.state import StageStatus, store_for
from bcp_pipeline.errors import ConfigError, StateError


@pytest.fixture
def project(tmp_path):
    config = write_chain_project(tmp_path)
    return config, store_for(config)


def request(config, **fields) -> RunRequest:
    return RunRequest(pipeline="chain", config_file=config, **fields)


def stored(chosen: ChosenRun, **statuses: StageStatus) -> None:
    for name, status in statuses.items():
        chosen.state.stages[name].status = status
    chosen.store.save(chosen.state)


def test_a_first_run_is_new_and_selects_every_stage(project):
    config, store = project
    chosen = choose_run(request(config), store)
    assert not chosen.continued and chosen.selected == {"first", "second", "third"}
    assert chosen.state.backend == "local" and chosen.store.root == config.parent / ".bcp-pipeline"
    assert store.runs() == []  # choosing records nothing: the run is saved once it is driven


def test_from_and_only_select_and_skip_the_rest_of_a_new_run(project):
    config, store = project
    chosen = choose_run(request(config, from_stage="second"), store)
    assert chosen.selected == {"second", "third"}
    assert chosen.state.stages["first"].status is StageStatus.SKIPPED
    assert choose_run(request(config, only=["third"]), store).selected == {"third"}
    with pytest.raises(ConfigError, match="no stage 'fourth' in pipeline chain"):
        choose_run(request(config, only=["fourth"]), store)


def test_an_unfinished_run_is_continued_with_its_failed_stage_reset(project):
    config, store = project
    first = choose_run(request(config), store)
    stored(first, first=StageStatus.SUCCEEDED, second=StageStatus.FAILED)
    chosen = choose_run(request(config), store)
    assert chosen.continued and chosen.state.run_id == first.state.run_id
    assert chosen.state.stages["second"].status is StageStatus.PENDING
    assert chosen.state.stages["first"].status is StageStatus.SUCCEEDED  # not redone
    assert choose_run(request(config, restart=True), store).state.run_id != first.state.run_id


def test_a_continued_run_keeps_its_overrides_unless_new_ones_replace_them(project):
    config, store = project
    first = choose_run(request(config, overrides=["vars.count=4"]), store)
    stored(first, first=StageStatus.FAILED)
    kept = choose_run(request(config), store)
    assert kept.state.overrides == ["vars.count=4"] and kept.pipeline.vars["count"] == "4"
    replaced = choose_run(request(config, overrides=["vars.count=5"]), store)
    assert replaced.state.overrides == ["vars.count=5"] and replaced.pipeline.vars["count"] == "5"


def test_a_detached_run_is_not_continued_here_by_run(project):
    config, store = project
    first = choose_run(request(config), store)
    first.state.detached = {"owner": "driver"}
    stored(first, first=StageStatus.RUNNING)
    with pytest.raises(StateError, match=f"is detached: follow it with `bcp-pipeline status {first.state.run_id}`"):
        choose_run(request(config), store)
    with pytest.raises(ConfigError, match="--detach runs the orchestrator as a BCP job"):
        choose_run(request(config, detach=True, restart=True), store)


def test_resume_keeps_skipped_stages_skipped_and_takes_a_detached_run_back_first(project):
    config, store = project
    first = choose_run(request(config, only=["first", "second"]), store)
    first.state.detached = {"owner": "driver"}
    stored(first, first=StageStatus.SUCCEEDED, second=StageStatus.CANCELLED)
    taken = []

    def take_back(chosen: ChosenRun) -> None:  # what detach/laptop.py does: the run is the laptop's again
        taken.append(chosen.state.run_id)
        chosen.state.detached = {"owner": "local"}

    chosen = choose_resume(store, None, config_file=None, detach=False, take_back=take_back)
    assert taken == [first.state.run_id]
    assert chosen.selected == {"first", "second"}  # third was left out with --only and stays out
    assert chosen.state.stages["first"].status is StageStatus.SUCCEEDED  # selected, but done: not redone
    assert chosen.state.stages["second"].status is StageStatus.PENDING  # cancelled: done again
    assert chosen.state.stages["third"].status is StageStatus.SKIPPED
    with pytest.raises(ConfigError, match="--detach needs a run on the bcp backend"):
        choose_resume(store, first.state.run_id, config_file=None, detach=True, take_back=take_back)


def test_open_run_reads_a_stored_run_with_the_config_it_was_started_with(project, tmp_path):
    config, store = project
    first = choose_run(request(config, overrides=["vars.count=3"]), store)
    stored(first)
    opened = open_run(store, first.state.run_id)
    assert opened.config.file == config and opened.pipeline.vars["count"] == "3" and opened.selected == set()
    with pytest.raises(StateError):
        open_run(store, "chain-no-such-run")
