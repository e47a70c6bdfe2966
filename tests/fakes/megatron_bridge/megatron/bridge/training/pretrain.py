"""pretrain(config, forward_step) as a run sees it from outside, without a model: the ranks' rendezvous (PyTorch's
own, gloo: a rank whose peers never start waits, then fails, as NCCL's would), Bridge's checks on its inputs,
its step line from the last rank, its checkpoints (rank 0: `iter_NNNNNNN/` with `run_config.yaml`, then
`latest_checkpointed_iteration.txt`), resumption from `checkpoint.load`, `train.exit_duration_in_mins` counted
from the call (a save, `exiting program after N minutes`, exit 0), SIGTERM with `exit_signal_handler`; with
`validation.skip_train`, an evaluation of `checkpoint.ckpt_step`'s checkpoint (Bridge's FileNotFoundError where its
folder is missing; its `validation loss at iteration N on validation set` line from the last rank, the loss a
function of the step and the held-out blend's files, which must exist; then the same `on test set` where the
per-split blends have a test split, as pretrain.py's do_test pass), nothing saved.

Stand-in knobs, from the environment (a test's job sets them; NVIDIA's code has none of them):
BCPP_BRIDGE_STANDIN_STEP_SECONDS (a step's duration, default 0.05), BCPP_BRIDGE_STANDIN_CRASH_AT_STEP (a Python
traceback and exit 1 at that step, as a CUDA error ends a rank), BCPP_BRIDGE_STANDIN_SECONDS_PER_MINUTE (how long a
minute of `exit_duration_in_mins` lasts, default 60), BCPP_BRIDGE_STANDIN_EVAL_SECONDS (how long an evaluation
takes, default 0).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path

import yaml

from megatron.bridge.training.config import ConfigContainer, runtime_config_update

TRACKER = "latest_checkpointed_iteration.txt"
RENDEZVOUS_SECONDS = 120  # Bridge's is 10 minutes: shorter is stricter, and a test's hang ends sooner


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _check_inputs(config: ConfigContainer) -> None:
    """What building the tokenizer and the datasets needs before the first step, as megatron-core fails on it."""
    tokenizer = config.tokenizer
    for path in (tokenizer.vocab_file, tokenizer.merge_file):
        if path and not os.path.isfile(path):
            raise FileNotFoundError(f"[Errno 2] No such file or directory: '{path}'")
    per_split = [blend[0] for blend in (config.dataset.blend_per_split or []) if blend]
    for prefix in [*(config.dataset.blend or [[]])[0], *(p for split in per_split for p in split)]:
        for suffix in (".bin", ".idx"):
            if not os.path.isfile(prefix + suffix):
                raise FileNotFoundError(f"[Errno 2] No such file or directory: '{prefix}{suffix}'")
    if config.dataset.path_to_cache:
        Path(config.dataset.path_to_cache).mkdir(parents=True, exist_ok=True)  # the index cache is written there


def _loaded_step(config: ConfigContainer) -> int:
    load = config.checkpoint.load
    tracker = Path(load) / TRACKER if load else None
    if tracker is None or not tracker.is_file():
        return 0
    step = int(tracker.read_text().strip())
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"loading checkpoint from {load} at iteration {step}", flush=True)
    return step


def _save(config: ConfigContainer, step: int) -> None:
    """Rank 0's part of a save, in Bridge's order: the iteration's folder, its run config, then the tracker."""
    save = config.checkpoint.save
    if not save or int(os.environ.get("RANK", "0")) != 0:
        return
    folder = Path(save) / f"iter_{step:07d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "common.pt").write_bytes(b"stand-in")
    (folder / "run_config.yaml").write_text(yaml.safe_dump({"train": config.train.as_dict()}))
    (Path(save) / TRACKER).write_text(str(step))
    print(f"  successfully saved checkpoint from iteration {step:7d} to {save}", flush=True)
    keep = config.checkpoint.most_recent_k
    if keep and keep > 0:
        for old in sorted(Path(save).glob("iter_*"))[:-keep]:
            shutil.rmtree(old)


SPLITS = {"validation": 1, "test": 2}  # their places in blend_per_split (train, validation, test)


def _held_out_prefixes(config: ConfigContainer, split: str = "validation") -> list[str]:
    per_split, index = config.dataset.blend_per_split, SPLITS[split]
    if not per_split or len(per_split) <= index or not per_split[index]:
        return []
    return list(per_split[index][0])


