"""The evaluate stage against Megatron-Bridge's REAL code (the Python 3.12 environment scripts/bridge-venv builds):

- the command evaluate.py --from bridge runs for one checkpoint, built from the job `plan` renders, resolves in
  Bridge's own config code to an evaluation of that checkpoint: training skipped, the checkpoint's step loaded
  without optimizer or RNG state, nothing saved, the training's model layout on one data-parallel rank;
- the stage reads its loss from the line Bridge's own `evaluate_and_print_results` prints (its evaluation
  replaced by a fixed loss: the model itself needs a GPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import _bridge_evaluate
import evaluate
import pytest
from support.bridge_venv import after_entry, bridge_python, dry_run, run_bridge
from support.cli import cli
from support.index_jobs import after, program_words, stage_job

REPO = Path(__file__).resolve().parents[2]
CHECKPOINTS = "/mount_workspace/results/gpt_8b-slimpajama-8b-bridge-RUN/checkpoints"


@pytest.fixture(scope="module")
def python() -> Path:
    return bridge_python()


def evaluate_arguments(capsys) -> list[str]:
    capsys.readouterr()
    assert cli(REPO / "pipelines.yaml", "plan", "slimpajama-8b-bridge", "--backend", "bcp", "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    return after(program_words("bcp", stage_job(plan, "evaluate"), "evaluate.py"), "evaluate.py")


def held_out_data_list(tmp_path: Path) -> Path:
    from data_list import render_hydra_per_split

    path = tmp_path / "data_path.txt"
    train = [0.6, "/data/preprocessed/train_chunk1_text_document", 0.4, "/data/preprocessed/train_chunk2_text_document"]
    held_out = [1.0, "/data/validation/preprocessed/validation_chunk_0.jsonl_text_document"]
    path.write_text(render_hydra_per_split([train, held_out, None]) + "\n")
    return path


def test_one_checkpoint_s_evaluation_resolves_in_bridge_s_config_as_an_evaluation(python, tmp_path, capsys):
    args = evaluate.parse_args(evaluate_arguments(capsys))  # the stage's own parser over the rendered job
    command = _bridge_evaluate.evaluation_command(args, 2000)
    assert command[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert command[command.index("--nproc-per-node") + 1] == "4"
    config = dry_run(python, after_entry(command), 4, held_out_data_list(tmp_path), tmp_path)

    assert config["validation"]["skip_train"] is True
    assert config["validation"]["eval_iters"] == 50  # the training's: the samples of its first validation line
    checkpoint = config["checkpoint"]
    assert (checkpoint["load"], checkpoint["ckpt_step"]) == (CHECKPOINTS, 2000)
    assert (checkpoint["load_optim"], checkpoint["load_rng"], checkpoint["save"]) == (False, False, None)
    assert checkpoint["async_save"] is False
    assert config["logger"]["tensorboard_dir"] is None
    assert config["train"]["exit_duration_in_mins"] is None  # no job's time limit: an evaluation runs to its end
    model = config["model"]
    assert (model["tensor_model_parallel_size"], model["pipeline_model_parallel_size"]) == (4, 1)
    assert (model["num_layers"], model["hidden_size"], model["seq_length"]) == (32, 4096, 2048)
    assert config["dataset"]["blend_per_split"][1] == [
        ["/data/validation/preprocessed/validation_chunk_0.jsonl_text_document"],
        [1.0],
    ]
    assert config["dataset"]["path_to_cache"] == CHECKPOINTS.replace("/checkpoints", "/data_cache")
    assert _bridge_evaluate.evaluated_tokens(args.overrides) == (50 * 512 * 2048, 50 * 512, 50)


PRINTED = """
import math, sys, torch
from types import SimpleNamespace
from megatron.bridge.training import eval as bridge_eval

losses = iter([float(sys.argv[1]), float(sys.argv[1]) * 1.5])  # the validation split's, then the test split's
bridge_eval.evaluate = lambda *a, **k: ({"lm loss": torch.tensor(next(losses))}, None, False)
state = SimpleNamespace(tensorboard_logger=None, wandb_logger=None, mlflow_logger=None, comet_logger=None,
                        train_state=SimpleNamespace(step=2000, consumed_train_samples=1024000),
                        cfg=SimpleNamespace(logger=SimpleNamespace(log_validation_ppl_to_tensorboard=False)))
bridge_eval.evaluate_and_print_results(state, "iteration 2000 on validation set", None, None, [], None,
                                       verbose=True, write_to_tensorboard=False)
bridge_eval.evaluate_and_print_results(state, "iteration 2000 on test set", None, None, [], None,
                                       verbose=True, write_to_tensorboard=False, is_test=True)
"""


@pytest.mark.parametrize("loss", [2.718281828, 10.84, 0.0123456])
def test_the_stage_reads_the_losses_from_bridge_s_own_validation_and_test_lines(python, tmp_path, loss):
    result = run_bridge(python, ["-c", PRINTED, str(loss)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any("validation loss at iteration 2000 on validation set" in line for line in lines), result.stdout
    assert _bridge_evaluate.validation_loss(lines, 2000) == pytest.approx(loss, rel=1e-6)  # printed as {:.6E}
    assert _bridge_evaluate.validation_loss(lines, 1000) is None  # another checkpoint's line is not this one's
    found = _bridge_evaluate.split_losses(lines, 2000)  # pretrain.py's test pass after it (a test split's blend)
    assert found == pytest.approx({"validation": loss, "test": loss * 1.5}, rel=1e-6), lines
