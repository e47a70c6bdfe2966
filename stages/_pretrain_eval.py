"""The smoke pretrain's own evaluation: the token-mean next-token loss on a held-out split, and its line.

The training (pretrain_local.py `--valid-data-dir`) evaluates every `--eval-interval` steps, and the evaluate
stage (evaluate.py) evaluates each saved checkpoint, both through `heldout_loss` over the same samples: the first
`--eval-iters` x global batch of megatron-core's GPTDataset over the split's data list, a fixed set, so every
evaluation of a run reads the same tokens and losses compare across steps (Megatron's validation iterator moves on
between evaluations instead), and the evaluate stage's numbers are the training's validation lines'.

The line is Megatron-LM's (`training.py` evaluate_and_print_results), so one parser reads all three engines':
` validation loss at iteration 20 | lm loss value: 5.432100E+00 | lm loss PPL: 2.286634E+02 |`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import data_list
import torch
from _pretrain_data import IdsTokenizer, build_train_dataset, get_micro_batches
from _smoke_gpt import autocast, masked_loss_sum
from torch import nn

VALID_CACHE = "valid_index_cache"  # beside the training's index_cache, under the run's folder


def eval_samples(eval_iters: int, global_batch_size: int) -> int:
    return eval_iters * global_batch_size


def build_heldout_dataset(data_dir: Path, cfg: dict, samples: int, cache_dir: Path, lead: bool = True) -> Any:
    """megatron-core's GPTDataset over the held-out split's data list (its own .bin/.idx, weights by tokens), at
    least `samples` long, with the training's sequence length, seed and tokenizer ids."""
    entries = data_list.build_data_list(data_dir)
    prefixes, weights = data_list.split_blend(data_list.blend(entries))
    heldout = {**cfg, "split": "100,0,0"}  # the whole split is held out: every sample of it may be evaluated
    return build_train_dataset(
        prefixes,
        weights,
        IdsTokenizer(cfg["vocab_size"], cfg["eod"]),
        heldout,
        samples,
        cache_dir,
        lead,
        what="held-out",
    )


@torch.no_grad()
def heldout_loss(
    model: nn.Module, dataset: Any, samples: int, micro_batch_size: int, device: torch.device, precision: str = "fp32"
) -> tuple[float, int]:
    """(token-mean loss, tokens) over samples [0, samples) of `dataset`, in micro batches of `micro_batch_size`;
    the model is left in the mode it was in."""
    was_training = model.training
    model.eval()
    loss_sum, tokens = 0.0, 0.0
    try:
        for batch in get_micro_batches(dataset, range(samples), micro_batch_size, device):
            with autocast(device, precision):
                loss_sum += float(masked_loss_sum(model(batch["tokens"]), batch["labels"], batch["loss_mask"]))
            tokens += float(batch["loss_mask"].sum())
    finally:
        model.train(was_training)
    return loss_sum / max(tokens, 1.0), int(tokens)


def perplexity(loss: float) -> float:
    """exp(loss), as Megatron prints it (capped where exp overflows: an untrained model's loss is about 10.8)."""
    return math.exp(min(loss, 700.0))


def validation_line(step: int, loss: float) -> str:
    """Megatron-LM's validation line (read back by bcp_pipeline/training_log.py)."""
    return f" validation loss at iteration {step} | lm loss value: {loss:.6E} | lm loss PPL: {perplexity(loss):.6E} |"
