"""Tokenizers for preprocess: GPT-2 BPE from vocab.json + merges.txt, or an HF `tokenizer.json`.

GPT-2 goes through one of two engines, each built offline from the two files and each giving the same ids as
Megatron's GPT2BPETokenizer (the same byte-level BPE, vocabulary and split regex): gigatoken where it is installed
(_fast_bpe.py; about 15x cheaper), else tiktoken (several times Megatron's speed). `--bpe-engine` chooses; the
stage's log says which ran. An HF `tokenizer.json` is the option for other vocabularies (`tokenizers` is then
needed; it is not in the stage requirements).

A `TokenizerSpec` is small and picklable: worker processes load their own tokenizer from it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import _fast_bpe
import numpy as np
from megatron_index import dtype_for_vocab

EOD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = ("<|endoftext|>", "<|startoftext|>")  # in vocab.json, but not BPE merges
# tiktoken's r50k/gpt2 split pattern: GPT-2's own
#   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
# rewritten with possessive quantifiers (same splits, no backtracking).
GPT2_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
# End-of-document tokens looked for in a tokenizer.json when --eod-token is not given, in this order.
KNOWN_EOD_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[SEP]")


class TokenizerError(ValueError):
    """The tokenizer files are missing, unreadable or inconsistent."""


class Tokenizer(Protocol):
    kind: str
    vocab_size: int
    eod: int
    engine: str  # what encodes, with its version (the stage's log says it)

    def encode(self, text: str) -> np.ndarray:
        """The ids of `text` (no special tokens, no EOD), as an unsigned integer array."""

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """encode() of each text, in order."""

    def drop_cache_if_due(self) -> None:
        """Between two batches: let the engine drop a cache that grew past its bound (_fast_bpe.py)."""


def gpt2_byte_order() -> tuple[list[int], dict[str, int]]:
    """GPT-2's single-byte tokens in rank order, and the character that stands for each byte in its files.

    Bytes whose character is printable (space excepted) come first and stand for themselves; the n-th of the
    others is written as chr(256 + n).
    """
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    others = [b for b in range(256) if b not in printable]
    chars = {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}
    return printable + others, chars


def gpt2_mergeable_ranks(vocab: Path, merges: Path) -> tuple[dict[bytes, int], dict[str, int]]:
    """tiktoken's ranks from GPT-2 files, and the raw vocabulary (for the special tokens).

    The same construction and check as `tiktoken.load.data_gym_to_mergeable_bpe_ranks` (single bytes, then one
    rank per merge in file order, which must equal the vocabulary's ids), with `str.translate` instead of a
    per-character generator: about twice as fast to load, and no copy in tiktoken's path-keyed temp cache, which
    would return a stale vocabulary if the file at that path changed.
    """
    order, chars = gpt2_byte_order()
    table = str.maketrans({char: chr(b) for char, b in chars.items()})  # then .encode("latin-1") gives the bytes
    vocab_bytes = vocab.read_bytes()
    encoder = read_vocab(vocab, vocab_bytes)
    from_vocab = {
        token.translate(table).encode("latin-1"): rank for token, rank in encoder.items() if token not in SPECIAL_TOKENS
    }
    if known_gpt2_files(vocab_bytes, merges):
        # GPT-2's own two files (their sha256): the check below passed for them once and for all, so every rank
        # and worker start skips parsing the 50,000 merges (a third of a tokenizer's start-up).
        return from_vocab, encoder
    ranks = {bytes([b]): rank for rank, b in enumerate(order)}
    for rank, (first, second) in enumerate(read_merges(merges), start=len(ranks)):
        ranks[(first + second).translate(table).encode("latin-1")] = rank
    if from_vocab != ranks:
        raise TokenizerError(f"{vocab} and {merges} do not match (the merge order must give the vocabulary's ids)")
    return ranks, encoder


def read_merges(merges: Path) -> list[tuple[str, str]]:
    """The merge pairs of a GPT-2 merges.txt, in order; TokenizerError naming the file and line otherwise."""
    try:
        lines = merges.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise TokenizerError(f"{merges}: not a GPT-2 merges.txt ({exc}); is --merges the right file?") from exc
    if not lines[0].startswith("#version"):
        raise TokenizerError(
            f"{merges}:1: not a GPT-2 merges.txt (it starts with {lines[0][:40]!r}, not the "
            "'#version' header); is --merges the right file?"
        )
    pairs = []
    for number, line in enumerate(lines[1:], start=2):
        if line:
            pair = line.split()
            if len(pair) != 2:
                raise TokenizerError(f"{merges}:{number}: expected two tokens separated by a space, got {line[:40]!r}")
            pairs.append((pair[0], pair[1]))
    return pairs


def known_gpt2_files(vocab_bytes: bytes, merges: Path) -> bool:
    """Whether vocab.json and merges.txt are GPT-2's own (gpt2_files.py's sha256 of each)."""
    from gpt2_files import GPT2_FILES, sha256_of

    (_, _, vocab_sha256), (_, _, merges_sha256) = GPT2_FILES
    return hashlib.sha256(vocab_bytes).hexdigest() == vocab_sha256 and sha256_of(merges) == merges_sha256


def read_vocab(vocab: Path, data: bytes | None = None) -> dict[str, int]:
    """A GPT-2 vocab.json (`{token: id}`, its bytes where already read); TokenizerError naming the file otherwise."""
    try:
        encoder = json.loads((vocab.read_bytes() if data is None else data).decode("utf-8"))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise TokenizerError(f"{vocab}: not a GPT-2 vocab.json ({exc}); is --vocab the right file?") from exc
    if not isinstance(encoder, dict) or not all(isinstance(i, int) for i in encoder.values()):
        raise TokenizerError(f"{vocab}: not a GPT-2 vocab.json (expected a JSON object of token: id)")
    return encoder


BPE_ENGINES = ("auto", "gigatoken", "tiktoken")


class Gpt2Bpe:
    """GPT-2 byte-level BPE through gigatoken or tiktoken; ids identical to Megatron's GPT2BPETokenizer."""

    kind = "gpt2-bpe"

    def __init__(self, vocab: Path, merges: Path, engine: str = "auto") -> None:
        for path in (vocab, merges):
            if not path.is_file():
                raise TokenizerError(f"{path}: no such file")
        try:
            ranks, encoder = gpt2_mergeable_ranks(vocab, merges)
        except TokenizerError:
            raise
        except (ValueError, OSError) as exc:  # UnicodeError (merges.txt) is a ValueError
            raise TokenizerError(f"{vocab} / {merges}: not a GPT-2 vocab.json + merges.txt ({exc!r})") from exc
        if EOD_TOKEN not in encoder:
            raise TokenizerError(f"{vocab}: has no {EOD_TOKEN} entry")
        self.eod = int(encoder[EOD_TOKEN])
        self.vocab_size = len(encoder)
        self._fast: _fast_bpe.GigatokenEncoder | None = None
        self.engine, self._encode, self._encode_batch = self._engine(ranks, engine)

    def _engine(self, ranks: dict[bytes, int], engine: str) -> tuple[str, Callable, Callable | None]:
        """(engine and version, its encode, its encode_batch or None): gigatoken where asked for or, with
        `auto`, where it loads (kept as `_fast`); else tiktoken, with why not gigatoken."""
        why_not = "--bpe-engine tiktoken"
        if engine != "tiktoken":
            version = _fast_bpe.installed_version()
            try:
                if version is None:
                    raise ImportError("gigatoken is not installed")
                self._fast = _fast_bpe.GigatokenEncoder(ranks)
                return f"gigatoken {version}", self._fast.encode, self._fast.encode_batch
            except (ImportError, OSError) as exc:  # not installed, or its binary does not load here
                if engine == "gigatoken":
                    raise TokenizerError(
                        f"--bpe-engine gigatoken: {exc} (pip install --no-deps --require-hashes "
                        "-r stages/requirements-fast.txt)"
                    ) from exc
                why_not = str(exc)
        import tiktoken

        # encode_to_numpy skips the list of Python ints that encode_ordinary builds (about 10 % of the time).
        # disallowed_special=() and no allowed specials: "<|endoftext|>" inside a text is ordinary text, as in
        # encode_ordinary and in Megatron.
        encoding = tiktoken.Encoding(
            name="gpt2-files", pat_str=GPT2_SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens={EOD_TOKEN: self.eod}
        )
        return (
            f"tiktoken {tiktoken.__version__} ({why_not})",
            functools.partial(encoding.encode_to_numpy, disallowed_special=()),
            None,
        )

    def encode(self, text: str) -> np.ndarray:
        try:
            return self._encode(text)
        except (UnicodeEncodeError, TypeError):  # gigatoken raises TypeError for a str it cannot make UTF-8 of
            # Lone surrogates (possible in JSON "\ud800" escapes): replaced, as tiktoken's encode_ordinary does.
            fixed = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            if fixed == text:
                raise
            return self._encode(fixed)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if self._encode_batch is not None:
            try:
                return self._encode_batch(texts)
            except (UnicodeEncodeError, TypeError):  # a lone surrogate in one of them: each text on its own
                pass
        return [self.encode(text) for text in texts]

    def drop_cache_if_due(self) -> None:
        if self._fast is not None:
            self._fast.drop_cache_if_due()


