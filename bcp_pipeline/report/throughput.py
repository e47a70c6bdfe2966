"""Step time, tokens/s and MFU over steps, out of a training log. Pure (text and figures in, points out).

Step times come from the log, one per logged step:
- the smoke pretrain (stages/pretrain_local.py): `step 12/60 loss ... 2.34 steps/s 0.4123 s/step`, the step's own
  wall time; its `model shape: layers L hidden H ... seq_length S vocab V global_batch B ...` line gives the FLOPs
  per token (report/mfu.py: 6N + 12 L s h with N = L x 12 h^2 + V h, its output layer tied to the embedding) and
  the tokens a step (B x S);
- NeMo (PyTorch Lightning's progress bar): `global_step=9.000, ..., train_step_timing in s=2.34`; the FLOPs per
  token and tokens per step are the stage's model config's (`TrainingFacts`, from the pipeline);
- Megatron-LM and Megatron-Bridge: ` iteration   10/  500000 | ... | elapsed time per iteration (ms): 2345.6 | ...`;
  Bridge's line also gives `throughput per GPU (TFLOP/s/GPU): X`, its own count of the FLOPs a GPU did: where a
  step has it, its MFU is X over one GPU's peak (Bridge's FLOPs, not this module's 6N + 12 L s h).
MFU needs a peak (report/mfu.py): the GPUs of the stage's instance, or a CPU peak the pipeline declares; without
one the points carry no MFU and `mfu_basis` says why.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from bcp_pipeline.config.nemo import ModelShape
from bcp_pipeline.report.mfu import Peak, flops_per_token, model_flops_utilization
from bcp_pipeline.report.timers import parse_timer_blocks
from bcp_pipeline.training_log import MEGATRON_STEP, MEGATRON_TFLOPS, MEGATRON_TIMING, NEMO_STEP, NEMO_TIMING, NUMBER

_LOCAL_STEP = re.compile(rf"^step (\d+)/\d+ .* ({NUMBER}) s/step\b")
_LOCAL_SHAPE = re.compile(
    r"^model shape: layers (\d+) hidden (\d+) heads \d+ seq_length (\d+) vocab (\d+) "
    r"global_batch (\d+) world (\d+) device (\w+)"
)


@dataclass(frozen=True)
class TrainingFacts:
    """What turns a step time into tokens/s and MFU: from the model config, or the log's own shape line."""

    flops_per_token: int
    tokens_per_step: int
    device: str = "gpu"  # "cpu" or "gpu": which peak applies
    devices: int = 1  # processes (CPU) or GPUs of the job


def smoke_facts(text: str) -> TrainingFacts | None:
    """The smoke pretrain's facts from its `model shape:` line; None when the log has none."""
    for line in re.split(r"[\r\n]+", text):
        if match := _LOCAL_SHAPE.match(line.strip()):
            layers, hidden, seq, vocab, batch, world = map(int, match.groups()[:6])
            shape = ModelShape(
                num_layers=layers,
                hidden_size=hidden,
                ffn_hidden_size=4 * hidden,
                seq_length=seq,
                gated_mlp=False,
                make_vocab_size_divisible_by=1,
                vocab_size=vocab,
            )
            return TrainingFacts(
                flops_per_token(shape, 1), batch * seq, "cpu" if match.group(7) == "cpu" else "gpu", world
            )
    return None


def step_times(text: str) -> dict[int, float]:
    """Seconds of each logged step, by step (a redrawn progress bar keeps its last value)."""
    times: dict[int, float] = {}
    for line in re.split(r"[\r\n]+", text):
        line = line.strip()
        if match := _LOCAL_STEP.match(line):
            times[int(match.group(1))] = float(match.group(2))
        elif (step := NEMO_STEP.search(line)) and (timing := NEMO_TIMING.search(line)):
            times[int(float(step.group(1)))] = float(timing.group(1))
        elif (step := MEGATRON_STEP.search(line)) and (timing := MEGATRON_TIMING.search(line)):
            times[int(step.group(1))] = float(timing.group(1)) / 1000
    return dict(sorted(times.items()))


def step_tflops(text: str) -> dict[int, float]:
    """Bridge's own TFLOP/s per GPU of each logged step that reports it."""
    found: dict[int, float] = {}
    for line in re.split(r"[\r\n]+", text):
        if (step := MEGATRON_STEP.search(line)) and (tflops := MEGATRON_TFLOPS.search(line)):
            found[int(step.group(1))] = float(tflops.group(1))
    return found


