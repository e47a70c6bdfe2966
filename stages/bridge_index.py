"""A Megatron-Bridge pretrain's data index, built on one CPU process before the training starts, so that no GPU
waits for it: the same recipe and overrides as the training's ranks (bcp_pipeline/config/bridge_index.py derives
them from the training stage), the same data list, then the dataset build that Bridge's `pretrain()` runs
(`get_dataset_provider`, `build_train_valid_test_datasets`: megatron-core's BlendedMegatronDatasetBuilder, with the
train/valid/test sample counts Bridge derives from train_iters, the global batch and the validation settings).
megatron-core writes the indices into `dataset.path_to_cache` under names hashed from each dataset's description,
so the training finds every one complete and only reads it.

    python3 bridge_index.py --recipe R --world-size N --data-dir DIR --data-list FILE --manifest FILE KEY=VALUE...

No GPU and no torch.distributed: megatron-core builds on the one process when no process group exists.
`--world-size`: Bridge validates the parallel sizes against one (config/bridge_index.py gives TP x PP x CP, one
data-parallel rank); the dataset does not depend on it. The data list is written first, to the file the training
reads it from, as the training's own first step writes it (data_list.py, the same arguments); the manifest
(_index_manifest.py) is written last.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import _index_manifest
import data_list

DATA_PATH_KEY = "dataset.data_path"  # as config/bridge.py renders it


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="vanilla_gpt_pretrain_config")
    parser.add_argument("--world-size", type=int, required=True, help="the ranks to resolve the config for")
    parser.add_argument("--data-dir", required=True, type=Path, help="the preprocess outputs and their manifests")
    parser.add_argument("--valid-data-dir", type=Path, help="a held-out split's outputs the training validates on")
    parser.add_argument("--test-data-dir", type=Path, help="with --valid-data-dir: the test split's outputs")
    parser.add_argument("--data-list", required=True, type=Path, help="the data list override file to write")
    parser.add_argument("--manifest", required=True, type=Path, help="the index manifest to write last")
    parser.add_argument("--hf-home", type=Path, help="a Hugging Face cache filled beforehand, read offline")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    return parser.parse_args(argv)


def resolved_config(args: argparse.Namespace):
    """The ConfigContainer as the training's rank 0 has it when it builds its datasets: the recipe with the data list
    and the overrides, `runtime_config_update` (what `pretrain()` runs first), and the tokenizer in the dataset
    config (what Bridge's `setup()` does before the data)."""
    from bridge_pretrain import build_config, overrides_of
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    os.environ["WORLD_SIZE"] = str(args.world_size)
    os.environ.setdefault("RANK", "0")
    config = build_config(
        args.recipe, overrides_of(argparse.Namespace(overrides_file=[args.data_list], overrides=args.overrides))
    )
    runtime_config_update(config)
    tokenizer = build_tokenizer(config.tokenizer)
    if hasattr(config.dataset, "tokenizer"):
        config.dataset.tokenizer = tokenizer
    if getattr(config.dataset, "token_dtype_code", 0) is None and getattr(tokenizer, "vocab_size", None):
        # Bridge's setup() fills it from the vocabulary (int32 tokens past 65536 ids, else uint16), as here
        config.dataset.token_dtype_code = 4 if tokenizer.vocab_size > 65536 else 8
    return config


def build(args: argparse.Namespace) -> int:
    from megatron.bridge.data.loaders import build_train_valid_test_datasets, get_train_valid_test_num_samples
    from megatron.bridge.data.utils import get_dataset_provider

    config = resolved_config(args)
    if not getattr(config.dataset, "path_to_cache", None):
        raise SystemExit("bridge_index: dataset.path_to_cache is not set: the training would build its index itself")
    cache = Path(config.dataset.path_to_cache)
    before = _index_manifest.begin(args.manifest, cache)
    samples = list(get_train_valid_test_num_samples(config))
    print(
        f"bridge_index: building the data index of recipe {args.recipe} into {cache} (train/valid/test samples "
        f"{'/'.join(map(str, samples))}; {len(before)} file(s) there already)",
        flush=True,
    )
    start = time.monotonic()
    datasets = build_train_valid_test_datasets(config, get_dataset_provider(config.dataset))
    record = _index_manifest.finish(
        args.manifest,
        cache,
        _index_manifest.datasets_of(*datasets),
        before,
        seconds=time.monotonic() - start,
        samples=samples,
        what=f"recipe {args.recipe}, {cache}",
    )
    train_blend = config.dataset.blend or (config.dataset.blend_per_split or [None])[0]
    prefixes = len(train_blend[0]) if train_blend else 0
    print(_index_manifest.summary_line("bridge_index", record, prefixes), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.hf_home is not None:  # before Bridge (and huggingface_hub) is imported: both read these once
        os.environ["HF_HOME"] = str(args.hf_home)
        os.environ["HF_HUB_OFFLINE"] = "1"
    held_out = ["--valid-data-dir", str(args.valid_data_dir)] if args.valid_data_dir else []
    held_out += ["--test-data-dir", str(args.test_data_dir)] if args.test_data_dir else []
    code = data_list.main(
        [
            "--data-dir",
            str(args.data_dir),
            *held_out,
            "--format",
            "hydra",
            "--key",
            DATA_PATH_KEY,
            "--out",
            str(args.data_list),
        ]
    )
    if code:
        return code
    try:
        return build(args)
    except _index_manifest.IndexBuildError as exc:
        print(f"bridge_index: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
