"""Drive one run: submit stages whose needs are met, poll all active jobs in one call, verify, gate, persist.

The state file is saved after every change, so the orchestrator can die at any point (SIGKILL, Ctrl-C) and
`resume` picks up: jobs still running are re-attached, a stage caught between "submitting" and "submitted" is
looked up by its labels instead of being submitted twice.

`Orchestrator.drive` is the loop; the work is done by three collaborators sharing the run state:
submitter.py (what is due, and submitting it), poller.py (job statuses into the state) and outcomes.py (what a
finished job means for its stage); streams.py stops a streamed downstream whose upstream failed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from collections.abc import Callable

from bcp_pipeline.engine.context import RunContext
from bcp_pipeline.engine.outcomes import Outcomes
from bcp_pipeline.engine.poller import Poller
from bcp_pipeline.engine.streams import Streams
from bcp_pipeline.engine.submitter import Submitter
from bcp_pipeline.errors import StateError


@dataclass
class Orchestrator(RunContext):
    """Drives the selected stages of one run to the end, with a back-off between cycles that do nothing."""

    selected: set[str] = field(default_factory=set)  # stages this invocation may submit
    sleep: Callable[[float], None] = time.sleep
    should_stop: Callable[[], bool] = lambda: False  # asked after each cycle: a detached driver's hand-over time
    stopped: bool = field(default=False, init=False)  # drive() returned because should_stop said so
    submitter: Submitter = field(init=False)
    poller: Poller = field(init=False)
    streams: Streams = field(init=False)

    def __post_init__(self) -> None:
        run = {f.name: getattr(self, f.name) for f in fields(RunContext)}  # the same objects, shared by all parts
        outcomes = Outcomes(**run)
        self.submitter = Submitter(**run, outcomes=outcomes, selected=self.selected)
        self.poller = Poller(**run, outcomes=outcomes)
        self.streams = Streams(**run)

    def drive(self) -> bool:
        """Run until every selected stage is done or one fails; True if all succeeded."""
        self.check_sharding()
        self.backend.prepare(self.pipeline, execute=True)
        delay = self.backend.poll_min_seconds
        while True:
            changed = self.submitter.submit_ready()
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
            self.sleep(delay)
        self.progress.update(self.state, final=True)
        return all(self.state.stages[name].status.done for name in self.selected)

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
                    f"tolerates it, or start over with --restart")


def _sharding_text(sharding: dict[str, int]) -> str:
    return f"{sharding['replicas']} replica(s) x {sharding['processes']} process(es)"
