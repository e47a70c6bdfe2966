#!/usr/bin/env python3
"""Benchmark extract, concat and tokenize-preprocess next to unzstd, cat and raw tiktoken, on the same data.

    python benchmarks/bench_stages.py [--files 4] [--docs 8000] [--replicas 4] [--repeats 3] [--workers N]
                                   [--scale-gb 10]
    python benchmarks/bench_stages.py --only tokenize [--runs 5] [--token-scale 4]

Sample data comes from `stages/sample.py`: F files of
D documents, copied R times under new names so the byte-rate measurements run long enough to mean something.
Every timed command runs as a child process; wall time, CPU time and peak RSS come from `wait4` (peak RSS is the
largest single process of the tree, tokenizer workers included). Each measurement is repeated and the fastest run
kept, tools and stages interleaved, with `sync` before each so one run's writeback does not land on the next.

Targets: extract >= 1.0x unzstd; concat >= 0.9x cat; preprocess >= 80 % of raw single-thread tiktoken
`encode_ordinary` tokens/s per core; tokenizer peak RSS <= 300 MB per process and flat when the input grows 10x.
`--only tokenize`: the stage (its default engine, gigatoken where installed) >= 8x raw tiktoken's tokens per
CPU-second and >= 70 % of raw gigatoken's, each raw engine in as many processes at once as the stage has workers;
peak RSS at 1x and 10x input (the sample's text, and words that never repeat); .bin/.idx of gigatoken == tiktoken's
(the chunk, one 50 MB document) and == Megatron's writer's (the first file; benchmarks/_shared.py).
The stages fsync each output before renaming it (a crash must not leave a partial file under a final name), which
plain `unzstd` / `cat` do not. At the sample's size, the tools' output fits in the page cache and is not on disk
when they exit, so extract and concat are also compared at `--scale-gb` (default 10 GB; inputs are hard links, so
only the outputs take disk space), past what the kernel holds back, as every real run is (SlimPajama is 2.6 TB).
The small-scale comparisons, and those against the tools followed by `sync FILES`, are printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGES = REPO / "stages"
MB = 1e6
RSS_LIMIT_MB = 300.0


@dataclass
class Run:
    """One child process: wall seconds, CPU seconds (user + sys, descendants included), peak RSS of one process."""

    wall: float
    cpu: float
    rss_mb: float

    def __add__(self, other: Run) -> Run:
        return Run(self.wall + other.wall, self.cpu + other.cpu, max(self.rss_mb, other.rss_mb))


# Runs one command and reports its rusage. A fresh small process does the spawning because a child's peak RSS
# starts at its parent's (fork/vfork, then exec, records the parent's high-water mark): spawned from this bench,
# which holds the tokenizer baseline's texts, every command would appear to use hundreds of MB.
SPAWNER = """
import json, os, sys, time
report, stdout, command = sys.argv[1], sys.argv[2], sys.argv[3:]
out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
started = time.perf_counter()
pid = os.posix_spawnp(command[0], command, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, out, 1)])
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - started
with open(report, "w") as handle:
    json.dump({"rc": os.waitstatus_to_exitcode(status), "wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
               "rss_kb": usage.ru_maxrss}, handle)
"""


def measure(
    command: list[str], stdout_path: Path | None = None, env: dict[str, str] | None = None, sync_first: bool = True
) -> Run:
    """Run `command` through SPAWNER; wall, CPU and peak RSS cover its whole process tree. Raise if it fails."""
    if sync_first:
        os.sync()  # earlier runs' dirty pages are written now, not during this measurement
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        done = subprocess.run(
            [sys.executable, "-c", SPAWNER, str(report), str(stdout_path or os.devnull), *command],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        result = json.loads(report.read_text()) if report.exists() else {"rc": done.returncode}
    if done.returncode != 0 or result["rc"] != 0:
        raise RuntimeError(f"{command[:3]} exited {result['rc']}: {done.stderr[-2000:]}")
    return Run(result["wall"], result["cpu"], result["rss_kb"] / 1024)


def best(runs: list[Run]) -> Run:
    return min(runs, key=lambda r: r.wall)


def stage(name: str, *argv: str) -> list[str]:
    return [sys.executable, str(STAGES / f"{name}.py"), *argv]


def stage_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(RANK="0", WORLD_SIZE="1")
    return env


def fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def folder_bytes(folder: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in folder.glob(pattern))


# ---------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------


def make_sample(work: Path, files: int, docs: int) -> tuple[list[Path], Path, Path, str]:
    """F sample `.jsonl.zst` files and GPT-2 vocab/merges, made by the sample stage; which generator made them."""
    mirror, bpe = work / "mirror", work / "bpe"
    measure(
        stage(
            "sample",
            "--out",
            str(mirror),
            "--chunks",
            "1",
            "--files-per-chunk",
            str(files),
            "--docs-per-file",
            str(docs),
            "--bpe-out",
            str(bpe),
        ),
        env=stage_env(),
    )
    return (
        sorted((mirror / "train" / "chunk1").glob("*.jsonl.zst")),
        bpe / "vocab.json",
        bpe / "merges.txt",
        "stages/sample.py",
    )


def replicate(sources: list[Path], folder: Path, replicas: int) -> list[Path]:
    """`replicas` copies of each source under download.py's flat names (distinct files, same bytes)."""
    fresh(folder)
    copies = []
    for r in range(replicas):
        for i, source in enumerate(sources):
            target = folder / f"example_train_chunk1_{r * len(sources) + i}.jsonl.zst"
            shutil.copyfile(source, target)
            copies.append(target)
    return copies


