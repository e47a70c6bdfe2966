"""GPT-2 BPE through gigatoken, the fast engine of tokenize-preprocess, with its pre-token cache kept bounded.

gigatoken (stages/requirements-fast.txt) gives tiktoken's ids for 1/15 of the CPU (docs/performance.md). Its 0.10.0
caches every distinct pre-token it has seen, without a bound (its issue 36: a TB-scale job ran out of 1 TB of RAM; the
bound, `set_max_cache_bytes`, came after 0.10.0). Here the cache is bounded from outside: the process's resident memory
is read every CACHE_CHECK_CHARS characters encoded, and where it grew by more than CACHE_GROWTH_BYTES since the
tokenizer was first built, the tokenizer is built again (0.05 CPU-seconds; dropping it, and malloc_trim, hand the cache
back to the system). The rebuild waits for the end of the batch, where the stage's workers call `drop_cache_if_due` with
none of a batch's texts and ids alive: then the cache's pages go back whole and every cycle peaks where the first did
(measured, words that never repeat: 130 MB at 8 MB of input and 131 MB at 80 MB; rebuilt mid-batch, where the live texts
and ids pin some of those pages, 130 and 146 MB). Past twice the bound it is rebuilt at once, for a caller that never
calls it. A text longer than PIECE_CHARS is encoded in pieces, one at a time, with the due rebuild between two pieces,
so that one 50 MB document cannot grow the cache past the bound nor be held twice: each cut is at a space between two
non-space characters, where no GPT-2 pre-token can span (every pre-token that holds a non-space character ends before a
space, and the one that starts at such a space is decided by what follows it), so the pieces' ids are the whole text's.

Special tokens: the tokenizer is built without any, so a literal "<|endoftext|>" inside a document is ordinary
text, as in Megatron's GPT2BPETokenizer and in tiktoken's encode_ordinary.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import re
import tempfile
from collections.abc import Iterator

import numpy as np
from _allocator import return_freed_memory

ENGINE = "gigatoken"
PIECE_CHARS = 1 << 20  # a text longer than this is encoded in pieces of about this many characters
CACHE_CHECK_CHARS = 1 << 20  # read the resident memory after about this many characters encoded
CACHE_GROWTH_BYTES = 32 << 20  # rebuild the tokenizer (dropping its cache) past this much growth
# A space between two non-space characters (Python's \s is a superset of Unicode's White_Space, which the GPT-2
# pattern's \s is, so \S here is never whitespace there).
SAFE_CUT = re.compile(r"(?<=\S) (?=\S)")
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def installed_version() -> str | None:
    """gigatoken's version where it can be imported, else None (the stage then uses tiktoken)."""
    if importlib.util.find_spec(ENGINE) is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(ENGINE)
    except PackageNotFoundError:
        return "unknown version"


def resident_bytes() -> int | None:
    """This process's resident memory (Linux), else None."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def tiktoken_rank_file(ranks: dict[bytes, int]) -> bytes:
    """The ranks as a `.tiktoken` file (base64 token, space, rank; one a line), what gigatoken loads."""
    return b"".join(
        base64.b64encode(token) + b" %d\n" % rank for token, rank in sorted(ranks.items(), key=lambda item: item[1])
    )


class GigatokenEncoder:
    """`encode(text)` -> uint32 ids, GPT-2 pre-tokenization, no special tokens; memory bounded as above.

    With `hf_json` (a tokenizer.json's path) instead of `ranks`: that tokenizer as gigatoken reads it (its
    pre-tokenizer, its added tokens), the cache bounded the same way, but a long text is not cut into pieces: a
    safe cut is GPT-2's pre-tokenizer's property, not every tokenizer's."""

    def __init__(self, ranks: dict[bytes, int] | None = None, hf_json: str | None = None) -> None:
        self._rank_file = tiktoken_rank_file(ranks) if ranks is not None else b""
        self._hf_json = hf_json
        self.rebuilds = 0
        self._build()

    def _build(self) -> None:
        from gigatoken.gigatoken_rs import BPETokenizer  # the Rust core only: no awkward, no typer

        rebuilt = getattr(self, "_bpe", None) is not None
        self._bpe = None  # drop the old one (and its cache) before the new one is made
        if rebuilt:
            return_freed_memory()
        if self._hf_json is not None:
            self._bpe = BPETokenizer.from_hf(self._hf_json)
        else:
            with tempfile.NamedTemporaryFile(prefix="gpt2-", suffix=".tiktoken") as ranks:
                ranks.write(self._rank_file)
                ranks.flush()
                self._bpe = BPETokenizer.from_tiktoken(ranks.name, "gpt2", None)
        now = resident_bytes()
        if not rebuilt:
            self._floor = now
        # Growth is counted from the first build's memory, so that what the allocator keeps back after a rebuild
        # cannot ratchet the bound up; from now only where much more is held (a large batch, a long text).
        floor = getattr(self, "_floor", None)
        self._baseline = floor if now is None or floor is None or now - floor < CACHE_GROWTH_BYTES // 2 else now
        self._unchecked = self._since_build = 0
        self._drop_due = False

    def encode(self, text: str) -> np.ndarray:
        if len(text) > PIECE_CHARS and self._hf_json is None:  # one piece at a time: a 50 MB text is not held twice
            ids = []
            for piece in iter_pieces(text):
                ids.append(self._encode_piece(piece))
                self.drop_cache_if_due()  # no batch boundary for this long: between its pieces
            return np.concatenate(ids)
        return self._encode_piece(text)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """The ids of each text, one `encode` each, through the one (bounded) cache. Not the engine's own
        `encode_batch`: measured on the stage, it takes more CPU (1.8 s against 1.5 s on 8 MB of words that never
        repeat, no less on natural text) and its peak memory grows more with the input."""
        return [self.encode(text) for text in texts]

    def _encode_piece(self, text: str) -> np.ndarray:
        ids = self._bpe.encode(text)
        self._unchecked += len(text)
        if self._unchecked >= CACHE_CHECK_CHARS:
            self._bound_cache()
        return ids

    def _bound_cache(self) -> None:
        self._since_build += self._unchecked
        self._unchecked = 0
        now = resident_bytes()
        if now is not None and self._baseline is not None:
            grown = now - self._baseline
        else:  # no /proc: judged by the characters encoded (about 16 bytes of cache each, at worst, measured)
            grown = self._since_build * 16
        if grown > 2 * CACHE_GROWTH_BYTES:  # nobody called drop_cache_if_due in time: now
            self._drop_cache()
        elif grown > CACHE_GROWTH_BYTES:
            self._drop_due = True

    def drop_cache_if_due(self) -> None:
        """Rebuild the tokenizer (drop its cache) where the bound was passed since the last call. Called between
        batches, when nothing of the last one is alive any more (the module's docstring says why)."""
        if self._drop_due:
            self._drop_cache()

    def _drop_cache(self) -> None:
        self.rebuilds += 1
        self._build()


def iter_pieces(text: str, size: int | None = None) -> Iterator[str]:
    """`text` cut at SAFE_CUT spaces into pieces of about `size` characters (PIECE_CHARS), each cut at the first
    such space at or after `size` characters into the piece; no cut where there is none."""
    size = size or PIECE_CHARS
    start = 0
    while len(text) - start > size:
        cut = SAFE_CUT.search(text, start + size)
        if cut is None:
            break
        yield text[start : cut.start()]
        start = cut.start()
    yield text[start:]


def pieces(text: str, size: int | None = None) -> list[str]:
    return list(iter_pieces(text, size))
