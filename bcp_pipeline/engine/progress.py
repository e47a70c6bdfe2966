"""How the engine tells what happens while it drives a run: an interface of its own, implemented by its callers.

The engine never prints. The command line passes `report.text.Reporter` (timestamped events and progress lines on
the terminal); a detached driver passes the same printer into its job log; tests may pass anything with these
three methods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from bcp_pipeline.engine.state import RunState


class Progress(Protocol):
    """Told when a run starts being driven, of each event, and of the run state after every cycle."""

    def started(self, state: RunState, state_file: Path) -> None:
        """The run's lock is held and its state saved: driving begins."""

    def event(self, text: str) -> None:
        """Something happened: a submission, a job's end, a verification, a retry."""

    def update(self, state: RunState, final: bool = False) -> None:
        """The run after a cycle (`final`: after the last one)."""
