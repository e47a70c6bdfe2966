"""The machine-readable lines a stage prints for the orchestrator (`##bcp-pipeline KIND {json}` on stdout), its
progress counts among them, and the failure report that ends a rank short of its shard.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO

LINE_PREFIX = "##bcp-pipeline "


def emit(kind: str, payload: dict, stream: IO[str] | None = None) -> None:
    """Print one machine-readable line for the orchestrator."""
    out = sys.stdout if stream is None else stream
    out.write(f"{LINE_PREFIX}{kind} {json.dumps(payload, sort_keys=True)}\n")
    out.flush()


class Progress:
    """Reports `done of total` at most every `interval` seconds, at the end, and when the rank fails short of the
    end (fail_with_items): the orchestrator shows a rank's last reported count, which would otherwise be the one of
    up to `interval` seconds before (`1/8 files` after seven of eight were written)."""

    latest: Progress | None = None  # this process's rank's, for fail_with_items

    def __init__(self, total: int, rank: int, unit: str = "files", interval: float = 2.0) -> None:
        self.total, self.rank, self.unit, self.interval = total, rank, unit, interval
        self.done = 0
        self._last = 0.0
        self._reported: int | None = None
        Progress.latest = self

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if now - self._last >= self.interval or self.done >= self.total:
            self._last = now
            self.report()

    def report(self) -> None:
        emit("progress", {"done": self.done, "total": self.total, "rank": self.rank, "unit": self.unit})
        self._reported = self.done

    def report_if_behind(self) -> None:
        if self._reported != self.done:
            self.report()


def fail_with_items(stage: str, failures: dict[str, str]) -> int:
    """Print every failed item with its reason and return the exit code to use (never 0 with a hole)."""
    if Progress.latest is not None:
        try:
            Progress.latest.report_if_behind()
        except OSError:  # a log on the full disk: the failures below still go to stderr
            pass
    print(f"{stage}: {len(failures)} item(s) could not be completed:", file=sys.stderr)
    for item, reason in sorted(failures.items()):
        print(f"  {item}: {reason}", file=sys.stderr)
    return 1