# ---------------------------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------------------------


def bench_extract(zst: Path, work: Path, repeats: int) -> dict[str, Run]:
    files = sorted(str(p) for p in zst.glob("*.jsonl.zst"))
    runs: dict[str, list[Run]] = {"extract": [], "unzstd": [], "unzstd + sync": []}
    for _ in range(repeats):
        plain = fresh(work / "unzstd")
        runs["unzstd"].append(measure(["unzstd", "-q", "-f", "--output-dir-flat", str(plain), *files]))
        synced = fresh(work / "unzstd-sync")
        run = measure(["unzstd", "-q", "-f", "--output-dir-flat", str(synced), *files])
        runs["unzstd + sync"].append(run + measure_sync(synced.glob("*.jsonl")))
        shutil.rmtree(work / "extracted", ignore_errors=True)
        runs["extract"].append(
            measure(
                stage("extract", "--in", str(zst), "--out", str(work / "extracted"), "--keep-source"), env=stage_env()
            )
        )
    return {name: best(r) for name, r in runs.items()}


def measure_sync(paths) -> Run:
    """`sync FILE...`: fsync of exactly these files (timed without the os.sync() that measure() does first)."""
    started = time.perf_counter()
    subprocess.run(["sync", *map(str, paths)], check=True)
    return Run(time.perf_counter() - started, 0.0, 0.0)


def cat_groups(in_dir: Path, groups: list[list[str]], out: Path) -> Run:
    """`cat` each group of `in_dir` names into `out/train_chunk_{i}.jsonl`, as concat names them; the summed runs."""
    total = Run(0.0, 0.0, 0.0)
    for index, group in enumerate(groups):  # no sync between the cats: that would flush untimed
        total += measure(
            ["cat", *(str(in_dir / n) for n in group)], out / f"train_chunk_{index}.jsonl", sync_first=False
        )
    return total


def bench_concat(extracted: Path, work: Path, per_output: int, repeats: int) -> dict[str, Run]:
    names = sorted(p.name for p in extracted.glob("*.jsonl"))
    groups = [names[i : i + per_output] for i in range(0, len(names), per_output)]
    runs: dict[str, list[Run]] = {"concat": [], "cat": [], "cat + sync": []}
    for _ in range(repeats):
        for label in ("cat", "cat + sync"):
            out = fresh(work / label.replace(" + ", "-"))
            os.sync()
            total = cat_groups(extracted, groups, out)
            if label == "cat + sync":
                total += measure_sync(out.glob("*.jsonl"))
            runs[label].append(total)
        shutil.rmtree(work / "concat", ignore_errors=True)
        runs["concat"].append(
            measure(
                stage(
                    "concat",
                    "--in",
                    str(extracted),
                    "--out",
                    str(work / "concat"),
                    "--files-per-output",
                    str(per_output),
                ),
                env=stage_env(),
            )
        )
    return {name: best(r) for name, r in runs.items()}


def kernel_dirty_limit_bytes() -> int:
    """About how much written data the kernel lets sit in the page cache before writers must wait for the disk."""
    vm = Path("/proc/sys/vm")
    try:
        fixed = int((vm / "dirty_bytes").read_text())
        if fixed:
            return fixed
        ratio = int((vm / "dirty_ratio").read_text())
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return int(meminfo["MemAvailable"].split()[0]) * 1024 * ratio // 100
    except (OSError, ValueError, KeyError):
        return 0


def linked_copies(sources: list[Path], folder: Path, copies: int) -> list[Path]:
    """`copies` hard links to each source under new names: distinct inputs, the same cached bytes, no disk space."""
    fresh(folder)
    links = []
    for copy in range(copies):
        for source in sources:
            links.append(folder / f"{copy:04d}_{source.name}")
            os.link(source, links[-1])
    return links


