"""The preprocess stage's tokenizing: each batch becomes token ids + EOD per document, in worker processes.

Each worker loads the tokenizer once (a forked one inherits the parent's) and returns, per batch, the tokens and
document lengths as bytes ready to append to the output, plus the lines it had to skip and why. Results come back
in input order with a bounded number of batches in flight, so memory does not grow with the input.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from collections import deque
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from collections.abc import Iterator

import numpy as np

from _preprocess_batches import Batch
from extract import line_problem
from megatron_index import LENGTH_DTYPE
from tokenizers_gpt2 import Tokenizer, TokenizerSpec, token_dtype


@dataclass
class BatchResult:
    source: int
    tokens: bytes = b""  # ids + EOD per document, in the output dtype, back to back
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
    encode, key, eod = state.tokenizer.encode, state.key, state.eod
    pieces: list[np.ndarray] = []
    lengths: list[int] = []
    result = BatchResult(batch.source)
    if batch.texts is not None:
        records, read = batch.texts, parquet_text
    else:
        records = batch.text().split(b"\n")
        if records[-1] == b"":
            records.pop()  # the batch ends with a newline; that is not one more (empty) line
        read = json_text
    result.lines = len(records)
    for offset, record in enumerate(records):
        text = read(record, key)
        if text.__class__ is not str:
            result.bad.append((offset, text))
            continue
        ids = encode(text)
        if ids.size == 0:
            result.empty += 1
            continue
        pieces += (ids, eod)
        lengths.append(ids.size + 1)
    if pieces:
        # Ids are below the vocabulary size, which chose the dtype, so the narrowing cast is exact.
        result.tokens = np.concatenate(pieces).astype(state.dtype, copy=False).tobytes()
        result.lengths = np.array(lengths, dtype=LENGTH_DTYPE).tobytes()
    result.documents = len(lengths)
    return result


class Problem(str):
    """Why a record has no usable text (a str subclass, told apart from a text by its class)."""


def json_text(line: bytes, key: str) -> str | Problem:
    """The `key` string of a JSON line, else why not."""
    try:
        text = json.loads(line)[key]
        if text.__class__ is str:
            return text
    except (ValueError, KeyError, TypeError, IndexError):
        pass
    return Problem(line_problem(line, key) or "unusable")


def parquet_text(value: str | None, key: str) -> str | Problem:
    return value if value is not None else Problem(f"{key!r} is null")


def ordered_results(batches: Iterator[Batch], executor: Executor | None, window: int) -> Iterator[BatchResult]:
    """Results in input order, with at most `window` batches in flight (Pool.imap would read the whole input)."""
    if executor is None:
        yield from map(tokenize_batch, batches)
        return
    pending: deque[Future] = deque()
    try:
        for batch in batches:
            pending.append(executor.submit(tokenize_batch, batch))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:  # an error upstream: drop what is still queued for this output
            future.cancel()


def make_executor(workers: int, spec: TokenizerSpec, key: str) -> Executor | None:
    """A pool of `workers` tokenizer processes, or None to tokenize inline (one worker: no pickling at all)."""
    if workers <= 1:
        return None
    # fork where available: workers inherit the tokenizer already loaded here instead of loading it again.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method),
                               initializer=init_worker,
                               initargs=(spec, key, _STATE.tokenizer if method else None, os.getpid()))
