"""The preprocess stage's tokenizing: each batch becomes token ids + EOD per document, in worker processes.

Each worker loads the tokenizer once (a forked one inherits the parent's) and returns, per batch, the tokens and
document lengths as bytes ready to append to the output, plus the lines it had to skip and why. Batches go to the
workers in turn over pipes of their own (TokenizerPool), and the token bytes come back down them as they are, not
pickled. Results come back in input order with a bounded number of batches in flight, so memory does not grow
with the input.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import pickle
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import numpy as np
from _allocator import keep_batch_buffers_in_heap
from _preprocess_batches import Batch
from extract import line_problem
from megatron_index import LENGTH_DTYPE
from tokenizers_gpt2 import Tokenizer, TokenizerSpec, token_dtype

try:  # optional: a faster JSON parser (stages/requirements.txt has it; json_text says why)
    from orjson import loads as fast_loads
except ImportError:
    fast_loads = None


@dataclass
class BatchResult:
    source: int
    tokens: bytes | bytearray | memoryview = b""  # ids + EOD per document, in the output dtype, back to back
    lengths: bytes = b""  # int32 per document (EOD included)
    lines: int = 0
    documents: int = 0
    empty: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line index in the batch, reason)


@dataclass
class WorkerState:
    tokenizer: Tokenizer
    key: str
    dtype: np.dtype
    eod: np.ndarray


_STATE: WorkerState | None = None


def init_worker(spec: TokenizerSpec, key: str, loaded: Tokenizer | None = None, parent: int | None = None) -> None:
    """Load the tokenizer once per process (a forked worker inherits the parent's, loaded before the fork)."""
    global _STATE
    if parent is not None:
        threading.Thread(target=exit_when_orphaned, args=(parent,), name="orphan-watch", daemon=True).start()
    keep_batch_buffers_in_heap()  # before the tokenizer's memory: batches then reuse the same pages (_allocator.py)
    tokenizer = loaded if loaded is not None else spec.load()
    dtype = token_dtype(tokenizer)
    _STATE = WorkerState(tokenizer, key, dtype, np.array([tokenizer.eod], dtype=np.uint32))


def exit_when_orphaned(parent: int, interval: float = 0.5) -> None:
    """End this worker once its parent is gone. A SIGKILLed parent never closes the task pipe for its workers
    (each worker holds the pipe's write end, inherited from the others), so they would wait on it forever."""
    while os.getppid() == parent:
        time.sleep(interval)
    os._exit(1)


def tokenize_batch(batch: Batch) -> BatchResult:
    """Tokenize every line (or parquet row) of `batch`: ids + EOD per usable document; bad ones listed, not raised."""
    state = _STATE
    assert state is not None, "init_worker was not called in this process"
    key, eod = state.key, state.eod
    pieces: list[np.ndarray] = []
    lengths: list[int] = []
    texts: list[str] = []
    result = BatchResult(batch.source)
    if batch.texts is not None:
        records, read = batch.texts, parquet_text
    else:
        records, read = json_lines(batch.text()), json_text
    offset = -1
    for offset, record in enumerate(records):
        text = read(record, key)
        if text.__class__ is not str:
            result.bad.append((offset, text))
            continue
        texts.append(text)
    # The whole batch in one call: the fast engine's per-call cost is a visible share of its work.
    for ids in state.tokenizer.encode_batch(texts):
        if ids.size == 0:
            result.empty += 1
            continue
        pieces += (ids, eod)
        lengths.append(ids.size + 1)
    if pieces:
        # Ids are below the vocabulary size, which chose the dtype, so the narrowing cast is exact (and done by
        # concatenate itself: no second array).
        result.tokens = memoryview(np.concatenate(pieces, dtype=state.dtype, casting="unsafe")).cast("B")
        result.lengths = np.array(lengths, dtype=LENGTH_DTYPE).tobytes()
    result.documents = len(lengths)
    result.lines = offset + 1
    return result


def drop_cache_if_due() -> None:
    """Between two batches, with nothing of the last one alive: the engine's cache is dropped here where it passed
    its bound (mid-batch, the live texts and ids keep some of its pages in use, and each cycle peaks higher)."""
    assert _STATE is not None, "init_worker was not called in this process"
    _STATE.tokenizer.drop_cache_if_due()


def json_lines(data: bytes) -> Iterator[memoryview]:
    """The lines of `data` (without their newlines; a final newline ends the last line, it starts no empty one),
    as views: no copy of each line, as `bytes.split` makes (about 1 % of the stage)."""
    view, find, start, size = memoryview(data), data.find, 0, len(data)
    while start < size:
        end = find(b"\n", start)
        if end < 0:
            end = size
        yield view[start:end]
        start = end + 1


class Problem(str):
    """Why a record has no usable text (a str subclass, told apart from a text by its class)."""


def json_text(line: bytes | memoryview, key: str) -> str | Problem:
    """The `key` string of a JSON line, else why not.

    orjson first, where installed: it parses a line in half the time of `json`, a few % of the whole stage (raw
    tiktoken's benchmark parses before its clock). Where it refuses a line (it is stricter: NaN, Infinity, lone
    surrogates, a byte-order mark) or finds no string there, `json` decides, so every line gives what `json` alone
    gives; where both parse it, the strings are the same (tests/stages/test_tokenize_pool.py).
    """
    if fast_loads is not None:
        try:
            record = fast_loads(line)
        except ValueError:  # orjson.JSONDecodeError is one
            pass
        else:
            if record.__class__ is dict and (text := record.get(key)).__class__ is str:
                return text
    line = bytes(line)
    try:
        text = json.loads(line)[key]
        if text.__class__ is str:
            return text
    except (ValueError, KeyError, TypeError, IndexError):
        pass
    return Problem(line_problem(line, key) or "unusable")


def parquet_text(value: str | None, key: str) -> str | Problem:
    return value if value is not None else Problem(f"{key!r} is null")


def ordered_results(batches: Iterator[Batch], pool: TokenizerPool | None, window: int) -> Iterator[BatchResult]:
    """Results in input order, with at most `window` batches in flight (Pool.imap would read the whole input)."""
    if pool is None:
        for batch in batches:
            yield tokenize_batch(batch)
            drop_cache_if_due()  # the result written (its tokens may still be referenced by the caller's loop)
        return
    try:
        for batch in batches:
            pool.submit(batch)
            if pool.in_flight >= window:
                yield pool.result()
        while pool.in_flight:
            yield pool.result()
    finally:
        pool.discard_in_flight()  # an error here or upstream: what was sent for this output is not wanted


class WorkerDied(RuntimeError):
    """A tokenizer process ended without answering (killed: out of memory?)."""


class TokenizerPool:
    """`workers` tokenizer processes, each with a pipe for its batches and one for its results; batches are dealt
    in turn, so each worker's results come back in the order it got them, and all of them in input order.

    Not a ProcessPoolExecutor: it pickles every result, 2 bytes a token, through a queue and a thread of this
    process, then unpickles it here: about 3x the CPU of sending the token bytes down a pipe as they are (a
    visible share of the stage's cost over raw tiktoken, docs/performance.md). Batches are about the same size,
    so dealing them in turn keeps the workers equally busy.
    """

    def __init__(self, workers: int, spec: TokenizerSpec, key: str) -> None:
        # fork where available: workers inherit the tokenizer already loaded here instead of loading it again.
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        context = multiprocessing.get_context(method)
        loaded = _STATE.tokenizer if method and _STATE is not None else None
        self._tasks: list[Connection] = []
        self._results: list[Connection] = []
        self._processes: list[multiprocessing.process.BaseProcess] = []
        for number in range(workers):
            task_reader, task_writer = context.Pipe(duplex=False)
            result_reader, result_writer = context.Pipe(duplex=False)
            enlarge_pipe(result_writer.fileno())  # a whole result fits: the worker goes on without waiting for us
            process = context.Process(
                target=serve,
                name=f"tokenizer-{number}",
                daemon=True,
                args=(task_reader, result_writer, spec, key, loaded, os.getpid()),
            )
            process.start()
            task_reader.close()
            result_writer.close()
            self._tasks.append(task_writer)
            self._results.append(result_reader)
            self._processes.append(process)
        self._next = 0
        self._sent: deque[int] = deque()  # the worker of each batch in flight, oldest first

    @property
    def in_flight(self) -> int:
        return len(self._sent)

    def submit(self, batch: Batch) -> None:
        worker = self._next
        self._next = (worker + 1) % len(self._tasks)
        try:
            self._tasks[worker].send(batch)
        except OSError as exc:  # a broken pipe: the worker is gone
            raise self._died(worker) from exc
        self._sent.append(worker)

    def result(self) -> BatchResult:
        """The oldest batch's result; its exception if tokenizing it raised one."""
        worker = self._sent.popleft()
        connection = self._results[worker]
        try:
            answer = connection.recv()
            if not isinstance(answer, BaseException):
                result, size = answer
                result.tokens = read_exactly(connection.fileno(), size)
        except (EOFError, OSError) as exc:  # the pipe closed under us: the worker is gone
            raise self._died(worker) from exc
        if isinstance(answer, BaseException):  # the batch's own error (an input that shrank), as raised there
            raise answer
        return result

    def discard_in_flight(self) -> None:
        """Receive and drop every result still due, so the next output starts with empty pipes."""
        while self._sent:
            try:
                self.result()
            except WorkerDied:
                raise
            except Exception:  # a dropped batch's own error: not wanted either
                pass

    def _died(self, worker: int) -> WorkerDied:
        process = self._processes[worker]
        process.join(timeout=1)
        # The pool is done for (the caller makes a new one): the other workers are killed now, since one may be
        # blocked sending a result that will never be read, and close() would wait for it in vain.
        for other in self._processes:
            other.kill()
        self._sent.clear()
        return WorkerDied(f"tokenizer process {process.pid} ended with exit code {process.exitcode}")

    def close(self) -> None:
        """Stop the workers: told to end, then, where one does not within a few seconds, killed. Where results are
        still due (an error on the way), they are killed at once: telling them could wait behind those results."""
        for connection, process in zip(self._tasks, self._processes):
            try:
                if self._sent:
                    process.kill()
                else:
                    connection.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        for process in self._processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        for connection in self._tasks + self._results:
            connection.close()


def serve(
    tasks: Connection, results: Connection, spec: TokenizerSpec, key: str, loaded: Tokenizer | None, parent: int
) -> None:
    """A worker: tokenize each batch received, then send back its result (the token bytes as they are)."""
    init_worker(spec, key, loaded, parent)
    # Batches are read by a thread of their own, so that a large one (decompressed text) sent to us never waits
    # for us to finish sending a result that the main process will read only after sending it: no deadlock.
    queued: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
    threading.Thread(target=receive_batches, args=(tasks, queued), name="batches", daemon=True).start()
    while (batch := queued.get()) is not None:
        try:
            result = tokenize_batch(batch)
        except Exception as exc:  # sent back, raised in the main process for the output being made
            results.send(exc if picklable(exc) else RuntimeError(f"{type(exc).__name__}: {exc}"))
            continue
        tokens, result.tokens = result.tokens, b""
        results.send((result, len(tokens)))
        write_all(results.fileno(), tokens)
        del batch, result, tokens
        drop_cache_if_due()


def receive_batches(tasks: Connection, queued: queue.SimpleQueue) -> None:
    try:
        while (batch := tasks.recv()) is not None:
            queued.put(batch)
    except EOFError:
        pass
    queued.put(None)


def picklable(value: object) -> bool:
    try:
        pickle.dumps(value)
    except Exception:
        return False
    return True


def enlarge_pipe(fd: int, size: int = 1 << 20) -> None:
    """Make a pipe hold `size` bytes (Linux; up to /proc/sys/fs/pipe-max-size, 1 MiB by default); best effort."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except (AttributeError, OSError):
        pass  # not Linux, or a lower limit: the pipe just holds less


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def read_exactly(fd: int, size: int) -> bytearray:
    """`size` bytes from `fd`, read straight into one buffer (no intermediate copies)."""
    data = bytearray(size)
    view, done = memoryview(data), 0
    while done < size:
        count = os.readv(fd, [view[done:]])
        if count == 0:
            raise EOFError(f"the pipe closed after {done} of {size} bytes")
        done += count
    return data


def make_pool(workers: int, spec: TokenizerSpec, key: str) -> TokenizerPool | None:
    """A pool of `workers` tokenizer processes, or None to tokenize inline (one worker: no pipes at all)."""
    return TokenizerPool(workers, spec, key) if workers > 1 else None
