"""Drive one run: submit stages whose needs are met, poll all active jobs in one call, verify, gate, persist.

The state file is saved after every change, so the orchestrator can die at any point (SIGKILL, Ctrl-C) and
`resume` picks up: jobs still running are re-attached, a stage caught between "submitting" and "submitted" is
looked up by its labels instead of being submitted twice.

`Orchestrator.drive` is the loop; the work is done by three collaborators sharing the run state:
submitter.py (what is due, and submitting it), poller.py (job statuses into the state) and outcomes.py (what a
finished job means for its stage); stall_guard.py cancels a training that stopped advancing; streams.py stops a
streamed downstream whose upstream failed. A `cancel` from another process is a request file it looks for before
every submission and while it waits between cycles (cancelling.py): it then stops the run itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from bcp_pipeline.engine.cancelling import answer_request, cancel_requested, stop_jobs
from bcp_pipeline.engine.context import RunContext
from bcp_pipeline.engine.outcomes import Outcomes
from bcp_pipeline.engine.poller import Poller
from bcp_pipeline.engine.stall_guard import StallWatch
from bcp_pipeline.engine.streams import Streams
from bcp_pipeline.engine.submitter import Submitter
from bcp_pipeline.errors import StateError

CANCEL_LOOK_SECONDS = 0.5  # while waiting between cycles, how often a cancel request is looked for


@dataclass
class Orchestrator(RunContext):
    """Drives the selected stages of one run to the end, with a back-off between cycles that do nothing."""

    selected: set[str] = field(default_factory=set)  # stages this invocation may submit
    sleep: Callable[[float], None] = time.sleep
    should_stop: Callable[[], bool] = lambda: False  # asked after each cycle: a detached driver's hand-over time
    stopped: bool = field(default=False, init=False)  # drive() returned because should_stop said so
    cancelled: bool = field(default=False, init=False)  # drive() returned because `cancel` asked it to
    submitter: Submitter = field(init=False)
    poller: Poller = field(init=False)
    streams: Streams = field(init=False)

    def __post_init__(self) -> None:
        run = {f.name: getattr(self, f.name) for f in fields(RunContext)}  # the same objects, shared by all parts
        outcomes = Outcomes(**run)
        self.submitter = Submitter(**run, outcomes=outcomes, selected=self.selected, stop_asked=self.cancel_asked)
        self.poller = Poller(**run, outcomes=outcomes, stall_watch=StallWatch(**run))
        self.streams = Streams(**run)

    def drive(self) -> bool:
        """Run until every selected stage is done or one fails; True if all succeeded."""
        self.check_sharding()
        self.backend.prepare(self.pipeline, execute=True)
        delay = self.backend.poll_min_seconds
        while True:
            changed = self.submitter.submit_ready()  # it stops before a submission once a cancel is asked
            if self.cancel_asked():
                return self.cancel_now()
            waiting = self.poller.active_jobs()
            if not waiting and not self.submitter.anything_due():
                break
            if waiting:
                changed |= self.poller.poll_once(waiting)
                changed |= self.streams.stop_orphans()  # a streamed downstream of a stage that just failed
            self.progress.update(self.state)
            if self.should_stop():  # at a cycle's end: never between a submit call and recording its job id
                self.stopped = True
                return False
            delay = self.backend.poll_min_seconds if changed else min(delay * 1.5, self.backend.poll_max_seconds)
            self.nap(delay)
        for reason in self.submitter.blocked():  # else "fix the cause above" would have nothing above it
            self.progress.event(reason)
        self.progress.update(self.state, final=True)
        return all(self.state.stages[name].status.done for name in self.selected)

    def cancel_asked(self) -> bool:
        return cancel_requested(self.store.run_dir(self.state.run_id))

    def cancel_now(self) -> bool:
        """`cancel` asked this orchestrator to stop: its jobs stopped (those that ended recorded as they ended), the
        run recorded cancelled, and what was done left for `cancel` to say."""
        outcome = stop_jobs(self, self.poller)
        answer_request(self.store.run_dir(self.state.run_id), outcome)
        self.progress.event(f"cancelled by `bcp-pipeline cancel`: {outcome.describe()}")
        self.progress.update(self.state, final=True)
        self.cancelled = True
        return False

    def nap(self, seconds: float) -> None:
        """The wait between cycles, cut short by a cancel request (the loop then stops the run)."""
        end = time.monotonic() + seconds
        while not self.cancel_asked() and (left := end - time.monotonic()) > 0:
            self.sleep(min(left, CANCEL_LOOK_SECONDS))

    def check_sharding(self) -> None:
        """Refuse to resume a partly-run stage with a different replicas x processes, unless it can re-shard."""
        for name in self.selected:
            stage_state = self.state.stages[name]
            stage = self.pipeline.stages[name]
            if stage_state.sharding is None or stage_state.status.done or stage.reshardable:
                continue
            now = self.backend.sharding(self.submitter.request(name, "stage"))
            if now != stage_state.sharding:
                raise StateError(
                    f"stage {name!r} started with {_sharding_text(stage_state.sharding)} and is now configured for "
                    f"{_sharding_text(now)}; its finished shards were assigned by rank, so re-sharding could skip or "
                    f"redo work. Restore the old sharding, mark the stage `reshardable: true` if its program "
                    f"tolerates it, or start over with --restart"
                )


def _sharding_text(sharding: dict[str, int]) -> str:
    return f"{sharding['replicas']} replica(s) x {sharding['processes']} process(es)"
