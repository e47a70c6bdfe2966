"""The smoke pretrain's data: megatron-core's blended GPTDataset over the data list, and each step's micro batches.

The samples come in a fixed, seeded order, and a step's samples are a function of the step alone (`sample_range`),
so a resumed run, on any world size that divides the global batch, reads exactly what an uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _common
import torch


class IdsTokenizer:
    """The attributes GPTDataset reads from a tokenizer (the data is already ids: no text methods needed)."""

    def __init__(self, vocab_size: int, eod: int) -> None:
        self.vocab_size, self.eod = vocab_size, eod
        # Part of megatron's cache key (it json-dumps `unique_identifiers` of the config's objects).
        self.unique_identifiers = {"class": "IdsTokenizer", "vocab_size": vocab_size, "eod": eod}


@contextlib.contextmanager
def single_process_group() -> Iterator[None]:
    """A world of one for megatron's dataset builder.

    `BlendedDataset` calls `torch.distributed.get_rank()` unguarded when its index cache is missing, which
    raises without a process group. A gloo group over an in-memory store needs no address, port or env vars.
    """
    dist = torch.distributed
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def prepare_cache(cache_dir: Path) -> None:
    """megatron writes its .npy indices in place (not atomically): a cache without our marker is rebuilt.

    The marker is absent while megatron may write (a new --steps adds files) and restored once the build returned,
    so a kill mid-build never leaves a half-written index that a later run would take for a cache hit.
    """
    marker = cache_dir / ".complete"
    if cache_dir.exists() and not marker.exists():
        shutil.rmtree(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)


def build_train_dataset(
    prefixes: list[str],
    weights: list[float],
    tokenizer: IdsTokenizer,
    cfg: dict,
    num_samples: int,
    cache_dir: Path,
    lead: bool = True,
    what: str = "training",
) -> Any:
    """megatron-core's blended GPT dataset over the data list, at least `num_samples` long.

    Under a process group megatron builds the indices on rank 0, barriers, then the other ranks read its cache;
    the caller (rank 0 only: `lead`) has prepared the cache folder and marks it complete."""
    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": irrelevant to datasets
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    config = GPTDatasetConfig(
        random_seed=cfg["seed"],
        sequence_length=cfg["seq_length"],
        blend=(prefixes, weights),
        split=cfg["split"],
        tokenizer=tokenizer,
        path_to_cache=str(cache_dir),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,  # the model masks causally itself (SDPA is_causal)
    )
    if lead:
        prepare_cache(cache_dir)
    with single_process_group():
        train, _valid, _test = BlendedMegatronDatasetBuilder(
            GPTDataset, [num_samples, 0, 0], lambda: True, config
        ).build()
    if lead:
        (cache_dir / ".complete").touch()
    if train is None or len(train) < num_samples:
        raise _common.StageError(
            f"the {what} split holds {0 if train is None else len(train)} samples, "
            f"{num_samples} needed; check --split {cfg['split']!r} and the data"
        )
    return train


def sample_range(step: int, global_batch: int, rank: int, world: int) -> range:
    """This rank's samples of a step: its contiguous share of [step*G, (step+1)*G) of the fixed sample order, so the
    data position is a function of the step alone and the ranks together read exactly the one-process batch."""
    share = global_batch // world
    first = step * global_batch + rank * share
    return range(first, first + share)


def get_micro_batches(
    dataset: Any, samples: range, micro_batch_size: int, device: torch.device
) -> list[dict[str, torch.Tensor]]:
    """The samples in micro batches (one forward/backward each)."""
    batches = []
    for start in range(samples.start, samples.stop, micro_batch_size):
        items = [dataset[i] for i in range(start, min(start + micro_batch_size, samples.stop))]
        batches.append(
            {key: torch.stack([s[key] for s in items]).to(device) for key in ("tokens", "labels", "loss_mask")}
        )
    return batches
