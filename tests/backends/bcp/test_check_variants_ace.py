"""`bcp-pipeline check` under the NGC API EMULATOR's variants of the ACE and its job list (tests/fakes/README.md
"Variants"), once per transport: the termination grace, the ACE's limits, a lagging list, a server clock ahead or
behind; each reported, saved in the profile, and what the backend then does with it."""

from __future__ import annotations

import pytest
from support.bcp_emulation import needs_ngcsdk
from support.check_fixtures import checked

from bcp_pipeline.backends.registry import make_backend
from bcp_pipeline.config.load import load_config
from bcp_pipeline.engine.selection import RunRequest, choose_run
from bcp_pipeline.engine.state import RunStore
from bcp_pipeline.errors import ConfigError

pytestmark = needs_ngcsdk


@pytest.mark.emulator(variants={"ace": {"terminationGracePeriodSeconds": 2}})
def test_a_kill_through_pending_termination_is_timed(tmp_path, fake):
    _, rows, result = checked(tmp_path, fake)
    assert rows["kill"].verdict.value == "ok", rows["kill"]
    assert "PENDING_TERMINATION -> KILLED_BY_USER" in rows["kill"].showed
    assert result.facts["probe"]["pending_termination"] is True
    assert result.facts["probe"]["kill_seconds"] >= 2.0
    assert result.facts["ace"]["terminationGracePeriodSeconds"] == 2


@pytest.mark.emulator(variants={"ace": {"maxRuntimeSeconds": 1800, "maxActiveJobsPerUser": 1}})
def test_ace_limits_from_the_policy_and_run_refused_by_the_profile(tmp_path, fake):
    fake.set_secret("bcp-pipeline-ngc", {"api_key": "x" * 12})
    config, rows, _ = checked(tmp_path, fake, jobs=False, detach=True)
    limits = rows["ace limits"]
    assert limits.verdict.value == "different"
    assert "maxRuntimeSeconds allows 30M (1800 s), but sample: total_runtime 1H (3600 s)" in limits.showed
    assert "--set sample.bcp.total_runtime=30M" in limits.meaning  # admission.py's fix
    assert "maxActiveJobsPerUser" in limits.showed  # the --detach driver and one stage job at once
    run = RunRequest(
        pipeline="demo",
        config_file=config,
        backend="bcp",
        overrides=[],
        from_stage=None,
        only=None,
        restart=False,
        detach=False,
    )
    with pytest.raises(ConfigError, match="maxRuntimeSeconds allows 30M.*as the check of"):
        choose_run(run, RunStore(config.parent / ".bcp-pipeline"))
    assert RunStore(config.parent / ".bcp-pipeline").runs() == []


@pytest.mark.emulator(variants={"list_lag_seconds": 2})
def test_a_lagging_job_list_is_measured_and_the_backend_waits_for_it(tmp_path, fake):
    config, rows, result = checked(tmp_path, fake)
    assert rows["labels"].verdict.value == "ok", rows["labels"]
    lag = result.facts["probe"]["list_lag_seconds"]
    # measured from when `job run` returned: the service created the job (and the lag's 2 s began) a little before
    assert lag > 1 and f"listed after {lag:.1f} s" in rows["labels"].showed
    backend = make_backend(
        "bcp",
        load_config(config),
        load_config(config).pipeline("demo"),
        config.parent / ".bcp-pipeline" / "runs" / "demo-RUN",
    )
    assert backend.lookup_grace_seconds >= 2 * lag  # crash recovery looks a just-submitted job up that long


@pytest.mark.parametrize("skew", [600, -600])
def test_a_server_clock_ahead_or_behind_is_measured_and_every_probe_job_still_listed(tmp_path, fake, skew):
    fake.set_variants(clock_skew_seconds=skew)
    _, rows, result = checked(tmp_path, fake)
    clock = rows.pop("clock")
    assert clock.verdict.value == "different", clock
    assert abs(result.facts["probe"]["clock_skew_seconds"] - skew) < 10  # less the time `job run` took
    assert ("s ahead of this machine's clock" if skew > 0 else "s behind this machine's clock") in clock.showed
    assert "new jobs are still listed (the labels row)" in clock.meaning
    # the job list's window reaches past our clock as the backend's does: both probe jobs found by their label
    assert "listed 2 of 2 probe jobs" in rows["labels"].showed
    not_ok = {topic: row.verdict.value for topic, row in rows.items() if row.verdict.value != "ok"}
    # the test ngc is ngcsdk's CLI code, which has no `version` command (the standalone CLI's)
    assert not_ok == ({} if fake.transport == "sdk" else {"client version": "could not check"}), not_ok
