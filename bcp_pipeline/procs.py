"""Process helpers: one wrapper for external commands (argv lists, never shell=True) and pid liveness checks."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bcp_pipeline.errors import CommandError


def run_command(
    argv: list[str],
    *,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    input_text: str | None = None,
    hint: str = "",
) -> subprocess.CompletedProcess[str]:
    """Run `argv`, capture output; raise CommandError (with stderr) on a non-zero exit or a missing binary."""
    try:
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            input=input_text,
            check=False,
            preexec_fn=die_with_parent(os.getpid()),
        )
    except FileNotFoundError:
        raise CommandError(argv, 127, f"{argv[0]}: command not found", hint=hint) from None
    except subprocess.TimeoutExpired as exc:
        # TimeoutExpired carries bytes even under text=True (subprocess reads them raw before it decodes).
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        raise CommandError(argv, 124, f"timed out after {timeout:.0f} s: {stderr}", hint=hint) from None
    if result.returncode != 0:
        raise CommandError(argv, result.returncode, result.stderr or result.stdout, hint=hint)
    return result


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child die (SIGKILL) with `parent` (Linux; None elsewhere).

    Used for the commands the orchestrator runs: an `ngc job run` or `sbatch` still on its way when the
    orchestrator is killed would otherwise create its job after the resumed orchestrator looked for it by label,
    and the stage would get a second job (found by tests/chaos on the emulated BCP). And for the ranks of a
    local job, which die with their supervisor as a node's processes die with it.
    """
    if not sys.platform.startswith("linux"):
        return None

    def in_child() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the orchestrator died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return in_child


def process_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (None if it is gone): tells a live pid from a reused one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has exited; only its parent has not reaped it yet
        return None
    return int(fields[19])


def is_alive(pid: int, start_ticks: int | None) -> bool:
    """True if `pid` runs and (when known) is the same process that started at `start_ticks`."""
    ticks = process_start_ticks(pid)
    return ticks is not None and (start_ticks is None or ticks == start_ticks)


def signal_group(pid: int, sig: int) -> bool:
    """Send `sig` to the process group led by `pid`; False if it is gone."""
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
