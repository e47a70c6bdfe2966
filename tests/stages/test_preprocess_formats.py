"""tokenize-preprocess from .parquet (pyarrow-written, several row groups) and .jsonl.gz, next to .jsonl.zst: the
same GPT-2 ids as the reference BPE (HF `tokenizers`, independent of tiktoken) read back by megatron-core."""

from __future__ import annotations

import gzip
import json

import doc_sources
import preprocess
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.gpt2_reference import EOD, GPT2, SPECIAL_TEXTS, read_dataset, reference_tokenizer
from support.stage_fixtures import compress, iter_documents, jsonl_bytes, run_as_rank, snapshot

TEXTS = SPECIAL_TEXTS + [r["text"] for r in iter_documents(21, 50)]


def write_parquet(path, texts, column="text", row_group_size=7) -> None:
    table = pa.table({"id": [f"d{i}" for i in range(len(texts))], column: texts})
    pq.write_table(table, path, row_group_size=row_group_size)


def write_gzip(path, payload: bytes, members: int = 2) -> None:
    """Several gzip members back to back (as `cat a.gz b.gz` makes): every member must be read."""
    cut = len(payload) // members
    pieces = [payload[i * cut : (i + 1) * cut if i < members - 1 else len(payload)] for i in range(members)]
    path.write_bytes(b"".join(gzip.compress(piece) for piece in pieces))


def test_parquet_gzip_and_zstd_give_the_reference_ids(tmp_path, monkeypatch):
    records = [{"text": t, "url": "https://example.com"} for t in TEXTS]
    folder = tmp_path / "in"
    folder.mkdir()
    write_gzip(folder / "a.jsonl.gz", jsonl_bytes(records), members=3)
    write_parquet(folder / "b.parquet", TEXTS)
    (folder / "c.jsonl.zst").write_bytes(compress(jsonl_bytes(records), frames=2))
    (folder / "README.md").write_text("not an input\n")
    for workers in ("1", "2"):
        out = tmp_path / f"out{workers}"
        argv = ["--in", str(folder), "--out", str(out), *GPT2, "--files-per-output", "1", "--workers", workers]
        assert run_as_rank(preprocess.main, argv, 0, 1, monkeypatch) == 0
    expected = [reference_tokenizer().encode(t).ids + [EOD] for t in TEXTS]
    files = snapshot(tmp_path / "out1")
    assert files == snapshot(tmp_path / "out2")
    for index, source in enumerate(["a.jsonl.gz", "b.parquet", "c.jsonl.zst"]):
        prefix = f"train_chunk_{index}.jsonl_text_document"
        assert read_dataset(tmp_path / "out1" / prefix) == expected, source
        assert json.loads(files[f"{prefix}.manifest.json"])["sources"] == [source]
        assert files[f"{prefix}.bin"] == files["train_chunk_0.jsonl_text_document.bin"]


def test_parquet_groups_follow_the_download_manifest_and_nulls_are_reported(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "in"
    (folder / ".manifest").mkdir(parents=True)
    names = [f"{i:03d}_00000.parquet" for i in range(3)]
    for i, name in enumerate(names):
        write_parquet(folder / name, [f"doc {i} {j}" for j in range(5)] + [None], column="content")
    (folder / ".manifest" / "download.json").write_text(json.dumps({"files": names}))
    argv = [
        "--in",
        str(folder),
        "--out",
        str(tmp_path / "out"),
        *GPT2,
        "--files-per-output",
        "2",
        "--json-key",
        "content",
        "--workers",
        "1",
    ]
    assert run_as_rank(preprocess.main, argv, 0, 1, monkeypatch) == 0
    first = json.loads((tmp_path / "out" / "train_chunk_0.jsonl_text_document.manifest.json").read_text())
    assert first["sources"] == names[:2] and first["documents"] == 10 and first["skipped_lines"] == 2
    assert "000_00000.parquet:6: 'content' is null (skipped)" in capsys.readouterr().err
    ids = read_dataset(tmp_path / "out" / "train_chunk_1.jsonl_text_document")
    assert ids == [reference_tokenizer().encode(f"doc 2 {j}").ids + [EOD] for j in range(5)]


def test_unusable_parquet_and_gzip_inputs_fail_by_name(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    write_parquet(folder / "a.parquet", ["x", "y"])
    pq.write_table(pa.table({"text": [1, 2]}), folder / "b.parquet")
    data = gzip.compress(jsonl_bytes([{"text": "whole"}] * 200))
    (folder / "c.jsonl.gz").write_bytes(data[: len(data) - 9])
    (folder / "d.parquet").write_bytes(b"PAR1 not really")
    argv = [
        "--in",
        str(folder),
        "--out",
        str(tmp_path / "out"),
        *GPT2,
        "--files-per-output",
        "1",
        "--json-key",
        "text",
        "--workers",
        "1",
    ]
    assert run_as_rank(preprocess.main, argv, 0, 1, monkeypatch) == 1
    err = capsys.readouterr().err
    assert "train_chunk_1.jsonl_text_document: b.parquet: column 'text' holds int64, not text" in err
    assert "c.jsonl.gz: truncated gzip stream" in err and "d.parquet: not a readable parquet file" in err
    assert (tmp_path / "out" / "train_chunk_0.jsonl_text_document.bin").exists()
    wrong = [
        "--in",
        str(folder),
        "--out",
        str(tmp_path / "o2"),
        *GPT2,
        "--files-per-output",
        "1",
        "--json-key",
        "body",
        "--workers",
        "1",
    ]
    assert run_as_rank(preprocess.main, wrong, 0, 1, monkeypatch) == 1
    assert "a.parquet: no column 'body' (its columns: id, text)" in capsys.readouterr().err


@pytest.mark.parametrize("batch_bytes", [1, 200, 1 << 20])
def test_parquet_batches_keep_every_row_in_order(tmp_path, batch_bytes):
    texts = [f"row {i} " * (i % 7) for i in range(3000)]
    write_parquet(tmp_path / "t.parquet", texts, row_group_size=500)
    batches = list(doc_sources.parquet_texts(tmp_path / "t.parquet", "text", batch_bytes))
    assert [t for batch in batches for t in batch] == texts
    assert len(batches) > 1 or batch_bytes > 100_000
