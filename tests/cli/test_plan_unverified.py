"""`plan` says so where a stage's outputs are checked by nothing: no `verify:` and no continuation (issue 50, item
12: such a stage succeeded unverified without a word, where the README says every stage is gated)."""

from __future__ import annotations

from support.cli import cli
from support.pipeline_fixtures import CHAIN_CONFIG, REPO, write_chain_project

NOTE = "has no `verify:` checks: it counts as done when its job succeeds, whatever it wrote"


def test_plan_names_a_stage_nothing_verifies_under_its_job(tmp_path, capsys):
    text = CHAIN_CONFIG.replace(
        """        verify:
          - {glob: "${workspace}/third/item-*.txt", expect_from: second, group: 2}
""",
        "",
    )
    assert cli(write_chain_project(tmp_path, text), "plan", "chain") == 0
    out = capsys.readouterr().out
    third = out[out.index("# stage third") :]
    assert third.splitlines()[1] == f"# third {NOTE} (add a check that counts its outputs)", third
    assert out.count(NOTE) == 1  # the verified stages, first and second, get no note


def test_a_training_checked_by_its_continuation_gets_no_note(capsys):
    assert cli(REPO / "pipelines.yaml", "plan", "slimpajama-126m", "--backend", "bcp") in (0, 1)
    assert NOTE not in capsys.readouterr().out  # its pretrain has no verify:, but trains to its steps
