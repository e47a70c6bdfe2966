"""The entry program stages/bridge_pretrain.py around Bridge, on the Megatron-Bridge STAND-IN (tests/fakes/
megatron_bridge: its recipe carries the real recipe's env_vars) and the tracker reader stages/_bridge_tracker.py on
files written by PyTorch's own torch.save (the real-Bridge versions of both are in tests/bridge/test_bridge_real.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "stages" / "bridge_pretrain.py"
STAND_IN = REPO / "tests" / "fakes" / "megatron_bridge"
RECIPE_ENV = (
    "NCCL_GRAPH_REGISTER",
    "NCCL_NVLS_ENABLE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCH_NCCL_AVOID_RECORD_STREAMS",
    "TORCH_NCCL_HIGH_PRIORITY",
)
sys.path.insert(0, str(REPO / "stages"))

from _bridge_tracker import LEGACY_TRACKER, TRAIN_STATE_TRACKER, UnreadableTrainState, read_train_state, tracked_step  # noqa: E402


def entry(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in RECIPE_ENV and not k.startswith("BCP_PIPELINE_")}
    data_list = tmp_path / "data_path.txt"
    data_list.write_text("dataset.data_path=[1.0,/nowhere/a]\n")
    return subprocess.run(
        [sys.executable, "-u", str(ENTRY), "--overrides-file", str(data_list), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**base, "PYTHONPATH": str(STAND_IN), **(env or {})},
    )


def environment_lines(stdout: str) -> list[str]:
    return (
        stdout.split("# bridge_pretrain: the recipe's environment\n", 1)[1].split("# bridge_pretrain")[0].splitlines()
    )


def test_the_recipe_s_environment_is_set_and_the_program_starts_again_before_bridge_is_imported(tmp_path):
    result = entry(tmp_path, "--dry-run", env={"NCCL_NVLS_ENABLE": "1"})  # a launcher's value
    assert result.returncode == 0, result.stderr
    assert "starting again so that torch and Transformer Engine see them at import" in result.stderr
    assert "NCCL_NVLS_ENABLE=" not in result.stderr.split("starting again")[0]  # given: not the recipe's to set
    assert environment_lines(result.stdout) == [
        "#   NCCL_GRAPH_REGISTER=0 (at start)",
        "#   NCCL_NVLS_ENABLE=1 (at start)",  # setdefault: the launcher's wins
        "#   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (at start)",
        "#   TORCH_NCCL_AVOID_RECORD_STREAMS=1 (at start)",
        "#   TORCH_NCCL_HIGH_PRIORITY=1 (at start)",
    ]


def test_a_second_start_never_starts_a_third(tmp_path):
    """The marker of a second start that still lacks the variables: set in place (as Bridge would), said, and no
    further start (the program would otherwise loop)."""
    result = entry(tmp_path, "--dry-run", env={"BCP_PIPELINE_RECIPE_ENV_APPLIED": "NCCL_GRAPH_REGISTER"})
    assert result.returncode == 0, result.stderr
    assert "starting again" not in result.stderr
    assert "were not in the environment at the second start; set now" in result.stderr
    assert "#   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set after import)" in environment_lines(result.stdout)


def torch_save_train_state(path: Path, step: int) -> None:
    """A train state as Bridge's TrainState.state_dict() makes it (0-d tensors), saved by PyTorch."""
    torch = pytest.importorskip("torch")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "step": torch.tensor(step, dtype=torch.int64),
            "consumed_train_samples": torch.tensor(step * 512, dtype=torch.int64),
            "floating_point_operations_so_far": torch.tensor(1.5e18, dtype=torch.float64),
            "do_train": torch.tensor(True, dtype=torch.bool),
        },
        path,
    )


def test_a_train_state_is_read_without_torch_and_a_torn_one_is_refused(tmp_path):
    whole = tmp_path / "train_state.pt"
    torch_save_train_state(whole, 2000)
    assert read_train_state(str(whole)) == {
        "step": 2000,
        "consumed_train_samples": 1024000,
        "floating_point_operations_so_far": 1.5e18,
        "do_train": True,
    }
    torn = tmp_path / "torn.pt"
    torn.write_bytes(whole.read_bytes()[:200])
    with pytest.raises(UnreadableTrainState):
        read_train_state(str(torn))
    (tmp_path / LEGACY_TRACKER).write_text("1000")
    (tmp_path / TRAIN_STATE_TRACKER).write_bytes(torn.read_bytes())
    tracked = tracked_step(str(tmp_path))
    assert (tracked.step, tracked.source) == (1000, LEGACY_TRACKER) and "is unreadable" in tracked.problem


def test_a_torn_tracker_is_replaced_before_training_resumes(tmp_path):
    """Rank 0, before pretrain(): the .txt's iteration's own copy over the torn latest_train_state.pt."""
    checkpoints = tmp_path / "run" / "checkpoints"
    torch_save_train_state(checkpoints / "iter_0000010" / "train_state.pt", 10)
    (checkpoints / "iter_0000010" / "run_config.yaml").write_text("model: {}\n")
    (checkpoints / LEGACY_TRACKER).write_text("10")
    (checkpoints / TRAIN_STATE_TRACKER).write_bytes(b"PK\x03\x04torn")
    (tmp_path / "bpe").mkdir()
    result = entry(
        tmp_path,
        f"checkpoint.save={checkpoints}",
        f"checkpoint.load={checkpoints}",
        "train.train_iters=12",
        "checkpoint.save_interval=0",
        "dataset.data_path=[]",
        env={
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29555",
            "BCPP_BRIDGE_STANDIN_STEP_SECONDS": "0.01",
        },
    )
    assert result.returncode == 0, result.stderr
    assert "latest_train_state.pt is unreadable" in result.stderr and "replaced it with" in result.stderr
    assert read_train_state(str(checkpoints / TRAIN_STATE_TRACKER))["step"] == 10
    assert "loading checkpoint from" in result.stdout and "at iteration 10" in result.stdout
