"""Streamed edges in a run (`needs: [{stage: X, stream: true}]`, config/needs.py): when the downstream may start,
when it may be verified, and stopping it when its upstream fails.

- The downstream's job is submitted once the upstream's job is (RUNNING, VERIFYING, or done): its ranks take each
  output group as soon as the upstream's completion records say every input of the group is complete.
- Its verification waits for the upstream's: the upstream's outputs counted complete, nothing is declared done on
  partial input, even where the downstream's job ended first.
- An upstream that fails or is cancelled leaves the downstream waiting for inputs that will not come: its job is
  cancelled and the stage marked cancelled, naming the upstream. A resume runs both again; each skips what it
  finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bcp_pipeline.backends.contract import JobState
from bcp_pipeline.config.model import PipelineConfig
from bcp_pipeline.engine.context import RunContext
from bcp_pipeline.engine.state import RunState, StageStatus
from bcp_pipeline.errors import BackendCallError

# An upstream in one of these has a job submitted (or done): a streamed downstream may start beside it.
STARTED = (StageStatus.RUNNING, StageStatus.VERIFYING)
STOPPED = (StageStatus.FAILED, StageStatus.CANCELLED)


def need_met(pipeline: PipelineConfig, state: RunState, name: str, need: str) -> bool:
    """Whether stage `name`'s need `need` lets it start: done, or started where the edge is streamed."""
    status = state.stages[need].status
    return status.done or (need in pipeline.stages[name].streamed and status in STARTED)


def unverified_upstreams(pipeline: PipelineConfig, state: RunState, name: str) -> list[str]:
    """The streamed upstreams of `name` not done yet: its verification waits for them."""
    return [need for need in pipeline.stages[name].streamed if not state.stages[need].status.done]


@dataclass
class Streams(RunContext):
    """Stops a streamed downstream whose upstream failed, so it does not wait for inputs that will not come."""

    def stop_orphans(self) -> bool:
        """Cancel the job of each running stage whose streamed upstream failed or was cancelled; True on a change.
        A failing cancel call is tried again next cycle."""
        changed = False
        for name in self.pipeline.order():
            stage_state = self.state.stages[name]
            stopped = [
                need for need in self.pipeline.stages[name].streamed if self.state.stages[need].status in STOPPED
            ]
            job = stage_state.active_job()
            if not stopped or job is None or job.kind != "stage":
                continue
            try:
                self.backend.cancel([job.job_id])
            except (BackendCallError, OSError) as exc:
                self.progress.event(
                    f"{name}: cancelling job {job.job_id} after {stopped[0]} stopped failed ({exc}); trying again"
                )
                continue
            upstream = stopped[0]
            reason = f"{upstream} {self.state.stages[upstream].status.value}"
            job.state, job.ended_at = JobState.CANCELLED.value, time.time()
            job.detail = f"cancelled: it streams from {reason}"
            stage_state.status = StageStatus.CANCELLED
            stage_state.error = (
                f"stopped because {reason}, whose outputs it was taking as they landed; a resume "
                "runs both again, each skipping what it finished"
            )
            self.progress.event(f"{name}: {stage_state.error}")
            changed = True
        if changed:
            self.store.save(self.state)
        return changed
