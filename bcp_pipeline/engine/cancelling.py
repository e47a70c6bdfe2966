"""Cancelling a run: ask the service what its jobs did first, then stop only what still runs.

A job the saved state calls active may have ended since that state was saved (a stage boundary, a detached
driver's last snapshot). Recorded as "cancelled", a job that succeeded would contradict the service and be run
again on resume; so each one is polled first, and one that ended is recorded as it ended, its stage moved on as
the orchestrator would have moved it (a finished stage job whose stage is verified: cancelled while verifying,
which a resume verifies again, no more). Only the jobs still unfinished are cancelled.

A run another orchestrator drives (its lock held) is stopped by that orchestrator: `cancel` leaves a request in
the run folder (`CANCEL_REQUEST`), which the orchestrator looks for before every submission and after every
cycle. It stops its jobs as above, records the run cancelled, writes what it did (`CANCEL_DONE`) and exits, so
that no stage is submitted after the cancel and `cancel` says what really happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from bcp_pipeline.atomic import atomic_write_json, atomic_write_text
from bcp_pipeline.engine.context import RunContext
from bcp_pipeline.engine.outcomes import Outcomes
from bcp_pipeline.engine.poller import Poller
from bcp_pipeline.engine.stall_guard import StallWatch
from bcp_pipeline.engine.state import RunState
from bcp_pipeline.errors import BackendCallError

CANCEL_REQUEST = "cancel-requested"  # in the run folder: `cancel` asks the orchestrator driving the run to stop
CANCEL_DONE = "cancel-done.json"  # in the run folder: what that orchestrator stopped (a CancelOutcome)


@dataclass(kw_only=True)
class CancelOutcome:
    """What a cancel did: the jobs it stopped, those it found already ended (job id -> their end), and why the
    service could not be asked, where it could not (the recorded jobs were then cancelled as recorded)."""

    stopped: list[str] = field(default_factory=list)
    ended: dict[str, str] = field(default_factory=dict)
    unasked: str | None = None

    def describe(self) -> str:
        """`3000010 stopped; 3000009 had already ended (succeeded)`: what a person reads."""
        parts = [
            f"{len(self.stopped)} job(s) stopped ({', '.join(self.stopped)})"
            if self.stopped
            else "no job was still running"
        ]
        parts += [f"{job_id} had already ended ({end})" for job_id, end in self.ended.items()]
        if self.unasked:
            parts.append(f"(the service could not be asked how its jobs ended: {self.unasked})")
        return "; ".join(parts)


class QuietProgress:
    """A cancel's progress: the events of the jobs it finds ended are kept, not printed (CancelOutcome says it)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def started(self, state: RunState, state_file: Path) -> None:
        pass

    def event(self, text: str) -> None:
        self.events.append(text)

    def update(self, state: RunState, final: bool = False) -> None:
        pass


def stop_jobs(run: RunContext, poller: Poller | None = None) -> CancelOutcome:
    """Poll the run's active jobs, record those that ended as they ended, cancel the rest, and mark every stage not
    done cancelled; the state is saved. The caller drives the run (holds its lock) or has taken it back."""
    if poller is None:
        shared = {f.name: getattr(run, f.name) for f in fields(RunContext)}
        poller = Poller(**shared, outcomes=Outcomes(**shared), stall_watch=StallWatch(**shared))
    outcome = CancelOutcome()
    waiting = poller.active_jobs()
    statuses = {}
    if waiting:
        try:
            statuses = run.backend.poll(list(waiting))
        except (BackendCallError, OSError) as exc:
            outcome.unasked = " ".join(str(exc).split())[:300]
    for job_id, (name, job) in waiting.items():
        status = statuses.get(job_id)
        if status is not None and status.state.finished:
            poller.handle(name, job, status)  # its stage moves on as the orchestrator would have moved it
            outcome.ended[job_id] = status.native or status.state.value
    outcome.stopped = [job_id for job_id in waiting if job_id not in outcome.ended]
    if outcome.stopped:
        run.backend.cancel(outcome.stopped)
    run.state.mark_cancelled()
    run.store.save(run.state)
    return outcome


# -- the request to the orchestrator driving the run ---------------------------------------------------------------
def request_cancel(run_dir: Path) -> None:
    atomic_write_text(run_dir / CANCEL_REQUEST, f"{os.getpid()} {time.time():.3f}\n")


def cancel_requested(run_dir: Path) -> bool:
    return (run_dir / CANCEL_REQUEST).exists()


def clear_request(run_dir: Path) -> None:
    """A run driven again starts with no request: one left by a cancel whose orchestrator died before it saw it is
    older than this `run`/`resume`, which is the user's latest word."""
    with contextlib.suppress(FileNotFoundError):
        (run_dir / CANCEL_REQUEST).unlink()


def answer_request(run_dir: Path, outcome: CancelOutcome) -> None:
    """The orchestrator's answer: what it stopped, then the request removed (`cancel` waits for that)."""
    atomic_write_json(run_dir / CANCEL_DONE, asdict(outcome))
    clear_request(run_dir)


def wait_for_answer(run_dir: Path, seconds: float, sleep=time.sleep) -> CancelOutcome | None:
    """The orchestrator's CancelOutcome once it removed the request; None after `seconds` without an answer (the
    request stays: that orchestrator stops when it next looks)."""
    deadline = time.monotonic() + seconds
    while cancel_requested(run_dir):
        if time.monotonic() > deadline:
            return None
        sleep(0.1)
    try:
        payload = json.loads((run_dir / CANCEL_DONE).read_text(encoding="utf-8"))
        (run_dir / CANCEL_DONE).unlink()
    except (FileNotFoundError, ValueError):
        return CancelOutcome(unasked="the orchestrator stopped without saying what it stopped")
    return CancelOutcome(**payload)
