"""preprocess stage: .bin and .idx byte for byte what Megatron's preprocess_data.py writes (megatron-core's own
IndexedDatasetBuilder, the reference GPT-2 ids), with each BPE engine, on SlimPajama-shaped and adversarial text."""

from __future__ import annotations

import _fast_bpe
import preprocess
import pytest
from support.gpt2_reference import ADVERSARIAL_TEXTS, GPT2, SPECIAL_TEXTS, megatron_preprocess_data
from support.stage_fixtures import completion_records, iter_documents, jsonl_bytes, run_as_rank

PREFIX = "train_chunk_0.jsonl_text_document"
# Lines the stage handles as it always has: invalid UTF-8 is skipped (and reported), a lone surrogate replaced.
UNUSABLE_LINES = b'{"text": "bad \xff\xfe bytes"}\n'
SURROGATE_LINE = b'{"text": "half \\ud83d of a pair"}\n'


@pytest.mark.parametrize("engine", ["gigatoken", "tiktoken"])
def test_bin_and_idx_are_megatrons_bytes(tmp_path, monkeypatch, capsys, engine):
    # gigatoken's own safeguards made to act on this small input: texts over 64 characters cut in pieces, the
    # tokenizer rebuilt (its cache dropped) every 20,000 characters.
    monkeypatch.setattr(_fast_bpe, "PIECE_CHARS", 64)
    monkeypatch.setattr(_fast_bpe, "CACHE_CHECK_CHARS", 20_000)
    monkeypatch.setattr(_fast_bpe, "CACHE_GROWTH_BYTES", -1)
    texts = [r["text"] for r in iter_documents(47, 300)] + SPECIAL_TEXTS + ADVERSARIAL_TEXTS
    (tmp_path / "in").mkdir()
    half = len(texts) // 2
    (tmp_path / "in" / "train_chunk_0.jsonl").write_bytes(
        jsonl_bytes({"text": t} for t in texts[:half])
        + UNUSABLE_LINES
        + SURROGATE_LINE
        + jsonl_bytes({"text": t} for t in texts[half:])
    )
    argv = [
        "--in",
        str(tmp_path / "in"),
        "--out",
        str(tmp_path / "out"),
        *GPT2,
        "--workers",
        "2",
        "--bpe-engine",
        engine,
    ]
    assert run_as_rank(preprocess.main, argv, 0, 1, monkeypatch) == 0
    log = capsys.readouterr().err
    assert f"preprocess: gpt2-bpe through {engine} " in log
    assert "train_chunk_0.jsonl:" in log and "(skipped)" in log  # the invalid UTF-8 line, named
    texts.insert(half, "half \ufffd of a pair")
    megatron_preprocess_data(texts, tmp_path / "megatron")
    for suffix in (".bin", ".idx"):
        ours = (tmp_path / "out" / (PREFIX + suffix)).read_bytes()
        theirs = (tmp_path / f"megatron{suffix}").read_bytes()
        assert len(ours) == len(theirs) and ours == theirs, suffix
    assert completion_records(tmp_path / "out", "preprocess")[0]["engine"].startswith(f"{engine} ")
