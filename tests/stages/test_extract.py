"""extract stage: ranks agree on items while sources disappear, corrupt inputs are named, kills are harmless."""

from __future__ import annotations

import json
from pathlib import Path

import _durable
import extract
import pytest
import zstandard
from support.stage_fixtures import (
    completion_records,
    compress,
    iter_documents,
    jsonl_bytes,
    kill_when,
    make_shards,
    run_as_rank,
    run_stage,
    snapshot,
    stage_command,
    temporaries,
)


def expected_text(path: Path) -> bytes:
    return zstandard.ZstdDecompressor().stream_reader(path.read_bytes(), read_across_frames=True).read()


def test_ranks_extract_every_file_once_even_when_one_starts_late(tmp_path, monkeypatch):
    sources = make_shards(tmp_path / "in", files=7, docs_per_file=30, frames=3)
    wanted = {p.name[: -len(".zst")]: expected_text(p) for p in sources}
    out = tmp_path / "out"
    # Rank 2 runs after ranks 0 and 1 have extracted (and deleted) their sources: it must still pick its own shard.
    for rank in (0, 1, 2):
        assert run_as_rank(extract.main, ["--in", str(tmp_path / "in"), "--out", str(out)], rank, 3, monkeypatch) == 0
    assert {p.name: p.read_bytes() for p in out.glob("*.jsonl")} == wanted
    assert not list((tmp_path / "in").glob("*.zst")), "sources are deleted after their output is complete"
    records = [json.loads(p.read_text()) for p in sorted((out / ".completions").glob("extract-*.json"))]
    assert [r["rank"] for r in records] == [0, 1, 2]
    assert sum(r["files"] for r in records) == 7
    assert sum(r["lines"] for r in records) == 7 * 30
    assert temporaries(out) == []


def test_in_place_extract_keeps_sources_when_asked(tmp_path, monkeypatch):
    sources = make_shards(tmp_path, files=2, docs_per_file=5)
    argv = ["--in", str(tmp_path), "--out", str(tmp_path), "--keep-source"]
    assert run_as_rank(extract.main, argv, 0, 1, monkeypatch) == 0
    assert all(p.exists() for p in sources)
    assert run_as_rank(extract.main, argv[:-1], 0, 1, monkeypatch) == 0  # rerun: complete outputs, sources go now
    assert not any(p.exists() for p in sources)
    assert sorted(p.name for p in tmp_path.glob("*.jsonl")) == [
        "example_train_chunk1_0.jsonl",
        "example_train_chunk1_1.jsonl",
    ]


def test_corrupt_truncated_and_empty_inputs_fail_by_name(tmp_path, monkeypatch, capsys):
    good, cut, bad, empty = make_shards(tmp_path / "in", files=4, docs_per_file=20, frames=2)
    cut.write_bytes(cut.read_bytes()[:-9])
    bad.write_bytes(b"this is not zstd\n" * 10)
    empty.write_bytes(b"")
    out = tmp_path / "out"
    assert run_as_rank(extract.main, ["--in", str(tmp_path / "in"), "--out", str(out)], 0, 1, monkeypatch) == 1
    err = capsys.readouterr().err
    assert f"{cut.name}: {cut.name}: truncated zstd stream" in err
    assert f"{bad.name}: {bad.name}: not valid zstd" in err
    assert f"{empty.name}: {empty.name}: empty file" in err
    assert [p.name for p in out.glob("*.jsonl")] == [good.name[:-4]], "only the good file is extracted"
    assert cut.exists() and bad.exists() and empty.exists(), "failed sources are kept for a retry"
    assert not (out / ".completions").exists(), "no completion record with a hole"
    assert temporaries(out) == []


def test_download_manifest_fixes_the_items_and_a_missing_file_fails(tmp_path, monkeypatch, capsys):
    make_shards(tmp_path / "in", files=2, docs_per_file=3)
    manifest = tmp_path / "in" / ".manifest" / "download.json"
    manifest.parent.mkdir()
    names = ["example_train_chunk1_0.jsonl.zst", "example_train_chunk1_1.jsonl.zst", "example_train_chunk1_2.jsonl.zst"]
    manifest.write_text(json.dumps({"stage": "download", "count": 3, "files": names}))
    assert extract.list_stems(tmp_path / "in", tmp_path / "out") == [n[: -len(".jsonl.zst")] for n in names]
    assert (
        run_as_rank(extract.main, ["--in", str(tmp_path / "in"), "--out", str(tmp_path / "out")], 0, 1, monkeypatch)
        == 1
    )
    assert "example_train_chunk1_2.jsonl.zst: example_train_chunk1_2.jsonl.zst is missing" in capsys.readouterr().err


