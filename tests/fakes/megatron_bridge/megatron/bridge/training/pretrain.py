"""pretrain(config, forward_step) as a run sees it from outside, without a model: the ranks' rendezvous (PyTorch's
own, gloo: a rank whose peers never start waits, then fails, as NCCL's would), Bridge's checks on its inputs,
its step line from the last rank, its checkpoints (rank 0: `iter_NNNNNNN/` with `run_config.yaml`, then
`latest_checkpointed_iteration.txt`), resumption from `checkpoint.load`, `train.exit_duration_in_mins` counted
from the call (a save, `exiting program after N minutes`, exit 0), SIGTERM with `exit_signal_handler`.

Stand-in knobs, from the environment (a test's job sets them; NVIDIA's code has none of them):
BCPP_BRIDGE_STANDIN_STEP_SECONDS (a step's duration, default 0.05), BCPP_BRIDGE_STANDIN_CRASH_AT_STEP (a Python
traceback and exit 1 at that step, as a CUDA error ends a rank), BCPP_BRIDGE_STANDIN_SECONDS_PER_MINUTE (how long a
minute of `exit_duration_in_mins` lasts, default 60).
"""

from __future__ import annotations

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
    for prefix in (config.dataset.blend or [[]])[0]:
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
