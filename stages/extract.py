#!/usr/bin/env python3
"""extract stage: `IN/X.jsonl.zst` -> `OUT/X.jsonl`, streaming, sharded by rank, resumable, never with a hole.

    python3 extract.py --in DIR --out DIR [--keep-source] [--validate-json] [--threads N]

Decompression streams through every zstd frame of a file. A file that ends inside a frame, or holds bytes that are
not zstd, fails its item with the file named (the guide's extract skipped such files and concat then silently lost
their documents). Each output is written under a hidden temporary name (full blocks go to the disk by direct I/O
while decompression goes on, see `_durable.py`), fsynced, and renamed only when complete; the source is deleted
only after that (unless `--keep-source`).

The item list is the download manifest `IN/.manifest/download.json` when present, else the sorted union of the
`*.jsonl.zst` stems in IN and the `*.jsonl` already in OUT: extract deletes its sources, so a plain listing would
change while ranks run and a rank that starts late would compute different shards.

`--validate-json` checks that every line is a JSON object with a string `text`. Bad lines are reported as
`X.jsonl:LINE: reason` and counted, but they do not fail the item and the output stays byte-exact: extraction is
lossless, and deciding what to drop is the tokenizer's job (preprocess skips and reports the same lines).

`--threads N` (default: 2, or 1 when this process may use only one CPU) extracts up to N files of the rank's shard
at once: zstandard and file writes release the GIL, so the two decompress on two cores while the writer threads
send their blocks to the disk. Outputs are the same bytes whatever N is; each file still becomes visible only by
its own rename.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import _common
import _durable
import zstandard

STAGE = "extract"
IN_SUFFIX = ".jsonl.zst"
OUT_SUFFIX = ".jsonl"
DOWNLOAD_MANIFEST = Path(".manifest") / "download.json"
# Compressed bytes per read. 256 KiB measured fastest here (bigger reads make bigger joined outputs that miss the
# CPU caches); each read inflates to about 1 MiB of text, which is also the write size.
READ_SIZE = 1 << 18
MAX_REPORTED_LINES = 20  # bad lines printed per file; the rest are only counted
SHORT_LINES = 1024  # newlines per block beyond which count_newlines stops hopping and counts every byte
MAX_DEFAULT_THREADS = 2  # files extracted at once by default (more only adds memory and disk contention here)
# Magic numbers of what else a file named .zst turns out to be, named in the error.
FOREIGN_MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"BZh", "bzip2"),
    (b"PK\x03\x04", "zip"),
    (b"{", "uncompressed JSON"),
)


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
        raise _common.StageError(f'{path}: expected {{"files": [names]}}; fix or remove it')
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
                    raise CorruptInput(
                        f"{path.name}: not valid zstd near compressed byte {consumed}: {exc}" + foreign_format(path)
                    ) from exc
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


def foreign_format(path: Path) -> str:
    """What `path` is when it starts with another format's magic number, as words to append to the error, else
    "": a gzip file named .zst would otherwise read as just "Unknown frame descriptor"."""
    with open(path, "rb") as handle:
        head = handle.read(6)
    for magic, name in FOREIGN_MAGIC:
        if head.startswith(magic):
            return f" (it is {name} data, not zstd: recompress it with zstd or download it again)"
    return ""


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
# One item
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Finished:
    """What one extracted file produced (for the rank's summary)."""

    stem: str
    lines: int = 0
    bytes_out: int = 0
    bad_lines: int = 0
    skipped: bool = False


def extract_one(stem: str, args: argparse.Namespace) -> Finished:
    """Extract one item: the output is on disk under its final name before the source is deleted."""
    source, final = args.in_dir / (stem + IN_SUFFIX), args.out_dir / (stem + OUT_SUFFIX)
    if final.exists():
        # Complete already (outputs appear only by rename); a kill may have come before the source was deleted.
        if not args.keep_source:
            source.unlink(missing_ok=True)
        return Finished(stem, skipped=True)
    if not source.exists():
        raise _common.StageError(f"{source.name} is missing and {final.name} was never completed")
    stats = LineStats(final.name, args.validate_json)
    with _durable.durable_output(final) as out:
        for block in decompress_blocks(source):
            stats.feed(block)
            out.write(block)
        stats.finish()
    if not args.keep_source:
        source.unlink(missing_ok=True)
    if stats.bad_lines > MAX_REPORTED_LINES:
        print(
            f"{STAGE}: {final.name}: {stats.bad_lines} bad lines in all (first {MAX_REPORTED_LINES} shown)",
            file=sys.stderr,
        )
    return Finished(stem, lines=stats.lines, bytes_out=out.size, bad_lines=stats.bad_lines)


# ---------------------------------------------------------------------------------------------------------------
# The rank's run
# ---------------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, rank: int, world: int) -> int:
    if _common.claim_or_refuse(args.out_dir, STAGE, args.out_dir.glob(f"*{OUT_SUFFIX}"), rank):
        return 1
    stems = list_stems(args.in_dir, args.out_dir)
    if not stems:
        return _common.fail_with_items(STAGE, {str(args.in_dir): f"no *{IN_SUFFIX} inputs and no download manifest"})
    mine = _common.shard(stems, rank, world)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    _common.remove_stale_temporaries_of(args.out_dir / (stem + OUT_SUFFIX) for stem in mine)
    progress = _common.Progress(len(mine), rank)
    finished: list[Finished] = []
    failures: dict[str, str] = {}

    def record(stem: str, attempt) -> None:
        try:
            done = attempt()
        except (_common.StageError, OSError) as exc:
            failures[stem + IN_SUFFIX] = str(exc)
            done = None
        if done is not None:  # a failed file is not done: progress counts complete outputs only
            finished.append(done)
            progress.advance()

    if args.threads == 1:
        for stem in mine:
            record(stem, functools.partial(extract_one, stem, args))
    else:
        extract_concurrently(mine, args, record)
    if failures:
        return _common.fail_with_items(STAGE, failures)
    _common.write_completion(args.out_dir, STAGE, rank, world, summarize(finished))
    return 0


def extract_concurrently(stems: list[str], args: argparse.Namespace, record) -> None:
    """Extract `stems` with up to `args.threads` files in flight, in shard order; `record(stem, result)` runs on
    this thread for each file as it finishes (so progress lines and the failure list are never touched at once)."""
    pool = ThreadPoolExecutor(max_workers=args.threads, thread_name_prefix="extract")
    in_flight: dict[Future, str] = {}
    try:
        for stem in stems:
            if len(in_flight) >= args.threads:
                settle(wait(in_flight, return_when=FIRST_COMPLETED).done, in_flight, record)
            in_flight[pool.submit(extract_one, stem, args)] = stem
        while in_flight:
            settle(wait(in_flight, return_when=FIRST_COMPLETED).done, in_flight, record)
    finally:
        # On an interrupt: files not yet started never start; those in flight finish (or clean up) first.
        pool.shutdown(wait=True, cancel_futures=True)


def settle(futures, in_flight: dict[Future, str], record) -> None:
    for future in sorted(futures, key=lambda f: in_flight[f]):
        record(in_flight.pop(future), future.result)


def summarize(finished: list[Finished]) -> dict:
    new = [f for f in finished if not f.skipped]
    return {
        "files": len(finished),
        "extracted": len(new),
        "already_complete": len(finished) - len(new),
        "lines": sum(f.lines for f in new),
        "bytes": sum(f.bytes_out for f in new),
        "bad_lines": sum(f.bad_lines for f in new),
    }


def default_threads() -> int:
    """min(MAX_DEFAULT_THREADS, the CPUs this process may use)."""
    return min(MAX_DEFAULT_THREADS, _common.usable_cpus())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="extract.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--in", dest="in_dir", type=Path, required=True, help="folder of *.jsonl.zst")
    parser.add_argument("--out", dest="out_dir", type=Path, required=True, help="folder for *.jsonl (may be --in)")
    parser.add_argument("--keep-source", action="store_true", help="do not delete X.jsonl.zst after extracting it")
    parser.add_argument(
        "--validate-json",
        action="store_true",
        help="report (and count) lines that are not JSON objects with a string 'text'",
    )
    parser.add_argument(
        "--threads",
        type=_common.positive_int,
        default=default_threads(),
        help="files extracted at once (default: %(default)s)",
    )
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
