#!/usr/bin/env python3
"""Benchmark the smoke pretrain on 1 vs 2 local ranks (DDP over gloo): steps/s and samples/s. CPU figures only.

    python benchmarks/bench_pretrain_ddp.py [--steps 20] [--hidden 128] [--seq-length 128] [--cpus N]

The data is benchmarks/_shared.py's English-like documents tokenized by the real preprocess stage. Each
configuration runs `stages/pretrain_local.py` in fresh processes with torchrun-style variables on 127.0.0.1; the
rate is rank 0's `steps_per_s_this_run` (the training loop only: imports, rendezvous and the index build excluded).
The ranks share the same `--cpus` cores (threads per rank = cpus / ranks), so 2 ranks show what data parallelism
costs or gains on one machine, not what it gains across nodes or GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from _shared import child_env, english_dataset  # noqa: E402

SCRIPT = REPO / "stages" / "pretrain_local.py"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(data: Path, results: Path, name: str, ranks: int, global_batch: int, args: argparse.Namespace) -> dict:
    """One training run on `ranks` local processes; returns rank 0's summary."""
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--data-dir",
        str(data),
        "--results",
        str(results),
        "--run-name",
        name,
        "--steps",
        str(args.steps),
        "--checkpoint-every",
        str(args.steps),
        "--seq-length",
        str(args.seq_length),
        "--hidden",
        str(args.hidden),
        "--global-batch-size",
        str(global_batch),
        "--threads",
        str(max(1, args.cpus // ranks)),
        "--log-every",
        str(args.steps),
    ]
    port = str(free_port())
    procs = [
        subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=child_env(
                RANK=str(rank),
                WORLD_SIZE=str(ranks),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(ranks),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
            ),
        )
        for rank in range(ranks)
    ]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    for rank, (proc, out) in enumerate(zip(procs, outputs)):
        if proc.returncode != 0:
            raise SystemExit(f"{name}: rank {rank} exited {proc.returncode}:\n{out}")
    return json.loads((results / name / "train_summary.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--cpus", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    print(
        f"CPU only: {args.cpus} core(s) shared by all ranks; model hidden {args.hidden}, 2 layers, sequence "
        f"{args.seq_length}, GPT-2 vocabulary; {args.steps} steps per run"
    )
    print(f"{'ranks':>5} {'threads/rank':>12} {'global batch':>12} {'steps/s':>8} {'samples/s':>9}")
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:
        work = Path(tmp)
        data = english_dataset(work / "data", chunks=(400, 200))
        for ranks, global_batch in ((1, 4), (2, 4), (1, 8), (2, 8)):
            result = run(data, work / "results", f"r{ranks}-g{global_batch}", ranks, global_batch, args)
            rate = result["steps_per_s_this_run"]
            print(
                f"{ranks:>5} {max(1, args.cpus // ranks):>12} {global_batch:>12} {rate:>8.2f} "
                f"{rate * global_batch:>9.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
