"""`bcp-pipeline check` under the NGC API EMULATOR's variants of the real service (tests/fakes/README.md
"Variants"), once per transport: each variant reported as it is, saved in the profile, and what the backend then
renders or refuses because of it."""

from __future__ import annotations

import json

import pytest
from support.bcp_emulation import needs_ngcsdk
from support.check_fixtures import checked

from bcp_pipeline.cli.main import main
from bcp_pipeline.engine.selection import RunRequest, choose_run
from bcp_pipeline.engine.state import RunStore

pytestmark = needs_ngcsdk


@pytest.mark.emulator(variants={"commandline": "launcher"})
def test_a_commandline_run_once_on_the_launcher_node(tmp_path, fake):
    _, rows, result = checked(tmp_path, fake)
    assert rows["replicas"].verdict.value == "ok" and "once, on the launcher node" in rows["replicas"].showed
    assert rows["bcprun"].verdict.value == "ok", rows["bcprun"]  # bcprun fans out: both ranks, each its own
    assert "0/4, 1/4, 2/4, 3/4" in rows["bcprun"].showed  # demo's download: --npernode 2 on the probe's 2 nodes
    assert result.facts["probe"]["commandline_runs"] == "launcher"


@pytest.mark.emulator(variants={"bcprun_in_single_replica_jobs": False})
def test_no_bcprun_in_one_replica_jobs_is_recorded_and_concat_renders_without_it(tmp_path, fake, capsys):
    config, rows, result = checked(tmp_path, fake)
    assert result.facts["probe"]["bcprun"]["in_single_replica_jobs"] is False
    assert "absent in a one-replica job" in rows["bcprun"].showed
    assert "the renderer does not use it there" in rows["bcprun"].meaning
    capsys.readouterr()
    assert (
        main(["--config", str(config), "plan", "demo", "--backend", "bcp", "--json", "--set", "concat.bcp.processes=4"])
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    concat = next(job for job in plan["jobs"] if job["stage"] == "concat" and job["kind"] == "stage")
    assert "bcprun" not in concat["spec"]["commandline"] and "WORLD_SIZE=4" in concat["spec"]["commandline"]
    run = RunRequest(
        pipeline="demo",
        config_file=config,
        backend="bcp",
        overrides=["concat.bcp.processes=4"],
        from_stage=None,
        only=None,
        restart=False,
        detach=False,
    )
    choose_run(run, RunStore(config.parent / ".bcp-pipeline"))  # not refused: concat does not need bcprun
