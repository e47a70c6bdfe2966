"""The GPU proof against NVIDIA's REAL code on CPU (the Megatron-Bridge test environment, support/bridge_venv.py):

- each change the proof makes because the GPU machine has neither Transformer Engine nor apex is one megatron-core
  0.19.2 needs: its local-spec modules refuse the rendered value (a zero-centred LayerNorm gamma; the fused softmax,
  whose compiled kernel is absent) and take the proof's;
- the proof's checks and MFU read logs made by Bridge's own step-line format strings: a continuation that
  matches passes, one whose resumed loss differs fails.
"""

from __future__ import annotations

import sys

import pytest
from support.bridge_venv import REPO, bridge_python, run_bridge, site_packages, step_line

sys.path.insert(0, str(REPO / "scripts" / "gpu-proof"))

import proof_jobs as jobs  # noqa: E402
import proof_report as report  # noqa: E402

LOCAL_SPEC_MODULES = """
import sys, torch
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.utils import attention_mask_func
zero_centered, softmax_fusion = sys.argv[1] == "true", sys.argv[2] == "true"
config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                           layernorm_zero_centered_gamma=zero_centered)
try:
    WrappedTorchNorm(config, 64)
    print("norm: built")
except AssertionError as exc:
    print(f"norm: refused: {exc}")
softmax = FusedScaleMaskSoftmax(False, True, AttnMaskType.causal, softmax_fusion, attention_mask_func, True, None)
try:
    causal = torch.triu(torch.ones(1, 1, 64, 64), diagonal=1).bool()  # given: megatron-core's default is made on CUDA
    softmax(torch.zeros(2, 4, 64, 64, dtype=torch.bfloat16), causal)
    print("softmax: ran")
except ModuleNotFoundError as exc:
    print(f"softmax: refused: {exc}")
"""


def local_spec(python, zero_centered: str, fusion: str) -> str:
    done = run_bridge(python, ["-c", LOCAL_SPEC_MODULES, zero_centered, fusion], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_no_te_changes_are_what_megatron_core_s_local_modules_need():
    python = bridge_python()
    rendered = {c.key: "true" for c in jobs.NO_TE}  # gpt3/7b_improved's layernorm1p; the recipe's softmax fusion
    proof = {c.key: c.value for c in jobs.NO_TE}
    keys = ("model.layernorm_zero_centered_gamma", "model.masked_softmax_fusion")

    refused = local_spec(python, *(rendered[k] for k in keys))
    assert "norm: refused: zero_centered_gamma not supported by torch LayerNorm" in refused
    assert "softmax: refused: No module named 'scaled_masked_softmax_cuda'" in refused

    taken = local_spec(python, *(proof[k] for k in keys))
    assert "norm: built" in taken and "softmax: ran" in taken


def bridge_log(
    source: str, steps: range, loss_of, *, train_iters: int, tflops: float = 120.0, extra: tuple[str, ...] = ()
) -> str:
    lines = [
        "time to initialize megatron (seconds): 3.000",
        "[after megatron is initialized] datetime: 2026-12-01 10:00:03 ",
        *extra,
    ]
    lines += [
        step_line(source, iteration=s, train_iters=train_iters, ms=25.0, tflops=tflops, loss=loss_of(s), batch=16)
        for s in steps
    ]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def source() -> str:
    return (site_packages(bridge_python()) / "megatron/bridge/training/utils/train_utils.py").read_text()


def loss(step: int) -> float:
    return 10.8 - step / 37


def test_a_matching_continuation_passes_every_check_and_mfu_is_bridge_s_tflops_over_the_peak(source):
    steps = 60
    a = bridge_log(source, range(1, steps + 1), loss, train_iters=steps)
    b = (
        bridge_log(source, range(1, 25), loss, train_iters=steps, extra=())
        + "\n[exiting program after 0.2500 minutes] datetime: 2026-12-01 10:00:20 "
    )
    c = bridge_log(
        source,
        range(25, steps + 1),
        loss,
        train_iters=steps,
        extra=("  successfully loaded checkpoint from /ckpt [ t 0/1, p 0/1 ] at iteration 24",),
    )

    found, figures = report.continuation_checks(a, b, c, steps=steps, b_exit=0, c_exit=0, tracker="24")

    assert [x["name"] for x in found if not x["ok"]] == []
    assert (figures["stopped_at"], figures["resumed_at"]) == (24, 25)
    figures = report.bridge_throughput(a, tokens_per_step=16 * 512)
    assert figures["tflops_per_gpu"] == 120.0 and figures["step_s"] == pytest.approx(0.025)
    assert figures["mfu"] == pytest.approx(120.0 / 989.0)
    assert figures["tokens_per_s"] == pytest.approx(16 * 512 / 0.025)


def test_a_resumed_loss_off_by_one_printed_digit_fails_the_proof(source):
    steps = 60
    a = bridge_log(source, range(1, steps + 1), loss, train_iters=steps)
    b = bridge_log(source, range(1, 25), loss, train_iters=steps) + "\n[exiting program after 0.25 minutes] x"
    c = bridge_log(
        source,
        range(25, steps + 1),
        lambda s: loss(s) + (1e-5 if s == 25 else 0),
        train_iters=steps,
        extra=("  successfully loaded checkpoint from /ckpt [ t 0/1, p 0/1 ] at iteration 24",),
    )

    found, _ = report.continuation_checks(a, b, c, steps=steps, b_exit=0, c_exit=0, tracker="24")

    failed = {x["name"] for x in found if not x["ok"]}
    assert failed == {
        "the loss at the resumed step equals the uninterrupted run's",
        "every continued step has A's loss",
    }


def test_a_job_that_ran_to_the_end_was_not_stopped_by_the_time_limit(source):
    steps = 60
    a = bridge_log(source, range(1, steps + 1), loss, train_iters=steps)
    found, _ = report.continuation_checks(a, a, "", steps=steps, b_exit=0, c_exit=0, tracker=str(steps))
    failed = {x["name"] for x in found if not x["ok"]}
    assert "B is stopped by train.exit_duration_in_mins" in failed and "C exits 0" not in failed
