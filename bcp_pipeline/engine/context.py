"""What the orchestrator and its parts (submitter, poller, outcomes) share: one run and what it runs on."""

from __future__ import annotations

from dataclasses import dataclass

from bcp_pipeline.backends.contract import Backend
from bcp_pipeline.config.model import PipelineConfig
from bcp_pipeline.engine.progress import Progress
from bcp_pipeline.engine.state import RunState, RunStore


@dataclass
class RunContext:
    """One run's pipeline, backend, state, the store it is saved to, and where progress goes; the same objects for all.

    The parts change `state` in place. The submitter and the poller save it after every change they make; the
    changes Outcomes makes are saved by the poller that handed it the finished job.
    """

    pipeline: PipelineConfig
    backend: Backend
    store: RunStore
    state: RunState
    progress: Progress
