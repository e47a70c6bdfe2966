"""A run between two stages (one succeeded, none active yet) is running, not pending (issue 50, item 12a: `status`
of a detached run being driven showed `status pending` between stages)."""

from __future__ import annotations

from bcp_pipeline.engine.state import RunState, StageState, StageStatus


def run_of(*statuses: StageStatus) -> RunState:
    return RunState(
        run_id="chain-20261202-000000-0000",
        pipeline="chain",
        backend="local",
        config_file="x",
        created_at=0.0,
        stages={f"s{i}": StageState(status=s) for i, s in enumerate(statuses)},
    )


def test_a_run_between_two_stages_is_running_and_one_not_started_is_pending():
    assert run_of(StageStatus.SUCCEEDED, StageStatus.PENDING).status == "running"
    assert run_of(StageStatus.SKIPPED, StageStatus.PENDING).status == "pending"  # --from: nothing ran yet
    assert run_of(StageStatus.PENDING, StageStatus.PENDING).status == "pending"
    assert run_of(StageStatus.SUCCEEDED, StageStatus.RUNNING).status == "running"
    assert run_of(StageStatus.SUCCEEDED, StageStatus.SKIPPED).status == "succeeded"
