"""What every backend's `check` (bcp-pipeline check) shares: its input, its rows and outcome, and the probe jobs'
plumbing (waiting with back-off, clean-up however the check ends, the `BCPP-` lines they print).

A row is never "ok" by default: a value the check does not recognise (an env var value, a status, a field) is
DIFFERENT, and a question the service did not answer is UNCHECKED with the reason.

The check wing (check/run.py) builds the CheckInput, with the parts only the wings above the backends have (the
engine's planned jobs, the report's sizes, detach's driver job), and dispatches through the registry to the
backend's `check_service` hook.
"""

from __future__ import annotations

import enum
import re
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bcp_pipeline.backends.contract import Backend, Submission
from bcp_pipeline.config.model import Config, PipelineConfig

T = TypeVar("T")


class Verdict(enum.Enum):
    OK = "ok"
    DIFFERENT = "different"
    UNCHECKED = "could not check"


@dataclass(frozen=True, kw_only=True)
class Row:
    """What the orchestrator assumes / what this service showed / the verdict / what it means and what to do."""

    topic: str  # short and stable, e.g. "python", "partition time", "ace instances": for --json readers and tests
    assumes: str
    showed: str
    verdict: Verdict
    meaning: str = ""

    def as_json(self) -> dict[str, str]:
        return {
            "topic": self.topic,
            "assumes": self.assumes,
            "showed": self.showed,
            "verdict": self.verdict.value,
            "meaning": self.meaning,
        }


def ok(topic: str, assumes: str, showed: str, meaning: str = "") -> Row:
    return Row(topic=topic, assumes=assumes, showed=showed, verdict=Verdict.OK, meaning=meaning)


def different(topic: str, assumes: str, showed: str, meaning: str) -> Row:
    return Row(topic=topic, assumes=assumes, showed=showed, verdict=Verdict.DIFFERENT, meaning=meaning)


def unchecked(topic: str, assumes: str, why: str, meaning: str = "") -> Row:
    return Row(topic=topic, assumes=assumes, showed=why, verdict=Verdict.UNCHECKED, meaning=meaning)


@dataclass(kw_only=True)
class CheckInput:
    """What a backend's check reads: the config, the pipeline (when one was named), its jobs as `plan` renders
    them, the bytes it will leave in the workspace, and where state lives. The jobs, the backend and the sizes are
    made on first use, by the functions the check wing gives (a check of the service alone needs none of them)."""

    config: Config
    pipeline: PipelineConfig | None  # None: only the service is checked, no per-stage rows
    backend_name: str
    state_root: Path
    environ: Mapping[str, str]
    jobs: bool = True  # probe jobs allowed (`--no-jobs`: False)
    detach: bool = False  # judge the service also for `run --detach`'s driver job
    detach_driver: Any = None  # with `detach`: the driver job `run --detach` adds (on BCP, its JobSpec)
    announce: Callable[[str], None] = lambda line: None  # says what is about to cost something (probe jobs)
    make_backend: Callable[[], Backend] | None = None
    render_jobs: Callable[[], list[Submission]] = list
    sizes: Callable[[], tuple[float, list[str]]] = lambda: (0.0, [])
    _submissions: list[Submission] | None = field(default=None, repr=False)

    def backend(self) -> Backend:
        assert self.make_backend is not None, "a backend is made only for a named pipeline"
        return self.make_backend()

    def submissions(self) -> list[Submission]:
        """Every job of the pipeline rendered as `plan` renders it (the backend's pure renderer); [] without one."""
        if self._submissions is None:
            self._submissions = self.render_jobs() if self.pipeline is not None else []
        return self._submissions

    def declared_bytes(self) -> tuple[float, list[str]]:
        """Bytes the pipeline's stages leave in the workspace, and the stages that add them; (0, []) where the
        pipeline declares no sizes."""
        return self.sizes() if self.pipeline is not None else (0.0, [])


@dataclass(kw_only=True)
class CheckOutcome:
    """What one backend's check found: saved as the profile named `profile_parts` (backends/profile.py)."""

    target: dict[str, str]  # what was checked, e.g. {"org": ..., "ace": ...}
    profile_parts: tuple[str, str]  # the profile's name, e.g. (org, ace) or ("slurm", cluster)
    rows: list[Row]
    facts: dict[str, Any] = field(default_factory=dict)  # what the backend may adapt to
    notes: list[str] = field(default_factory=list)  # printed before the table (e.g. what probe jobs cost)


def poll_until(
    ask: Callable[[], T | None],
    timeout: float,
    *,
    first_delay: float = 0.2,
    max_delay: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T | None:
    """Ask until the answer is not None, waiting 1.5 times longer after each None (up to `max_delay`); the
    answer, or None once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    delay = first_delay
    while time.monotonic() < deadline:
        answer = ask()
        if answer is not None:
            return answer
        sleep(delay)
        delay = min(delay * 1.5, max_delay)
    return None


@contextmanager
def always_cleaned_up(cleanup: Callable[[], None]) -> Iterator[None]:
    """Clean-up that runs however a check ends: an answer, an error, Ctrl-C or SIGTERM. Inside, SIGTERM raises
    KeyboardInterrupt as Ctrl-C does, so both unwind through `cleanup`; while it runs a further SIGTERM is ignored
    (a second Ctrl-C still stops the process: the user insists)."""
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            cleanup()
        finally:
            signal.signal(signal.SIGTERM, previous)


class ProbeJob:
    """A probe job's id, once the service has answered its submission."""

    id: str | None = None


@contextmanager
def removed_at_exit(remove: Callable[[ProbeJob], None]) -> Iterator[ProbeJob]:
    """Whatever ends the block, `remove(job)` runs: by the job's id where the service answered, and otherwise by
    whatever else names it (the interrupt may come before the answer)."""
    job = ProbeJob()
    with always_cleaned_up(lambda: remove(job)):
        yield job


# What probe jobs print to be read back: each such line starts `BCPP-KIND`, and may carry `key=value` fields.
PROBE_LINE = re.compile(r"^(BCPP-[A-Z-]+) ?(.*)$", re.M)


def lines_of(text: str | None, kind: str) -> list[str]:
    """The rest of every `BCPP-KIND ...` line of `text` (one space after the kind dropped), in order."""
    return [rest for k, rest in PROBE_LINE.findall(text or "") if k == kind]


def fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split() if "=" in part)
