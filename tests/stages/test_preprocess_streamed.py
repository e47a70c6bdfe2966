"""tokenize-preprocess on a streamed edge: it starts before its inputs are there, takes each output as soon as the
upstream's records say all of its inputs landed, and writes the same bytes as after a finished download; it trusts
no manifest of another config and stops, saying why, when nothing lands."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from support.stage_fixtures import gpt2_vocab_merges, make_shards, snapshot, stage_command, stage_env

DIGEST = "0123456789abcdef"
PER_OUTPUT = 2


def gpt2_args() -> list[str]:
    vocab, merges = gpt2_vocab_merges()
    return ["--vocab", str(vocab), "--merges", str(merges)]


def argv(in_dir: Path, out: Path) -> list[str]:
    return [
        "--in",
        str(in_dir),
        "--out",
        str(out),
        "--files-per-output",
        str(PER_OUTPUT),
        *gpt2_args(),
        "--workers",
        "1",
    ]


def publish_upstream(folder: Path, names: list[str], digest: str = DIGEST, manifest_digest: str | None = DIGEST):
    """What the download stage writes before its first file: its digest record, then the manifest of every name."""
    (folder / ".completions").mkdir(parents=True, exist_ok=True)
    (folder / ".completions" / "download.digest").write_text(json.dumps({"digest": digest}))
    (folder / ".manifest").mkdir(exist_ok=True)
    payload = {"stage": "download", "count": len(names), "files": names}
    if manifest_digest:
        payload["output_digest"] = manifest_digest
    (folder / ".manifest" / "download.json").write_text(json.dumps(payload))


def land(source: Path, folder: Path) -> None:
    """A file lands as download.py lands it: a hidden temporary, then a rename to its final name."""
    temporary = folder / f".{source.name}.tmp-1"
    shutil.copy(source, temporary)
    os.replace(temporary, folder / source.name)


def start(in_dir: Path, out: Path, **extra_env: str) -> subprocess.Popen:
    env = {**stage_env(), "BCP_PIPELINE_STREAM_DIGESTS": f"ffffffffffffffff,{DIGEST}", **extra_env}
    return subprocess.Popen(
        stage_command("preprocess", argv(in_dir, out)),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_outputs_are_made_as_their_inputs_land_and_match_a_run_after_the_download(tmp_path):
    shards = make_shards(tmp_path / "shards", files=6, docs_per_file=30)
    names = sorted(p.name for p in shards)
    serial_in = tmp_path / "serial-in"
    serial_in.mkdir()
    for shard in shards:
        shutil.copy(shard, serial_in)
    publish_upstream(serial_in, names, manifest_digest=None)
    done = subprocess.run(
        stage_command("preprocess", argv(serial_in, tmp_path / "serial")),
        env=stage_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr

    streamed_in = tmp_path / "streamed-in"
    streamed_in.mkdir()
    out = tmp_path / "streamed"
    process = start(streamed_in, out)
    time.sleep(1.5)
    assert process.poll() is None and not list(out.glob("*.bin")), "it waits for the upstream's records"
    publish_upstream(streamed_in, names)
    # The last group lands first: the rank takes whichever output is ready, not the first in its order.
    by_name = {p.name: p for p in shards}
    for name in names[4:6]:
        land(by_name[name], streamed_in)
    wait_until(lambda: (out / "train_chunk_2.jsonl_text_document.manifest.json").exists())
    assert not (out / "train_chunk_0.jsonl_text_document.bin").exists()
    assert process.poll() is None, "two outputs still wait for their inputs"
    land(by_name[names[0]], streamed_in)  # half a group: not taken
    time.sleep(1.5)
    assert not (out / "train_chunk_0.jsonl_text_document.bin").exists()
    for name in names[1:4]:
        land(by_name[name], streamed_in)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert "waiting for the upstream" in stderr
    assert snapshot(out) == snapshot(tmp_path / "serial")


def test_a_manifest_of_another_config_is_not_trusted(tmp_path):
    shards = make_shards(tmp_path / "in", files=2, docs_per_file=5)
    publish_upstream(tmp_path / "in", [p.name for p in shards], manifest_digest="a-stale-config")
    process = start(tmp_path / "in", tmp_path / "out", BCP_PIPELINE_STREAM_STALL_SECONDS="2")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0
    assert "download.json is another config's (digest a-stale-config)" in stderr
    assert not list((tmp_path / "out").glob("*.bin"))


def test_a_rank_waiting_for_inputs_that_never_land_fails_naming_them(tmp_path):
    shards = make_shards(tmp_path / "shards", files=4, docs_per_file=5)
    folder = tmp_path / "in"
    folder.mkdir()
    publish_upstream(folder, sorted(p.name for p in shards))
    for shard in shards[:3]:
        land(shard, folder)
    process = start(folder, tmp_path / "out", BCP_PIPELINE_STREAM_STALL_SECONDS="3")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0
    assert "no new input landed" in stderr and shards[3].name in stderr, stderr
    assert (tmp_path / "out" / "train_chunk_0.jsonl_text_document.bin").exists()  # the complete group was made


def test_it_starts_before_the_upstream_has_made_its_folder(tmp_path):
    shards = make_shards(tmp_path / "shards", files=2, docs_per_file=5)
    folder = tmp_path / "not-yet"
    process = start(folder, tmp_path / "out")
    time.sleep(1.5)
    assert process.poll() is None, process.communicate()[1]
    folder.mkdir()
    publish_upstream(folder, [p.name for p in shards])
    for shard in shards:
        land(shard, folder)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert (tmp_path / "out" / "train_chunk_0.jsonl_text_document.idx").exists()
