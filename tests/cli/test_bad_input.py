"""Bad input, one test per row of the README's "Bad input" table: what the user gets (exit status, a message naming
the file, line or key) and that nothing good is lost (outputs completed before are still there, byte for byte).

Stages run in-process as rank 0 of 1 (`run_as_rank`), the orchestrator through its CLI `main`. The full-disk and
read-only rows mount a small tmpfs (root only; skipped with the reason elsewhere) and always unmount it.
"""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import download
import extract
import preprocess
import pytest
import sample
import zstandard
from support.cli import cli
from support.http_faults import FaultServer
from support.pipeline_fixtures import (
    CHAIN_CONFIG,
    stage_status,
    stall_stage,
    start_orchestrator,
    wait_for,
    write_chain_project,
)
from support.stage_fixtures import (
    gpt2_vocab_merges,
    iter_documents,
    jsonl_bytes,
    make_shards,
    run_as_rank,
    snapshot,
    temporaries,
)

VOCAB, MERGES = gpt2_vocab_merges()
GPT2 = ["--vocab", str(VOCAB), "--merges", str(MERGES), "--workers", "1"]


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------


def extract_args(folder: Path, *extra: str) -> list[str]:
    return ["--in", str(folder / "in"), "--out", str(folder / "out"), "--threads", "1", *extra]


def extract_with_a_complete_output(folder: Path, monkeypatch) -> dict[str, bytes]:
    """`folder/in` -> `folder/out` for one good shard (source kept); returns the output snapshot (no completions)."""
    make_shards(folder / "in", files=1, docs_per_file=5)
    assert run_as_rank(extract.main, extract_args(folder, "--keep-source"), 0, 1, monkeypatch) == 0
    before = snapshot(folder / "out")
    assert list(before) == ["example_train_chunk1_0.jsonl"]
    return before


def preprocess_args(folder: Path, *extra: str) -> list[str]:
    return ["--in", str(folder / "in"), "--out", str(folder / "out"), *GPT2, *extra]


def preprocess_with_a_complete_output(folder: Path, monkeypatch) -> dict[str, bytes]:
    """Tokenize a good `train_chunk_9.jsonl`; returns the output snapshot (.bin, .idx, .manifest.json)."""
    (folder / "in").mkdir(parents=True)
    (folder / "in" / "train_chunk_9.jsonl").write_bytes(jsonl_bytes(iter_documents(9, 4)))
    assert run_as_rank(preprocess.main, preprocess_args(folder), 0, 1, monkeypatch) == 0
    before = snapshot(folder / "out")
    assert len(before) == 3
    return before


def still_there(before: dict[str, bytes], folder: Path) -> None:
    """Every file of `before` is still in `folder` with the same bytes."""
    after = snapshot(folder)
    assert {name: after.get(name) for name in before} == before


# ---------------------------------------------------------------------------------------------------------------
# extract: compressed inputs that are not whole zstd
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,message",
    [
        ("truncated", "truncated zstd stream (ends inside a frame"),
        (
            "gzip",
            "not valid zstd near compressed byte 35: zstd decompressor error: Unknown frame descriptor "
            "(it is gzip data, not zstd: recompress it with zstd or download it again)",
        ),
        ("empty", "empty file, not a zstd stream"),
        ("uncompressed", "(it is uncompressed JSON data, not zstd: recompress it with zstd or download it again)"),
    ],
)
def test_a_bad_zst_fails_by_name_and_keeps_every_good_output(tmp_path, monkeypatch, capsys, kind, message):
    before = extract_with_a_complete_output(tmp_path, monkeypatch)
    bad, good = make_shards(tmp_path / "in", files=2, docs_per_file=5, chunk=2, frames=2)
    expected_good = text_of(good)
    bad.write_bytes(
        {
            "truncated": bad.read_bytes()[:-9],
            "gzip": gzip.compress(b'{"text": "hi"}\n', mtime=0),
            "empty": b"",
            "uncompressed": b'{"text": "hi"}\n',
        }[kind]
    )
    bad_bytes = bad.read_bytes()
    capsys.readouterr()
    assert run_as_rank(extract.main, extract_args(tmp_path), 0, 1, monkeypatch) == 1
    named = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"  {bad.name}: {bad.name}: ")]
    assert len(named) == 1 and message in named[0]
    still_there(before, tmp_path / "out")
    assert (tmp_path / "out" / good.name[:-4]).read_bytes() == expected_good  # the other new shard is extracted
    assert not (tmp_path / "out" / bad.name[:-4]).exists() and temporaries(tmp_path / "out") == []
    assert bad.read_bytes() == bad_bytes, "the bad source is kept as it was, for a look or a new download"


