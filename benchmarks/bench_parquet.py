#!/usr/bin/env python3
"""Benchmark tokenize-preprocess on the same documents as .jsonl, .parquet and .jsonl.gz: tokens/s per core.

    python benchmarks/bench_parquet.py [--docs 20000] [--repeats 3] [--row-group-rows 10000] [--workers 1]

The documents come from stages/sample.py, the project's sample generator (web text, code, papers and books,
~700 words each, so the BPE really merges). They are written once as one `.jsonl` (`{"text", "id"}` per line, as
concat writes), once as a `.parquet` written by pyarrow with FineWeb's shape (text, id, and a few metadata
columns; snappy; row groups of `--row-group-rows`) and once as a `.jsonl.gz`. Each is tokenized by
`preprocess.py --files-per-output 1` in a child process, measured by bench_stages.measure (wall, CPU of the
whole process tree, peak RSS); the fastest of `--repeats` runs counts. Tokens/s per core = tokens / CPU seconds.

Target: parquet >= 90 % of .jsonl tokens/s per core. The ids are the same for all three (the tests
check that); only reading differs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from _shared import gpt2_vocab_merges, sample_texts  # noqa: E402
from bench_stages import measure, stage, stage_env  # noqa: E402

TARGET = 0.90


def write_inputs(work: Path, docs: int, row_group_rows: int) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(14)
    texts = sample_texts(docs, mean_words=700)
    ids = [f"<urn:uuid:{i:08x}>" for i in range(docs)]
    folders = {kind: work / kind for kind in ("jsonl", "parquet", "jsonl.gz")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    lines = "".join(json.dumps({"text": t, "id": i}, ensure_ascii=False) + "\n" for t, i in zip(texts, ids))
    (folders["jsonl"] / "part_0.jsonl").write_text(lines, encoding="utf-8")
    (folders["jsonl.gz"] / "part_0.jsonl.gz").write_bytes(gzip.compress(lines.encode(), compresslevel=6))
    table = pa.table(
        {
            "text": texts,
            "id": ids,
            "dump": ["CC-MAIN-2024-10"] * docs,
            "url": [f"https://example.com/{i}" for i in range(docs)],
            "score": [rng.random() * 5 for _ in range(docs)],
        }
    )
    pq.write_table(table, folders["parquet"] / "part_0.parquet", row_group_size=row_group_rows, compression="snappy")
    return folders


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--row-group-rows", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=1, help="tokenizer processes (1: tokenize inline)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-parquet-"))
    try:
        folders = write_inputs(work, args.docs, args.row_group_rows)
        vocab, merges = gpt2_vocab_merges()
        text_mb = (folders["jsonl"] / "part_0.jsonl").stat().st_size / 1e6
        print(f"{args.docs} documents, {text_mb:.1f} MB as .jsonl; workers {args.workers}; best of {args.repeats}")
        results: dict[str, tuple[float, float, float, float]] = {}
        for _ in range(args.repeats):
            for kind, folder in folders.items():  # interleaved, so a noisy moment hits every format alike
                out = work / f"out-{kind}"
                shutil.rmtree(out, ignore_errors=True)
                run = measure(
                    stage(
                        "preprocess",
                        "--in",
                        str(folder),
                        "--out",
                        str(out),
                        "--files-per-output",
                        "1",
                        "--vocab",
                        str(vocab),
                        "--merges",
                        str(merges),
                        "--workers",
                        str(args.workers),
                    ),
                    env=stage_env(),
                )
                manifest = json.loads((out / "train_chunk_0.jsonl_text_document.manifest.json").read_text())
                previous = results.get(kind)
                if previous is None or run.wall < previous[0]:
                    results[kind] = (run.wall, run.cpu, run.rss_mb, manifest["tokens"])
        print(
            f"{'input':<10} {'tokens':>12} {'wall s':>8} {'cpu s':>8} {'tokens/s':>12} {'tokens/s/core':>14} "
            f"{'peak RSS MB':>12}"
        )
        for kind, (wall, cpu, rss, tokens) in results.items():
            print(
                f"{kind:<10} {tokens:>12,} {wall:>8.2f} {cpu:>8.2f} {tokens / wall:>12,.0f} {tokens / cpu:>14,.0f} "
                f"{rss:>12.0f}"
            )
        per_core = {kind: r[3] / r[1] for kind, r in results.items()}
        ratio = per_core["parquet"] / per_core["jsonl"]
        print(
            f"parquet / jsonl tokens/s per core: {ratio:.3f} (target >= {TARGET:.2f}: "
            f"{'met' if ratio >= TARGET else 'NOT met'})"
        )
        print(f"jsonl.gz / jsonl tokens/s per core: {per_core['jsonl.gz'] / per_core['jsonl']:.3f}")
        return 0 if ratio >= TARGET else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
