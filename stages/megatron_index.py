"""Streaming writer for Megatron's indexed dataset (`PREFIX.bin` + `PREFIX.idx`), with bounded memory.

The format, as megatron-core's `IndexedDataset` reads it:

* `.bin`: the token ids of every sequence back to back, no header, in the index's dtype (numpy's native byte
  order, as megatron-core reads them): uint16 for a vocabulary of fewer than 65,500 ids, else int32.
* `.idx`, every integer little-endian; with N sequences:
  - bytes 0-8: the magic `MMIDIDX` followed by two zero bytes;
  - bytes 9-16: the version, uint64, 1;
  - byte 17: the dtype's code, uint8 (megatron-core's `DType`: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
    6 float64, 7 float32, 8 uint16);
  - bytes 18-25: the sequence count N, uint64; bytes 26-33: the document count N + 1, uint64;
  - from byte 34: N int32 sequence lengths, in tokens;
  - then N int64 pointers: each sequence's byte offset in `.bin` (0 for the first, then the running sum of the
    lengths before it times the dtype's size);
  - then N + 1 int64 document indices `[0, 1, ..., N]`: document i is sequences idx[i] to idx[i + 1] - 1.

Every document is one sequence here (Megatron's preprocess_data.py without sentence splitting). megatron-core's
own `IndexedDatasetBuilder` keeps every length in a Python list until `finalize` (tens of millions of Python ints
for one 16 GB shard); this writer spills the lengths to a scratch file as int32 and builds the index from it in
fixed-size chunks, so memory stays flat whatever the shard size.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQB")  # magic, version, dtype code
COUNTS = struct.Struct("<QQ")  # sequence count, document count (+1 for the leading 0)
LENGTH_DTYPE = np.dtype("<i4")
POINTER_DTYPE = np.dtype("<i8")
DOCUMENT_DTYPE = np.dtype("<i8")
# megatron.core.datasets.indexed_dataset.DType
DTYPE_CODES: dict[np.dtype, int] = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
UINT16_VOCAB_LIMIT = 65500  # megatron-core's DType.optimal_dtype: uint16 below this vocabulary size, else int32
INDEX_CHUNK = 1 << 20  # entries per chunk while building the .idx (4-8 MiB of numpy at a time)


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The token dtype Megatron uses for a vocabulary of this size."""
    return np.dtype(np.uint16) if vocab_size < UINT16_VOCAB_LIMIT else np.dtype(np.int32)


class HashingWriter:
    """Wraps a binary handle: counts the bytes written and their sha256 (for the output manifest)."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes | memoryview) -> None:
        self.sha256.update(data)
        self.handle.write(data)
        self.bytes += memoryview(data).nbytes


class IndexedDatasetWriter:
    """Appends documents to `.bin` and their lengths to a scratch file; `write_index` then streams out `.idx`.

    `bin_out` and `spill` are open binary handles the caller owns (and makes atomic / removes).
    """

    def __init__(self, bin_out: BinaryIO | HashingWriter, spill: BinaryIO, dtype: np.dtype) -> None:
        if np.dtype(dtype) not in DTYPE_CODES:
            raise ValueError(f"{dtype} is not a Megatron indexed-dataset dtype")
        self.bin_out, self.spill, self.dtype = bin_out, spill, np.dtype(dtype)
        self.sequences = 0
        self.tokens = 0

    def add_batch(self, tokens: bytes, lengths: bytes) -> None:
        """Append documents: `tokens` (this dtype, back to back) and their `lengths` (int32 bytes), in order."""
        count = len(lengths) // LENGTH_DTYPE.itemsize
        if count == 0:
            return
        self.bin_out.write(tokens)
        self.spill.write(lengths)
        self.sequences += count
        self.tokens += len(tokens) // self.dtype.itemsize

    def write_index(self, idx_out: BinaryIO | HashingWriter) -> None:
        """Write the whole `.idx`, reading the spilled lengths back in chunks (memory does not grow with N)."""
        n = self.sequences
        idx_out.write(HEADER.pack(MAGIC, VERSION, DTYPE_CODES[self.dtype]) + COUNTS.pack(n, n + 1))
        for lengths in self._spilled_lengths():
            idx_out.write(lengths.tobytes())
        offset = 0  # byte offset of the next sequence in .bin
        for lengths in self._spilled_lengths():
            ends = np.cumsum(lengths, dtype=POINTER_DTYPE) * self.dtype.itemsize + offset
            starts = np.empty_like(ends)
            starts[0] = offset
            starts[1:] = ends[:-1]
            offset = int(ends[-1])
            idx_out.write(starts.tobytes())
        for start in range(0, n + 1, INDEX_CHUNK):
            idx_out.write(np.arange(start, min(start + INDEX_CHUNK, n + 1), dtype=DOCUMENT_DTYPE).tobytes())
        if offset != self.tokens * self.dtype.itemsize:
            raise AssertionError(f"index covers {offset} bytes but {self.tokens} tokens were written")

    def _spilled_lengths(self) -> Iterator[np.ndarray]:
        """Yield the spilled lengths as int32 arrays of at most INDEX_CHUNK entries."""
        self.spill.flush()
        self.spill.seek(0)
        remaining = self.sequences
        while remaining:
            want = min(remaining, INDEX_CHUNK)
            data = self.spill.read(want * LENGTH_DTYPE.itemsize)
            if len(data) != want * LENGTH_DTYPE.itemsize:
                raise OSError(f"length scratch file is short: {len(data)} bytes read, {want * 4} expected")
            remaining -= want
            yield np.frombuffer(data, dtype=LENGTH_DTYPE)
        self.spill.seek(0, 2)