def text_of(path: Path) -> bytes:
    """The decompressed bytes of a good .zst (every frame)."""
    return zstandard.ZstdDecompressor().stream_reader(path.read_bytes(), read_across_frames=True).read()


# ---------------------------------------------------------------------------------------------------------------
# preprocess: bad lines are skipped and named; a shard with no usable document fails
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line,reason",
    [
        (b'{"text": "unclosed', "invalid JSON"),
        (b'{"body": "no text key"}', "no 'text' key"),
        (b'{"text": ["not", "a", "string"]}', "'text' is not a string"),
        (b'{"text": "caf\xe9 in Latin-1"}', "not valid UTF-8"),
    ],
)
def test_a_bad_line_is_skipped_by_file_and_line_and_every_good_document_is_kept(
    tmp_path, monkeypatch, capsys, line, reason
):
    before = preprocess_with_a_complete_output(tmp_path, monkeypatch)
    head, tail = jsonl_bytes(iter_documents(1, 3)), jsonl_bytes(iter_documents(2, 2))
    (tmp_path / "in" / "train_chunk_0.jsonl").write_bytes(head + line + b"\n" + tail)
    capsys.readouterr()
    assert run_as_rank(preprocess.main, preprocess_args(tmp_path), 0, 1, monkeypatch) == 0
    assert f"preprocess: train_chunk_0.jsonl:4: {reason}" in capsys.readouterr().err
    still_there(before, tmp_path / "out")
    # The output equals one made from the file without the bad line: every good document, in order.
    clean = tmp_path / "clean"
    (clean / "in").mkdir(parents=True)
    (clean / "in" / "train_chunk_0.jsonl").write_bytes(head + tail)
    assert run_as_rank(preprocess.main, preprocess_args(clean), 0, 1, monkeypatch) == 0
    prefix = "train_chunk_0.jsonl_text_document"
    for suffix in (".bin", ".idx"):
        assert (tmp_path / "out" / (prefix + suffix)).read_bytes() == (clean / "out" / (prefix + suffix)).read_bytes()
    manifest = json.loads((tmp_path / "out" / f"{prefix}.manifest.json").read_text())
    assert manifest["documents"] == 5 and manifest["skipped_lines"] == 1


@pytest.mark.parametrize(
    "payload,detail",
    [
        (b'{"body": "a"}\n{"body": "b"}\n', "all 2 lines were skipped"),
        (b"", "all 0 lines were skipped"),
    ],
)
def test_a_shard_with_no_usable_document_fails_by_name(tmp_path, monkeypatch, capsys, payload, detail):
    before = preprocess_with_a_complete_output(tmp_path, monkeypatch)
    (tmp_path / "in" / "train_chunk_0.jsonl").write_bytes(payload)
    capsys.readouterr()
    assert run_as_rank(preprocess.main, preprocess_args(tmp_path), 0, 1, monkeypatch) == 1
    err = capsys.readouterr().err
    assert f"train_chunk_0.jsonl_text_document: train_chunk_0.jsonl: no usable documents: {detail}" in err
    still_there(before, tmp_path / "out")
    assert not list((tmp_path / "out").glob("train_chunk_0*")) and temporaries(tmp_path / "out") == []


