"""The smoke pretrain's profiling: a torch.profiler window written as a Chrome trace and a top-operators table,
the phase timers in Megatron's layout (read back by the report's reader), the step time in each step line, and
no checkpoint with --no-checkpoints. One real 5-step run on CPU (a few seconds)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.smoke_pretrain import command, data_dir, run_to_end  # noqa: F401 (data_dir is a fixture)

from bcp_pipeline.report.throughput import smoke_facts, step_times
from bcp_pipeline.report.timers import parse_timer_blocks

pytest.importorskip("megatron.core", reason="the smoke pretrain reads its data with megatron-core")


def test_profile_window_writes_a_chrome_trace_a_table_and_timers(data_dir: Path, tmp_path: Path) -> None:
    done = run_to_end(
        command(data_dir, tmp_path, "prof", "--steps", "5", "--profile-steps", "2:3", "--timers", "--no-checkpoints")
    )
    profile = tmp_path / "prof" / "profile"
    trace = json.loads((profile / "trace_rank0.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    # Steps 2 and 3 only, each a named range, with the matrix multiplies of the model inside.
    assert {"step 2", "step 3"} <= names and "step 1" not in names and "step 4" not in names
    assert any(name and "addmm" in name for name in names)
    table = (profile / "top_ops_rank0.txt").read_text()
    assert "Self CPU" in table and "aten::" in table
    assert "profile of steps 2-3 (rank 0): trace" in done.stdout
    assert list((tmp_path / "prof" / "checkpoints").glob("*.pt")) == []

    blocks = parse_timer_blocks(done.stdout)
    assert [b.step for b in blocks] == [1, 2, 3, 4, 5]
    assert set(blocks[0].milliseconds) == {"forward-compute", "backward-compute", "optimizer"}
    assert all(value > 0 for b in blocks for value in b.milliseconds.values())
    times = step_times(done.stdout)
    assert list(times) == [1, 2, 3, 4, 5] and all(t > 0 for t in times.values())
    # A step's phases fit inside its wall time.
    assert sum(blocks[2].milliseconds.values()) / 1000 <= times[3] * 1.05
    facts = smoke_facts(done.stdout)
    assert facts is not None and facts.device == "cpu" and facts.devices == 1


def test_a_bad_window_is_one_clear_line(data_dir: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        command(data_dir, tmp_path, "bad", "--profile-steps", "3-5"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "--profile-steps '3-5': give A:B, the first and last step to profile (e.g. 5:8)" in done.stderr