def bench_at_scale(
    zst: Path, extracted: Path, work: Path, per_output: int, gigabytes: float, repeats: int
) -> tuple[dict[str, Run], int] | None:
    """extract vs unzstd and concat vs cat with about `gigabytes` of text written per run, past what the page cache
    holds back, as in every real run (SlimPajama is 2.6 TB of text; its concat outputs are about 35 GB each):
    (best runs, text bytes per run); None when the disk has no room for one run's outputs.

    The inputs are hard links (see linked_copies), so only the outputs take disk space and the inputs are read from
    the page cache by tools and stages alike; each run's outputs are deleted before the next."""
    text = sorted(extracted.glob("*.jsonl"))
    size = sum(p.stat().st_size for p in text)
    copies = max(1, round(gigabytes * 1e9 / size))
    free = shutil.disk_usage(work).free
    if free < 1.5 * copies * size:
        print(f"skipping the runs at {gigabytes:g} GB: {work} has {free / 1e9:.0f} GB free")
        return None
    zst_links = linked_copies(sorted(zst.glob("*.jsonl.zst")), work / "scale-zst", copies)
    text_links = linked_copies(text, work / "scale-text", copies)
    names = [p.name for p in text_links]
    groups = [names[i : i + per_output] for i in range(0, len(names), per_output)]
    out = work / "scale-out"
    runs: dict[str, list[Run]] = {"extract": [], "unzstd": [], "concat": [], "cat": []}
    for _ in range(repeats):
        fresh(out)
        runs["unzstd"].append(measure(["unzstd", "-q", "-f", "--output-dir-flat", str(out), *map(str, zst_links)]))
        shutil.rmtree(out)
        runs["extract"].append(
            measure(
                stage("extract", "--in", str(work / "scale-zst"), "--out", str(out), "--keep-source"), env=stage_env()
            )
        )
        fresh(out)
        os.sync()
        runs["cat"].append(cat_groups(work / "scale-text", groups, out))
        shutil.rmtree(out)
        runs["concat"].append(
            measure(
                stage(
                    "concat", "--in", str(work / "scale-text"), "--out", str(out), "--files-per-output", str(per_output)
                ),
                env=stage_env(),
            )
        )
        shutil.rmtree(out)
    shutil.rmtree(work / "scale-zst")
    shutil.rmtree(work / "scale-text")
    return {name: best(r) for name, r in runs.items()}, copies * size


# A raw engine, one thread, over a share of the documents: tiktoken `encode_ordinary`, or gigatoken's
# `BPETokenizer.encode` (its Rust core, GPT-2 pre-tokenizer, no special tokens: what the issue measured), each built
# from the same vocab/merges as the stage; the documents taken as the stage takes them, in its ~1 MiB batches of
# whole lines (its own line_ranges), process `part` of `parts` taking every parts-th batch (the stage's workers are
# dealt batches in turn); each batch's JSON parsed off the clock, then its texts encoded on it, one call a text.
# Batches keep the texts being encoded in the caches, as the stage's workers have them: a baseline holding every
# text of the file at once (hundreds of MB) pays cache misses that grow when two such processes run at once, and
# would flatter the stage. The clocks start at an agreed time (so that P copies run at once) and count the encode
# loops only. `gigatoken-jsonl` is the engine's own path from a JSONL file to ids instead (`encode_files` over a
# `JsonlFileSource`, one thread): its share of the batches written to a file of its own off the clock, then the
# clock counts the engine reading it (mmap), finding each `text` (sonic-rs, which does not validate the line:
# docs/dependencies.md) and encoding it. Not the stage's work (no validation, nothing written), but what the
# engine itself does with the stage's input.
RAW_ENGINE = """
import json, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tokenizers_gpt2 import GPT2_SPLIT_PATTERN
from _preprocess_batches import line_ranges
from preprocess import BATCH_BYTES
engine, vocab, merges = sys.argv[2], sys.argv[3], sys.argv[4]
start_at, part, parts = float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
ranks = data_gym_to_mergeable_bpe_ranks(merges, vocab)
if engine == "tiktoken":
    import tiktoken
    encode = tiktoken.Encoding("gpt2-bench", pat_str=GPT2_SPLIT_PATTERN, mergeable_ranks=ranks,
                               special_tokens={"<|endoftext|>": 50256}).encode_ordinary
else:
    import base64
    from gigatoken.gigatoken_rs import BPETokenizer
    with tempfile.NamedTemporaryFile("w", suffix=".tiktoken") as handle:
        handle.write("".join(f"{base64.b64encode(t).decode()} {r}\\n" for t, r in ranks.items()))
        handle.flush()
        encoder = BPETokenizer.from_tiktoken(handle.name, "gpt2", None)
        encode = encoder.encode
batches = []
for path in map(Path, sys.argv[8:]):
    data = path.read_bytes()
    batches += [data[start:end] for start, end in line_ranges(path, BATCH_BYTES)]  # the stage's own batches
del data
wall = cpu = 0.0
tokens = documents = 0
if engine == "gigatoken-jsonl":
    from gigatoken.gigatoken_rs import JsonlFileSource
    with tempfile.NamedTemporaryFile(suffix=".jsonl", dir=Path(sys.argv[8]).parent) as share:
        share.write(b"".join(batches[part::parts]))
        share.flush()
        documents = sum(batch.count(b"\\n") for batch in batches[part::parts])
        time.sleep(max(0.0, start_at - time.time()))
        started, used = time.perf_counter(), time.process_time()
        tokens = sum(map(len, encoder.encode_files(JsonlFileSource([share.name]), parallel=False)))
        wall, cpu = time.perf_counter() - started, time.process_time() - used
    print(json.dumps({"wall": wall, "cpu": cpu, "tokens": tokens, "documents": documents}))
    sys.exit(0)
time.sleep(max(0.0, start_at - time.time()))
for batch in batches[part::parts]:
    texts = [json.loads(line)["text"] for line in batch.split(b"\\n") if line]
    started, used = time.perf_counter(), time.process_time()
    tokens += sum(len(encode(text)) for text in texts)
    wall += time.perf_counter() - started
    cpu += time.process_time() - used
    documents += len(texts)
print(json.dumps({"wall": wall, "cpu": cpu, "tokens": tokens, "documents": documents}))
"""


