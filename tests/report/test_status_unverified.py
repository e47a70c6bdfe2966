"""`status` says where a stage succeeded with nothing checking its outputs (issue 50, item 12h: a stage with no
`verify:` succeeded unverified without a word, where the README says every stage is gated)."""

from __future__ import annotations

from bcp_pipeline.engine.state import JobRecord, RunState, StageState, StageStatus
from bcp_pipeline.report.text import render_status


def test_a_stage_that_succeeded_with_no_verification_shows_none_and_the_legend_says_why():
    verified = StageState(
        status=StageStatus.SUCCEEDED,
        verification={"ok": True, "checks": [{"glob": "a/*", "expected": 2, "found": 2}]},
        jobs=[
            JobRecord(job_id="first.1", kind="stage", attempt=1, submitted_at=0.0, state="succeeded", ended_at=1.0),
            JobRecord(
                job_id="first.verify.1", kind="verify", attempt=1, submitted_at=1.0, state="succeeded", ended_at=2.0
            ),
        ],
    )
    bare = StageState(
        status=StageStatus.SUCCEEDED,
        jobs=[JobRecord(job_id="third.1", kind="stage", attempt=1, submitted_at=2.0, state="succeeded", ended_at=3.0)],
    )
    state = RunState(
        run_id="chain-20261202-000000-0000",
        pipeline="chain",
        backend="local",
        config_file="x",
        created_at=0.0,
        stages={"first": verified, "second": StageState(status=StageStatus.SKIPPED), "third": bare},
    )
    text = render_status(state)
    rows = {
        line.split()[0]: line.split()[-1]
        for line in text.splitlines()
        if line.startswith(("first ", "second ", "third "))
    }
    assert rows == {"first": "2/2", "second": "-", "third": "none"}, text
    assert "none = no `verify:` checks: counted done when its job succeeded, whatever it wrote" in text
    del state.stages["third"]
    assert "no `verify:` checks" not in render_status(state)
