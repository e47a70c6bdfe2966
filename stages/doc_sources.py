"""Document sources beyond plain and zstd JSONL, for tokenize-preprocess: `.jsonl.gz` and `.parquet`.

* `.jsonl.gz`: `gzip_blocks` yields the decompressed bytes (every member of a multi-member file); a cut-short or
  corrupt file raises `extract.CorruptInput` naming it, as a cut `.zst` does.
* `.parquet` (FineWeb, FineWeb-Edu, DCLM...): `parquet_texts` reads only the text column, one row group at a time
  (pyarrow), and yields lists of about `batch_bytes` of texts; memory stays at a row group plus a batch whatever
  the file's size. A missing column, or one that is not text, is an error naming the file, the column and the
  columns there are. A null text is passed on as None (the tokenizer reports that row and skips it).

The formats preprocess reads, by suffix, are `INPUT_SUFFIXES`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

from extract import CorruptInput

ZST_SUFFIX, GZ_SUFFIX, PARQUET_SUFFIX, JSONL_SUFFIX = ".jsonl.zst", ".jsonl.gz", ".parquet", ".jsonl"
INPUT_SUFFIXES = (ZST_SUFFIX, GZ_SUFFIX, PARQUET_SUFFIX, JSONL_SUFFIX)
READ_SIZE = 1 << 18
PARQUET_ROWS_PER_READ = 1024  # rows per Arrow record batch: small against a row group, large against overhead


def input_suffix(name: str) -> str | None:
    """The input format of `name` (one of INPUT_SUFFIXES), or None when preprocess does not read it."""
    return next((suffix for suffix in INPUT_SUFFIXES if name.endswith(suffix)), None)


def gzip_blocks(path: Path, read_size: int = READ_SIZE) -> Iterator[bytes]:
    """The decompressed bytes of every gzip member of `path`; CorruptInput when the last member does not end."""
    inflater = zlib.decompressobj(wbits=31)  # 31: gzip header and trailer (its CRC and length are checked)
    consumed = 0
    with open(path, "rb", buffering=0) as source:
        while chunk := source.read(read_size):
            consumed += len(chunk)
            while chunk:
                try:
                    block = inflater.decompress(chunk)
                except zlib.error as exc:
                    raise CorruptInput(f"{path.name}: not valid gzip near compressed byte {consumed}: {exc}") from exc
                if block:
                    yield block
                if inflater.eof:  # a member ended: what follows is the next member
                    chunk, inflater = inflater.unused_data, zlib.decompressobj(wbits=31)
                    started = bool(chunk)
                else:
                    chunk, started = b"", True
    if consumed == 0:
        raise CorruptInput(f"{path.name}: empty file, not a gzip stream")
    if started and not inflater.eof:
        raise CorruptInput(f"{path.name}: truncated gzip stream (ends inside a member after {consumed} bytes)")


def parquet_texts(path: Path, column: str, batch_bytes: int) -> Iterator[list[str | None]]:
    """The `column` of every row of `path`, in order, in lists of about `batch_bytes` of text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise CorruptInput(f"{path.name}: not a readable parquet file: {exc}") from exc
    schema = parquet.schema_arrow
    if column not in schema.names:
        raise CorruptInput(
            f"{path.name}: no column {column!r} (its columns: {', '.join(schema.names)}); "
            "--json-key names the text column of parquet inputs"
        )
    kind = schema.field(column).type
    if not (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or getattr(pa.types, "is_string_view", lambda _: False)(kind)
    ):
        raise CorruptInput(f"{path.name}: column {column!r} holds {kind}, not text; --json-key names the text column")
    texts: list[str | None] = []
    size = 0
    try:
        for record_batch in parquet.iter_batches(batch_size=PARQUET_ROWS_PER_READ, columns=[column], use_threads=False):
            values = record_batch.column(0)
            texts += values.to_pylist()
            size += values.nbytes
            if size >= batch_bytes:
                yield texts
                texts, size = [], 0
    except (pa.ArrowException, OSError) as exc:
        raise CorruptInput(f"{path.name}: unreadable parquet data after {len(texts)} rows of a batch: {exc}") from exc
    if texts:
        yield texts
