"""What a saved `check` profile changes: `run` on BCP suggests `check` where none exists for the org/ACE, and refuses,
before recording anything, stages that the profile says cannot work here."""

from __future__ import annotations

import pytest
from support.bcp_emulation import needs_ngcsdk
from support.check_fixtures import project

from bcp_pipeline.backends.profile import profile_key, save_profile
from bcp_pipeline.cli.main import main
from bcp_pipeline.cli.runs import suggest_check
from bcp_pipeline.engine.selection import RunRequest, choose_run
from bcp_pipeline.engine.state import RunStore
from bcp_pipeline.errors import ConfigError

pytestmark = [needs_ngcsdk, pytest.mark.parametrize("fake", ["sdk"], indirect=True)]
KEY = profile_key("bcpp-test-org", "bcpp-test-ace")  # the emulator's


@pytest.fixture
def bcp_env(fake):
    """choose_run checks credentials, the ACE's limits and the pipeline's workspace through the API: the
    emulator's (never the internet), which has the demo's workspace."""
    fake.create_workspace("demo")
    return fake


def request(config) -> RunRequest:
    return RunRequest(
        pipeline="demo",
        config_file=config,
        backend="bcp",
        overrides=[],
        from_stage=None,
        only=None,
        restart=False,
        detach=False,
    )


def profile(bcprun: dict) -> dict:
    return {"key": KEY, "checked_at": 0.0, "rows": [], "facts": {"probe": {"bcprun": bcprun}}}


def test_run_suggests_check_where_no_profile_exists(tmp_path, bcp_env, capsys):
    config = project(tmp_path, "  bcp: {transport: sdk}\n")
    store = RunStore(tmp_path / ".bcp-pipeline")
    suggest_check(choose_run(request(config), store))
    assert f"no `check` profile for {KEY} yet: `bcp-pipeline check demo`" in capsys.readouterr().err
    save_profile(store.root, KEY, profile({"present": True, "in_single_replica_jobs": True}))
    suggest_check(choose_run(request(config), store))
    assert capsys.readouterr().err == ""


def test_run_refuses_stages_under_a_bcprun_the_profile_found_missing(tmp_path, bcp_env):
    config = project(tmp_path, "  bcp: {transport: sdk}\n")
    store = RunStore(tmp_path / ".bcp-pipeline")
    save_profile(store.root, KEY, profile({"present": False, "in_single_replica_jobs": False}))
    with pytest.raises(ConfigError) as caught:
        choose_run(request(config), store)
    message = str(caught.value)
    assert "stage download starts under bcprun, which the check of bcpp-test-org-bcpp-test-ace" in message
    assert "found missing" in message and "Nothing was submitted or recorded" in message
    assert store.runs() == []


def test_a_profile_changes_what_plan_renders(tmp_path, bcp_env, capsys):
    """The bcprun of this ACE spells its flag `--no_redirect` (its usage, as the probe read it): plan renders that,
    and says which profile it rendered with. Without the profile: NVIDIA's launcher's `-no_redirect`."""
    config = project(tmp_path, "  bcp: {transport: sdk}\n")
    plan = ["--config", str(config), "plan", "demo", "--backend", "bcp"]
    assert main(plan) == 0
    before = capsys.readouterr().out
    assert "bcprun --nnodes 2 --npernode 2 -no_redirect --cmd" in before and "check` found" not in before
    save_profile(
        tmp_path / ".bcp-pipeline",
        KEY,
        profile({"present": True, "in_single_replica_jobs": True, "no_redirect_spelling": "--no_redirect"}),
    )
    assert main(plan) == 0
    after = capsys.readouterr().out
    assert "bcprun --nnodes 2 --npernode 2 --no_redirect --cmd" in after
    assert f"# rendered with what `bcp-pipeline check` found for {KEY}" in after
