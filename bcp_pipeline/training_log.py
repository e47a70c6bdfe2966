"""Loss and step points from a training job's log: the run report's charts, and a running training's progress
(`status`, the live view). Pure (text in, points out); at the package's top because the backends read progress
with it and the report draws with it.

Three forms are read, each a line (a progress bar's updates, separated by carriage returns, count as lines):
- the local smoke pretrain (stages/pretrain_local.py): `step 12/60 loss 9.1234 lr 1.000e-03 2.34 steps/s`, the
  rate being the average since this attempt's first step, so its elapsed time is (step - first step) / rate;
- NeMo (PyTorch Lightning's progress bar): `... reduced_train_loss=10.80, global_step=9.000, ...,
  train_step_timing in s=2.34]`, elapsed time summed from the step timings;
- Megatron-LM, and Megatron-Bridge, which prints the same line after a ` [YYYY-MM-DD HH:MM:SS]` stamp:
  ` iteration   10/  500000 | ... | elapsed time per iteration (ms): 2345.6 | throughput per GPU (TFLOP/s/GPU):
  401.2 | ... | lm loss: 1.08E+01 |` (the throughput only with Bridge's `logger.log_throughput`).
A step logged more than once (a progress bar redrawn) keeps its last value. A line may start with its rank,
`[rankN]:` (RANK_LINE_PREFIX: torchrun's `--tee` form, which the Kubernetes pods write), read past.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
RANK_LINE_PREFIX = re.compile(r"^\[rank(\d+)\]:")  # `[rank3]:text`: the line of rank 3 in a log several ranks share
_LOCAL = re.compile(rf"^step (\d+)/\d+ loss ({NUMBER}) lr {NUMBER} ({NUMBER}) steps/s")
_LOCAL_FIRST = re.compile(r"(?:resuming from .* at step (\d+) of|starting at step (\d+) of)")
_NEMO_LOSS = re.compile(rf"\breduced_train_loss=({NUMBER})")
NEMO_STEP = re.compile(rf"\bglobal_step=({NUMBER})")
NEMO_TIMING = re.compile(rf"\btrain_step_timing in s=({NUMBER})")
_NEMO_BAR = re.compile(r"\|\s*(\d+)/(\d+) \[")  # tqdm's `| 100/300000 [` (batches done of the run's total)
MEGATRON_STEP = re.compile(r"\biteration\s+(\d+)/\s*\d+")
_MEGATRON_TOTAL = re.compile(r"\biteration\s+\d+/\s*(\d+)")
MEGATRON_TFLOPS = re.compile(rf"\bthroughput per GPU \(TFLOP/s/GPU\): ({NUMBER})")
_MEGATRON_LOSS = re.compile(rf"\blm loss: ({NUMBER})")
MEGATRON_TIMING = re.compile(rf"\belapsed time per iteration \(ms\): ({NUMBER})")


@dataclass(frozen=True)
class TrainingPoint:
    step: int
    loss: float
    seconds: float | None  # since the attempt's first step; None where the log gives no timing

    def as_json(self) -> dict:
        return asdict(self)


def parse_training_log(text: str) -> list[TrainingPoint]:
    """Every (step, loss, elapsed) the log reports, in step order; [] for a log with no training lines."""
    points: dict[int, TrainingPoint] = {}
    first_step = 0
    summed = 0.0  # NeMo / Megatron: elapsed time, summed from per-step timings
    last_timed_step: int | None = None
    last_local_step, last_local_seconds = -1, None  # the smoke pretrain's last timed point
    for line in re.split(r"[\r\n]+", text):
        line = RANK_LINE_PREFIX.sub("", line.strip(), count=1).strip()
        if match := _LOCAL_FIRST.search(line):
            first_step = int(match.group(1) or match.group(2))
            last_local_step, last_local_seconds = -1, None  # a new attempt's clock
            continue
        if match := _LOCAL.match(line):
            step, loss, rate = int(match.group(1)), float(match.group(2)), float(match.group(3))
            seconds = (step - first_step) / rate if rate > 0 else None
            if seconds is not None and last_local_seconds is not None and step > last_local_step:
                # The rate is printed to 2 decimals: rebuilt from it, a later step could land before an earlier one
                # (step 33 at 131.0 s after step 32 at 131.5 s). Time never runs backwards.
                seconds = max(seconds, last_local_seconds)
            if seconds is not None:
                last_local_step, last_local_seconds = step, seconds
            points[step] = TrainingPoint(step, loss, seconds)
            continue
        step, loss, timing = _step_loss_timing(line)
        if step is None or loss is None:
            continue
        seconds = None
        if timing is not None:
            summed += timing * (step - last_timed_step if last_timed_step is not None and step > last_timed_step else 1)
            last_timed_step, seconds = step, summed
        points[step] = TrainingPoint(step, loss, seconds)
    return [points[step] for step in sorted(points)]


def _step_loss_timing(line: str) -> tuple[int | None, float | None, float | None]:
    """A NeMo or Megatron-LM log line's step, loss and seconds per step (None for what it lacks)."""
    if (loss := _NEMO_LOSS.search(line)) and (step := NEMO_STEP.search(line)):
        timing = NEMO_TIMING.search(line)
        return int(float(step.group(1))), float(loss.group(1)), float(timing.group(1)) if timing else None
    if (step := MEGATRON_STEP.search(line)) and (loss := _MEGATRON_LOSS.search(line)):
        timing = MEGATRON_TIMING.search(line)
        return int(step.group(1)), float(loss.group(1)), float(timing.group(1)) / 1000 if timing else None
    return None, None, None


@dataclass(frozen=True)
class TrainingProgress:
    """Where a running training is, from the last line of its log that says."""

    steps_done: int
    total: int | None  # the training's steps in all, where the line gives them
    loss: float
    step_seconds: float | None


def last_progress(text: str) -> TrainingProgress | None:
    """The last progress a log shows (any of the three forms); None when it shows none."""
    for line in reversed(re.split(r"[\r\n]+", text)):
        line = RANK_LINE_PREFIX.sub("", line.strip(), count=1).strip()
        if match := _LOCAL.match(line):
            total = re.match(r"^step \d+/(\d+)", line)
            rate = float(match.group(3))
            return TrainingProgress(
                int(match.group(1)), int(total.group(1)), float(match.group(2)), 1 / rate if rate > 0 else None
            )
        step, loss, timing = _step_loss_timing(line)
        if step is None or loss is None:
            continue
        if bar := _NEMO_BAR.search(line):  # NeMo: global_step counts the steps before this one; the bar, done
            return TrainingProgress(int(bar.group(1)), int(bar.group(2)), loss, timing)
        if total := _MEGATRON_TOTAL.search(line):  # Megatron counts the iterations done: `iteration 10/300000`
            return TrainingProgress(step, int(total.group(1)), loss, timing)
        return TrainingProgress(step + 1 if NEMO_STEP.search(line) else step, None, loss, timing)
    return None
