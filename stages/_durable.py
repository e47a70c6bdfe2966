"""Durable output files written at the disk's speed: full blocks go to the disk by direct I/O, in the background.

Every stage output must be on disk (fsynced) before it is renamed into place. Through the page cache that costs
twice: the copy into newly allocated cache pages, then the kernel's writeback, which issues small requests and on
the machines measured for this project runs at a third to a half of what the same disk takes in large direct
writes. `DurableFile` instead fills page-aligned buffers, reused for the life of the process (fresh memory is
slow to touch in a VM), and hands each full buffer to a writer thread that writes it with O_DIRECT while the next
one fills. Closing the file waits for those writes, writes the short tail through the page cache and fsyncs, which
then has only the tail, the metadata and the disk's own cache left to flush.

Where the filesystem refuses O_DIRECT (tmpfs, some network filesystems), or `BCP_PIPELINE_DIRECT_IO=0` is set,
the same class writes through the page cache, starts writeback as it goes and fsyncs at the end. The bytes on disk
are the same either way.

Standard library only: this module ships into job containers with the other stage programs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import _common

DIRECT_IO_ENV = "BCP_PIPELINE_DIRECT_IO"  # "0" writes through the page cache (then fsync) instead
ALIGNMENT = 4096  # O_DIRECT needs offsets, lengths and memory aligned to the logical block size; 4 KiB covers all
BLOCK_BYTES = 16 << 20  # per direct write: large requests are what make direct writes fast (measured: 16-64 MiB)
WRITER_THREADS = 2  # direct writes in flight at once, across all open files of the process
BUFFERS = WRITER_THREADS + 2  # the writes in flight + one filling per file open at once (extract has 2 open)
O_DIRECT = getattr(os, "O_DIRECT", 0)  # 0 where the platform has none (not Linux): page cache only
MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def direct_io_wanted(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(O_DIRECT) and env.get(DIRECT_IO_ENV, "1").strip().lower() not in {"0", "false", "no", "off"}


class BufferPool:
    """Up to `count` page-aligned blocks (anonymous mmaps), made on first need and reused; `take` waits for one."""

    def __init__(self, count: int, block_bytes: int) -> None:
        if block_bytes % ALIGNMENT:
            raise ValueError(f"block_bytes={block_bytes} is not a multiple of {ALIGNMENT}")
        self.block_bytes = block_bytes
        self._free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
        self._unmade = count
        self._lock = threading.Lock()

    def take(self) -> mmap.mmap:
        with self._lock:
            if self._free.empty() and self._unmade:
                self._unmade -= 1
                # MAP_POPULATE: the pages are faulted in by one call, about twice as fast as touching them one by
                # one, which in a VM is a noticeable part of a short run.
                return mmap.mmap(-1, self.block_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_POPULATE)
        return self._free.get()

    def give(self, buffer: mmap.mmap) -> None:
        self._free.put(buffer)


class Writers:
    """The process's buffers and writer threads, shared by all its open `DurableFile`s (created on first use)."""

    _lock = threading.Lock()
    _shared: Writers | None = None

    def __init__(self, buffers: int = BUFFERS, block_bytes: int = BLOCK_BYTES, threads: int = WRITER_THREADS) -> None:
        self.pool = BufferPool(buffers, block_bytes)
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="durable-write")

    @classmethod
    def shared(cls) -> Writers:
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared


