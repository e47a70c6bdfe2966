"""The preprocess stage's reading: each source of an output cut into batches of whole lines, about
`batch_bytes` each, that never span two sources.

A plain `.jsonl` is cut into byte ranges (the worker that tokenizes a batch reads its range itself); a `.jsonl.zst`
or `.jsonl.gz` is decompressed by the main process, which hands the lines over; a parquet file gives the rows of
its text column.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from doc_sources import GZ_SUFFIX, PARQUET_SUFFIX, ZST_SUFFIX, gzip_blocks, parquet_texts
from extract import decompress_blocks

PROBE_BYTES = 1 << 16  # read around a batch boundary to find the end of its line


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