def raw_engine(
    jsonl: list[Path], vocab: Path, merges: Path, processes: int, engine: str = "tiktoken"
) -> tuple[Run, int, int]:
    """`processes` single-thread runs of `engine` at once, each on 1/processes of the documents:
    (wall of the slowest and total CPU, tokens, documents)."""
    start_at = time.time() + 2.0  # after every process has loaded the vocabulary and the texts
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RAW_ENGINE,
                str(STAGES),
                engine,
                str(vocab),
                str(merges),
                str(start_at),
                str(part),
                str(processes),
                *map(str, jsonl),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for part in range(processes)
    ]
    results = [json.loads(child.communicate()[0]) for child in children]
    if any(child.returncode for child in children):
        raise RuntimeError(f"the raw {engine} baseline failed")
    run = Run(max(r["wall"] for r in results), sum(r["cpu"] for r in results), 0.0)
    return run, sum(r["tokens"] for r in results), sum(r["documents"] for r in results)


def bench_preprocess(
    chunks: Path, work: Path, vocab: Path, merges: Path, workers: int, repeats: int
) -> tuple[dict[str, Run], int, dict[str, tuple[Run, int, int]]]:
    """The stage with `workers` and with 1 worker, and raw tiktoken with 1 and with `workers` processes."""
    tokenizer = ["--vocab", str(vocab), "--merges", str(merges)]
    runs: dict[str, list[Run]] = {f"preprocess ({workers} workers)": [], "preprocess (1 worker)": []}
    raw: dict[str, list[tuple[Run, int, int]]] = {"1": [], str(workers): []}
    inputs = sorted(chunks.glob("train_chunk_*.jsonl"))
    for _ in range(repeats):
        for processes in {1, workers}:
            raw[str(processes)].append(raw_engine(inputs, vocab, merges, processes))
        for label, count in ((f"preprocess ({workers} workers)", workers), ("preprocess (1 worker)", 1)):
            out = work / "tokens"
            shutil.rmtree(out, ignore_errors=True)
            runs[label].append(
                measure(
                    stage("preprocess", "--in", str(chunks), "--out", str(out), *tokenizer, "--workers", str(count)),
                    env=stage_env(),
                )
            )
    tokens = sum(json.loads(p.read_text())["tokens"] for p in (work / "tokens").glob("*.manifest.json"))
    return (
        {name: best(r) for name, r in runs.items()},
        tokens,
        {name: min(r, key=lambda x: x[0].wall) for name, r in raw.items()},
    )


def tokenize_runs(chunks: Path, work: Path, vocab: Path, merges: Path, workers: int, runs: int) -> list[dict]:
    """`runs` rounds of: raw tiktoken and raw gigatoken, each in `workers` processes at once, raw gigatoken alone,
    gigatoken's own JSONL file path in `workers` processes at once (RAW_ENGINE says what it counts), then the stage
    with `workers` workers (its default engine), on the same documents. Each round's figures compare like with like:
    the stage's tokens per CPU-second (every process of it: the reader and writer, the workers, JSON, its start-up)
    against the raw processes' (the same tokens on the same cores, as many processes at once, at the same moment's
    load). One raw process alone, the other core idle, is printed too: two at once share the cores' caches and
    memory bandwidth, which is no overhead of the stage's."""
    inputs = sorted(chunks.glob("train_chunk_*.jsonl"))
    rounds = []
    for _ in range(runs):
        tiktoken_x, raw_tokens, documents = raw_engine(inputs, vocab, merges, workers, "tiktoken")
        fast_x, fast_tokens, _ = raw_engine(inputs, vocab, merges, workers, "gigatoken")
        fast_alone, _, _ = raw_engine(inputs, vocab, merges, 1, "gigatoken")
        fast_jsonl, jsonl_tokens, _ = raw_engine(inputs, vocab, merges, workers, "gigatoken-jsonl")
        if fast_tokens != raw_tokens:
            raise RuntimeError(f"raw gigatoken gave {fast_tokens} tokens, raw tiktoken {raw_tokens}")
        if jsonl_tokens != raw_tokens:  # its reader ends a file silently at a line it cannot use
            raise RuntimeError(f"gigatoken's JSONL reader gave {jsonl_tokens} tokens, raw tiktoken {raw_tokens}")
        out = work / "tokens"
        shutil.rmtree(out, ignore_errors=True)
        run = measure(
            stage(
                "preprocess",
                "--in",
                str(chunks),
                "--out",
                str(out),
                "--vocab",
                str(vocab),
                "--merges",
                str(merges),
                "--workers",
                str(workers),
            ),
            env=stage_env(),
        )
        tokens = sum(json.loads(p.read_text())["tokens"] for p in out.glob("*.manifest.json"))
        if tokens != raw_tokens + documents:  # the same work: each document's ids plus its EOD
            raise RuntimeError(f"preprocess wrote {tokens} tokens, raw tiktoken gave {raw_tokens} + {documents}")
        rounds.append(
            {
                "vs_tiktoken": tiktoken_x.cpu / run.cpu,
                "vs_fast": 100 * fast_x.cpu / run.cpu,
                "vs_fast_alone": 100 * fast_alone.cpu / run.cpu,
                "vs_fast_jsonl": 100 * fast_jsonl.cpu / run.cpu,
                "wall_vs_fast": 100 * fast_x.wall / run.wall,
                "stage": run,
                "tiktoken": tiktoken_x,
                "fast": fast_x,
                "fast_alone": fast_alone,
                "fast_jsonl": fast_jsonl,
                "tokens": raw_tokens,
            }
        )
    return rounds


