#!/usr/bin/env python3
"""extract stage: `IN/X.jsonl.zst` -> `OUT/X.jsonl`, streaming, sharded by rank, resumable, never with a hole.

    python3 extract.py --in DIR --out DIR [--keep-source] [--validate-json] [--threads N]

Decompression streams through every zstd frame of a file. A file that ends inside a frame, or holds bytes that are
not zstd, fails its item with the file named (the guide's extract skipped such files and concat then silently lost
their documents). Each output is written under a hidden temporary name and renamed only when complete; the source
is deleted only after that (unless `--keep-source`).

The item list is the download manifest `IN/.manifest/download.json` when present, else the sorted union of the
`*.jsonl.zst` stems in IN and the `*.jsonl` already in OUT: extract deletes its sources, so a plain listing would
change while ranks run and a rank that starts late would compute different shards.

`--validate-json` checks that every line is a JSON object with a string `text`. Bad lines are reported as
`X.jsonl:LINE: reason` and counted, but they do not fail the item and the output stays byte-exact: extraction is
lossless, and deciding what to drop is the tokenizer's job (preprocess skips and reports the same lines).

`--threads N` (default: 2, or 1 when this process may use only one CPU) extracts up to N files of the rank's shard
at once: zstandard and file writes release the GIL, so one file's decompression overlaps another's writeback and
fsync. Outputs are the same bytes whatever N is; each file still becomes visible only by its own rename.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import zstandard

import _common

STAGE = "extract"
IN_SUFFIX = ".jsonl.zst"
OUT_SUFFIX = ".jsonl"
DOWNLOAD_MANIFEST = Path(".manifest") / "download.json"
# Compressed bytes per read. 256 KiB measured fastest here (bigger reads make bigger joined outputs that miss the
# CPU caches); each read inflates to about 1 MiB of text, which is also the write size.
READ_SIZE = 1 << 18
MAX_REPORTED_LINES = 20  # bad lines printed per file; the rest are only counted
SHORT_LINES = 1024  # newlines per block beyond which count_newlines stops hopping and counts every byte
WRITEBACK_BYTES = 8 << 20  # start writing the output to disk every 8 MiB (see start_writeback)
MAX_UNCOMMITTED = 2  # extracted files waiting for their fsync + rename at most
MAX_DEFAULT_THREADS = 2  # files extracted at once by default (more only adds memory and disk contention here)


class CorruptInput(_common.StageError):
    """A compressed input is truncated or is not valid zstd."""


# ---------------------------------------------------------------------------------------------------------------
# Item list
# ---------------------------------------------------------------------------------------------------------------

def download_manifest_names(in_dir: Path) -> list[str] | None:
    """The names the download stage promised (`{"files": [names]}`), or None when there is no manifest."""
    path = in_dir / DOWNLOAD_MANIFEST
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise _common.StageError(f"{path}: unreadable download manifest ({exc}); fix or remove it") from exc
    files = payload.get("files") if isinstance(payload, dict) else None
    if not isinstance(files, list) or not all(isinstance(name, str) for name in files):
        raise _common.StageError(f"{path}: expected {{\"files\": [names]}}; fix or remove it")
    return sorted({Path(name).name for name in files})


def stem_of(name: str, suffix: str) -> str:
    return name[: -len(suffix)]


def visible_names(folder: Path, suffix: str) -> list[str]:
    """Names in `folder` ending in `suffix`, hidden temporaries excluded."""
    if not folder.is_dir():
        return []
    with os.scandir(folder) as entries:
        return [e.name for e in entries if e.name.endswith(suffix) and not e.name.startswith(".") and e.is_file()]


def list_stems(in_dir: Path, out_dir: Path) -> list[str]:
    """Every item of the stage (all ranks), as sorted stems `X` of `X.jsonl.zst`; stable while extract runs."""
    names = download_manifest_names(in_dir)
    if names is not None:
        return sorted(stem_of(n, IN_SUFFIX) for n in names if n.endswith(IN_SUFFIX))
    sources = {stem_of(n, IN_SUFFIX) for n in visible_names(in_dir, IN_SUFFIX)}
    done = {stem_of(n, OUT_SUFFIX) for n in visible_names(out_dir, OUT_SUFFIX)}
    return sorted(sources | done)


# ---------------------------------------------------------------------------------------------------------------
# Decompression (also used by preprocess for `.jsonl.zst` inputs)
# ---------------------------------------------------------------------------------------------------------------

def decompress_blocks(path: Path, read_size: int = READ_SIZE) -> Iterator[bytes]:
    """Yield the decompressed bytes of every frame of `path`; raise CorruptInput on a truncated or bad stream.

    One decompressobj per frame rather than `stream_reader(read_across_frames=True)`: that reader (like
    `copy_stream`) returns a clean EOF when the file stops in the middle of a frame, so a cut-short download would
    pass as a shorter file. Per frame, `eof` tells whether the frame finished, and `unused_data` starts the next one.
    """
    dctx = zstandard.ZstdDecompressor()
    frame = None  # the decompressobj of the frame being read; None between frames
    consumed = 0
    with open(path, "rb", buffering=0) as source:
        while chunk := source.read(read_size):
            consumed += len(chunk)
            while chunk:
                if frame is None:
                    frame = dctx.decompressobj()
                try:
                    block = frame.decompress(chunk)
                except zstandard.ZstdError as exc:
                    raise CorruptInput(f"{path.name}: not valid zstd near compressed byte {consumed}: {exc}") from exc
                if block:
                    yield block
                if frame.eof:
                    chunk, frame = frame.unused_data, None
                else:
                    chunk = b""
    if consumed == 0:
        raise CorruptInput(f"{path.name}: empty file, not a zstd stream")
    if frame is not None:
        raise CorruptInput(f"{path.name}: truncated zstd stream (ends inside a frame after {consumed} bytes)")


# ---------------------------------------------------------------------------------------------------------------
# Line counting and optional JSON validation
# ---------------------------------------------------------------------------------------------------------------

def line_problem(line: bytes, key: str) -> str | None:
    """Why `line` is not a usable document (a JSON object with a string `key`), or None when it is."""
    try:
        record = json.loads(line)
    except UnicodeDecodeError:
        return "not valid UTF-8"
    except ValueError as exc:
        return "empty line" if not line.strip() else f"invalid JSON ({exc})"
    if not isinstance(record, dict):
        return "not a JSON object"
    if key not in record:
        return f"no {key!r} key"
    if not isinstance(record[key], str):
        return f"{key!r} is not a string"
    return None


def count_newlines(block: bytes) -> int:
    """Newlines in `block`. SlimPajama lines average several KB, so hopping from newline to newline with
    `find` (memchr) is about 4x faster than `bytes.count`, which tests every byte; if the lines turn out short,
    the rest of the block is counted with `bytes.count` instead, so the worst case stays linear."""
    find = block.find
    count, at = 0, find(b"\n")
    while at >= 0:
        count += 1
        if count == SHORT_LINES:
            return count + block.count(b"\n", at + 1)
        at = find(b"\n", at + 1)
    return count


@dataclass
class LineStats:
    """Counts lines across blocks; with `validate`, also checks each line and reports the bad ones."""

    name: str
    validate: bool
    key: str = "text"
    lines: int = 0
    bad_lines: int = 0
    last_byte: bytes = b"\n"
    _carry: bytes = b""

    def feed(self, block: bytes) -> None:
        self.lines += count_newlines(block)
        self.last_byte = block[-1:]
        if self.validate:
            self._check_complete_lines(block)

    def finish(self) -> None:
        """Count a final line without a newline (and check it)."""
        if self.last_byte != b"\n":
            self.lines += 1
            if self.validate:
                self._check(self._carry, self.lines)
            self._carry = b""

    def _check_complete_lines(self, block: bytes) -> None:
        data = self._carry + block
        pieces = data.split(b"\n")
        self._carry = pieces.pop()  # the unfinished last line (b"" when the block ends with a newline)
        first = self.lines - len(pieces) + 1
        for offset, line in enumerate(pieces):
            self._check(line, first + offset)

    def _check(self, line: bytes, number: int) -> None:
        problem = line_problem(line, self.key)
        if problem is None:
            return
        self.bad_lines += 1
        if self.bad_lines <= MAX_REPORTED_LINES:
            print(f"{STAGE}: {self.name}:{number}: {problem}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------------------
# One item, and the background commit that overlaps one file's fsync with the next file's decompression
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Finished:
    """What one extracted file produced (for the rank's summary)."""

    stem: str
    lines: int = 0
    bytes_out: int = 0
    bad_lines: int = 0
    skipped: bool = False


def decompress_to_temporary(source: Path, tmp: Path, stats: LineStats) -> int:
    """Write the decompressed `source` to `tmp` (its fsync comes later, in `commit`); return the byte count."""
    written = flushed = 0
    with open(tmp, "wb", buffering=0) as out:
        for block in decompress_blocks(source):
            stats.feed(block)
            out.write(block)
            written += len(block)
            if written - flushed >= WRITEBACK_BYTES:
                _common.start_writeback(out.fileno(), flushed, written - flushed)
                flushed = written
    stats.finish()
    return written


def commit(tmp: Path, final: Path, source: Path, keep_source: bool) -> None:
    """fsync, rename into place, fsync the folder; only then delete the source."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    _common.fsync_dir(final.parent)
    if not keep_source:
        source.unlink(missing_ok=True)


class Committer:
    """Runs `commit` on one background thread, so the disk flush of a file overlaps decompressing the next.

    `submit` may be called from several extracting threads at once."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="extract-commit")
        self._pending: list[tuple[Finished, Path, Future]] = []
        self._lock = threading.Lock()

    def submit(self, done: Finished, tmp: Path, final: Path, source: Path, keep_source: bool) -> None:
        # Bounded: when the disk is slower than decompression, wait here rather than pile up uncommitted files.
        while True:
            with self._lock:
                unfinished = [future for _, _, future in self._pending if not future.done()]
                if len(unfinished) < MAX_UNCOMMITTED:
                    self._pending.append((done, tmp, self._pool.submit(commit, tmp, final, source, keep_source)))
                    return
            wait(unfinished[:1])

    def drain(self) -> tuple[list[Finished], dict[str, str]]:
        """Wait for every commit: the finished items, and the failures by source name."""
        finished, failures = [], {}
        for done, tmp, future in self._pending:
            try:
                future.result()
                finished.append(done)
            except OSError as exc:
                failures[done.stem + IN_SUFFIX] = f"could not commit the output: {exc}"
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
        self._pending.clear()
        self._pool.shutdown()
        return finished, failures


def extract_one(stem: str, args: argparse.Namespace, committer: Committer) -> Finished | None:
    """Extract one item; None when it was handed to the committer, a Finished record when it was already done."""
    source, final = args.in_dir / (stem + IN_SUFFIX), args.out_dir / (stem + OUT_SUFFIX)
    if final.exists():
        # Complete already (outputs appear only by rename); a kill may have come before the source was deleted.
        if not args.keep_source:
            source.unlink(missing_ok=True)
        return Finished(stem, skipped=True)
    if not source.exists():
        raise _common.StageError(f"{source.name} is missing and {final.name} was never completed")
    tmp = _common.temp_path_for(final)
    stats = LineStats(final.name, args.validate_json)
    try:
        written = decompress_to_temporary(source, tmp, stats)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    done = Finished(stem, lines=stats.lines, bytes_out=written, bad_lines=stats.bad_lines)
    if stats.bad_lines > MAX_REPORTED_LINES:
        print(f"{STAGE}: {final.name}: {stats.bad_lines} bad lines in all (first {MAX_REPORTED_LINES} shown)",
              file=sys.stderr)
    committer.submit(done, tmp, final, source, args.keep_source)
    return None


# ---------------------------------------------------------------------------------------------------------------
# The rank's run
# ---------------------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace, rank: int, world: int) -> int:
    stems = list_stems(args.in_dir, args.out_dir)
    if not stems:
        return _common.fail_with_items(STAGE, {str(args.in_dir): f"no *{IN_SUFFIX} inputs and no download manifest"})
    mine = _common.shard(stems, rank, world)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    _common.remove_stale_temporaries_of(args.out_dir / (stem + OUT_SUFFIX) for stem in mine)
    progress = _common.Progress(len(mine), rank)
    committer = Committer()
    finished: list[Finished] = []
    failures: dict[str, str] = {}

    def record(stem: str, attempt) -> None:
        try:
            done = attempt()
        except (_common.StageError, OSError) as exc:
            failures[stem + IN_SUFFIX] = str(exc)
            done = None
        if done is not None:
            finished.append(done)
        progress.advance()

    try:
        if args.threads == 1:
            for stem in mine:
                record(stem, lambda: extract_one(stem, args, committer))
        else:
            extract_concurrently(mine, args, committer, record)
    finally:
        committed, commit_failures = committer.drain()
    finished += committed
    failures.update(commit_failures)
    if failures:
        return _common.fail_with_items(STAGE, failures)
    _common.write_completion(args.out_dir, STAGE, rank, world, summarize(finished))
    return 0


def extract_concurrently(stems: list[str], args: argparse.Namespace, committer: Committer, record) -> None:
    """Extract `stems` with up to `args.threads` files in flight, in shard order; `record(stem, result)` runs on
    this thread for each file as it finishes (so progress lines and the failure list are never touched at once)."""
    pool = ThreadPoolExecutor(max_workers=args.threads, thread_name_prefix="extract")
    in_flight: dict[Future, str] = {}
    try:
        for stem in stems:
            if len(in_flight) >= args.threads:
                settle(wait(in_flight, return_when=FIRST_COMPLETED).done, in_flight, record)
            in_flight[pool.submit(extract_one, stem, args, committer)] = stem
        while in_flight:
            settle(wait(in_flight, return_when=FIRST_COMPLETED).done, in_flight, record)
    finally:
        # On an interrupt: files not yet started never start; those in flight finish (or clean up) first, so no
        # thread is still writing when the committer drains.
        pool.shutdown(wait=True, cancel_futures=True)


def settle(futures, in_flight: dict[Future, str], record) -> None:
    for future in sorted(futures, key=lambda f: in_flight[f]):
        record(in_flight.pop(future), future.result)


def summarize(finished: list[Finished]) -> dict:
    new = [f for f in finished if not f.skipped]
    return {"files": len(finished), "extracted": len(new), "already_complete": len(finished) - len(new),
            "lines": sum(f.lines for f in new), "bytes": sum(f.bytes_out for f in new),
            "bad_lines": sum(f.bad_lines for f in new)}


def default_threads() -> int:
    """min(MAX_DEFAULT_THREADS, the CPUs this process may use)."""
    return min(MAX_DEFAULT_THREADS, _common.usable_cpus())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="extract.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--in", dest="in_dir", type=Path, required=True, help="folder of *.jsonl.zst")
    parser.add_argument("--out", dest="out_dir", type=Path, required=True, help="folder for *.jsonl (may be --in)")
    parser.add_argument("--keep-source", action="store_true", help="do not delete X.jsonl.zst after extracting it")
    parser.add_argument("--validate-json", action="store_true",
                        help="report (and count) lines that are not JSON objects with a string 'text'")
    parser.add_argument("--threads", type=_common.positive_int, default=default_threads(),
                        help="files extracted at once (default: %(default)s)")
    args = parser.parse_args(argv)
    if not args.in_dir.is_dir():
        parser.error(f"--in {args.in_dir}: not a folder")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rank, world = _common.rank_and_world_size()
    except _common.StageError as exc:
        print(f"{STAGE}: {exc}", file=sys.stderr)
        return 2
    try:
        return run(args, rank, world)
    except _common.StageError as exc:  # e.g. an unreadable download manifest: nothing can be assigned
        return _common.fail_with_items(STAGE, {str(args.in_dir): str(exc)})


if __name__ == "__main__":
    sys.exit(main())
