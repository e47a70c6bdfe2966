"""One writer per workspace: the lock a run holds on its backend's workspace data while it is driven.

Two runs writing one workspace corrupt each other (one's extract deletes the `.zst` files the other's download is
verifying). The run lock (state.RunLock) keeps two orchestrators off one run; this lock keeps two runs off one
workspace, whichever verb or flag started them (`--restart` included).

The lock is a file the backend places where every orchestrator that could write the same data sees it
(Backend.writer_lock_path: beside the folder on local and Slurm; in the user's state folder, keyed by org and
workspace name, on BCP). An orchestrator holds `flock` on it, which the kernel releases even on SIGKILL, so a dead
holder is never waited for; the file's content names the holder for the refusal. A run handed to a BCP driver
job (`run --detach`) has no process here: its record stays in the file, marked detached, and counts as long as
that run's own state says a driver owns it and it is unfinished.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.contract import Backend
from bcp_pipeline.engine.state import RunState, RunStore
from bcp_pipeline.errors import StateError


class WorkspaceLock:
    """The workspace writer lock of one run (`with WorkspaceLock(...)` while it is driven)."""

    def __init__(self, path: Path, *, workspace: str, state: RunState, store: RunStore) -> None:
        self.path = path
        self.workspace = workspace
        self.holder = {
            "run_id": state.run_id,
            "pipeline": state.pipeline,
            "backend": state.backend,
            "state_root": str(store.root.resolve()),
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        self._fd: int | None = None
        self.recorded = store.state_path(state.run_id).is_file()  # False: a new run, which a refusal leaves unmade

    def acquire(self, *, detached: bool = False) -> None:
        """Take the lock, or raise a StateError naming the run that holds the workspace."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(fd)
            os.close(fd)
            raise StateError(self._refusal(holder, alive=True)) from None
        holder = read_holder(fd)
        if holder.get("detached") and holder.get("run_id") != self.holder["run_id"] and detached_run_owns(holder):
            os.close(fd)
            raise StateError(self._refusal(holder, alive=False))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**self.holder, "detached": detached}).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WorkspaceLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _refusal(self, holder: dict[str, Any], *, alive: bool) -> str:
        run_id = holder.get("run_id", "another run")
        where = f" (its state: {holder['state_root']})" if holder.get("state_root") else ""
        if alive:
            by = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
            what = f"is being written by run {run_id}{where}, driven by {by}"
            todo = f"wait for it to end, or stop it with `bcp-pipeline cancel {run_id}` (and Ctrl-C its orchestrator)"
        else:
            what = f"is being written by run {run_id}{where}, detached to a BCP driver job"
            todo = (
                f"follow it with `bcp-pipeline status {run_id}`, stop it with `bcp-pipeline cancel {run_id}`, "
                f"or take it back with `bcp-pipeline resume {run_id}`"
            )
        refused = (
            f"run {self.holder['run_id']} is refused"
            if self.recorded
            else "this run is refused (nothing of it was recorded)"
        )
        return (
            f"workspace {self.workspace} {what}; two runs writing one workspace corrupt each other's data, so "
            f"{refused}: {todo} (lock: {self.path})"
        )


@contextlib.contextmanager
def hold_workspace(
    backend: Backend, workspace: str, state: RunState, store: RunStore, *, detached: bool = False
) -> Iterator[None]:
    """The writer lock of workspace `workspace` as `backend` writes it for `state`, held for the block. With
    `detached` the record stays after it (a driver job writes from now on: see the module's docstring)."""
    lock = WorkspaceLock(
        backend.writer_lock_path(), workspace=f"{workspace} ({backend.name})", state=state, store=store
    )
    lock.acquire(detached=detached)
    try:
        yield
    finally:
        lock.release()


def read_holder(fd: int) -> dict[str, Any]:
    """The holder recorded in the lock file; {} when there is none (or it cannot be read)."""
    try:
        raw = os.pread(fd, 64 * 1024, 0)
        holder = json.loads(raw) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def detached_run_owns(holder: dict[str, Any]) -> bool:
    """A detached holder still counts while its run's state (where it was started) says a driver job owns it and
    it has not ended; a run since cancelled, finished, taken back or removed holds nothing."""
    path = RunStore(Path(holder.get("state_root", ""))).state_path(str(holder.get("run_id", "")))
    try:  # read only: a corrupt file is reported (and set aside) by a command of its own store, not here
        state = RunState.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return state.driver_owned and state.status in ("running", "pending")