@pytest.mark.parametrize(
    "case",
    ["missing vocab", "vocab is merges", "merges is vocab", "bad merges line", "mismatched", "vocab not an object"],
)
def test_missing_or_wrong_vocab_or_merges_exit_2_naming_the_file(tmp_path, monkeypatch, capsys, case):
    before = preprocess_with_a_complete_output(tmp_path, monkeypatch)
    (tmp_path / "in" / "train_chunk_0.jsonl").write_bytes(jsonl_bytes(iter_documents(1, 2)))
    merges_lines = MERGES.read_text(encoding="utf-8").split("\n")
    bad = tmp_path / "bad"
    vocab, merges, message = {
        "missing vocab": (bad, MERGES, f"{bad}: no such file"),
        "vocab is merges": (MERGES, MERGES, f"{MERGES}: not a GPT-2 vocab.json (Expecting value: line 1"),
        "merges is vocab": (VOCAB, VOCAB, f"{VOCAB}:1: not a GPT-2 merges.txt"),
        "bad merges line": (VOCAB, bad, f"{bad}:3: expected two tokens separated by a space, got 'a b c'"),
        "mismatched": (VOCAB, bad, f"{VOCAB} and {bad} do not match"),
        "vocab not an object": (bad, MERGES, f"{bad}: not a GPT-2 vocab.json (expected a JSON object"),
    }[case]
    if case == "bad merges line":
        bad.write_text("\n".join([merges_lines[0], merges_lines[1], "a b c", *merges_lines[2:]]), encoding="utf-8")
    elif case == "mismatched":
        bad.write_text(
            "\n".join([merges_lines[0], merges_lines[2], merges_lines[1], *merges_lines[3:]]), encoding="utf-8"
        )
    elif case == "vocab not an object":
        bad.write_text('["<|endoftext|>"]')
    capsys.readouterr()
    argv = [
        "--in",
        str(tmp_path / "in"),
        "--out",
        str(tmp_path / "out"),
        "--vocab",
        str(vocab),
        "--merges",
        str(merges),
    ]
    assert run_as_rank(preprocess.main, argv, 0, 1, monkeypatch) == 2
    assert f"preprocess: {message}" in capsys.readouterr().err
    assert snapshot(tmp_path / "out") == before, "nothing is read or written before the tokenizer loads"


# ---------------------------------------------------------------------------------------------------------------
# extract: a disk that fills up, a read-only output folder
# ---------------------------------------------------------------------------------------------------------------


def test_a_full_disk_fails_naming_the_output_and_keeps_complete_outputs(tmp_path, monkeypatch, capsys, tmpfs):
    tmpfs(tmp_path / "out", size="1m")
    before = extract_with_a_complete_output(tmp_path, monkeypatch)
    big = make_shards(tmp_path / "in", files=1, docs_per_file=100, mean_words=300, repeat=20, chunk=2)[0]
    assert len(text_of(big)) > 2 << 20  # twice what the disk holds
    capsys.readouterr()
    assert run_as_rank(extract.main, extract_args(tmp_path), 0, 1, monkeypatch) == 1
    output = tmp_path / "out" / big.name[:-4]
    assert f"  {big.name}: [Errno 28] No space left on device: '{output}'" in capsys.readouterr().err
    still_there(before, tmp_path / "out")
    assert not output.exists() and temporaries(tmp_path / "out") == [], "the partial output is removed"
    assert big.exists(), "the source is deleted only after its output is complete"


def test_a_read_only_output_folder_fails_naming_it_and_keeps_complete_outputs(tmp_path, monkeypatch, capsys, tmpfs):
    out = tmpfs(tmp_path / "out")
    before = extract_with_a_complete_output(tmp_path, monkeypatch)
    source = make_shards(tmp_path / "in", files=1, docs_per_file=5, chunk=2)[0]
    subprocess.run(["mount", "-o", "remount,ro", str(out)], check=True)
    capsys.readouterr()
    assert run_as_rank(extract.main, extract_args(tmp_path), 0, 1, monkeypatch) == 1
    err = capsys.readouterr().err
    assert f"  {source.name}: [Errno 30] Read-only file system: '{out}/.{source.name[:-4]}.tmp-" in err
    still_there(before, out)
    assert source.exists()


