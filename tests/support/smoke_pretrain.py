"""The local smoke pretrain (stages/pretrain_local.py) run by tests on real GPT-2 token data: English-like JSONL
tokenized by the real preprocess stage (`make_dataset`, the module fixture `data_dir`), one process's command line
and its summary and step lines."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from support.stage_fixtures import gpt2_vocab_merges

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "stages" / "pretrain_local.py"
# Small enough for 2 cores: a run of 16 steps takes a few seconds after the ~5 s of torch + megatron imports.
# Hidden 64 halves the cost of the 50257-token embedding (its update dominates a step at this size).
STEPS = 16
TRAIN_ARGS = [
    "--steps",
    str(STEPS),
    "--checkpoint-every",
    "4",
    "--seq-length",
    "64",
    "--micro-batch-size",
    "4",
    "--hidden",
    "64",
    "--heads",
    "4",
    "--threads",
    "2",
    "--lr",
    "3e-3",
    "--seed",
    "7",
]

SUBJECTS = ["the farmer", "a young girl", "the old king", "my brother", "the small dog", "our teacher", "the city"]
VERBS = ["walked to", "looked at", "talked about", "found", "remembered", "built", "painted", "carried"]
OBJECTS = ["the river", "a red house", "the long road", "an old book", "the green field", "the market", "a boat"]
ENDINGS = ["in the morning", "after the rain", "with great care", "before dinner", "every summer", "at night"]


def english_like_documents(count: int, seed: int) -> list[str]:
    """Grammatical, repetitive English: learnable structure so the loss falls within a few dozen steps."""
    rng = random.Random(seed)
    docs = []
    for _ in range(count):
        sentences = [
            f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(ENDINGS)}."
            for _ in range(rng.randint(3, 12))
        ]
        docs.append(" ".join(sentences))
    return docs


def make_dataset(folder: Path, chunks: tuple[int, ...] = (120, 60)) -> Path:
    """Unequal chunks of English-like documents, tokenized by the real preprocess stage into `folder/out`."""
    source = folder / "jsonl"
    source.mkdir(parents=True)
    for i, count in enumerate(chunks):
        lines = [
            json.dumps({"text": text, "meta": {"redpajama_set_name": "RedPajamaC4"}})
            for text in english_like_documents(count, seed=i)
        ]
        (source / f"train_chunk_{i}.jsonl").write_text("\n".join(lines) + "\n")
    return preprocess(source, folder / "out")


def preprocess(source: Path, out: Path, *extra: str) -> Path:
    """The real tokenize-preprocess stage over `source` into `out` (GPT-2's BPE, one worker); `extra` adds its
    options (e.g. `--output-stem`)."""
    vocab, merges = gpt2_vocab_merges()
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "stages" / "preprocess.py"),
            "--in",
            str(source),
            "--out",
            str(out),
            *extra,
            "--vocab",
            str(vocab),
            "--merges",
            str(merges),
            "--workers",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data"))


def command(data: Path, results: Path, run_name: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(SCRIPT),
        "--data-dir",
        str(data),
        "--results",
        str(results),
        "--run-name",
        run_name,
        *TRAIN_ARGS,
        *extra,
    ]


def run_to_end(cmd: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=child_env())
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def summary(results: Path, run_name: str) -> dict:
    return json.loads((results / run_name / "train_summary.json").read_text())


def logged_steps(stdout: str) -> list[int]:
    return [int(line.split()[1].split("/")[0]) for line in stdout.splitlines() if line.startswith("step ")]
