"""Profiling for the smoke pretrain (pretrain_local.py): a torch.profiler window and per-step phase timers.

The window (`--profile-steps A:B`, steps numbered as the step lines number them, both ends included) records every
operator torch runs in those steps (and CUDA kernels on a GPU) with `torch.profiler`, then writes
- `trace_rank<R>.json`: a Chrome trace, which https://ui.perfetto.dev and chrome://tracing open;
- `top_ops_rank<R>.txt`: torch's table of the operators that took the most time (self time, top 20),
into `<results>/<run name>/profile/`, and prints the table into the log.

The timers (`--timers`) time each step's phases (forward, backward, optimizer) and print them after each logged
step in the layout Megatron's timers print with `log_option=max` (megatron/core/timers.py,
`_get_global_min_max_time_string`): a `max time across ranks (ms):` line, then one `    NAME ....: VALUE` line per
timer, so the report reads NeMo's timers and these with one reader (bcp_pipeline/report/timers.py). On one
process "max across ranks" is this rank's own time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

TOP_OPERATORS = 20
TRACE_NAME = "trace_rank{rank}.json"
TABLE_NAME = "top_ops_rank{rank}.txt"


def parse_window(text: str) -> tuple[int, int]:
    """`A:B` -> (A, B): steps A through B; ValueError naming the problem."""
    match = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if not match:
        raise ValueError(f"--profile-steps {text!r}: give A:B, the first and last step to profile (e.g. 5:8)")
    first, last = int(match.group(1)), int(match.group(2))
    if not 1 <= first <= last:
        raise ValueError(f"--profile-steps {text!r}: need 1 <= A <= B")
    return first, last


class TorchProfilerWindow:
    """torch.profiler over steps [first, last] of one rank; `before(step)` and `after(step)` bracket each step."""

    def __init__(self, window: tuple[int, int] | None, out_dir: Path, rank: int, device: torch.device) -> None:
        self.window, self.out_dir, self.rank, self.device = window, out_dir, rank, device
        self._profiler: torch.profiler.profile | None = None
        self.written: list[Path] = []

    def before(self, step: int) -> None:
        """`step` is the number the step will have when done (1 for the first)."""
        if self.window and step == self.window[0] and self._profiler is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.start()

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Names the step in the trace (a `step N` range around its operators)."""
        if self._profiler is None:
            yield
            return
        with torch.profiler.record_function(f"step {step}"):
            yield

    def after(self, step: int) -> None:
        if self._profiler is not None and self.window and step >= self.window[1]:
            self.finish()

    def finish(self) -> None:
        """Stop and write the trace and the table (also when training stops inside the window)."""
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / TRACE_NAME.format(rank=self.rank)
        partial = trace.with_name(f".{trace.name}.partial")
        profiler.export_chrome_trace(str(partial))
        partial.replace(trace)
        sort_by = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort_by, row_limit=TOP_OPERATORS)
        table_path = self.out_dir / TABLE_NAME.format(rank=self.rank)
        partial = table_path.with_name(f".{table_path.name}.partial")
        partial.write_text(table + "\n", encoding="utf-8")
        partial.replace(table_path)
        self.written = [trace, table_path]
        first, last = self.window
        print(
            f"profile of steps {first}-{last} (rank {self.rank}): trace {trace} (open it in https://ui.perfetto.dev "
            f"or chrome://tracing); top {TOP_OPERATORS} operators by self time, also in {table_path}:\n{table}",
            flush=True,
        )


class PhaseTimers:
    """Wall time of a step's phases, summed over its micro batches; printed Megatron's way."""

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.device, self.enabled = device, enabled
        self.elapsed: dict[str, float] = {}

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        self._sync()
        began = time.perf_counter()
        try:
            yield
        finally:
            self._sync()  # a GPU runs asynchronously: the phase ends when its kernels do
            self.elapsed[name] = self.elapsed.get(name, 0.0) + time.perf_counter() - began

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def report(self) -> str | None:
        """The block for the log (None when disabled or nothing was timed); resets the timers."""
        if not self.enabled or not self.elapsed:
            return None
        lines = ["max time across ranks (ms):"]
        lines += [f"    {(name + ' ').ljust(48, '.')}: {seconds * 1000:.2f}" for name, seconds in self.elapsed.items()]
        self.elapsed = {}
        return "\n".join(lines)
