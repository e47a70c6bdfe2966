#!/usr/bin/env python3
"""preprocess (tokenize-preprocess) stage: JSONL -> Megatron indexed dataset, sharded by rank, resumable.

    python3 preprocess.py --in DIR --out DIR --vocab vocab.json --merges merges.txt
                          [--tokenizer-json FILE [--eod-token TOKEN]] [--json-key text]
                          [--files-per-output N] [--workers P]

Each `IN/train_chunk_{i}.jsonl` (concat's outputs) becomes `OUT/train_chunk_{i}.jsonl_text_document.bin/.idx`
(the NeMo launcher's names) plus `.manifest.json`, written last: documents, tokens, bytes, sha256 of both files,
sources, skipped lines, tokenizer. With `--files-per-output N` the inputs are instead the sorted `IN/*.jsonl.zst`,
`*.jsonl.gz`, `*.parquet` and `*.jsonl` (the download manifest's list when there is one) in groups of N, exactly
concat's groups, so a pipeline can go straight from download to tokens without writing the text twice. A parquet
input is read one row group at a time, and only its `--json-key` column (doc_sources.py).

Every document becomes its token ids followed by the EOD id (50256 for GPT-2), one sequence per document, in input
order, like Megatron's preprocess_data.py with --append-eod; a document whose text has no tokens (empty text) gets
no sequence either, as in Megatron, and is counted as `empty_documents`. Lines that are not JSON objects with a
string `--json-key` are skipped and reported as `SOURCE:LINE: reason` (the first few per output; all are counted
in `skipped_lines`); an output without a single document fails (every line skipped: a wrong --json-key?).

Outputs are sharded across ranks; within a rank, `--workers` processes tokenize ~1 MiB batches of whole lines
(reading plain inputs themselves; compressed and parquet inputs are read by the main process) while it writes
the results in input order. A bounded window of batches is in flight and document lengths are spilled to a scratch
file, so memory does not grow with the input.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys
import threading
import time
from collections import deque
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

import _common
from doc_sources import GZ_SUFFIX, INPUT_SUFFIXES, PARQUET_SUFFIX, ZST_SUFFIX
from doc_sources import gzip_blocks, input_suffix, parquet_texts
from extract import decompress_blocks, download_manifest_names, line_problem, visible_names
from megatron_index import LENGTH_DTYPE, HashingWriter, IndexedDatasetWriter
from tokenizers_gpt2 import Tokenizer, TokenizerError, TokenizerSpec, describe, token_dtype

STAGE = "preprocess"
JSONL_INPUT = re.compile(r"train_chunk_(\d+)\.jsonl")
PREFIX_TEMPLATE = "train_chunk_{index}.jsonl_text_document"
BATCH_BYTES = 1 << 20  # text per task: ~60 ms of tokenizing, so pickling and scheduling are noise
PROBE_BYTES = 1 << 16  # read around a batch boundary to find the end of its line
MAX_REPORTED_LINES = 20  # bad lines printed per output; the rest are only counted


# ---------------------------------------------------------------------------------------------------------------
# Items
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OutputItem:
    """One output prefix and the input files it is made of, in order."""

    index: int
    sources: tuple[str, ...]

    @property
    def prefix(self) -> str:
        return PREFIX_TEMPLATE.format(index=self.index)


def list_items(in_dir: Path, files_per_output: int | None) -> list[OutputItem]:
    """Every output of the stage (all ranks), in a fixed order."""
    if files_per_output is None:
        indexed = sorted((int(m.group(1)), m.group(0)) for name in visible_names(in_dir, ".jsonl")
                         if (m := JSONL_INPUT.fullmatch(name)))
        return [OutputItem(index, (name,)) for index, name in indexed]
    names = download_manifest_names(in_dir)
    if names is None:
        names = [name for suffix in INPUT_SUFFIXES for name in visible_names(in_dir, suffix)]
    # Sorted by the name without its format suffix, as concat sorts extract's outputs (0, 1, 10 in name order).
    names = sorted({n for n in names if input_suffix(n)}, key=lambda n: n[: -len(input_suffix(n))])
    return [OutputItem(i, tuple(names[start:start + files_per_output]))
            for i, start in enumerate(range(0, len(names), files_per_output))]


# ---------------------------------------------------------------------------------------------------------------
# Reading: batches of ~BATCH_BYTES of whole lines
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Batch:
    """Whole lines of one source: a byte range of a plain file, which the worker reads itself (so the text does
    not travel through the main process and a pipe), or bytes the main process decompressed from a .jsonl.zst or
    .jsonl.gz; or, from a parquet file, the texts themselves (one per row, None for a null)."""

    source: int  # index into the item's sources
    data: bytes = b""
    path: str = ""
    start: int = 0
    end: int = 0
    texts: list[str | None] | None = None

    def text(self) -> bytes:
        if not self.path:
            return self.data
        with open(self.path, "rb", buffering=0) as handle:
            data = os.pread(handle.fileno(), self.end - self.start, self.start)
        if len(data) != self.end - self.start:
            raise OSError(f"{Path(self.path).name} shrank while being read")
        return data


def line_ranges(path: Path, batch_bytes: int) -> Iterator[tuple[int, int]]:
    """(start, end) byte ranges of about `batch_bytes` that end just after a newline (or at the end of file).
    Only a small window around each cut is read here; the workers read the ranges themselves."""
    with open(path, "rb", buffering=0) as handle:
        fd, size, start = handle.fileno(), os.fstat(handle.fileno()).st_size, 0
        while start < size:
            end = min(start + batch_bytes, size)
            while end < size:  # move the cut to just after the next newline
                window = os.pread(fd, PROBE_BYTES, end - 1)
                newline = window.find(b"\n")
                if newline >= 0:
                    end += newline
                    break
                end = min(end - 1 + len(window), size) if window else size
            yield start, end
            start = end


def compressed_batches(source: int, path: Path, batch_bytes: int) -> Iterator[Batch]:
    """Decompressed whole lines of a .jsonl.zst or .jsonl.gz (a truncated stream raises, naming the file)."""
    pending: list[bytes] = []
    size = 0
    for block in (gzip_blocks if path.name.endswith(GZ_SUFFIX) else decompress_blocks)(path):
        pending.append(block)
        size += len(block)
        last_newline = block.rfind(b"\n")
        if size < batch_bytes or last_newline < 0:
            continue  # a small batch so far, or a line longer than a batch that has not ended yet
        data = b"".join(pending)
        cut = size - len(block) + last_newline + 1
        yield Batch(source, data=data[:cut])
        pending, size = [data[cut:]], size - cut
    if size:
        yield Batch(source, data=b"".join(pending))


def read_batches(paths: list[Path], batch_bytes: int, key: str = "text") -> Iterator[Batch]:
    """Every source in order, cut into batches of whole lines (of rows of the `key` column, for parquet); batches
    never span two sources."""
    for source, path in enumerate(paths):
        if path.name.endswith((ZST_SUFFIX, GZ_SUFFIX)):
            yield from compressed_batches(source, path, batch_bytes)
        elif path.name.endswith(PARQUET_SUFFIX):
            yield from (Batch(source, texts=texts) for texts in parquet_texts(path, key, batch_bytes))
        else:
            for start, end in line_ranges(path, batch_bytes):
                yield Batch(source, path=str(path), start=start, end=end)


# ---------------------------------------------------------------------------------------------------------------
# Tokenizing (in worker processes, or inline with one worker)
# ---------------------------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------------------------
# One output
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Context:
    """What every output of the rank shares."""

    in_dir: Path
    out_dir: Path
    tokenizer: Tokenizer
    executor: Executor | None
    window: int
    json_key: str = "text"


@dataclass
class Tally:
    """Counts over one output; turns batch-relative line indices into file line numbers (results come in order)."""

    item: OutputItem
    documents: int = 0
    empty: int = 0
    skipped: int = 0
    source: int = 0
    lines_before: int = 0  # lines of `source` in the batches already counted

    def add(self, result: BatchResult) -> None:
        if result.source != self.source:
            self.source, self.lines_before = result.source, 0
        self.documents += result.documents
        self.empty += result.empty
        for offset, reason in result.bad:
            self.skipped += 1
            if self.skipped <= MAX_REPORTED_LINES:
                line = self.lines_before + offset + 1
                print(f"{STAGE}: {self.item.sources[self.source]}:{line}: {reason} (skipped)", file=sys.stderr)
        self.lines_before += result.lines


def output_paths(out_dir: Path, prefix: str) -> tuple[Path, Path, Path]:
    base = out_dir / prefix
    return base.with_name(prefix + ".bin"), base.with_name(prefix + ".idx"), base.with_name(prefix + ".manifest.json")


def is_complete(out_dir: Path, item: OutputItem) -> bool:
    """The manifest exists and the .bin/.idx beside it have the sizes it records."""
    bin_path, idx_path, manifest_path = output_paths(out_dir, item.prefix)
    try:
        manifest = json.loads(manifest_path.read_text())
        return (bin_path.stat().st_size == manifest["bin_bytes"] and idx_path.stat().st_size == manifest["idx_bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def build_output(item: OutputItem, ctx: Context) -> dict:
    """Tokenize `item` into .bin/.idx, then write its manifest last; returns the manifest."""
    bin_path, idx_path, manifest_path = output_paths(ctx.out_dir, item.prefix)
    manifest_path.unlink(missing_ok=True)  # a stale manifest must not vouch for the files being rewritten
    spill_path = _common.temp_path_for(ctx.out_dir / f"{item.prefix}.lengths")
    tally = Tally(item)
    batches = read_batches([ctx.in_dir / name for name in item.sources], BATCH_BYTES, ctx.json_key)
    try:
        with open(spill_path, "w+b") as spill, _common.atomic_output(bin_path) as bin_file:
            bin_out = HashingWriter(bin_file)
            writer = IndexedDatasetWriter(bin_out, spill, token_dtype(ctx.tokenizer))
            for result in ordered_results(batches, ctx.executor, ctx.window):
                writer.add_batch(result.tokens, result.lengths)
                tally.add(result)
            if tally.documents == 0:  # nothing to train on: an upstream problem, not an output to publish
                raise _common.StageError(f"{', '.join(item.sources)}: no usable documents: all {tally.skipped} "
                                         f"lines were skipped (is --json-key right?) and {tally.empty} texts were "
                                         "empty")
            with _common.atomic_output(idx_path) as idx_file:
                idx_out = HashingWriter(idx_file)
                writer.write_index(idx_out)
    finally:
        spill_path.unlink(missing_ok=True)
    if tally.skipped > MAX_REPORTED_LINES:
        print(f"{STAGE}: {item.prefix}: {tally.skipped} lines skipped in all (first {MAX_REPORTED_LINES} shown)",
              file=sys.stderr)
    manifest = {
        "prefix": item.prefix, "documents": writer.sequences, "tokens": writer.tokens,
        "bin_bytes": bin_out.bytes, "idx_bytes": idx_out.bytes,
        "sha256_bin": bin_out.sha256.hexdigest(), "sha256_idx": idx_out.sha256.hexdigest(),
        "sources": list(item.sources), "skipped_lines": tally.skipped, "empty_documents": tally.empty,
        "tokenizer": describe(ctx.tokenizer), "dtype": writer.dtype.name,
    }
    _common.atomic_write_json(manifest_path, manifest)
    return manifest


# ---------------------------------------------------------------------------------------------------------------
# The rank's run
# ---------------------------------------------------------------------------------------------------------------

def make_executor(workers: int, spec: TokenizerSpec, key: str) -> Executor | None:
    """A pool of `workers` tokenizer processes, or None to tokenize inline (one worker: no pickling at all)."""
    if workers <= 1:
        return None
    # fork where available: workers inherit the tokenizer already loaded here instead of loading it again.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method),
                               initializer=init_worker,
                               initargs=(spec, key, _STATE.tokenizer if method else None, os.getpid()))


def run(args: argparse.Namespace, spec: TokenizerSpec, tokenizer: Tokenizer, rank: int, world: int) -> int:
    outputs = [p for suffix in (".bin", ".idx", ".manifest.json", ".lengths") for p in args.out_dir.glob(f"*{suffix}")]
    if _common.claim_or_refuse(args.out_dir, STAGE, outputs, rank):
        return 1
    items = list_items(args.in_dir, args.files_per_output)
    if not items:
        wanted = "/".join(f"*{s}" for s in INPUT_SUFFIXES) if args.files_per_output else "train_chunk_{i}.jsonl"
        return _common.fail_with_items(STAGE, {str(args.in_dir): f"no {wanted} inputs"})
    mine = _common.shard(items, rank, world)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    own = [args.out_dir / f"{item.prefix}{suffix}" for item in mine for suffix in (".bin", ".idx", ".manifest.json",
                                                                                     ".lengths")]
    _common.remove_stale_temporaries_of(own)
    progress = _common.Progress(len(mine), rank, unit="outputs")
    ctx = Context(args.in_dir, args.out_dir, tokenizer, make_executor(args.workers, spec, args.json_key),
                  window=2 * args.workers, json_key=args.json_key)
    failures: dict[str, str] = {}
    manifests: list[dict] = []
    skipped_complete = 0
    try:
        for item in mine:
            if is_complete(args.out_dir, item):
                skipped_complete += 1
            else:
                try:
                    manifests.append(timed_build(item, ctx))
                except BrokenProcessPool as exc:
                    failures[item.prefix] = f"a tokenizer worker died ({exc}); out of memory?"
                    ctx.executor = make_executor(args.workers, spec, args.json_key)
                except (_common.StageError, TokenizerError, OSError) as exc:
                    failures[item.prefix] = str(exc)
            if item.prefix not in failures:  # progress counts complete outputs only
                progress.advance()
    finally:
        if ctx.executor is not None:
            ctx.executor.shutdown(cancel_futures=True)
    if failures:
        return _common.fail_with_items(STAGE, failures)
    _common.write_completion(args.out_dir, STAGE, rank, world, {
        "outputs": len(mine), "written": len(manifests), "already_complete": skipped_complete,
        "documents": sum(m["documents"] for m in manifests), "tokens": sum(m["tokens"] for m in manifests),
        "skipped_lines": sum(m["skipped_lines"] for m in manifests)})
    return 0


def timed_build(item: OutputItem, ctx: Context) -> dict:
    started = time.monotonic()
    manifest = build_output(item, ctx)
    seconds = max(time.monotonic() - started, 1e-9)
    print(f"{STAGE}: {item.prefix}: {manifest['documents']} documents, {manifest['tokens']} tokens in "
          f"{seconds:.1f} s ({manifest['tokens'] / seconds:,.0f} tokens/s)", file=sys.stderr)
    return manifest


def default_workers() -> int:
    """One tokenizer process per CPU this process may use."""
    return _common.usable_cpus()


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, TokenizerSpec]:
    parser = argparse.ArgumentParser(prog="preprocess.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--in", dest="in_dir", type=Path, required=True,
                        help="folder of train_chunk_{i}.jsonl (or, with --files-per-output, of *.jsonl.zst, "
                        "*.jsonl.gz, *.parquet, *.jsonl)")
    parser.add_argument("--out", dest="out_dir", type=Path, required=True, help="folder for .bin/.idx/.manifest.json")
    parser.add_argument("--vocab", type=Path, help="GPT-2 vocab.json")
    parser.add_argument("--merges", type=Path, help="GPT-2 merges.txt")
    parser.add_argument("--tokenizer-json", type=Path, help="an HF tokenizer.json instead of GPT-2 BPE")
    parser.add_argument("--eod-token", help="end-of-document token of --tokenizer-json (default: a known one)")
    parser.add_argument("--json-key", default="text",
                        help="the JSON key (the column, in parquet) holding the document text")
    parser.add_argument("--files-per-output", type=_common.positive_int,
                        help="read downloaded files directly (.jsonl.zst, .jsonl.gz, .parquet, .jsonl), in concat's "
                        "groups of N per output")
    parser.add_argument("--workers", type=_common.positive_int, default=default_workers(),
                        help="tokenizer processes in this rank (default: the CPUs it may use)")
    args = parser.parse_args(argv)
    if not args.in_dir.is_dir():
        parser.error(f"--in {args.in_dir}: not a folder")
    if args.tokenizer_json is None and (args.vocab is None or args.merges is None):
        parser.error("give --vocab and --merges (GPT-2 BPE), or --tokenizer-json")
    spec = TokenizerSpec(vocab=args.vocab, merges=args.merges, tokenizer_json=args.tokenizer_json,
                         eod_token=args.eod_token)
    return args, spec


def main(argv: list[str] | None = None) -> int:
    args, spec = parse_args(argv)
    try:
        rank, world = _common.rank_and_world_size()
        tokenizer = spec.load()
    except (_common.StageError, TokenizerError) as exc:
        print(f"{STAGE}: {exc}", file=sys.stderr)
        return 2
    init_worker(spec, args.json_key, tokenizer)  # inline tokenizing, and what forked workers inherit
    try:
        return run(args, spec, tokenizer, rank, world)
    except _common.StageError as exc:  # e.g. an unreadable download manifest: nothing can be assigned
        return _common.fail_with_items(STAGE, {str(args.in_dir): str(exc)})


if __name__ == "__main__":
    sys.exit(main())
