#!/usr/bin/env python3
"""Steps/s, tokens/s and MFU of the smoke pretrain on one CUDA GPU (docs/performance.md, "The smoke pretrain on one
GPU").

    benchmarks/bench_pretrain_gpu.py --data-dir DIR [--logs OUT] [--peak-tflops 989]
    benchmarks/bench_pretrain_gpu.py --from-logs OUT       # the table again from the logs of an earlier run

DIR is a preprocess output (.bin/.idx + manifests), e.g. `.bcp-pipeline/workspaces/demo/data/slimpajama/
preprocessed` after `bcp-pipeline run demo`. Each case runs `stages/pretrain_local.py --device cuda` once, its
log kept in OUT (default: a temporary folder); the figures come from the logs through the run report's own
readers (`report/throughput.py`: the `model shape:` line and each step's `s/step`) and formula (`report/mfu.py`).
Steady = the median step time of the steps after the fifth (the first ones pay for CUDA's start and autotuning).
The peak is the H100/H200 SXM BF16 dense figure unless --peak-tflops says another (A100: 312).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bcp_pipeline.report import mfu, throughput  # noqa: E402  (the repo on the path first)

WARM_UP_STEPS = 5
GPT2_SMALL = ["--layers", "12", "--hidden", "768", "--heads", "12", "--seq-length", "1024", "--global-batch-size", "32"]
GPT2_MEDIUM = [
    "--layers",
    "24",
    "--hidden",
    "1024",
    "--heads",
    "16",
    "--seq-length",
    "1024",
    "--global-batch-size",
    "32",
]
# name -> (what it is, the trainer's arguments)
CASES = {
    "smoke-fp32": (
        "the demo's smoke shape (2 x 128, seq 128, batch 8), fp32",
        ["--steps", "60", "--global-batch-size", "8", "--checkpoint-every", "20"],
    ),
    "gpt2s-fp32": (
        "GPT-2 small shape (124 M: 12 x 768, seq 1024, batch 32), fp32",
        ["--steps", "20", *GPT2_SMALL, "--no-checkpoints", "--lr", "6e-4"],
    ),
    "gpt2s-bf16": (
        "GPT-2 small shape, bf16-mixed",
        ["--steps", "40", *GPT2_SMALL, "--precision", "bf16-mixed", "--no-checkpoints", "--lr", "6e-4"],
    ),
    "gpt2m-bf16": (
        "GPT-2 medium shape (355 M: 24 x 1024, seq 1024, batch 32), bf16-mixed",
        ["--steps", "30", *GPT2_MEDIUM, "--precision", "bf16-mixed", "--no-checkpoints", "--lr", "3e-4"],
    ),
}


def run_case(name: str, arguments: list[str], data_dir: Path, logs: Path) -> None:
    log = logs / f"{name}.log"
    with log.open("w") as out:
        code = subprocess.call(
            [
                sys.executable,
                str(REPO / "stages" / "pretrain_local.py"),
                "--device",
                "cuda",
                "--data-dir",
                str(data_dir),
                "--results",
                str(logs / "results"),
                "--run-name",
                name,
                *arguments,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if code:
        sys.exit(f"{name}: the trainer exited {code}; its log: {log}")


def figures(log: Path, peak_tflops: float) -> str:
    text = log.read_text(errors="replace")
    facts = throughput.smoke_facts(text)
    times = throughput.step_times(text)
    steady = [seconds for step, seconds in times.items() if step > WARM_UP_STEPS]
    if facts is None or not steady:
        return f"{log.stem}: no model shape or no steps past step {WARM_UP_STEPS} in {log}"
    step_s = statistics.median(steady)
    tokens_per_s = mfu.tokens_per_second(step_s, facts.tokens_per_step)
    peak = mfu.Peak(1, peak_tflops, f"1 GPU at {peak_tflops:g} TFLOP/s")
    utilization = mfu.model_flops_utilization(tokens_per_s, facts.flops_per_token, peak)
    return f"| {len(times)} | {1 / step_s:.2f} | {tokens_per_s / 1e3:,.1f} k | {100 * utilization:.1f} % |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data-dir", type=Path, help="preprocess output to train on")
    source.add_argument("--from-logs", type=Path, help="print the table from an earlier run's logs")
    parser.add_argument("--logs", type=Path, default=None, help="keep the logs here (default: a temporary folder)")
    parser.add_argument("--peak-tflops", type=float, default=mfu.H100_SXM_BF16_TFLOPS)
    args = parser.parse_args()
    logs = args.from_logs or args.logs or Path(tempfile.mkdtemp(prefix="bench-pretrain-gpu-"))
    if args.data_dir is not None:
        logs.mkdir(parents=True, exist_ok=True)
        for name, (_, arguments) in CASES.items():
            print(f"running {name} ...", file=sys.stderr, flush=True)
            run_case(name, arguments, args.data_dir, logs)
    print("| run | steps | steady steps/s | tokens/s | MFU |\n|---|---|---|---|---|")
    for name, (what, _) in CASES.items():
        log = logs / f"{name}.log"
        if not log.exists():
            return print(f"{name}: no log {log}", file=sys.stderr) or 1
        print(f"| {what} {figures(log, args.peak_tflops)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
