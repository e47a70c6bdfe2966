"""What the benchmarks share: sample documents, the GPT-2 vocab and merges, a small tokenized dataset and
Megatron's own .bin/.idx writer as a reference.

Nothing here comes from tests/ (the benchmarks run apart from the test tree, which may be reorganised freely).
The documents come from the project's real sample generator, stages/sample.py. The dataset for the training
benchmarks is grammatical, repetitive English, so a loss falls within a few dozen steps; tests/support/
smoke_pretrain.py builds the same for the tests.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = REPO / "stages"
if str(STAGES) not in sys.path:
    sys.path.insert(0, str(STAGES))  # the stage programs' helpers import one another by bare name

SUBJECTS = ["the farmer", "a young girl", "the old king", "my brother", "the small dog", "our teacher", "the city"]
VERBS = ["walked to", "looked at", "talked about", "found", "remembered", "built", "painted", "carried"]
OBJECTS = ["the river", "a red house", "the long road", "an old book", "the green field", "the market", "a boat"]
ENDINGS = ["in the morning", "after the rain", "with great care", "before dinner", "every summer", "at night"]
EOD = 50256  # GPT-2's <|endoftext|>


def gpt2_vocab_merges() -> tuple[Path, Path]:
    """The real GPT-2 `vocab.json` and `merges.txt`, where the bpe stage finds them (stages/gpt2_files.py)."""
    from gpt2_files import wheel_data_dir

    data = wheel_data_dir()
    return data / "encoder.json", data / "vocab.bpe"


def sample_texts(docs: int, mean_words: int = 700, seed: int = 14) -> list[str]:
    """`docs` SlimPajama-like documents (web text, code, papers, books) from stages/sample.py's generator."""
    import sample

    lines = sample.generate_lines(sample.WordModel(), seed, 1, 0, docs, mean_words)
    return [json.loads(line)["text"] for line in lines]


def child_env(**extra: str) -> dict[str, str]:
    """This environment without a launcher's rank variables, unbuffered, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def english_dataset(folder: Path, chunks: tuple[int, ...]) -> Path:
    """Chunks of English-like documents, tokenized by the real preprocess stage into `folder/out`."""
    source = folder / "jsonl"
    source.mkdir(parents=True)
    for i, count in enumerate(chunks):
        rng = random.Random(i)
        lines = []
        for _ in range(count):
            text = " ".join(
                f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(ENDINGS)}."
                for _ in range(rng.randint(3, 12))
            )
            lines.append(json.dumps({"text": text, "meta": {"redpajama_set_name": "RedPajamaC4"}}))
        (source / f"train_chunk_{i}.jsonl").write_text("\n".join(lines) + "\n")
    vocab, merges = gpt2_vocab_merges()
    done = subprocess.run(
        [
            sys.executable,
            str(STAGES / "preprocess.py"),
            "--in",
            str(source),
            "--out",
            str(folder / "out"),
            "--vocab",
            str(vocab),
            "--merges",
            str(merges),
            "--workers",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    if done.returncode != 0:
        raise SystemExit(f"preprocess failed:\n{done.stdout}{done.stderr}")
    return folder / "out"


def megatron_preprocess_data(texts: list[str], prefix: Path) -> None:
    """What Megatron's tools/preprocess_data.py writes for `texts` with `--append-eod` (GPT-2 BPE, no sentence
    splitting), through megatron-core's own IndexedDatasetBuilder in uint16. The ids are HF `tokenizers`' byte-level
    BPE: independent of both engines the stage uses. A text without tokens is left out, as the stage leaves it."""
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab, merges = gpt2_vocab_merges()
    tokenizer = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for text in texts:
        ids = tokenizer.encode(text).ids
        if ids:
            builder.add_document(ids + [EOD], [len(ids) + 1])
    builder.finalize(f"{prefix}.idx")
