"""Inputs taken as they land: a stage on a streamed edge (`needs: [{stage: X, stream: true}]`) starts while its
upstream still runs, and takes a group of inputs once the upstream's own records say every input of it is complete.

The orchestrator gives such a job the upstream's output digest (STREAM_DIGESTS_ENV). What counts as the
upstream's record, never a partial file:
- the folder is the upstream's for this config: `.completions/*.digest` holds that digest (its rank 0 wrote it
  after setting aside what another config made, _completion.claim_outputs), and the manifest of every name it
  will write (`.manifest/download.json`) is there, written under that digest where it names one;
- an input is complete once it is under its final name: the upstream writes a hidden temporary and renames it
  into place only when it is whole and checked (download.py), so a name that exists is a finished file.

A group whose inputs are not all there yet waits while the rank takes the next ready one; a rank with nothing
ready polls. Where no new input lands for STALL_SECONDS (the upstream died with nobody to cancel this job, say),
the stage fails naming what it waited for; the orchestrator cancels it sooner when the upstream fails.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from _completion import COMPLETIONS_DIR, recorded_text
from _stage_error import StageError

STREAM_DIGESTS_ENV = "BCP_PIPELINE_STREAM_DIGESTS"  # comma-separated output digests of the streamed upstreams
STALL_SECONDS_ENV = "BCP_PIPELINE_STREAM_STALL_SECONDS"
STALL_SECONDS = 6 * 3600.0  # no new input for this long: the upstream is gone (a download retries for minutes)
POLL_SECONDS = 0.25  # a stat per waiting output a poll: cheap, and a landed group waits at most this
NOTICE_SECONDS = 60.0  # how often a waiting rank says what it waits for


def streamed_digests(environ: dict[str, str] | None = None) -> list[str]:
    """The upstream digests this job streams from; [] where its inputs are all there before it starts."""
    env = os.environ if environ is None else environ
    return [part for part in env.get(STREAM_DIGESTS_ENV, "").split(",") if part]


def stall_seconds(environ: dict[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    text = env.get(STALL_SECONDS_ENV)
    try:
        return float(text) if text else STALL_SECONDS
    except ValueError:
        raise StageError(f"{STALL_SECONDS_ENV}={text!r} is not a number of seconds") from None


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def wait_for_upstream(
    in_dir: Path,
    manifest: Path,
    digests: Sequence[str],
    stage: str,
    stall: float = STALL_SECONDS,
    poll: float = POLL_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Until `in_dir` is the upstream's for this config and its manifest is there (see the module docstring)."""
    started = clock()
    noticed = None
    while True:
        why = upstream_not_ready(in_dir, manifest, digests)
        if why is None:
            return
        waited = clock() - started
        if waited >= stall:
            raise StageError(
                f"{in_dir}: {why} after {waited:.0f} s; is the upstream stage running? (a streamed "
                f"input waits {STALL_SECONDS_ENV} seconds at most)"
            )
        if noticed is None or waited - noticed >= NOTICE_SECONDS:
            log(f"{stage}: waiting for the upstream: {why}")
            noticed = waited
        sleep(poll)


def upstream_not_ready(in_dir: Path, manifest: Path, digests: Sequence[str]) -> str | None:
    """Why the upstream's records do not vouch for `in_dir` yet, or None when they do."""
    records = sorted((in_dir / COMPLETIONS_DIR).glob("*.digest"))
    recorded = {recorded_text(path, "digest") for path in records}
    if not recorded & set(digests):
        return f"its output digest {' or '.join(digests)} is not recorded in {in_dir / COMPLETIONS_DIR} yet"
    if not manifest.is_file():
        return f"no manifest {manifest} yet"
    written_under = recorded_text(manifest, "output_digest")
    if written_under is not None and written_under not in digests:
        return f"{manifest} is another config's (digest {written_under})"
    return None


class Arrivals:
    """Which of a rank's groups can be taken now: every input under its final name in `in_dir`."""

    def __init__(
        self,
        in_dir: Path,
        stage: str,
        stall: float = STALL_SECONDS,
        poll: float = POLL_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.in_dir, self.stage, self.stall, self.poll = in_dir, stage, stall, poll
        self.sleep, self.clock = sleep, clock
        self._present: set[str] = set()

    def first_missing(self, names: Sequence[str]) -> str | None:
        """The first of `names` not under its final name yet (names found are remembered: files only land)."""
        for name in names:
            if name not in self._present:
                if not (self.in_dir / name).exists():
                    return name
                self._present.add(name)
        return None

    def next_ready(self, groups: Sequence[tuple[str, Sequence[str]]]) -> int:
        """The index in `groups` ((label, input names) in the rank's order) of the first whose inputs have all
        landed, waiting until one has; StageError once nothing new landed for `stall` seconds."""
        last_change = noticed = self.clock()
        seen = len(self._present)
        while True:
            first_waiting = None  # (label, a missing input) of the first group still waiting: what messages name
            for index, (label, names) in enumerate(groups):
                missing = self.first_missing(names)
                if missing is None:
                    return index
                first_waiting = first_waiting or (label, missing)
            label, missing = first_waiting
            now = self.clock()
            if len(self._present) != seen:
                seen, last_change = len(self._present), now
            if now - last_change >= self.stall:
                raise StageError(
                    f"no new input landed in {self.in_dir} for {now - last_change:.0f} s; {label} "
                    f"still waits for {missing} (and maybe more): is the upstream stage running? "
                    f"(set {STALL_SECONDS_ENV} to wait longer)"
                )
            if now - noticed >= NOTICE_SECONDS:
                log(
                    f"{self.stage}: {len(groups)} output(s) wait for their inputs; {label} for {missing} (and "
                    "maybe more), still being written upstream"
                )
                noticed = now
            self.sleep(self.poll)