# ---------------------------------------------------------------------------------------------------------------
# download: a 404 for a shard that should exist
# ---------------------------------------------------------------------------------------------------------------


def test_a_404_for_an_expected_shard_fails_by_name_and_url_and_keeps_downloaded_files(tmp_path, capsys):
    mirror = tmp_path / "mirror"
    assert (
        sample.main(
            [
                "--out",
                str(mirror),
                "--chunks",
                "1",
                "--files-per-chunk",
                "4",
                "--docs-per-file",
                "3",
                "--mean-words",
                "20",
            ]
        )
        == 0
    )
    out = tmp_path / "out"
    fast = ["--chunks", "1", "--backoff", "0.01", "--max-wait", "0.05", "--timeout", "5", "--workers", "2"]
    missing = "/train/chunk1/example_train_3.jsonl.zst"
    with FaultServer(mirror) as server:
        assert download.main(["--base-url", server.url, "--out", str(out), "--files-per-chunk", "2", *fast]) == 0
        before = snapshot(out)
        (mirror / missing.lstrip("/")).unlink()
        capsys.readouterr()
        assert download.main(["--base-url", server.url, "--out", str(out), "--files-per-chunk", "4", *fast]) == 1
        assert server.requests[missing] == 1, "a 404 is not retried"
        assert server.requests["/train/chunk1/example_train_0.jsonl.zst"] == 1, "complete files are not fetched again"
    err = capsys.readouterr().err
    assert (
        f"  example_train_chunk1_3.jsonl.zst: HTTP 404 Not Found: the file should exist ({server.url}{missing}" in err
    )
    still_there({name: data for name, data in before.items() if not name.startswith(".manifest")}, out)
    assert (out / "example_train_chunk1_2.jsonl.zst").read_bytes() == (
        mirror / "train/chunk1/example_train_2.jsonl.zst"
    ).read_bytes()
    assert not (out / "example_train_chunk1_3.jsonl.zst").exists() and temporaries(out) == []


# ---------------------------------------------------------------------------------------------------------------
# The orchestrator: state.json, the run lock, pipelines.yaml
# ---------------------------------------------------------------------------------------------------------------


def project_with_a_run(root: Path) -> tuple[Path, dict[str, bytes]]:
    """A chain project whose stage `first` ran (the others skipped); returns the config and the workspace."""
    config = write_chain_project(root)
    assert cli(config, "run", "chain", "--only", "first") == 0
    workspace = snapshot(root / "ws")
    assert len(workspace) == 7  # 6 items and the workspace's writer lock (engine/workspace_lock.py)
    return config, workspace


