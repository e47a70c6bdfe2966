"""Megatron's timer blocks out of a training log: where each step's time went. Pure (text in, blocks out).

Megatron-core's `Timers.get_all_timers_string` (megatron/core/timers.py; read at 0.16.1, the project's pin, and
tests/report/test_timers.py runs it) prints one of three layouts, chosen by `log_option`; each name is padded with
dots to 48 characters:

    max time across ranks (ms):                      log_option=max
        forward-backward ...............................: 1234.56
    (min, max) time across ranks (ms):               log_option=minmax (NeMo's default)
        forward-backward ...............................: (1200.01, 1234.56)
    times across ranks (ms):                         log_option=all
      forward-backward:
         rank  0: 1234.56

NeMo prints the block from `MegatronBaseModel.on_train_batch_end` as `logging.info("\\n " + block)` every
`megatron_timer_kwargs.log_every_n_steps` steps, with `reset=True` and no normalizer: a value is the time summed
since the previous block (nemo/collections/nlp/models/language_modeling/megatron_base_model.py). The smoke pretrain
prints the `max` layout after each logged step (stages/_profiling.py). Each block is read as the slowest rank's
time (the max, or the largest rank's value) and tied to the last step the log named before it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from bcp_pipeline.training_log import NUMBER

_HEADER = re.compile(r"(max|\(min, max\)|times) (?:time )?across ranks \(ms\):\s*$")
_ENTRY = re.compile(rf"^\s+(\S.*?) \.*: (?:({NUMBER})|\(({NUMBER}), ({NUMBER})\))\s*$")
_ALL_NAME = re.compile(r"^\s{2}(\S.*):\s*$")
_ALL_RANK = re.compile(rf"^\s+rank\s+(\d+): ({NUMBER})\s*$")
# The step a block belongs to: the smoke pretrain's step line, or NeMo's progress bar.
_STEP = re.compile(r"^step (\d+)/\d+ |\bglobal_step=(\d+(?:\.\d*)?)")
OPTIONS = {"max": "max", "(min, max)": "minmax", "times": "all"}


@dataclass
class TimerBlock:
    step: int | None  # the last step named before the block; None before any
    option: str  # max, minmax or all
    milliseconds: dict[str, float] = field(default_factory=dict)  # timer name -> the slowest rank's time

    def as_json(self) -> dict:
        return asdict(self)


def parse_timer_blocks(text: str) -> list[TimerBlock]:
    """Every timer block of the log, in order; [] for a log without any."""
    blocks: list[TimerBlock] = []
    current: TimerBlock | None = None
    all_name: str | None = None
    step: int | None = None
    for line in re.split(r"[\r\n]+", text):
        if match := _HEADER.search(line):
            current, all_name = TimerBlock(step, OPTIONS[match.group(1)]), None
            blocks.append(current)
            continue
        if current is not None and _read_entry(current, line, all_name):
            if current.option == "all" and (name := _ALL_NAME.match(line)):
                all_name = name.group(1)
            continue
        current = None
        if match := _STEP.search(line):
            step = int(float(match.group(1) or match.group(2)))
    return [block for block in blocks if block.milliseconds]


def _read_entry(block: TimerBlock, line: str, all_name: str | None) -> bool:
    """Add one line of the block; False where the block has ended."""
    if block.option == "all":
        if _ALL_NAME.match(line):
            return True
        if all_name is not None and (rank := _ALL_RANK.match(line)):
            value = float(rank.group(2))
            block.milliseconds[all_name] = max(block.milliseconds.get(all_name, value), value)
            return True
        return False
    entry = _ENTRY.match(line)
    if entry is None:
        return False
    block.milliseconds[entry.group(1).strip()] = float(entry.group(2) or entry.group(4))
    return True
