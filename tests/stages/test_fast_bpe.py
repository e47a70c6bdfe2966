"""The fast GPT-2 BPE engine (stages/_fast_bpe.py, gigatoken): long texts cut only where the ids stay the same, its
cache bounded, its encode path free of the packages its wheel declares but the stage does not install, and
tiktoken in its place where it is missing."""

from __future__ import annotations

import random
import string
import subprocess
import sys

import _allocator
import _fast_bpe
import numpy as np
import preprocess
import pytest
from support.gpt2_reference import ADVERSARIAL_TEXTS, GPT2, MERGES, SPECIAL_TEXTS, VOCAB
from support.stage_fixtures import STAGES_DIR, iter_documents, run_as_rank
from tokenizers_gpt2 import Gpt2Bpe, HfTokenizerJson, TokenizerError, gpt2_mergeable_ranks

TEXTS = (
    SPECIAL_TEXTS
    + ADVERSARIAL_TEXTS
    + [r["text"] for r in iter_documents(3, 20)]
    + ["a" + " " * 9 + "b  c\n\n d \u00a0 e \x1c f", "x" * 300, "end with spaces    "]
)


@pytest.fixture(scope="module")
def tiktoken_bpe() -> Gpt2Bpe:
    return Gpt2Bpe(VOCAB, MERGES, "tiktoken")


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1000])
def test_pieces_give_the_ids_of_the_whole_text(tiktoken_bpe, size):
    for text in TEXTS:
        parts = _fast_bpe.pieces(text, size)
        assert "".join(parts) == text
        ids = np.concatenate([tiktoken_bpe.encode(part) for part in parts])
        assert ids.tolist() == tiktoken_bpe.encode(text).tolist(), (text[:40], size)


def test_gigatoken_in_pieces_gives_tiktokens_ids(tiktoken_bpe, monkeypatch):
    fast = Gpt2Bpe(VOCAB, MERGES, "gigatoken")
    assert fast.engine.startswith("gigatoken ")
    for size in (5, 100):
        monkeypatch.setattr(_fast_bpe, "PIECE_CHARS", size)
        for text in TEXTS:
            assert fast.encode(text).tolist() == tiktoken_bpe.encode(text).tolist(), (text[:40], size)


def unique_words(seed: int, characters: int) -> str:
    """Words that almost never repeat: every one a new entry of a pre-token cache."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(4, 11))) for _ in range(characters // 8)]
    return " ".join(words)


def test_the_pre_token_cache_is_bounded(monkeypatch, tiktoken_bpe):
    # 4 MB of new words grow gigatoken 0.10.0's cache by about 60 MB unbounded; bounded at 8 MiB of growth,
    # checked every 128k characters, the process never holds much more than the bound plus one check's worth.
    monkeypatch.setattr(_fast_bpe, "CACHE_GROWTH_BYTES", 8 << 20)
    monkeypatch.setattr(_fast_bpe, "CACHE_CHECK_CHARS", 128 << 10)
    texts = [unique_words(seed, 200_000) for seed in range(20)]
    # Free heap that glibc keeps from earlier tests (_allocator.py) would take the first growth unseen.
    _allocator.return_freed_memory()
    encoder = _fast_bpe.GigatokenEncoder(gpt2_mergeable_ranks(VOCAB, MERGES)[0])
    start, peak = _fast_bpe.resident_bytes(), 0
    for text in texts:  # one text a batch, the cache dropped between batches where due, as the stage's workers do
        encoder.encode_batch([text])
        peak = max(peak, _fast_bpe.resident_bytes() - start)
        encoder.drop_cache_if_due()
    assert encoder.rebuilds >= 3
    assert peak < 24 << 20, f"grew by {peak / 2**20:.0f} MiB"
    assert encoder.encode(texts[0]).tolist() == tiktoken_bpe.encode(texts[0]).tolist()  # a rebuilt one: same ids


class ReadResidentMemory:
    """A stand-in for the process's resident memory as the encoder reads it: the test says how much it grew, or
    how much more each reading finds (`step`)."""

    def __init__(self, floor: int, step: int = 0) -> None:
        self.now, self.step = floor, step

    def __call__(self) -> int:
        self.now += self.step
        return self.now


def test_the_cache_is_dropped_between_batches_or_at_once_past_twice_the_bound(monkeypatch):
    monkeypatch.setattr(_fast_bpe, "CACHE_CHECK_CHARS", 10)
    memory = ReadResidentMemory(floor=100 << 20)
    monkeypatch.setattr(_fast_bpe, "resident_bytes", memory)
    encoder = _fast_bpe.GigatokenEncoder(gpt2_mergeable_ranks(VOCAB, MERGES)[0])
    bound = _fast_bpe.CACHE_GROWTH_BYTES

    memory.now += bound + 1  # past the bound in the middle of a batch: the batch goes on with the same tokenizer
    encoder.encode_batch(["a text of more than ten characters", "and another one"])
    assert encoder.rebuilds == 0
    encoder.drop_cache_if_due()  # the batch done: dropped now
    assert encoder.rebuilds == 1
    encoder.drop_cache_if_due()  # nothing grew since: nothing to drop
    assert encoder.rebuilds == 1

    memory.now += 2 * bound + 1  # past twice the bound since the rebuild: no waiting for the end of the batch
    encoder.encode_batch(["a text of more than ten characters"])
    assert encoder.rebuilds == 2


def test_a_long_text_drops_the_cache_between_its_pieces(monkeypatch, tiktoken_bpe):
    monkeypatch.setattr(_fast_bpe, "PIECE_CHARS", 1000)
    monkeypatch.setattr(_fast_bpe, "CACHE_CHECK_CHARS", 1000)
    monkeypatch.setattr(_fast_bpe, "CACHE_GROWTH_BYTES", 10)
    # 15 bytes more at every reading: past the bound at each check (after each piece), never past twice it.
    monkeypatch.setattr(_fast_bpe, "resident_bytes", ReadResidentMemory(floor=0, step=15))
    encoder = _fast_bpe.GigatokenEncoder(gpt2_mergeable_ranks(VOCAB, MERGES)[0])
    text = unique_words(7, 20_000)
    assert encoder.encode(text).tolist() == tiktoken_bpe.encode(text).tolist()
    # One a piece: no batch boundary comes for a text this long (without the drops between pieces, only the
    # readings past twice the bound would rebuild it: every other piece).
    assert encoder.rebuilds >= len(_fast_bpe.pieces(text)) - 1  # the last piece may end short of a check


def test_the_encode_path_imports_neither_awkward_nor_typer():
    # The wheel declares awkward and typer (and through it pydantic, rich, click), which the job bootstrap does not
    # install (--no-deps): the stage's use of it must work without them, and import none where they are there.
    program = f"""
