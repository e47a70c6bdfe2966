"""Clean-up that happens even when the test process never gets to its teardown.

Ctrl-C on the README's test command reaches pytest-xdist's workers with the terminal's SIGINT, and the controller
then kills workers whose session teardown (stopping Slurm takes seconds) has not finished; `kill -9` or a cut CI
job skips teardown altogether. The emulators, their fork servers and the clusters' daemons run in sessions of their
own (so that Ctrl-C does not kill them mid-test), and so outlived the run.

`run_when_gone(argv)` starts a small watcher, itself in a session of its own, that reads a pipe from this process:
the pipe ends when this process exits however it exits, and the watcher then runs `argv` (a cluster's `stop`, the
emulator's shutdown). The fixture's own teardown calls the returned `disarm()` after cleaning up itself.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

DISARM = b"disarm\n"
# Reads one line: the fixture's "disarm" (nothing to do), or end of file (the test process is gone: clean up).
WATCHER = (
    "import subprocess, sys\n"
    "if sys.stdin.buffer.readline() != b'disarm\\n':\n"
    "    subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,"
    " stderr=subprocess.DEVNULL, timeout=300)\n"
)


def run_when_gone(argv: list[str]) -> Callable[[], None]:
    """Run `argv` once this process has exited without calling the returned function (which ends the watcher)."""
    watcher = subprocess.Popen(
        [sys.executable, "-c", WATCHER, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def disarm() -> None:
        try:
            watcher.stdin.write(DISARM)
            watcher.stdin.close()
        except (BrokenPipeError, ValueError):  # it is gone already
            pass
        try:
            watcher.wait(timeout=10)
        except subprocess.TimeoutExpired:
            watcher.kill()

    return disarm


def shutdown_emulator_when_gone(fake) -> Callable[[], None]:
    """run_when_gone for a started FakeNgc: its jobs killed and its servers stopped (whichever it runs then)."""
    from ngc_control import FAKES_DIR

    code = (
        f"import sys; sys.path.insert(0, {str(FAKES_DIR)!r}); from ngc_control import shutdown_abandoned; "
        f"shutdown_abandoned({str(fake.home)!r})"
    )
    return run_when_gone([sys.executable, "-c", code])
