"""Clean-up that runs however a check ends: an answer, an error, Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def always_cleaned_up(cleanup: Callable[[], None]) -> Iterator[None]:
    """Inside, SIGTERM raises KeyboardInterrupt as Ctrl-C does, so both unwind through `cleanup`; while it runs a
    further SIGTERM is ignored (a second Ctrl-C still stops the process: the user insists)."""
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