def _evaluate(config: ConfigContainer, rank: int, world: int) -> None:
    """skip_train: load the checkpoint of ckpt_step (or the tracker's), print the validation line, save nothing."""
    load = config.checkpoint.load
    if not load:
        raise AssertionError("validation.skip_train needs checkpoint.load: there is no model to evaluate")
    step = config.checkpoint.ckpt_step
    if step is None:
        step = _loaded_step(config)
    folder = Path(load) / f"iter_{int(step):07d}"
    if not folder.is_dir():
        raise FileNotFoundError(
            f"ckpt_step={step} specified but checkpoint directory does not exist: {folder}\n"
            f"Available checkpoints can be listed with: ls {load}/iter_*"
        )
    splits = {split: _held_out_prefixes(config, split) for split in SPLITS}
    for prefix in (p for prefixes in splits.values() for p in prefixes):
        for suffix in (".bin", ".idx"):
            if not os.path.isfile(prefix + suffix):
                raise FileNotFoundError(f"[Errno 2] No such file or directory: '{prefix}{suffix}'")
    if rank == 0:
        print(f"Loading checkpoint from iteration {step} (specified via ckpt_step)", flush=True)
        print("skipping training ...", flush=True)
    for split, prefixes in splits.items():
        if split != "validation" and not prefixes:
            continue  # no test split: no do_test pass
        time.sleep(_env_float("BCPP_BRIDGE_STANDIN_EVAL_SECONDS", 0.0))  # the forward passes' time
        held_out = sum(os.path.getsize(p + ".bin") for p in prefixes)
        loss = 10.8 * 0.995 ** int(step) + 1.05 + (held_out % 997) / 1e6
        if rank == world - 1:  # print_rank_last
            text = f" validation loss at iteration {step} on {split} set | lm loss value: {loss:.6E} | "
            text += f"lm loss PPL: {math.exp(min(20, loss)):.6E} | "
            print("-" * (len(text) + 1), text, "-" * (len(text) + 1), sep="\n", flush=True)


def _step_line(config: ConfigContainer, step: int, ms: float) -> str:
    line = f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}]"
    line += f" iteration {step:8d}/{config.train.train_iters:8d} |"
    line += f" consumed samples: {step * config.train.global_batch_size:12d} |"
    line += f" elapsed time per iteration (ms): {ms:.1f} |"
    if config.logger.log_throughput:
        line += f" throughput per GPU (TFLOP/s/GPU): {123.4:.1f} |"
    line += f" learning rate: {config.optimizer.lr:.6E} |"
    line += f" global batch size: {config.train.global_batch_size:5d} |"
    line += f" lm loss: {10.8 * 0.995**step + 1.0:.6E} |"
    line += " loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:   0 | number of nan iterations:   0 |"
    return line


def _rendezvous(world: int) -> None:
    """Every rank of the world meets, or this one fails after the timeout."""
    import torch.distributed as dist

    if world > 1:
        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=RENDEZVOUS_SECONDS))


def pretrain(config: ConfigContainer, forward_step_func) -> None:
    started = time.monotonic()
    runtime_config_update(config)
    _check_inputs(config)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    _rendezvous(world)
    step_seconds = _env_float("BCPP_BRIDGE_STANDIN_STEP_SECONDS", 0.05)
    crash_at = int(os.environ.get("BCPP_BRIDGE_STANDIN_CRASH_AT_STEP", "0"))
    minute = _env_float("BCPP_BRIDGE_STANDIN_SECONDS_PER_MINUTE", 60.0)
    limit = config.train.exit_duration_in_mins
    stop = {"signal": False}
    if config.train.exit_signal_handler:
        signal.signal(signal.SIGTERM, lambda *_: stop.update(signal=True))
    if config.validation.skip_train:
        _evaluate(config, rank, world)
        return
    step = _loaded_step(config)
    interval = config.logger.log_interval or 1
    while step < config.train.train_iters:
        time.sleep(step_seconds)
        step += 1
        if step == crash_at:
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered (stand-in, step {step})")
        if rank == world - 1 and step % interval == 0:  # print_rank_last
            print(_step_line(config, step, step_seconds * 1000), flush=True)
        if config.checkpoint.save_interval and step % config.checkpoint.save_interval == 0:
            _save(config, step)
        if stop["signal"]:
            _save(config, step)
            if rank == 0:
                print("exiting program after receiving SIGTERM.", flush=True)
            return
        if limit is not None and time.monotonic() - started > limit * minute:
            _save(config, step)
            if rank == 0:
                print(f"exiting program after {(time.monotonic() - started) / minute:.2f} minutes", flush=True)
            return
    _save(config, step)
    if rank == 0:
        print("after training is done", flush=True)
