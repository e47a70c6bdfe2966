"""The seeded chaos monkey: kills at random moments, and a loopback HTTP source that misbehaves at random.

Everything random comes from one `random.Random(seed)`, so a seed fixes the sequence of choices (which kind of
target next, how long to wait, which request gets which fault); what a kill hits still depends on timing.
What can be killed is the backend's business (tests/support/chaos_backends.py): each backend lists its live targets of a
kind (`rank`, `verify`, `supervisor`, `orchestrator`, `job-kill`, `preempt`, `lost`, `scancel`, ...).
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from support.http_faults import Fault, FaultServer

# What the HTTP source does instead of a good answer, with Retry-After 0 so a 429 costs no wall time.
HTTP_FAULTS: dict[str, Fault] = {
    "429": Fault.too_many(retry_after="0"),
    "500": Fault.error(500),
    "drop": Fault.drop(),  # half the body, then a TCP reset
    "short": Fault.short(),  # half the body, then a clean close: shorter than its Content-Length
}


class ChaosHttpSource(FaultServer):
    """A real loopback HTTP server over a mirror folder: each request gets a random fault with probability `rate`."""

    def __init__(self, root: Path, rng: random.Random, rate: float, kinds: list[str] | None = None) -> None:
        super().__init__(root)
        self.rng = rng
        self.rate = rate
        self.kinds = sorted(kinds or HTTP_FAULTS)
        self.injected: collections.Counter[str] = collections.Counter()

    def choose(self, path: str, host: str, authorization: str | None) -> Fault | None:
        scripted = super().choose(path, host, authorization)
        if scripted is not None:
            return scripted
        with self._lock:  # handler threads share the generator: one draw at a time keeps the seed meaningful
            if not self.kinds or self.rng.random() >= self.rate:
                return None
            kind = self.rng.choice(self.kinds)
            self.injected[kind] += 1
            return HTTP_FAULTS[kind]

    @property
    def retried_requests(self) -> int:
        """Requests beyond the first for each path: what the faults (and killed downloads) cost in requests."""
        return sum(self.requests.values()) - len(self.requests)


@dataclass(frozen=True)
class Target:
    """One thing that can be hit now: `kill()` does it, `name` says what it was."""

    kind: str
    name: str
    kill: Callable[[], None]


@dataclass
class KillRecord:
    at: float  # seconds since the chaos run started
    kind: str
    name: str


@dataclass
class Monkey:
    """Decides when and what to hit next. `tick()` is called often; it kills when a kill is due and a target exists.

    Kinds come in shuffled rounds (every kind once, in a random order), so any `total` >= len(kinds) hits every
    kind. After a kill it waits `gap` seconds (uniform) before the next; a kind with no target for `patience`
    seconds goes to the back of the queue (a verification job may not come up again for a while).
    """

    rng: random.Random
    kinds: list[str]
    total: int
    gap: tuple[float, float] = (0.3, 2.0)
    patience: float = 4.0
    started: float = field(default_factory=time.monotonic)
    kills: list[KillRecord] = field(default_factory=list)
    _queue: list[str] = field(default_factory=list)
    _due: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._plan_next(time.monotonic())

    @property
    def done(self) -> bool:
        return len(self.kills) >= self.total

    def _plan_next(self, now: float) -> None:
        if self._queue:
            self._queue.pop(0)
        if not self._queue:
            self._queue = list(self.kinds)
            self.rng.shuffle(self._queue)
        self._due = now + self.rng.uniform(*self.gap)

    def tick(self, targets_of: Callable[[str], list[Target]]) -> KillRecord | None:
        """Kill one target of the planned kind if it is due and one is there; returns what was done."""
        now = time.monotonic()
        if self.done or now < self._due:
            return None
        targets = sorted(targets_of(self._queue[0]), key=lambda t: t.name)
        if not targets:
            if now - self._due > self.patience and len(self._queue) > 1:
                self._queue.append(self._queue.pop(0))  # later: another kind may be there now
                self._due = now
            return None
        victim = self.rng.choice(targets)
        try:
            victim.kill()
        except ProcessLookupError:
            return None  # it ended on its own between the listing and the kill: try again next tick
        record = KillRecord(at=now - self.started, kind=victim.kind, name=victim.name)
        self.kills.append(record)
        self._plan_next(now)
        return record

    def counts(self) -> collections.Counter[str]:
        return collections.Counter(k.kind for k in self.kills)