class DurableFile:
    """An output file written front to back; `close()` returns only when every byte is on disk.

    Not thread-safe: one thread writes a given file (several threads may each write their own)."""

    def __init__(self, path: Path, writers: Writers | None = None, direct: bool | None = None) -> None:
        self.path = path
        self._writers = writers or Writers.shared()
        self._block = self._writers.pool.block_bytes
        self._fd, self.direct = _open_for_writing(path, direct_io_wanted() if direct is None else direct)
        self._buffer: mmap.mmap | None = None
        self._filled = 0  # bytes in self._buffer
        self._offset = 0  # file offset of self._buffer's first byte (everything before it is handed to writers)
        self._pending: list[Future] = []
        self._mode_lock = threading.Lock()
        self._closed = False

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self._offset + self._filled

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            buffer = self._current_buffer()
            count = min(len(view), self._block - self._filled)
            buffer[self._filled : self._filled + count] = view[:count]
            self._filled += count
            view = view[count:]
            self._hand_off_if_full()

    def append_from(self, source_fd: int, size: int) -> None:
        """Append `size` bytes of `source_fd` from its offset 0, read straight into the buffers (no extra copy)."""
        done = 0
        while done < size:
            buffer = self._current_buffer()
            with memoryview(buffer) as whole:
                count = os.preadv(
                    source_fd, [whole[self._filled : self._filled + min(size - done, self._block - self._filled)]], done
                )
            if count == 0:
                raise _common.StageError(f"input shrank while being copied ({done} of {size} bytes read)")
            self._filled += count
            done += count
            self._hand_off_if_full()

    def last_byte(self) -> int | None:
        """The byte appended last, while it is still in the buffer being filled (None once that was handed off)."""
        if self._buffer is None or self._filled == 0:
            return None
        return self._buffer[self._filled - 1]

    def close(self) -> int:
        """Write the rest, wait for every write, fsync, close; the file's size. Raises the first write error."""
        try:
            self._wait_for_writers()
            if self._filled:
                self._use_page_cache()  # the tail is not a whole number of aligned blocks
                with memoryview(self._buffer) as view:
                    self._pwrite_all(view[: self._filled], self._offset)
                self._offset += self._filled
                self._filled = 0
            os.fsync(self._fd)
            return self._offset
        finally:
            self._release()

    def abort(self) -> None:
        """Stop without making anything durable (the caller removes the file); never raises a write error."""
        with contextlib.suppress(OSError, _common.StageError):
            self._wait_for_writers()
        self._release()

    # -- internals --------------------------------------------------------------------------------------------------

    def _current_buffer(self) -> mmap.mmap:
        if self._closed:
            raise ValueError(f"{self.path}: write after close")
        if self._buffer is None:
            self._buffer = self._writers.pool.take()
            self._filled = 0
        return self._buffer

    def _hand_off_if_full(self) -> None:
        if self._filled < self._block:
            return
        buffer, offset = self._buffer, self._offset
        self._buffer, self._filled, self._offset = None, 0, offset + self._block
        self._pending.append(self._writers.executor.submit(self._write_block, buffer, offset))
        self._pending = [future for future in self._pending if not future.done() or future.exception()]
        failed = [future for future in self._pending if future.done()]
        if failed:  # say so now, not after the producer has made the rest of a file that can never be complete
            raise failed[0].exception()

    def _write_block(self, buffer: mmap.mmap, offset: int) -> None:
        try:
            with memoryview(buffer) as view:
                self._pwrite_all(view, offset)
            if not self.direct:  # page-cache mode: have the disk start now, so the final fsync waits less
                _common.start_writeback(self._fd, offset, len(buffer))
        finally:
            self._writers.pool.give(buffer)

    def _pwrite_all(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            try:
                done += os.pwrite(self._fd, view[done:], offset + done)
            except OSError as exc:
                # Opened with O_DIRECT, but these writes are refused (an alignment this filesystem does not take,
                # or a short write left us unaligned): go on through the page cache; the result is the same.
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                self._use_page_cache()

    def _use_page_cache(self) -> None:
        with self._mode_lock:
            if self.direct:
                flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
                fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~O_DIRECT)
                self.direct = False

    def _wait_for_writers(self) -> None:
        pending, self._pending = self._pending, []
        errors = [error for error in (future.exception() for future in pending) if error is not None]
        if errors:
            raise errors[0]

    def _release(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._buffer is not None:
            self._writers.pool.give(self._buffer)
            self._buffer = None
        os.close(self._fd)


def _open_for_writing(path: Path, direct: bool) -> tuple[int, bool]:
    """(fd, direct?) for a new, empty file at `path`; falls back to the page cache when O_DIRECT is refused."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    if direct:
        try:
            return os.open(path, flags | O_DIRECT, 0o644), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: this filesystem has no direct I/O
                raise
    return os.open(path, flags, 0o644), False


@contextlib.contextmanager
def durable_output(path: Path, writers: Writers | None = None, direct: bool | None = None) -> Iterator[DurableFile]:
    """Like `_common.atomic_output`, for large outputs: a DurableFile on a hidden temporary that becomes `path`
    (renamed, folder fsynced) only when the block completes and every byte is on disk; otherwise it is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _common.temp_path_for(path)
    out = DurableFile(tmp, writers, direct)
    try:
        yield out
        out.close()
        os.replace(tmp, path)
        _common.fsync_dir(path.parent)
    except BaseException as exc:
        out.abort()
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if (named := _common.error_naming(exc, path)) is not None:
            raise named from exc
        raise