def stage_output(chunks: Path, out: Path, vocab: Path, merges: Path, workers: int, engine: str) -> tuple[Run, bytes]:
    """The stage on `chunks` with `engine`: its run, and its .bin + .idx bytes (every output, in name order)."""
    shutil.rmtree(out, ignore_errors=True)
    run = measure(
        stage(
            "preprocess",
            "--in",
            str(chunks),
            "--out",
            str(out),
            "--vocab",
            str(vocab),
            "--merges",
            str(merges),
            "--workers",
            str(workers),
            "--bpe-engine",
            engine,
        ),
        env=stage_env(),
    )
    data = b"".join(p.read_bytes() for p in sorted(out.glob("*.bin")) + sorted(out.glob("*.idx")))
    shutil.rmtree(out)
    return run, data


def one_chunk(folder: Path, payload: bytes) -> Path:
    chunks = fresh(folder)
    (chunks / "train_chunk_0.jsonl").write_bytes(payload)
    return chunks


def unique_words_jsonl(megabytes: float, seed: int = 0) -> bytes:
    """About `megabytes` of JSONL whose words almost never repeat (each a new entry of a pre-token cache): the
    input that grew gigatoken 0.10.0's unbounded cache without end."""
    import random

    rng = random.Random(seed)
    letters = bytes.maketrans(bytes(range(256)), bytes(97 + b % 26 for b in range(256)))
    lines, size = [], 0
    while size < megabytes * MB:
        words = rng.randbytes(200_000).translate(letters)
        text = b" ".join(words[i : i + 8] for i in range(0, len(words), 8)).decode()
        lines.append(json.dumps({"text": text}).encode() + b"\n")
        size += len(lines[-1])
    return b"".join(lines)


def tokenize_memory(
    sample: bytes, work: Path, vocab: Path, merges: Path, workers: int, megabytes: float, runs: int
) -> list[tuple[str, list[float], list[float]]]:
    """The stage's peak RSS (its largest process), `runs` times each, on `megabytes` of input and on 10x that: the
    sample's text, and words that never repeat. Each input is made once, then tokenized `runs` times."""
    head = sample[: sample.rfind(b"\n", 0, int(megabytes * MB)) + 1]
    inputs = {
        "the sample's text": lambda factor: head * factor,  # 10x: the same text again, as a larger shard has
        "words that never repeat": lambda factor: unique_words_jsonl(megabytes * factor, seed=factor),
    }
    rows = []
    for label, make in inputs.items():
        peaks = []
        for factor in (1, 10):
            chunks = one_chunk(work / "rss", make(factor))
            peaks.append(
                [stage_output(chunks, work / "rss-out", vocab, merges, workers, "auto")[0].rss_mb for _ in range(runs)]
            )
        rows.append((label, peaks[0], peaks[1]))
    shutil.rmtree(work / "rss", ignore_errors=True)
    return rows


def identity_checks(
    chunks: Path, sources: list[Path], work: Path, vocab: Path, merges: Path, workers: int
) -> list[bool]:
    """The stage's .bin/.idx with gigatoken against tiktoken's (the fallback) on the whole chunk and on one
    50 MB document, and against Megatron's own writer (benchmarks/_shared.py) on the first file."""
    import zstandard

    ok = []
    fast_run, fast = stage_output(chunks, work / "id-fast", vocab, merges, workers, "gigatoken")
    slow_run, slow = stage_output(chunks, work / "id-slow", vocab, merges, workers, "tiktoken")
    ok.append(
        verdict(
            f"whole chunk: gigatoken's .bin/.idx == tiktoken's ({len(fast):,} bytes; stage CPU "
            f"{fast_run.cpu:.1f} s vs {slow_run.cpu:.1f} s)",
            float(fast == slow),
            1.0,
            "",
        )
    )
    texts, total = [], 0
    with open(chunks / "train_chunk_0.jsonl", "rb") as handle:
        for line in handle:
            texts.append(json.loads(line)["text"])
            total += len(texts[-1])
            if total >= 50 * MB:
                break
    big = one_chunk(work / "big", json.dumps({"text": "\n\n".join(texts)}, ensure_ascii=False).encode() + b"\n")
    fast_run, fast = stage_output(big, work / "big-fast", vocab, merges, 1, "gigatoken")
    slow_run, slow = stage_output(big, work / "big-slow", vocab, merges, 1, "tiktoken")
    ok.append(
        verdict(
            f"one {total / MB:.0f} MB document: gigatoken's .bin/.idx == tiktoken's (peak RSS "
            f"{fast_run.rss_mb:.0f} MB vs {slow_run.rss_mb:.0f} MB)",
            float(fast == slow),
            1.0,
            "",
        )
    )
    shutil.rmtree(big)
    try:
        sys.path[:0] = [str(REPO / "benchmarks"), str(STAGES)]
        from _shared import megatron_preprocess_data
    except ImportError as exc:  # megatron-core or tokenizers missing: no Megatron reference here
        print(f"  SKIP  Megatron's writer: {exc}")
        return ok
    payload = zstandard.ZstdDecompressor().stream_reader(open(sources[0], "rb")).read()
    first = one_chunk(work / "first", payload)
    _, ours = stage_output(first, work / "first-out", vocab, merges, workers, "gigatoken")
    megatron_preprocess_data([json.loads(line)["text"] for line in payload.splitlines() if line], work / "megatron")
    theirs = (work / "megatron.bin").read_bytes() + (work / "megatron.idx").read_bytes()
    ok.append(
        verdict(
            f"{sources[0].name}: the stage's .bin/.idx == Megatron's preprocess_data.py writer's "
            f"({len(theirs):,} bytes)",
            float(ours == theirs),
            1.0,
            "",
        )
    )
    return ok


