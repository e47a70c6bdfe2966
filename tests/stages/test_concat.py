"""concat stage: fixed groups over ranks, every line kept and separated, kills harmless, both write paths exact."""

from __future__ import annotations

from pathlib import Path

import _durable
import concat
import pytest
from support.stage_fixtures import (
    completion_records,
    iter_documents,
    jsonl_bytes,
    kill_when,
    run_as_rank,
    run_stage,
    snapshot,
    stage_command,
    temporaries,
)


def write_inputs(folder: Path, count: int, docs: int = 4, repeat: int = 1) -> dict[str, bytes]:
    """`part_{i:02d}.jsonl` files; returns name -> content."""
    folder.mkdir(parents=True, exist_ok=True)
    contents = {}
    for i in range(count):
        name = f"part_{i:02d}.jsonl"
        contents[name] = jsonl_bytes(iter_documents(i, docs)) * repeat
        (folder / name).write_bytes(contents[name])
    return contents


def expected_outputs(contents: dict[str, bytes], per_output: int) -> dict[str, bytes]:
    names = sorted(contents)
    outputs = {}
    for index, start in enumerate(range(0, len(names), per_output)):
        parts = [
            contents[n] + (b"\n" if contents[n] and not contents[n].endswith(b"\n") else b"")
            for n in names[start : start + per_output]
        ]
        outputs[f"train_chunk_{index}.jsonl"] = b"".join(parts)
    return outputs


def test_groups_over_ranks_keep_every_line_and_fix_missing_newlines(tmp_path, monkeypatch, capsys):
    contents = write_inputs(tmp_path / "in", 10)
    for name, cut in (("part_03.jsonl", 1), ("part_07.jsonl", 1)):  # drop the final newline
        contents[name] = contents[name][:-cut]
        (tmp_path / "in" / name).write_bytes(contents[name])
    contents["part_05.jsonl"] = b""  # an empty input contributes nothing
    (tmp_path / "in" / "part_05.jsonl").write_bytes(b"")
    (tmp_path / "in" / ".part_99.jsonl.tmp-123").write_bytes(b"a live temporary of extract\n")
    out = tmp_path / "out"
    argv = ["--in", str(tmp_path / "in"), "--out", str(out), "--files-per-output", "3"]
    for rank in (1, 0):  # any order, any start time: groups are fixed by the sorted listing
        assert run_as_rank(concat.main, argv, rank, 2, monkeypatch) == 0
    assert snapshot(out) == expected_outputs(contents, 3)
    lines = sum(c.count(b"\n") + (1 if c and not c.endswith(b"\n") else 0) for c in contents.values())
    assert sum(data.count(b"\n") for data in snapshot(out).values()) == lines
    records = completion_records(out, "concat")
    assert sum(r["fixed_final_newlines"] for r in records) == 2
    assert sum(r["inputs"] for r in records) == 10 and sum(r["outputs"] for r in records) == 4
    err = capsys.readouterr().err
    assert "part_03.jsonl: last line had no newline; added one in train_chunk_1.jsonl" in err
    assert "part_07.jsonl: last line had no newline; added one in train_chunk_2.jsonl" in err


def test_complete_outputs_are_skipped_on_rerun(tmp_path, monkeypatch):
    write_inputs(tmp_path / "in", 4)
    argv = ["--in", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--files-per-output", "2"]
    assert run_as_rank(concat.main, argv, 0, 1, monkeypatch) == 0
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("*.jsonl")}
    assert run_as_rank(concat.main, argv, 0, 1, monkeypatch) == 0
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("*.jsonl")} == before
    assert completion_records(tmp_path / "out", "concat")[0]["already_complete"] == 2


@pytest.mark.parametrize("direct_io", ["1", "0"])
def test_direct_and_page_cache_writes_give_the_same_bytes(tmp_path, monkeypatch, direct_io):
    # Small blocks, so these small outputs take the whole-block path (direct writes) as well as the tail path.
    monkeypatch.setattr(_durable.Writers, "_shared", _durable.Writers(buffers=3, block_bytes=8192, threads=2))
    monkeypatch.setenv(_durable.DIRECT_IO_ENV, direct_io)
    contents = write_inputs(tmp_path / "in", 5, repeat=60)  # ~13 KB per input
    contents["part_02.jsonl"] = contents["part_02.jsonl"][:-1]
    (tmp_path / "in" / "part_02.jsonl").write_bytes(contents["part_02.jsonl"])
    argv = ["--in", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--files-per-output", "2"]
    assert run_as_rank(concat.main, argv, 0, 1, monkeypatch) == 0
    expected = expected_outputs(contents, 2)
    assert max(map(len, expected.values())) > 3 * 8192
    assert snapshot(tmp_path / "out") == expected


def test_bad_arguments_and_empty_input_fail(tmp_path):
    (tmp_path / "in").mkdir()
    same = run_stage("concat", ["--in", str(tmp_path / "in"), "--out", str(tmp_path / "in"), "--files-per-output", "2"])
    assert same.returncode == 2 and "--out must differ from --in" in same.stderr
    zero = run_stage("concat", ["--in", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--files-per-output", "0"])
    assert zero.returncode == 2 and "not a positive integer" in zero.stderr
    empty = run_stage("concat", ["--in", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--files-per-output", "2"])
    assert empty.returncode == 1 and "no *.jsonl inputs" in empty.stderr


def test_an_input_that_vanished_fails_its_output_by_name(tmp_path, monkeypatch, capsys):
    contents = write_inputs(tmp_path / "in", 4)
    (tmp_path / "in" / "part_03.jsonl").unlink()  # listed, then gone before its group was copied
    monkeypatch.setattr(concat, "list_inputs", lambda folder: sorted(contents))
    argv = ["--in", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--files-per-output", "2"]
    assert run_as_rank(concat.main, argv, 0, 1, monkeypatch) == 1
    err = capsys.readouterr().err
    assert "train_chunk_1.jsonl:" in err and "part_03.jsonl" in err
    assert [p.name for p in (tmp_path / "out").glob("*.jsonl")] == ["train_chunk_0.jsonl"]
    assert temporaries(tmp_path / "out") == [] and not (tmp_path / "out" / ".completions").exists()


@pytest.mark.parametrize("outputs_before_kill", [0, 3])
def test_sigkill_then_rerun_gives_the_uninterrupted_result(tmp_path, outputs_before_kill):
    write_inputs(tmp_path / "in", 12, docs=20, repeat=150)  # ~1.5 MB each: the fsync of each output takes a while
    reference, out = tmp_path / "reference", tmp_path / "out"
    argv = ["--in", str(tmp_path / "in"), "--files-per-output", "2"]
    assert run_stage("concat", argv + ["--out", str(reference)]).returncode == 0

    def condition() -> bool:
        if not out.is_dir():
            return False
        return len(list(out.glob("*.jsonl"))) >= outputs_before_kill and bool(temporaries(out))

    assert kill_when(stage_command("concat", argv + ["--out", str(out)]), condition), "finished before the kill"
    for done in out.glob("*.jsonl"):
        assert done.read_bytes() == (reference / done.name).read_bytes()
    assert run_stage("concat", argv + ["--out", str(out)]).returncode == 0
    assert snapshot(out) == snapshot(reference)
    assert temporaries(out) == []
