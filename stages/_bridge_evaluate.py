"""One Megatron-Bridge checkpoint's held-out loss, by Bridge's own evaluation (evaluate.py --from bridge).

The checkpoints: `iter_NNNNNNN/` folders at or below the step Bridge's tracker records (_bridge_tracker: a save
is complete once the tracker names it; a folder above it is a save under way). One evaluation: the training's own
entry program (bridge_pretrain.py) under torchrun on one node, `--world-size` ranks (one data-parallel rank of the
training's layout), with the training's recipe, data list and overrides, those of an evaluation
(bcp_pipeline/config/evaluate.py: validation.skip_train, no optimizer or RNG state, nothing saved) and the
checkpoint's step (checkpoint.load, checkpoint.ckpt_step). Bridge loads the model, skips training, and its last rank
prints ` validation loss at iteration N on validation set | lm loss value: X | lm loss PPL: Y | `
(megatron/bridge/training/eval.py, evaluate_and_print_results), which is read here; with a test split in the data
list (megatron_bridge.test_data_dir) it prints the same line `on test set` next, read too. Its output goes on to
this job's log as it comes.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections import deque
from pathlib import Path

import _bridge_tracker
from _stage_error import StageError

HERE = Path(__file__).resolve().parent
ENTRY_PROGRAM = "bridge_pretrain.py"
# Bridge's format: "{key} value: {:.6E} | {key} PPL: {:.6E} | " for each loss key; the language model's is "lm loss"
VALIDATION_LINE = re.compile(
    r"validation loss at iteration (?P<step>\d+) on (?P<split>validation|test) set \|.*?"
    r"lm loss value: (?P<loss>[-+0-9.eE]+|nan|inf) \|"
)
TAIL_LINES = 40  # of a failed evaluation's output, in the error


def complete_checkpoints(folder: Path) -> dict[int, Path]:
    """Complete checkpoints by step: iteration folders at or below the tracker's step."""
    tracked = _bridge_tracker.tracked_step(str(folder)).step if folder.is_dir() else None
    if tracked is None:
        return {}
    found = {}
    for path in folder.glob("iter_*"):
        digits = path.name[len("iter_") :]
        if digits.isdigit() and int(digits) <= tracked and path.is_dir():
            found[int(digits)] = path
    return found


def setting(overrides: list[str], key: str) -> str | None:
    """The last value `overrides` give `key` (Bridge applies them in order)."""
    found = None
    for item in overrides:
        name, _, value = item.partition("=")
        if name.lstrip("+~") == key:
            found = value
    return found


def evaluation_command(args, step: int) -> list[str]:
    hub = ["--hf-home", str(args.hf_home)] if args.hf_home else []
    hub += ["--layer-spec", args.layer_spec] if getattr(args, "layer_spec", None) else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(args.world_size),
        str(HERE / ENTRY_PROGRAM),
        "--recipe",
        args.recipe,
        *hub,
        "--overrides-file",
        str(args.data_list),
        *args.overrides,
        f"checkpoint.load={args.checkpoints}",
        f"checkpoint.ckpt_step={step}",
    ]


def split_losses(lines, step: int) -> dict[str, float]:
    """The `lm loss` of iteration `step` on each split Bridge printed it for (the last line of each, if several)."""
    found = {}
    for line in lines:
        match = VALIDATION_LINE.search(line)
        if match and int(match["step"]) == step:
            found[match["split"]] = float(match["loss"])
    return found


def validation_loss(lines, step: int) -> float | None:
    """The `lm loss` of the validation line of iteration `step` among `lines` (the last one, if several)."""
    return split_losses(lines, step).get("validation")


def run_evaluation(args, step: int) -> dict[str, float]:
    """Bridge's loss of the checkpoint of `step` on each held-out split ("validation", and "test" where the data
    list has one); StageError naming what went wrong."""
    command = evaluation_command(args, step)
    print(f"evaluate: step {step}: {' '.join(command[:9])} ... checkpoint.ckpt_step={step}", flush=True)
    seen: list[str] = []
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            tail.append(line.rstrip("\n"))
            if "validation loss at iteration" in line:
                seen.append(line)
        code = proc.wait()
    sys.stdout.flush()
    if code != 0:
        raise StageError(
            f"the evaluation of step {step} ({args.checkpoints}/iter_{step:07d}) exited with status {code}; its "
            "last lines:\n  " + "\n  ".join(tail)
        )
    losses = split_losses(seen, step)
    loss = losses.get("validation")
    if loss is None:
        raise StageError(
            f"the evaluation of step {step} printed no `validation loss at iteration {step}` line: is "
            "validation.eval_iters 0, or the held-out split empty? Its last lines:\n  " + "\n  ".join(tail)
        )
    for split, value in losses.items():
        if not math.isfinite(value):
            raise StageError(f"step {step}: Bridge's {split} loss is {value}: the checkpoint's weights are not finite")
    return losses


def evaluated_tokens(overrides: list[str]) -> tuple[int, int, int]:
    """(tokens, samples, eval_iters) one evaluation reads, from the overrides the stage was given."""
    iters = int(setting(overrides, "validation.eval_iters") or 0)
    batch = int(
        setting(overrides, "validation.eval_global_batch_size") or setting(overrides, "train.global_batch_size") or 0
    )
    seq = int(setting(overrides, "model.seq_length") or 0)
    return iters * batch * seq, iters * batch, iters
