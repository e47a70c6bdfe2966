"""STAND-IN for NeMo's `examples/nlp/language_modeling/megatron_gpt_pretraining.py`, NOT NVIDIA's code: it trains
no model. It plays what the pipeline depends on, as tests/fakes/README.md ("The NeMo launcher stand-in") lists with
each fact's source in NeMo 1.22.0 / PyTorch Lightning 2.0.7:

- the config the launcher wrote (`--config-path DIR --config-name FILE`, plus `+rank=R`);
- resume: with exp_manager.resume_if_exists it continues from `<explicit_log_dir>/checkpoints/*-last.ckpt`;
  exp_manager.resume_from_checkpoint, when set, is loaded instead (and wins over the run's own `-last`);
- time limits: exp_manager.max_time_per_run is per job (NeMo's StatelessTimer, which replaces Lightning's Timer);
  without it, trainer.max_time is a budget over every job of the run (Lightning's Timer saves its elapsed time in
  each checkpoint and adds it back on resume, so a resumed job with no budget left stops at once);
- output: Lightning's progress bar, one redraw per step, separated by carriage returns, with NeMo's
  `reduced_train_loss`, `global_step`, `consumed_samples` and `train_step_timing in s`;
- checkpoints named `megatron_gpt--val_loss=L-step=N-consumed_samples=C[-last].ckpt`, every
  trainer.val_check_interval steps and when training stops;
- rank 0 alone prints and writes.
Stand-in only: `+training.standin.step_seconds=S` (a step's duration, default 0.05) and
`+training.standin.crash_at_step=N` (a traceback and exit 1 there, as a CUDA error would end NeMo).
"""

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import yaml

STEP = re.compile(r"-step=(\d+)-")


def clock_seconds(text) -> float | None:
    """Lightning's `D:HH:MM:SS`."""
    if text in (None, "", "null"):
        return None
    days, hours, minutes, seconds = (int(part) for part in str(text).split(":"))
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def latest_last(folder: Path) -> Path | None:
    found = sorted(folder.glob("*-last.ckpt"), key=lambda p: int(STEP.search(p.name).group(1)))
    return found[-1] if found else None


def save(folder: Path, step: int, loss: float, gbs: int, elapsed_total: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*-last.ckpt"):
        old.rename(old.with_name(old.name.replace("-last.ckpt", ".ckpt")))
    name = f"megatron_gpt--val_loss={loss:.2f}-step={step}-consumed_samples={step * gbs}.0-last.ckpt"
    temporary = folder / f".{name}.tmp"
    temporary.write_text(json.dumps({"global_step": step, "callbacks": {"Timer": {"time_elapsed": elapsed_total}}}))
    temporary.rename(folder / name)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config-path", required=True)
    parser.add_argument("--config-name", required=True)
    known, extra = parser.parse_known_args()
    cfg = yaml.safe_load((Path(known.config_path) / known.config_name).read_text())
    for item in extra:  # +rank=R and the like
        key, _, value = item.lstrip("+").partition("=")
        cfg[key] = value
    rank = int(os.environ.get("RANK", cfg.get("rank") or 0))
    trainer, exp, model = cfg["trainer"], cfg["exp_manager"], cfg["model"]
    standin = cfg.get("standin") or {}
    step_seconds = float(standin.get("step_seconds", 0.05))
    crash_at = standin.get("crash_at_step")
    checkpoints = Path(exp["explicit_log_dir"]) / "checkpoints"
    gbs = int(model["global_batch_size"])
    tokens_per_step = gbs * int(model.get("encoder_seq_length", 2048))

    step, elapsed_before = 0, 0.0
    source = exp.get("resume_from_checkpoint") or (latest_last(checkpoints) if exp.get("resume_if_exists") else None)
    if source:
        state = json.loads(Path(source).read_text())
        step = int(state["global_step"])
        elapsed_before = float(state["callbacks"]["Timer"]["time_elapsed"])
        if rank == 0:
            print(f"Resuming training from checkpoint: {source}", flush=True)
    per_run = clock_seconds(exp.get("max_time_per_run"))
    if per_run is not None:
        limit, used = per_run, 0.0  # StatelessTimer: this job's time only
        if trainer.get("max_time") and rank == 0:
            print("Found a PTL Timer callback, replacing with a StatelessTimer callback.", flush=True)
    else:
        limit, used = clock_seconds(trainer.get("max_time")), elapsed_before  # Lightning's Timer: the run's total
    max_steps = int(trainer["max_steps"])
    every = int(trainer.get("val_check_interval", 2000))
    started = time.monotonic()
    loss = 10.8
    while step < max_steps:
        if limit is not None and used + (time.monotonic() - started) >= limit:
            if rank == 0:
                print(
                    f"\nTime limit reached. Elapsed time is {time.monotonic() - started:.0f} s. Signaling "
                    "Trainer to stop.",
                    flush=True,
                )
            break
        if crash_at is not None and step == int(crash_at):
            print(
                'Traceback (most recent call last):\n  File "megatron_gpt_pretraining.py", line 42, in main\n'
                "RuntimeError: CUDA error: an illegal memory access was encountered (NeMo stand-in's crash)",
                file=sys.stderr,
                flush=True,
            )
            return 1
        time.sleep(step_seconds)
        step += 1
        loss = 2.0 + 8.8 * math.exp(-step / 40)
        if rank == 0:
            sys.stdout.write(
                f"\rEpoch 0: :  {100 * step // max_steps:3d}%| | {step}/{max_steps} [00:00<00:00, "
                f"reduced_train_loss={loss:.3f}, global_step={step - 1}.000, "
                f"consumed_samples={step * gbs}.0, train_step_timing in s={step_seconds:.3f}]"
            )
            sys.stdout.flush()
        if step % every == 0 and rank == 0:
            save(checkpoints, step, loss, gbs, used + time.monotonic() - started)
    if rank == 0:
        save(checkpoints, step, loss, gbs, used + time.monotonic() - started)
        print(f"\n`Trainer.fit` stopped: at step {step} ({tokens_per_step} tokens a step)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