def test_a_corrupt_or_hand_edited_state_json_is_refused_by_name_and_set_aside_byte_for_byte(tmp_path, capsys):
    config, workspace = project_with_a_run(tmp_path)
    state_path = next((tmp_path / ".bcp-pipeline" / "runs").glob("*/state.json"))
    good = json.loads(state_path.read_text())

    def edited(change) -> str:
        payload = json.loads(json.dumps(good))
        change(payload)
        return json.dumps(payload)

    variants = {
        # cut short between two keys (not at a fixed offset, which may fall inside a string of the tmp path's
        # length): the JSON error then says where
        "Expecting": state_path.read_text()[: state_path.read_text().index('"stages"')],
        "stages.first: 'runing' is not a valid StageStatus": edited(
            lambda s: s["stages"]["first"].update(status="runing")
        ),
        "missing key 'stages'": edited(lambda s: s.pop("stages")),
        "stages.first: StageState.__init__() got an unexpected keyword argument 'colour'": edited(
            lambda s: s["stages"]["first"].update(colour="red")
        ),
        "state version 7, this tool reads 1": edited(lambda s: s.update(version=7)),
        "'list' object has no attribute 'items'": edited(lambda s: s.update(stages=[])),
    }
    run_id = state_path.parent.name
    for reason, text in variants.items():
        state_path.write_text(text)
        capsys.readouterr()
        for verb in (("resume", run_id), ("status", run_id), ("run", "chain")):
            assert cli(config, *verb) == 1, (verb, reason)
            err = capsys.readouterr().err
            assert (
                f"run {run_id} is corrupt: its state file could not be read ({reason}" in err
                or f"the last run of chain ({run_id}) is corrupt" in err
            ), (verb, err)
        # Set aside under a name that says so, never rewritten from a guess, and said where.
        aside = next(state_path.parent.glob("state.corrupt-*.json"))
        assert aside.read_text() == text and not state_path.exists()
        assert snapshot(tmp_path / "ws") == workspace
        aside.unlink()  # the next variant


def test_a_stale_lock_of_a_dead_orchestrator_is_taken_over_and_a_live_one_is_refused(tmp_path, capsys):
    config = write_chain_project(tmp_path)
    stall = stall_stage(tmp_path / "ws/main", "second")
    orchestrator = start_orchestrator(config, "run", "chain")
    try:
        lock = wait_for(
            lambda: next((tmp_path / ".bcp-pipeline/runs").glob("*/orchestrator.lock"), None), what="the run lock"
        )
        run_dir = lock.parent
        wait_for(lambda: stage_status(run_dir, "second") == "running", what="stage second to run")
        capsys.readouterr()
        assert cli(config, "resume") == 1
        assert (
            f"run {run_dir.name} is being driven by pid {orchestrator.pid}; watch it with `bcp-pipeline status`"
            in capsys.readouterr().err
        )
    finally:
        orchestrator.kill()  # SIGKILL: the lock file stays, naming a dead pid
        orchestrator.communicate()
    assert lock.read_text() == str(orchestrator.pid)
    first = snapshot(tmp_path / "ws/main/first")
    stall.unlink()
    assert cli(config, "resume") == 0
    assert snapshot(tmp_path / "ws/main/first") == first
    assert len(snapshot(tmp_path / "ws/main/third")) == 3


@pytest.mark.parametrize("case", ["tab", "duplicate key", "unknown placeholder"])
def test_a_bad_pipelines_yaml_exits_2_naming_file_line_and_key_and_touches_no_run(tmp_path, capsys, case):
    config, workspace = project_with_a_run(tmp_path)
    runs_before = snapshot(tmp_path / ".bcp-pipeline")
    text, line, message = {
        "tab": (
            CHAIN_CONFIG.replace('    vars: {count: "6"}', '\tvars: {count: "6"}'),
            9,
            "invalid YAML: found character '\\t' that cannot start any token (YAML indents with spaces only",
        ),
        "duplicate key": (
            CHAIN_CONFIG.replace('    vars: {count: "6"}\n', '    vars: {count: "6"}\n    vars: {count: "7"}\n'),
            10,
            "invalid YAML: duplicate key 'vars' (first on line 9)",
        ),
        "unknown placeholder": (
            CHAIN_CONFIG.replace('"${workspace}/third"', '"${workspace}/${thrid}"'),
            26,
            "pipelines.chain.stages.third.args: unknown placeholder ${thrid}",
        ),
    }[case]
    config.write_text(text)
    capsys.readouterr()
    for verb in (("run", "chain"), ("resume",)):
        assert cli(config, *verb) == 2
        assert f"{config}:{line}: {message}" in capsys.readouterr().err
    assert snapshot(tmp_path / ".bcp-pipeline") == runs_before, "no run is started or changed"
    assert snapshot(tmp_path / "ws") == workspace