def throughput_points(
    times: dict[int, float], facts: TrainingFacts | None, peak: Peak | None, tflops: dict[int, float] | None = None
) -> list[dict]:
    """Per step: seconds, tokens/s (with facts) and MFU (with a peak: from the step's own TFLOP/s per GPU where the
    log gives it, else from the facts)."""
    points = []
    for step, seconds in times.items():
        point: dict = {"step": step, "step_s": seconds, "tokens_per_s": None, "mfu": None}
        if facts is not None and seconds > 0:
            point["tokens_per_s"] = round(facts.tokens_per_step / seconds, 3)
            if peak is not None:
                point["mfu"] = round(model_flops_utilization(point["tokens_per_s"], facts.flops_per_token, peak), 6)
        if peak is not None and tflops and step in tflops:
            point["mfu"] = round(tflops[step] / peak.tflops_per_device, 6)
        points.append(point)
    return points


def summary(points: list[dict], skip_first: int = 1) -> dict | None:
    """Median step time, tokens/s and MFU, the first step(s) left out (start-up, allocation, compilation)."""
    steady = points[skip_first:] or points
    if not steady:
        return None
    median = statistics.median(p["step_s"] for p in steady)
    tokens = [p["tokens_per_s"] for p in steady if p["tokens_per_s"] is not None]
    mfus = [p["mfu"] for p in steady if p["mfu"] is not None]
    return {
        "steps": len(steady),
        "step_s": median,
        "tokens_per_s": statistics.median(tokens) if tokens else None,
        "mfu": statistics.median(mfus) if mfus else None,
    }


def summary_text(summary: dict) -> str:
    """`0.412 s/step, 19,883 tokens/s, MFU 21.3%` (the parts that are known)."""
    parts = [f"{summary['step_s']:.3g} s/step"]
    if summary["tokens_per_s"] is not None:
        parts.append(f"{summary['tokens_per_s']:,.0f} tokens/s")
    if summary["mfu"] is not None:
        parts.append(f"MFU {summary['mfu']:.1%}")
    return ", ".join(parts)


@dataclass(frozen=True)
class StageFacts:
    """What the report holds a training stage's step times against (gather.py works it out from the config)."""

    facts: TrainingFacts | None  # None: from the log (the smoke pretrain's shape line)
    peak: Peak | None
    mfu_basis: str  # in words: the peak MFU is held against, or why there is no MFU


def throughput_series(
    logs_by_stage: dict[str, dict[str, str]],
    stage_facts: dict[str, StageFacts],
    cpu_peak_of: Callable[[int], Peak | None],
) -> list[dict]:
    """Per training stage, per attempt (job id): step time, tokens/s and MFU points, and the timer blocks.

    `cpu_peak_of(processes)` is the declared CPU peak for a smoke pretrain that ran on CPU (None: none declared).
    """
    series = []
    for stage, logs in logs_by_stage.items():
        given = stage_facts.get(stage, StageFacts(None, None, "no MFU: the stage's model is not known"))
        attempts, basis = [], given.mfu_basis
        for job_id, text in logs.items():
            facts, peak = given.facts, given.peak
            if facts is None and (facts := smoke_facts(text)) is not None and facts.device == "cpu":
                peak = cpu_peak_of(facts.devices)
                basis = (
                    f"MFU against {peak.source} (estimates.cpu_peak_tflops)"
                    if peak
                    else "no MFU: the smoke pretrain ran on CPU and the pipeline declares no CPU peak "
                    "(estimates.cpu_peak_tflops)"
                )
            points = throughput_points(step_times(text), facts, peak, step_tflops(text))
            timers = [block.as_json() for block in parse_timer_blocks(text)]
            if points or timers:
                attempts.append(
                    {
                        "job_id": job_id,
                        "points": points,
                        "timers": timers,
                        "summary": summary(points),
                        "flops_per_token": facts.flops_per_token if facts else None,
                        "tokens_per_step": facts.tokens_per_step if facts else None,
                    }
                )
        if attempts:
            series.append({"stage": stage, "mfu_basis": basis, "attempts": attempts})
    return series
