"""The stall guard's decision (engine/stall_guard.py): when a running training's step count counts as stalled."""

from __future__ import annotations

from types import SimpleNamespace

from bcp_pipeline.backends.contract import Backend, JobProgress
from bcp_pipeline.config.model import StallGuard
from bcp_pipeline.config.typed import Duration
from bcp_pipeline.engine import stall_guard
from bcp_pipeline.engine.stall_guard import StallWatch, observe, reads_progress, stall_limit, stall_reason
from bcp_pipeline.engine.state import JobRecord, RunState, StageState

GUARD = StallGuard(at_least=Duration("10m"), first_step=Duration("1h"))


def running_job(started_at: float = 1000.0) -> JobRecord:
    return JobRecord(
        job_id="7", kind="stage", attempt=1, submitted_at=started_at - 60, state="running", started_at=started_at
    )


def steps(done: int, step_seconds: float | None = None) -> JobProgress:
    return JobProgress(done=done, total=100, unit="steps", loss=2.0, step_seconds=step_seconds)


def test_before_its_first_step_a_job_has_the_first_step_allowance_from_when_it_was_seen_running():
    job = running_job(started_at=1000.0)
    assert stall_reason(GUARD, job, now=1000.0 + 3600) is None
    reason = stall_reason(GUARD, job, now=1000.0 + 3601)
    assert reason == "no step line in 1h00m since it was seen running (limit: stall_guard.first_step 1h)"
    # A job never seen running (queued) is never stalled, however long it waits.
    queued = JobRecord(job_id="8", kind="stage", attempt=1, submitted_at=0.0)
    assert stall_reason(GUARD, queued, now=10**9) is None


def test_the_derived_limit_is_three_times_the_slowest_step_and_at_least_the_floor():
    job = running_job()
    assert observe(job, steps(10, step_seconds=300.0), now=2000.0)  # the training's own step time: 5 minutes
    assert stall_limit(GUARD, job) == (900.0, "3x its slowest step so far (5m00s)")
    assert stall_reason(GUARD, job, now=2000.0 + 900) is None
    assert stall_reason(GUARD, job, now=2000.0 + 901) == (
        "no new step for 15m01s after step 10 (limit: 3x its slowest step so far (5m00s))"
    )
    fast = running_job()
    observe(fast, steps(10, step_seconds=2.0), now=2000.0)
    assert stall_limit(GUARD, fast)[0] == 600.0  # 3 x 2 s is below the floor (a checkpoint save between steps)
    assert stall_reason(GUARD, fast, now=2000.0 + 599) is None
    assert "limit: stall_guard.at_least 10m" in stall_reason(GUARD, fast, now=2000.0 + 601)


def test_the_slowest_step_is_the_longest_wait_between_two_step_lines():
    job = running_job()
    observe(job, steps(10), now=2000.0)  # no step time in the log
    assert job.slowest_step is None
    observe(job, steps(12), now=2000.0 + 800)  # 800 s until the next line (a checkpoint save between them)
    assert job.slowest_step == 800.0
    assert stall_limit(GUARD, job)[0] == 2400.0
    observe(job, steps(20, step_seconds=1.0), now=2000.0 + 808)  # faster later: the slowest stays
    assert job.slowest_step == 800.0
    assert job.advanced_at == 2808.0 and job.steps_seen == 20


def test_a_training_that_logs_every_tenth_step_waits_ten_steps_between_lines():
    """Megatron-Bridge prints a line every `log_interval` steps: 3x one step's time would cancel it between two."""
    job = running_job()
    observe(job, steps(10, step_seconds=100.0), now=2000.0)
    observe(job, steps(20, step_seconds=100.0), now=2000.0 + 400)  # the polls saw it late: its own time is longer
    assert job.slowest_step == 1000.0
    assert stall_reason(GUARD, job, now=2400.0 + 2999) is None
    assert "3x its slowest step so far (16m40s)" in stall_reason(GUARD, job, now=2400.0 + 3001)


def test_a_step_count_that_does_not_grow_is_no_advance():
    job = running_job()
    assert observe(job, steps(10), now=2000.0)
    assert not observe(job, steps(10), now=2500.0)
    assert not observe(job, steps(9), now=2600.0)  # a log tail that shows an older line
    assert not observe(job, None, now=2700.0)  # no progress read this cycle
    assert not observe(job, JobProgress(done=50, total=60, unit="files"), now=2800.0)  # not a training's steps
    assert job.advanced_at == 2000.0
    assert "after step 10" in stall_reason(GUARD, job, now=2000.0 + 601)