def tokenize_only(args: argparse.Namespace, work: Path) -> int:
    """`--only tokenize`: the sample's text `--token-scale` times in one chunk, then `--runs` rounds, with medians;
    then the stage's memory at 1x and 10x input, and the byte-identity checks."""
    import statistics

    import zstandard

    sources, vocab, merges, generator = make_sample(work, args.files, args.docs)
    chunks = fresh(work / "chunks")
    with open(chunks / "train_chunk_0.jsonl", "wb") as out:
        for _ in range(args.token_scale):
            for source in sources:
                with open(source, "rb") as handle:
                    zstandard.ZstdDecompressor().copy_stream(handle, out)
    size = folder_bytes(chunks, "*.jsonl")
    print(
        f"data: {len(sources)} x {args.docs} documents from {generator}, x{args.token_scale}: {size / MB:.0f} MB "
        f"of JSONL; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at start"
    )
    rounds = tokenize_runs(chunks, work, vocab, merges, args.workers, args.runs)
    w = args.workers
    print(
        f"\n  round  stage wall  stage cpu  tiktoken x{w} cpu  gigatoken x{w} wall  gigatoken x{w} cpu  "
        f"gigatoken alone cpu  its jsonl path cpu  vs tiktoken  vs gigatoken %  (alone %)  (jsonl path %)"
    )
    for number, r in enumerate(rounds, 1):
        print(
            f"  {number:5d}  {r['stage'].wall:10.2f}  {r['stage'].cpu:9.2f}  {r['tiktoken'].cpu:15.2f}  "
            f"{r['fast'].wall:16.2f}  {r['fast'].cpu:15.2f}  {r['fast_alone'].cpu:19.2f}  "
            f"{r['fast_jsonl'].cpu:18.2f}  {r['vs_tiktoken']:10.2f}x  {r['vs_fast']:13.1f}  {r['vs_fast_alone']:9.1f}  "
            f"{r['vs_fast_jsonl']:14.1f}"
        )
    median = {
        key: statistics.median(r[key] for r in rounds)
        for key in ("vs_tiktoken", "vs_fast", "vs_fast_alone", "vs_fast_jsonl", "wall_vs_fast")
    }
    stage_rate = statistics.median(r["tokens"] / r["stage"].cpu for r in rounds)
    print(
        f"\nmedians of {len(rounds)} rounds ({rounds[0]['tokens']:,} tokens each; the stage "
        f"{stage_rate / 1e6:.1f} M tokens per CPU-second; load average {os.getloadavg()[0]:.2f} at the end):"
    )
    ok = [
        verdict(
            f"preprocess ({w} workers) tokens per CPU-second vs raw tiktoken in {w} processes at once",
            median["vs_tiktoken"],
            8.0,
        ),
        verdict(
            f"preprocess ({w} workers) tokens per CPU-second vs raw gigatoken in {w} processes at once",
            median["vs_fast"],
            70.0,
            " %",
        ),
    ]
    print(
        f"info: vs raw gigatoken alone (one process, the other core idle), per CPU-second: "
        f"{median['vs_fast_alone']:.1f} %; wall vs raw gigatoken in {w} processes: {median['wall_vs_fast']:.1f} %"
    )
    print(
        f"info: vs gigatoken's own JSONL path in {w} processes (its reader and encode, no validation, nothing "
        f"written), per CPU-second: {median['vs_fast_jsonl']:.1f} %"
    )
    print(
        f"\nmemory (peak RSS of the stage's largest process, {args.rss_mb:g} MB of input, then 10x that; median of "
        f"{args.runs} runs each, their range in brackets):"
    )
    sample = (chunks / "train_chunk_0.jsonl").read_bytes()
    for label, ones, tens in tokenize_memory(sample, work, vocab, merges, w, args.rss_mb, args.runs):
        one, ten = statistics.median(ones), statistics.median(tens)
        print(
            f"  {label}: {one:.0f} MB at 1x ({min(ones):.0f}-{max(ones):.0f}), "
            f"{ten:.0f} MB at 10x ({min(tens):.0f}-{max(tens):.0f})"
        )
        headroom = RSS_LIMIT_MB / ten
        ok.append(verdict(f"{label}: peak RSS at 10x within {RSS_LIMIT_MB:g} MB", headroom, 1.0, "x headroom"))
        ok.append(verdict(f"{label}: peak RSS flat (1x / 10x)", one / ten, 0.9))
    del sample
    print("\nbyte identity:")
    ok += identity_checks(chunks, sources, work, vocab, merges, w)
    return 1 if args.strict and not all(ok) else 0


