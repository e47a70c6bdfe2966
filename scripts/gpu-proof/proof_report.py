"""The GPU proof's checks and figures, from the three Bridge jobs' logs (pure: text in, a summary out).

Steps and losses are read by the project's own parser (bcp_pipeline/training_log.py, what `status` and the report
use), step times and Bridge's own TFLOP/s per GPU by report/throughput.py, MFU as the report computes it: Bridge's
TFLOP/s over one GPU's dense BF16 peak (report/mfu.py). Each check is {name, ok, detail}; the proof fails when any
required one does.
"""

from __future__ import annotations

import re
import statistics

from bcp_pipeline.report import mfu, throughput
from bcp_pipeline.training_log import parse_training_log

# NVIDIA H200 SXM: the H100's Hopper chip, dense BF16 989 TFLOP/s (1,979 with sparsity; NVIDIA's H200 datasheet, the
# figure bcp_pipeline/config/instances.py keeps for the H100 SXM). KINDS.md of the device tool measured 788 TFLOP/s
# for an 8192^3 bf16 matrix product through PyTorch on one such machine: shown beside it, as what is reachable.
H200_BF16_DENSE_TFLOPS = mfu.H100_SXM_BF16_TFLOPS
H200_MEASURED_MATMUL_TFLOPS = 788.0
WARM_UP_STEPS = 5  # the first steps pay for CUDA's start, allocation and autotuning
EXITED_BY_TIME = re.compile(r"exiting program after ([\d.]+) minutes")
LOADED = re.compile(r"successfully loaded checkpoint from .* at iteration (\d+)")


def check(name: str, ok: bool, detail: str, required: bool = True) -> dict:
    return {"name": name, "ok": bool(ok), "detail": detail, "required": required}


def losses(log: str) -> dict[int, float]:
    return {p.step: p.loss for p in parse_training_log(log)}


def continuation_checks(
    a_log: str, b_log: str, c_log: str, *, steps: int, b_exit: int, c_exit: int, tracker: str | None
) -> tuple[list[dict], dict]:
    """The uninterrupted run (A), the job stopped by its time limit (B) and the one that continues it (C)."""
    a, b, c = losses(a_log), losses(b_log), losses(c_log)
    stopped = max(b) if b else 0
    found = [
        check(
            "A trains every step",
            sorted(a) == list(range(1, steps + 1)),
            f"A logged {len(a)} step(s) of {steps}, last {max(a) if a else None}",
        ),
        check("B exits 0", b_exit == 0, f"exit code {b_exit}"),
        check(
            "B is stopped by train.exit_duration_in_mins",
            bool(EXITED_BY_TIME.search(b_log)) and 2 <= stopped < steps,
            f"B's last step {stopped} of {steps}; Bridge's line: "
            f"{m.group(0) if (m := EXITED_BY_TIME.search(b_log)) else 'none'}",
        ),
        check(
            "B saved its last step as Bridge's latest checkpoint",
            tracker is not None and tracker.strip() == str(stopped),
            f"latest_checkpointed_iteration.txt holds {tracker!r}, B's last step {stopped}",
        ),
        check("C exits 0", c_exit == 0, f"exit code {c_exit}"),
        check(
            "C loads B's checkpoint",
            (m := LOADED.search(c_log)) is not None and int(m.group(1)) == stopped,
            f"Bridge's line: {m.group(0) if m else 'none'}",
        ),
        check(
            "C continues at the next step and ends at the last",
            bool(c) and min(c) == stopped + 1 and max(c) == steps,
            f"C logged steps {min(c) if c else None}..{max(c) if c else None}",
        ),
    ]
    same_before = [s for s in b if s in a]
    diff_before = max((abs(a[s] - b[s]) for s in same_before), default=None)
    resumed = stopped + 1
    after = [s for s in c if s in a]
    diff_after = max((abs(a[s] - c[s]) for s in after), default=None)
    found += [
        check(
            "B's steps have A's losses (same data order)",
            bool(same_before) and diff_before == 0,
            f"{len(same_before)} step(s), largest difference {diff_before}",
        ),
        check(
            "the loss at the resumed step equals the uninterrupted run's",
            resumed in a and resumed in c and a[resumed] == c[resumed],
            f"step {resumed}: A {a.get(resumed)}, C {c.get(resumed)} (Bridge prints 7 significant digits)",
        ),
        check(
            "every continued step has A's loss",
            bool(after) and diff_after == 0,
            f"{len(after)} step(s), largest difference {diff_after}",
            required=False,
        ),
    ]
    figures = {
        "stopped_at": stopped,
        "resumed_at": resumed,
        "loss_resumed_a": a.get(resumed),
        "loss_resumed_c": c.get(resumed),
        "largest_loss_difference_after": diff_after,
        "loss_first": a.get(1),
        "loss_last": a.get(steps),
    }
    return found, figures