def test_a_fixed_limit_replaces_the_derived_one_and_a_disabled_guard_never_stalls():
    job = running_job()
    observe(job, steps(3, step_seconds=500.0), now=2000.0)
    fixed = StallGuard(after=Duration("2m"), first_step=Duration("1h"))
    assert stall_limit(fixed, job) == (120.0, "stall_guard.after 2m")
    assert stall_reason(fixed, job, now=2121.0) is not None
    assert stall_reason(StallGuard(enabled=False), job, now=10**9) is None


def test_what_the_guard_measured_survives_a_restart_of_the_orchestrator():
    job = running_job()
    observe(job, steps(10, step_seconds=300.0), now=2000.0)
    state = RunState(
        run_id="r",
        pipeline="p",
        backend="local",
        config_file="c",
        created_at=0.0,
        stages={"pretrain": StageState(jobs=[job])},
    )
    again = RunState.from_json(state.to_json()).stages["pretrain"].jobs[0]
    assert (again.steps_seen, again.advanced_at, again.slowest_step) == (10, 2000.0, 300.0)
    assert stall_reason(GUARD, again, now=2901.0) == stall_reason(GUARD, job, now=2901.0) is not None


class _NoProgressBackend(Backend):
    """A backend that reads no training's steps (the contract's default `progress`): never guarded."""

    name = "none"

    def sharding(self, request): ...
    def render(self, request): ...
    def submit(self, submission): ...
    def poll(self, job_ids): ...
    def find_active(self, run_id, stage, kind): ...
    def logs(self, job_id, rank=None, tail=None): ...
    def cancel(self, job_ids):
        raise AssertionError("a backend that reads no steps is never asked to cancel")


class _StepsBackend(_NoProgressBackend):
    def progress(self, job_id, *, training=False):
        return None


def test_a_backend_that_reads_no_training_steps_is_never_guarded():
    assert not reads_progress(_NoProgressBackend())
    assert reads_progress(_StepsBackend())
    job = running_job(started_at=0.0)
    state = RunState(
        run_id="r",
        pipeline="p",
        backend="none",
        config_file="c",
        created_at=0.0,
        stages={"pretrain": StageState(jobs=[job])},
    )
    pipeline = SimpleNamespace(stages={"pretrain": SimpleNamespace(stall_guard=GUARD)})
    watch = StallWatch(pipeline=pipeline, backend=_NoProgressBackend(), store=None, state=state, progress=None)
    watch.check("pretrain", job, None, running=True)  # hours past its first-step allowance
    assert job.stall is None


class _SavingStore:
    def __init__(self) -> None:
        self.saves = 0

    def save(self, state) -> None:
        self.saves += 1


class _Events:
    def event(self, text: str) -> None:
        pass


def test_time_a_job_spends_preempted_or_queued_again_does_not_count(monkeypatch):
    """A preempted job resumed hours later is not stalled for the hours it did not run."""
    job = running_job(started_at=1000.0)
    observe(job, steps(10, step_seconds=1.0), now=2000.0)
    state = RunState(
        run_id="r",
        pipeline="p",
        backend="x",
        config_file="c",
        created_at=0.0,
        stages={"pretrain": StageState(jobs=[job])},
    )
    pipeline = SimpleNamespace(stages={"pretrain": SimpleNamespace(stall_guard=GUARD)})
    watch = StallWatch(
        pipeline=pipeline, backend=_StepsBackend(), store=_SavingStore(), state=state, progress=_Events()
    )
    clock = [2000.0 + 7200]  # preempted for two hours
    monkeypatch.setattr(stall_guard.time, "time", lambda: clock[0])
    watch.check("pretrain", job, None, running=False)
    assert job.advanced_at == 2000.0 + 7200 and job.stall is None
    clock[0] += 599  # running again, within the floor
    watch.check("pretrain", job, None, running=True)
    assert job.stall is None
    assert "after step 10" in stall_reason(GUARD, job, now=2000.0 + 7200 + 601)