def bench_rss(
    sample_jsonl: Path, work: Path, vocab: Path, merges: Path, workers: int, megabytes: float
) -> tuple[Run, Run, int, int]:
    """Preprocess on the first `megabytes` of whole lines, then on that input repeated 10 times:
    (run 1x, run 10x, input bytes 1x, tokens 1x)."""
    data = sample_jsonl.read_bytes()
    data = data[: data.rfind(b"\n", 0, int(megabytes * MB)) + 1] or data
    runs, tokens = [], []
    for factor in (1, 10):
        chunks, out = fresh(work / f"rss-{factor}x"), work / f"rss-{factor}x-tokens"
        with open(chunks / "train_chunk_0.jsonl", "wb") as handle:
            for _ in range(factor):
                handle.write(data)
        runs.append(
            measure(
                stage(
                    "preprocess",
                    "--in",
                    str(chunks),
                    "--out",
                    str(out),
                    "--vocab",
                    str(vocab),
                    "--merges",
                    str(merges),
                    "--workers",
                    str(workers),
                ),
                env=stage_env(),
            )
        )
        tokens.append(json.loads((out / "train_chunk_0.jsonl_text_document.manifest.json").read_text())["tokens"])
        shutil.rmtree(chunks)
        shutil.rmtree(out)
    return runs[0], runs[1], len(data), tokens[0]


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------


def row(name: str, run: Run, nbytes: int, tokens: int | None = None, cores: int = 1) -> str:
    rate = f"{nbytes / run.wall / MB:9.1f}"
    per_core = f"{tokens / run.wall / cores:14,.0f}" if tokens else " " * 14
    per_cpu = f"{tokens / run.cpu:14,.0f}" if tokens and run.cpu else " " * 14
    rss = f"{run.rss_mb:9.1f}" if run.rss_mb else " " * 9
    return f"  {name:34s} {run.wall:8.2f} {run.cpu:8.2f} {rate} {per_core} {per_cpu} {rss}"