import sys
sys.path.insert(0, {str(STAGES_DIR)!r})
from tokenizers_gpt2 import Gpt2Bpe
bpe = Gpt2Bpe(__import__("pathlib").Path({str(VOCAB)!r}), __import__("pathlib").Path({str(MERGES)!r}), "gigatoken")
assert bpe.encode("Hello world").tolist() == [15496, 995]
print(sorted(m for m in sys.modules if m.split(".")[0] in ("awkward", "typer", "pydantic", "rich", "click")))
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_tiktoken_stands_in_where_gigatoken_is_missing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(_fast_bpe, "installed_version", lambda: None)
    fallback = Gpt2Bpe(VOCAB, MERGES)
    assert fallback.engine.startswith("tiktoken ") and fallback.engine.endswith("(gigatoken is not installed)")
    assert fallback.encode("a <|endoftext|> b").tolist() == [64, 1279, 91, 437, 1659, 5239, 91, 29, 275]
    with pytest.raises(TokenizerError, match="--bpe-engine gigatoken: gigatoken is not installed"):
        Gpt2Bpe(VOCAB, MERGES, "gigatoken")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train_chunk_0.jsonl").write_text('{"text": "Hello world"}\n')
    argv = ["--in", str(tmp_path / "in"), "--out", str(tmp_path / "out"), *GPT2, "--workers", "1"]
    assert run_as_rank(preprocess.main, argv + ["--bpe-engine", "gigatoken"], 0, 1, monkeypatch) == 2
    assert "requirements-fast.txt" in capsys.readouterr().err
    assert run_as_rank(preprocess.main, argv, 0, 1, monkeypatch) == 0
    assert "preprocess: gpt2-bpe through tiktoken " in capsys.readouterr().err


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory):
    """GPT-2's BPE as an HF tokenizer.json (built by `tokenizers` from the vocab and merges, with the
    end-of-document token added), and that `tokenizers` tokenizer."""
    from support.gpt2_reference import reference_tokenizer

    reference = reference_tokenizer()
    reference.add_special_tokens(["<|endoftext|>"])
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    reference.save(str(path))
    return path, reference


def test_a_tokenizer_json_goes_through_gigatoken_with_tokenizers_ids(tokenizer_json):
    """Where gigatoken reads the file as `tokenizers` does (its self-check at load), it encodes: the same ids on
    texts beyond the probes, a literal added token matched as `tokenizers` matches it."""
    path, reference = tokenizer_json
    fast = HfTokenizerJson(path, None)
    assert fast.engine.startswith("gigatoken ") and "checked against tokenizers" in fast.engine
    slow = HfTokenizerJson(path, None, "tiktoken")  # the fallback engine asked for by name
    assert slow.engine.startswith("tokenizers ") and slow.engine.endswith("(--bpe-engine tiktoken)")
    for text in [*TEXTS, "x" * 200_000 + " tail"]:
        want = reference.encode(text, add_special_tokens=False).ids
        assert fast.encode(text).tolist() == want == slow.encode(text).tolist(), text[:40]
    assert fast.encode("a <|endoftext|> b").tolist() == reference.encode("a <|endoftext|> b").ids


def test_a_tokenizer_json_gigatoken_reads_otherwise_falls_back_to_tokenizers(tokenizer_json, tmp_path, monkeypatch):
    path, _ = tokenizer_json
    original = _fast_bpe.GigatokenEncoder.encode

    def off_by_one(self, text):  # an engine that reads the file otherwise: the self-check finds it
        ids = original(self, text)
        return ids[:-1] if len(ids) > 1 else ids

    monkeypatch.setattr(_fast_bpe.GigatokenEncoder, "encode", off_by_one)
    fallback = HfTokenizerJson(path, None)
    assert fallback.engine.startswith("tokenizers ") and "gigatoken's ids differ from tokenizers'" in fallback.engine
    with pytest.raises(TokenizerError, match="--bpe-engine gigatoken: .*ids differ"):
        HfTokenizerJson(path, None, "gigatoken")
    monkeypatch.setattr(_fast_bpe, "installed_version", lambda: None)
    assert HfTokenizerJson(path, None).engine.endswith("(gigatoken is not installed)")