# Texts a fast engine must encode as `tokenizers` does before it is used for a tokenizer.json (a self-check at load:
# gigatoken reads the file's model, pre-tokenizer and added tokens itself, and a file it reads otherwise is caught
# here, not in the data): whitespace runs, digits, contractions, case, accents, emoji, CJK, a literal special token.
HF_PROBES = (
    "Hello, world! It's 2026: 1234567890 x 12.5%",
    "   leading spaces\n\n\ttabs and  double  spaces   \r\n",
    "don't you'll I'M we've THEY'RE",
    "naïve café ünïcödé \u00a0 non-breaking",
    "emoji 😀🚀 and CJK 中文字符 日本語 한국어",
    "a literal <|endoftext|> inside, and </s> <s> [SEP]",
    "x" * 3000 + " " + "9" * 500,
)


class HfTokenizerJson:
    """Any HF `tokenizer.json`, its added tokens matched as `tokenizers` matches them (no template's special
    tokens added): through gigatoken where it loads the file and gives `tokenizers`' ids on HF_PROBES (`auto`),
    else through the `tokenizers` package."""

    kind = "hf-tokenizer-json"

    def __init__(self, path: Path, eod_token: str | None, engine: str = "auto") -> None:
        try:
            from tokenizers import Tokenizer as HfTokenizer
        except ImportError as exc:
            raise TokenizerError("--tokenizer-json needs the `tokenizers` package (pip install tokenizers)") from exc
        if not path.is_file():
            raise TokenizerError(f"{path}: no such file")
        try:
            self._tokenizer = HfTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exception subclasses from Rust
            raise TokenizerError(f"{path}: not a tokenizer.json ({exc})") from exc
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        from tokenizers import __version__ as version

        self.eod = self._find_eod(path, eod_token)
        self._fast = None
        why_not = "--bpe-engine tiktoken" if engine == "tiktoken" else ""
        if engine != "tiktoken":
            try:
                self._fast = self._fast_engine(path)
            except (ImportError, OSError, ValueError, RuntimeError) as exc:  # not installed, or not this file
                if engine == "gigatoken":
                    raise TokenizerError(f"--bpe-engine gigatoken: {path}: {exc}") from exc
                why_not = str(exc)
        fast_version = _fast_bpe.installed_version()
        self.engine = (
            f"gigatoken {fast_version} (checked against tokenizers {version})"
            if self._fast is not None
            else f"tokenizers {version} ({why_not or 'gigatoken not used'})"
        )

    def _fast_engine(self, path: Path) -> _fast_bpe.GigatokenEncoder:
        if _fast_bpe.installed_version() is None:
            raise ImportError("gigatoken is not installed")
        fast = _fast_bpe.GigatokenEncoder(hf_json=str(path))
        for text in HF_PROBES:
            want = self._tokenizer.encode(text, add_special_tokens=False).ids
            got = fast.encode(text).tolist()
            if got != want:
                raise ValueError(f"gigatoken's ids differ from tokenizers' on {text[:40]!r}: it is not used")
        return fast

    def _find_eod(self, path: Path, eod_token: str | None) -> int:
        candidates = (eod_token,) if eod_token else KNOWN_EOD_TOKENS
        for token in candidates:
            token_id = self._tokenizer.token_to_id(token)
            if token_id is not None:
                return int(token_id)
        raise TokenizerError(
            f"{path}: none of {', '.join(candidates)} is in the vocabulary; name the "
            "end-of-document token with --eod-token"
        )

    def encode(self, text: str) -> np.ndarray:
        if self._fast is not None:
            try:
                return self._fast.encode(text).astype(np.uint32, copy=False)
            except (UnicodeEncodeError, TypeError):  # a lone surrogate: `tokenizers` below, as without gigatoken
                pass
        return np.asarray(self._tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.uint32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(text) for text in texts]  # not tokenizers' encode_batch: it starts threads

    def drop_cache_if_due(self) -> None:
        if self._fast is not None:
            self._fast.drop_cache_if_due()


@dataclass(frozen=True)
class TokenizerSpec:
    """How to build the tokenizer (what workers receive): GPT-2 files, or a tokenizer.json."""

    vocab: Path | None = None
    merges: Path | None = None
    tokenizer_json: Path | None = None
    eod_token: str | None = None
    bpe_engine: str = "auto"  # GPT-2 BPE: gigatoken where installed (auto), or the one named

    def load(self) -> Tokenizer:
        if self.tokenizer_json is not None:
            return HfTokenizerJson(self.tokenizer_json, self.eod_token, self.bpe_engine)
        if self.vocab is None or self.merges is None:
            raise TokenizerError("GPT-2 BPE needs both --vocab and --merges")
        return Gpt2Bpe(self.vocab, self.merges, self.bpe_engine)


def describe(tokenizer: Tokenizer) -> dict:
    """The manifest's `tokenizer` block."""
    return {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size, "eod": tokenizer.eod}


def token_dtype(tokenizer: Tokenizer) -> np.dtype:
    return dtype_for_vocab(tokenizer.vocab_size)
