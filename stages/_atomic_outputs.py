"""Outputs that appear whole or not at all: written to a hidden temporary beside the final name, fsynced, renamed,
the folder fsynced; the temporaries of killed runs removed; writeback started early for large outputs.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # write errors that name no file


def temp_path_for(path: Path) -> Path:
    """Hidden temporary name next to `path`: globs like `*.jsonl` never match it.

    Host and pid both go in: containers on different nodes often run their ranks under the same pids.
    """
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output(path: Path, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file that becomes `path` only if the block completes; otherwise it is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        with open(tmp, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if (named := error_naming(exc, path)) is not None:
            raise named from exc
        raise


def error_naming(exc: BaseException, path: Path) -> OSError | None:
    """For a full disk or quota (errors only a write gives, and without a file name), the same error naming `path`:
    "[Errno 28] No space left on device" alone does not say which output could not be written. Else None."""
    if isinstance(exc, OSError) and exc.filename is None and exc.errno in OUT_OF_SPACE:
        return OSError(exc.errno, exc.strerror, str(path))
    return None


def atomic_write_json(path: Path, payload: object) -> None:
    with atomic_output(path, "w") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)
        handle.write("\n")


def remove_stale_temporaries(folder: Path) -> int:
    """Delete `.NAME.tmp-PID` leftovers of killed runs (they are never valid outputs)."""
    removed = 0
    if folder.is_dir():
        for leftover in folder.glob(".*.tmp-*"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
                removed += 1
    return removed


def remove_stale_temporaries_of(paths: Iterable[Path]) -> int:
    """Delete `.NAME.tmp-*` leftovers of these outputs only (one listing per folder).

    Safe when several ranks share a folder, unlike `remove_stale_temporaries(folder)`: a rank that starts late must
    not delete the temporary another rank is still writing, so each rank cleans only the outputs of its own shard.
    """
    wanted: dict[Path, set[str]] = {}
    for path in paths:
        wanted.setdefault(path.parent, set()).add(path.name)
    removed = 0
    for folder, names in wanted.items():
        if not folder.is_dir():
            continue
        with os.scandir(folder) as entries:
            leftovers = [
                entry.name
                for entry in entries
                if entry.name.startswith(".")
                and ".tmp-" in entry.name
                and entry.name[1 : entry.name.rindex(".tmp-")] in names
            ]
        for name in leftovers:
            with contextlib.suppress(FileNotFoundError):
                (folder / name).unlink()
                removed += 1
    return removed


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages in the range, do not wait


@functools.cache
def _sync_file_range():
    """libc's sync_file_range (Linux), or None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing this range of a file to disk now, without waiting (advisory; a no-op without Linux's
    sync_file_range). A stage that writes an output at hundreds of MB/s and fsyncs it at the end otherwise waits
    for the whole file there; started early, the disk works while the rest is still being produced."""
    function = _sync_file_range()
    if function is not None and length > 0:
        function(fd, offset, length, _SYNC_FILE_RANGE_WRITE)
