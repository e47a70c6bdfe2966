"""The sample stage's held-out split (`--validation-files`): SlimPajama's layout and names, documents of their own
(none is a train document), and the train files unchanged by it."""

from __future__ import annotations

import subprocess
import sys

import sample
import zstandard
from support.smoke_pretrain import REPO, child_env


def lines(path) -> list[str]:
    return zstandard.ZstdDecompressor().decompress(path.read_bytes(), max_output_size=1 << 26).decode().splitlines()


def test_the_held_out_files_sit_beside_the_train_split_and_share_no_document(tmp_path):
    base = ["--chunks", "1", "--files-per-chunk", "2", "--docs-per-file", "20", "--mean-words", "30", "--seed", "0"]
    for out, extra in (
        (tmp_path / "plain", []),
        (tmp_path / "held", ["--validation-files", "2", "--validation-docs-per-file", "5"]),
    ):
        done = subprocess.run(
            [sys.executable, str(REPO / "stages/sample.py"), "--out", str(out), *base, *extra],
            capture_output=True,
            text=True,
            timeout=120,
            env=child_env(),
        )
        assert done.returncode == 0, done.stderr
    held = sorted(p.relative_to(tmp_path / "held").as_posix() for p in (tmp_path / "held").rglob("*.jsonl.zst"))
    assert held == [
        "train/chunk1/example_train_0.jsonl.zst",
        "train/chunk1/example_train_1.jsonl.zst",
        "validation/chunk1/example_holdout_0.jsonl.zst",
        "validation/chunk1/example_holdout_1.jsonl.zst",
    ]
    for name in ("example_train_0", "example_train_1"):  # the train split is the bytes it was without one
        path = f"train/chunk1/{name}.jsonl.zst"
        assert (tmp_path / "held" / path).read_bytes() == (tmp_path / "plain" / path).read_bytes()
    train = {line for p in (tmp_path / "held/train").rglob("*.zst") for line in lines(p)}
    validation = [line for p in (tmp_path / "held/validation").rglob("*.zst") for line in lines(p)]
    assert len(validation) == 10 and not train & set(validation)
    paths = sample.sample_paths(tmp_path, 1, 2, validation_files=2)
    assert [split for *_, split in paths] == ["train", "train", "validation", "validation"]