def verdict(label: str, value: float, target: float, unit: str = "x") -> bool:
    ok = value >= target
    print(f"  {'PASS' if ok else 'FAIL'}  {label}: {value:.2f}{unit} (target >= {target:g}{unit})")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=4, help="sample files to generate")
    parser.add_argument("--docs", type=int, default=8000, help="documents per sample file")
    parser.add_argument("--replicas", type=int, default=4, help="copies of the sample for extract/concat")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (the fastest is kept)")
    parser.add_argument("--token-repeats", type=int, default=2, help="runs per tokenizer measurement")
    # 32 MB: on words that never repeat, a worker's cache first reaches its bound after about 3.4 M characters
    # (_fast_bpe.py), so 8 MB (4 M a worker) measured one cycle from a fresh heap against ten times as many.
    parser.add_argument("--rss-mb", type=float, default=32.0, help="input of the RSS check (then 10x that)")
    parser.add_argument(
        "--scale-gb", type=float, default=10.0, help="input of the concat-vs-cat run past the page cache (0: skip it)"
    )
    parser.add_argument("--scale-files-per-output", type=int, default=20, help="concat group size at that scale")
    parser.add_argument("--scale-repeats", type=int, default=2, help="runs per measurement at that scale")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="preprocess workers")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temporary one, removed after)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--only",
        choices=["all", "tokenize"],
        default="all",
        help="tokenize: only the tokenizer against raw tiktoken, --runs rounds, medians",
    )
    parser.add_argument("--runs", type=int, default=5, help="rounds of the tokenize comparison (--only tokenize)")
    parser.add_argument(
        "--token-scale",
        type=int,
        default=4,
        help="the sample's text this many times in the chunk tokenized (--only tokenize)",
    )
    args = parser.parse_args(argv)
    if shutil.which("unzstd") is None:
        print("unzstd is not installed (Debian: apt-get install -y zstd): the extract comparison needs it")
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-stages-"))
    try:
        return tokenize_only(args, fresh(work)) if args.only == "tokenize" else run_all(args, fresh(work))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def run_all(args: argparse.Namespace, work: Path) -> int:
    cores = min(args.workers, len(os.sched_getaffinity(0)))
    started = time.monotonic()
    sources, vocab, merges, generator = make_sample(work, args.files, args.docs)
    zst = work / "zst"
    replicate(sources, zst, args.replicas)
    print(
        f"data: {len(sources)} x {args.docs} documents from {generator}, x{args.replicas} copies; "
        f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at start"
    )

    extract_runs = bench_extract(zst, work, args.repeats)
    text_bytes = folder_bytes(work / "extracted", "*.jsonl")
    concat_runs = bench_concat(work / "extracted", work, args.files, args.repeats)
    scale = None
    if args.scale_gb > 0:
        scale = bench_at_scale(
            zst, work / "extracted", work, args.scale_files_per_output, args.scale_gb, args.scale_repeats
        )
    # preprocess input: one copy of the sample (concat's outputs hold R copies; one is enough to time tokenizing)
    chunks = fresh(work / "chunks")
    shutil.copyfile(work / "concat" / "train_chunk_0.jsonl", chunks / "train_chunk_0.jsonl")
    chunk_bytes = folder_bytes(chunks, "*.jsonl")
    pre_runs, tokens, raw = bench_preprocess(chunks, work, vocab, merges, args.workers, args.token_repeats)
    raw_run, raw_tokens, documents = raw["1"]
    rss_1x, rss_10x, rss_bytes, rss_tokens = bench_rss(
        chunks / "train_chunk_0.jsonl", work, vocab, merges, args.workers, args.rss_mb
    )
    if tokens != raw_tokens + documents:
        print(f"WARNING: preprocess wrote {tokens} tokens, raw tiktoken gave {raw_tokens} + {documents} EOD")

    print(
        f"\n  {'':34s} {'wall s':>8s} {'cpu s':>8s} {'MB/s':>9s} {'tokens/s/core':>14s} {'tokens/cpu-s':>14s} "
        f"{'peak RSS':>9s}"
    )
    for name, run in extract_runs.items():
        print(row(name, run, text_bytes))
    for name, run in concat_runs.items():
        print(row(name, run, text_bytes))
    if scale:
        for name, run in scale[0].items():
            print(row(f"{name} at {scale[1] / 1e9:.1f} GB", run, scale[1]))
    print(row("tiktoken encode_ordinary (1 thread)", raw_run, chunk_bytes, raw_tokens))
    raw_parallel = raw[str(args.workers)][0]
    if args.workers > 1:
        print(row(f"tiktoken, {args.workers} processes at once", raw_parallel, chunk_bytes, raw_tokens, cores))
    for name, run in pre_runs.items():
        print(row(name, run, chunk_bytes, tokens, cores if "workers" in name else 1))
    print(
        row(f"preprocess {rss_bytes / MB:.0f} MB input, {args.workers} workers", rss_1x, rss_bytes, rss_tokens, cores)
    )
    print(row(f"preprocess 10x that, {args.workers} workers", rss_10x, 10 * rss_bytes, 10 * rss_tokens, cores))

    raw_rate, raw_cpu_rate = raw_tokens / raw_run.wall, raw_tokens / raw_run.cpu
    parallel = pre_runs[f"preprocess ({args.workers} workers)"]
    dirty_limit = kernel_dirty_limit_bytes()
    print(
        f"\ntargets (the kernel holds back about {dirty_limit / 1e9:.1f} GB of writes in the page cache here; the "
        "stages fsync every output):"
    )
    past = ""
    if scale:
        past = f"at {scale[1] / 1e9:.1f} GB " + (
            "(past the page cache, as every real run)"
            if scale[1] > dirty_limit
            else "(NOT past the page cache here: raise --scale-gb)"
        )
    results = [
        verdict(f"extract vs unzstd {past}", scale[0]["unzstd"].wall / scale[0]["extract"].wall, 1.0)
        if scale
        else True,
        verdict(f"concat vs cat {past}", scale[0]["cat"].wall / scale[0]["concat"].wall, 0.9) if scale else True,
        verdict(
            f"preprocess tokens/s per core ({args.workers} workers on {cores} cores) vs raw tiktoken",
            100 * tokens / parallel.wall / cores / raw_rate,
            80.0,
            " %",
        ),
        verdict(
            "preprocess peak RSS at 10x input within 300 MB",
            RSS_LIMIT_MB / max(rss_10x.rss_mb, 1e-9),
            1.0,
            "x headroom",
        ),
        verdict("preprocess peak RSS flat (1x / 10x)", rss_1x.rss_mb / max(rss_10x.rss_mb, 1e-9), 0.9),
    ]
    print(
        f"at the sample's {text_bytes / 1e9:.2f} GB (fits in the page cache: the tools' output is not on disk when "
        "they exit), and against the tools followed by `sync FILES` (the same durability):"
    )
    verdict("extract vs unzstd (plain, no fsync)", extract_runs["unzstd"].wall / extract_runs["extract"].wall, 1.0)
    verdict("concat vs cat (plain, no fsync)", concat_runs["cat"].wall / concat_runs["concat"].wall, 0.9)
    verdict("extract vs unzstd + sync", extract_runs["unzstd + sync"].wall / extract_runs["extract"].wall, 1.0)
    verdict("concat vs cat + sync", concat_runs["cat + sync"].wall / concat_runs["concat"].wall, 0.9)
    print("the same, against what this machine gives parallel work right now:")
    verdict(
        f"preprocess tokens/s vs raw tiktoken in {args.workers} processes at once",
        100 * tokens / parallel.wall / (raw_tokens / raw_parallel.wall),
        80.0,
        " %",
    )
    verdict(
        "preprocess tokens per CPU-second vs raw tiktoken's", 100 * tokens / parallel.cpu / raw_cpu_rate, 80.0, " %"
    )
    single = pre_runs["preprocess (1 worker)"]
    print(
        f"info: preprocess with 1 worker: {100 * tokens / single.wall / raw_rate:.0f} % of raw tiktoken (wall); "
        f"raw tiktoken in {args.workers} processes: {100 * raw_tokens / raw_parallel.wall / cores / raw_rate:.0f} "
        "% per core of one alone"
    )
    print(f"bench took {time.monotonic() - started:.0f} s; load average {os.getloadavg()[0]:.1f} at the end")
    return 1 if args.strict and not all(results) else 0


if __name__ == "__main__":
    sys.exit(main())
