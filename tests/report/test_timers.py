"""Megatron's timer blocks and NeMo's step timings as they are printed, read back by the report.

The samples are written from the printing code, and one test has megatron-core's own `Timers` (0.16.1, the
project's pin) make them: `Timers.get_all_timers_string` (megatron/core/timers.py,
`_get_global_min_max_time_string` and `_get_all_ranks_time_string`: each name padded with dots to 48 characters,
values `{:.2f}`), printed by NeMo's `MegatronBaseModel.on_train_batch_end` as
`logging.info("\\n " + block)` (nemo/collections/nlp/models/language_modeling/megatron_base_model.py), and
PyTorch Lightning's progress bar with NeMo's logged metrics (`reduced_train_loss`, `global_step`,
`train_step_timing in s`, as NeMo 1.22 logs them).
"""

from __future__ import annotations

import pytest

from bcp_pipeline.report.mfu import gpu_peak
from bcp_pipeline.report.throughput import TrainingFacts, step_times, summary, throughput_points
from bcp_pipeline.report.timers import parse_timer_blocks


def megatron_line(name: str, value: str) -> str:
    return "\n    {}: {}".format((name + " ").ljust(48, "."), value)


def nemo_bar(step: int, timing: float) -> str:
    return (
        f"Epoch 0: :   0%|          | {step}/300000 [00:{step:02d}<8:00:00, reduced_train_loss=10.80, "
        f"global_step={step}.000, consumed_samples={512 * (step + 1)}.0, train_step_timing in s={timing}]"
    )


def test_the_three_layouts_of_megatron_timers_as_nemo_logs_them():
    max_block = (
        "max time across ranks (ms):"
        + megatron_line("forward-backward", "1234.56")
        + megatron_line("optimizer", "45.10")
    )
    minmax = "(min, max) time across ranks (ms):" + megatron_line("forward-backward", "(1200.01, 1240.50)")
    all_ranks = "times across ranks (ms):\n  forward-backward:\n     rank  0: 1210.00\n     rank  1: 1250.25"
    log = "\r".join(
        [
            nemo_bar(9, 1.3),
            f"[NeMo I 2024-01-10 12:00:00 megatron_base_model:1121] \n {max_block}",
            nemo_bar(10, 1.29),
            f"[NeMo I 2024-01-10 12:00:01 megatron_base_model:1121] \n {minmax}",
            nemo_bar(11, 1.31),
            f"[NeMo I 2024-01-10 12:00:02 megatron_base_model:1121] \n {all_ranks}",
            nemo_bar(12, 1.28),
        ]
    )
    blocks = parse_timer_blocks(log)
    assert [(b.step, b.option) for b in blocks] == [(9, "max"), (10, "minmax"), (11, "all")]
    assert blocks[0].milliseconds == {"forward-backward": 1234.56, "optimizer": 45.10}
    assert blocks[1].milliseconds == {"forward-backward": 1240.50}  # the slowest rank
    assert blocks[2].milliseconds == {"forward-backward": 1250.25}
    assert step_times(log) == {9: 1.3, 10: 1.29, 11: 1.31, 12: 1.28}


def test_nemo_step_times_become_tokens_per_second_and_mfu():
    # 7b_improved: 1,048,576 tokens a step, 43,020,976,128 FLOPs a token, 64 A100s (19.968 PFLOP/s).
    facts = TrainingFacts(43_020_976_128, 512 * 2048, "gpu", 64)
    points = throughput_points({1: 30.0, 2: 11.2, 3: 11.2}, facts, gpu_peak("dgxa100.80g.8.norm", 64))
    assert points[1]["tokens_per_s"] == pytest.approx(93_622.857, abs=1e-3)
    assert points[1]["mfu"] == pytest.approx(0.20171, abs=1e-5)
    steady = summary(points)  # the first step (start-up) left out
    assert steady["steps"] == 2 and steady["step_s"] == 11.2


def test_megatron_lm_iteration_lines_give_step_times():
    # megatron/training/training.py training_log: ' iteration {:8d}/{:8d} |' then
    # ' elapsed time per iteration (ms): {:.1f} |'.
    line = (
        " [2024-01-10 12:00:00] iteration       10/  500000 | consumed samples:         5120 | elapsed time per "
        "iteration (ms): 11234.5 | learning rate: 1.500E-04 | global batch size:   512 | lm loss: 1.080E+01 |"
    )
    assert step_times(line) == {10: 11.2345}


def test_a_log_without_timers_or_timings_gives_nothing():
    assert parse_timer_blocks("step 1/5 loss 10.0 lr 1e-3 1.00 steps/s\nmax time across ranks (ms):\n") == []
    assert step_times("Epoch 0: reduced_train_loss=10.8, global_step=3.000]") == {}


@pytest.mark.parametrize("option", ["max", "minmax", "all"])
def test_megatron_cores_own_timer_strings_are_read(option, monkeypatch):
    """The strings megatron-core's own `Timers.get_all_timers_string` makes (its gather across ranks, which needs
    CUDA, given two ranks' seconds instead), logged the way NeMo logs them."""
    timers_module = pytest.importorskip("megatron.core.timers")
    import torch

    timers = timers_module.Timers(log_level=2, log_option=option)
    seconds = torch.tensor([[1.2000, 0.0451], [1.2405, 0.0449]])  # [rank, timer]
    monkeypatch.setattr(timers, "_get_elapsed_time_all_ranks", lambda names, reset, barrier: seconds)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *args: 2)
    block = timers.get_all_timers_string(names=["forward-backward", "optimizer"])
    log = "\r".join([nemo_bar(7, 1.25), f"[NeMo I 2024-01-10 12:00:00 megatron_base_model:1121] \n {block}"])
    (parsed,) = parse_timer_blocks(log)
    assert parsed.step == 7 and parsed.option == option
    assert parsed.milliseconds == {"forward-backward": 1240.5, "optimizer": 45.1}  # the slowest rank's