def test_validate_json_reports_bad_lines_and_keeps_the_file_exact(tmp_path, monkeypatch, capsys):
    good = jsonl_bytes(iter_documents(1, 3))
    payload = (
        good
        + b'{"text": "ok"}\nnot json\n\n{"meta": {}}\n{"text": 7}\n[1, 2]\n{"text": "caf\xe9"}\n'
        + b'{"text": "last line without newline"}'
    )
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl.zst").write_bytes(compress(payload, frames=3))
    argv = ["--in", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--validate-json"]
    assert run_as_rank(extract.main, argv, 0, 1, monkeypatch) == 0
    assert (tmp_path / "out" / "a.jsonl").read_bytes() == payload
    err = capsys.readouterr().err
    for line, reason in (
        (5, "invalid JSON"),
        (6, "empty line"),
        (7, "no 'text' key"),
        (8, "'text' is not a string"),
        (9, "not a JSON object"),
        (10, "not valid UTF-8"),
    ):
        assert f"a.jsonl:{line}: {reason}" in err
    record = json.loads((tmp_path / "out" / ".completions" / "extract-00000-of-00001.json").read_text())
    assert record["bad_lines"] == 6 and record["lines"] == 11


@pytest.mark.parametrize("outputs_before_kill", [0, 2, 5])
def test_sigkill_then_rerun_gives_the_uninterrupted_result(tmp_path, outputs_before_kill):
    make_shards(tmp_path / "pristine", files=8, docs_per_file=100, mean_words=300, repeat=40)
    reference = tmp_path / "reference"
    copy_tree(tmp_path / "pristine", tmp_path / "ref-in")
    assert run_stage("extract", ["--in", str(tmp_path / "ref-in"), "--out", str(reference)]).returncode == 0
    work_in, work_out = tmp_path / "in", tmp_path / "out"
    copy_tree(tmp_path / "pristine", work_in)
    command = stage_command("extract", ["--in", str(work_in), "--out", str(work_out)])

    def condition() -> bool:
        done = len(list(work_out.glob("*.jsonl"))) if work_out.is_dir() else 0
        return done >= outputs_before_kill and bool(temporaries(work_out) if work_out.is_dir() else [])

    assert kill_when(command, condition), "the stage finished before the kill point"
    for partial in work_out.glob("*.jsonl"):  # whatever is under a final name is complete
        assert partial.read_bytes() == (reference / partial.name).read_bytes()
    assert run_stage("extract", command[2:]).returncode == 0  # the rerun completes what is missing
    assert snapshot(work_out) == snapshot(reference)
    assert completion_records(work_out, "extract")[0]["files"] == 8
    assert temporaries(work_out) == [] and not list(work_in.glob("*.zst"))


def copy_tree(source: Path, target: Path) -> None:
    target.mkdir(parents=True)
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())


@pytest.mark.parametrize("direct_io", ["1", "0"])
def test_threads_give_the_same_outputs_and_still_name_a_corrupt_file(tmp_path, monkeypatch, capsys, direct_io):
    # Small blocks, so two files written at once share the buffers and writers through several whole blocks each.
    monkeypatch.setattr(_durable.Writers, "_shared", _durable.Writers(buffers=4, block_bytes=8192, threads=2))
    monkeypatch.setenv(_durable.DIRECT_IO_ENV, direct_io)
    sources = make_shards(tmp_path / "pristine", files=6, docs_per_file=40, frames=2)
    assert all(len(expected_text(p)) > 3 * 8192 for p in sources)
    results = {}
    for threads in (1, 2):
        work_in, out = tmp_path / f"in-{threads}", tmp_path / f"out-{threads}"
        copy_tree(tmp_path / "pristine", work_in)
        argv = ["--in", str(work_in), "--out", str(out), "--threads", str(threads)]
        assert run_as_rank(extract.main, argv, 0, 1, monkeypatch) == 0
        results[threads] = {p.name: p.read_bytes() for p in out.glob("*.jsonl")}
        assert completion_records(out, "extract")[0]["lines"] == 6 * 40
        assert not list(work_in.glob("*.zst")) and temporaries(out) == []
    assert results[2] == results[1] == {p.name[: -len(".zst")]: expected_text(p) for p in sources}

    work_in, out = tmp_path / "in-bad", tmp_path / "out-bad"
    copy_tree(tmp_path / "pristine", work_in)
    bad = work_in / sources[3].name
    bad.write_bytes(bad.read_bytes()[:-9])
    capsys.readouterr()
    argv = ["--in", str(work_in), "--out", str(out), "--threads", "2"]
    assert run_as_rank(extract.main, argv, 0, 1, monkeypatch) == 1
    assert f"{bad.name}: {bad.name}: truncated zstd stream" in capsys.readouterr().err
    assert sorted(p.name for p in out.glob("*.jsonl")) == sorted(n for n in results[1] if n != bad.name[:-4])
    assert bad.exists() and len(list(work_in.glob("*.zst"))) == 1, "only the failed source is kept"
    assert not (out / ".completions").exists() and temporaries(out) == []