def bridge_throughput(log: str, *, tokens_per_step: int, peak_tflops: float = H200_BF16_DENSE_TFLOPS) -> dict:
    """Steady step time, tokens/s, Bridge's TFLOP/s per GPU and the MFU it means (the warm-up steps left out)."""
    times = {s: t for s, t in throughput.step_times(log).items() if s > WARM_UP_STEPS}
    tflops = {s: t for s, t in throughput.step_tflops(log).items() if s > WARM_UP_STEPS}
    if not times or not tflops:
        return {"steps": len(times), "step_s": None, "tokens_per_s": None, "tflops_per_gpu": None, "mfu": None}
    step_s = statistics.median(times.values())
    per_gpu = statistics.median(tflops.values())
    peak = mfu.Peak(1, peak_tflops, f"1 x H200 BF16 dense ({peak_tflops:g} TFLOP/s, datasheet)")
    return {
        "steps": len(times),
        "step_s": step_s,
        "tokens_per_s": mfu.tokens_per_second(step_s, tokens_per_step),
        "tflops_per_gpu": per_gpu,
        "mfu": per_gpu / peak.tflops_per_device,
        "mfu_of_measured_matmul": per_gpu / H200_MEASURED_MATMUL_TFLOPS,
        "peak": peak.source,
    }


def smoke_throughput(log: str, peak_tflops: float = H200_BF16_DENSE_TFLOPS) -> dict:
    """The smoke trainer's steady figures, MFU by the report's own formula (its log's `model shape:` line)."""
    facts = throughput.smoke_facts(log)
    times = [t for s, t in throughput.step_times(log).items() if s > WARM_UP_STEPS]
    if facts is None or not times:
        return {"steps": len(times), "step_s": None, "tokens_per_s": None, "mfu": None}
    step_s = statistics.median(times)
    tokens_per_s = mfu.tokens_per_second(step_s, facts.tokens_per_step)
    return {
        "steps": len(times),
        "step_s": step_s,
        "tokens_per_s": tokens_per_s,
        "mfu": mfu.model_flops_utilization(tokens_per_s, facts.flops_per_token, mfu.Peak(1, peak_tflops, "")),
    }


def markdown(summary: dict) -> str:
    """The summary as a page: where and when, what changed from the rendered list and why, checks, figures."""
    env = summary["environment"]
    lines = [
        f"# GPU proof, {summary['date']}",
        "",
        f"Machine: {env.get('gpu')}; Python {env.get('python')}, torch {env.get('torch')}, megatron-core "
        f"{env.get('megatron_core')}, megatron-bridge {env.get('megatron_bridge')}, transformers "
        f"{env.get('transformers')}. Transformer Engine: {env.get('transformer_engine')}; layer spec: "
        f"{summary.get('layer_spec')}.",
        "",
        f"Pipeline `{summary['pipeline']}` rendered by `plan --backend slurm --json`; "
        f"{summary['rendered_overrides']} rendered override(s), these changed:",
        "",
        "| key | rendered | proof | why |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| `{c['key']}` | {'(not rendered)' if c['rendered'] is None else c['rendered']} | {c['value']} | "
        f"{c['reason']} |"
        for c in summary["changes"]
    ]
    lines += ["", "| check | result | detail |", "|---|---|---|"]
    for item in summary["checks"]:
        result = "ok" if item["ok"] else ("FAILED" if item["required"] else "failed (optional)")
        lines.append(f"| {item['name']} | {result} | {item['detail']} |")
    lines += ["", "| run | steady s/step | tokens/s | TFLOP/s per GPU | MFU |", "|---|---|---|---|---|"]
    for name, fig in summary["throughput"].items():
        cells = [
            f"{fig['step_s']:.4f}" if fig.get("step_s") else "-",
            f"{fig['tokens_per_s']:,.0f}" if fig.get("tokens_per_s") else "-",
            f"{fig['tflops_per_gpu']:.1f}" if fig.get("tflops_per_gpu") else "-",
            f"{100 * fig['mfu']:.1f} %" if fig.get("mfu") is not None else "-",
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"MFU: over {H200_BF16_DENSE_TFLOPS:g} TFLOP/s (H200 dense BF16, datasheet); Bridge's own TFLOP/s "
        "for Bridge, the report's 6N + 12 L s h for the smoke trainer.",
        "",
        f"Stages (s): {', '.join(f'{k} {v:.1f}' for k, v in summary['seconds'].items())}",
        "",
    ]
    return "\n".join(lines)
