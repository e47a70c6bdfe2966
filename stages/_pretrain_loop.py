"""The smoke pretrain's training steps: micro batches, gradient accumulation, the step lines, checkpoints and a
clean stop on SIGTERM/SIGINT (every rank after the same step, a checkpoint saved first unless --no-checkpoints).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common
import _profiling
import torch
from _pretrain_checkpoints import checkpoint_payload, save_checkpoint
from _pretrain_comm import Comm
from _pretrain_data import get_micro_batches, sample_range
from _smoke_gpt import autocast, lr_at, masked_loss_sum
from torch import nn


class StopFlag:
    """SIGTERM/SIGINT ask for a clean stop after the current step (checkpoint first), as NeMo's max_time does."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.signal = signum


def train_step(
    comm: Comm,
    ddp: nn.Module,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[dict[str, torch.Tensor]],
    timers: _profiling.PhaseTimers | None = None,
    precision: str = "fp32",
) -> tuple[float, float]:
    """One optimizer step over this rank's micro batches; returns (this rank's loss sum, the step's global token
    count): the step's loss is the sum over ranks divided by the count.

    Each micro batch's loss sum is divided by the step's global token count and multiplied by the world size
    (DDP averages gradients over ranks), so the summed gradients are those of the one-batch mean loss."""
    local_tokens = sum(float(b["loss_mask"].sum()) for b in micro_batches)
    global_tokens = max(comm.sum([local_tokens], "counting the step's tokens")[0], 1.0)
    timers = timers or _profiling.PhaseTimers(comm.device, enabled=False)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for index, batch in enumerate(micro_batches):
        last = index == len(micro_batches) - 1
        # DDP all-reduces gradients on the last micro batch only; the others accumulate locally.
        sync = contextlib.nullcontext() if last or ddp is model else ddp.no_sync()
        with sync, comm.guard("the gradient all-reduce"):
            with timers.time("forward-compute"), autocast(comm.device, precision):
                summed = masked_loss_sum(ddp(batch["tokens"]), batch["labels"], batch["loss_mask"])
            # With DDP the last micro batch's backward also all-reduces the gradients (overlapped).
            with timers.time("backward-compute"):
                (summed * comm.world / global_tokens).backward()
        loss_sum += float(summed.detach())
    with timers.time("optimizer"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return loss_sum, global_tokens


def loop(
    args: argparse.Namespace,
    comm: Comm,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Any,
    state: dict,
    cfg: dict,
    ckpt_dir: Path,
    validate: Callable[[int], None] | None = None,
) -> dict:
    """The training steps from state['step'] to args.steps, with logging, validation (rank 0 calls `validate`
    every args.eval_interval steps and at the last), checkpoints and a clean stop."""
    device, lead = comm.device, comm.rank == 0
    stop = StopFlag()
    progress = _common.Progress(args.steps, comm.rank, unit="steps")
    if state["step"] and lead:
        progress.advance(state["step"])
    ddp = model
    if comm.world > 1:
        from torch.nn.parallel import DistributedDataParallel  # pylint: disable=import-outside-toplevel

        with comm.guard("wrapping the model in DDP"):  # DDP broadcasts rank 0's weights: a collective
            ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    model.train()
    window = _profiling.TorchProfilerWindow(
        args.profile_steps if comm.rank in args.profile_ranks else None,
        args.results / args.run_name / "profile",
        comm.rank,
        device,
    )
    timers = _profiling.PhaseTimers(device, enabled=args.timers and lead)
    began, first = time.monotonic(), state["step"]
    while state["step"] < args.steps:
        step = state["step"]
        window.before(step + 1)
        step_began = time.monotonic()
        lr = lr_at(step, args.steps, args.lr, args.warmup_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        micro_batches = get_micro_batches(
            dataset, sample_range(step, args.global_batch_size, comm.rank, comm.world), args.micro_batch_size, device
        )
        with window.step(step + 1):
            loss_sum, tokens = train_step(comm, ddp, model, optimizer, micro_batches, timers, args.precision)
        # One all-reduce for the log and the stop: a signal may reach some ranks only, or at different steps,
        # and all must stop after the same one.
        loss_sum, stops = comm.sum([loss_sum, float(stop.signal is not None)], "summing the loss")
        loss, stopping = loss_sum / tokens, stops > 0
        state["step"] = step + 1
        state["losses"].append(loss)
        now = time.monotonic()
        rate = (state["step"] - first) / max(now - began, 1e-9)
        window.after(state["step"])
        if lead and (state["step"] % args.log_every == 0 or state["step"] == args.steps):
            # The step's own wall time last: the report's step time and tokens/s come from it.
            print(
                f"step {state['step']}/{args.steps} loss {loss:.4f} lr {lr:.3e} {rate:.2f} steps/s "
                f"{now - step_began:.4f} s/step",
                flush=True,
            )
            if (block := timers.report()) is not None:
                print(block, flush=True)
        if lead:
            progress.advance()
        done = state["step"] == args.steps
        if lead and validate is not None and (done or state["step"] % args.eval_interval == 0):
            validate(state["step"])
        if lead and args.checkpoints and (done or state["step"] % args.checkpoint_every == 0 or stopping):
            path = save_checkpoint(
                ckpt_dir, state["step"], checkpoint_payload(model, optimizer, state, cfg, device), args.keep_checkpoints
            )
            print(f"checkpoint saved: {path}", flush=True)
        if stopping and not done:
            window.finish()  # a window cut short by the stop still writes what it recorded
            comm.barrier("waiting for the checkpoint")  # no rank reports the stop before the checkpoint exists
            raise _common.StageError(
                f"stopped by signal {stop.signal or 'on another rank'} at step {state['step']} "
                f"of {args.steps} (checkpoint saved); rerun with --run-name {args.run_name} "
                "to continue"
            )
    window.finish()  # a window past the last step ends with the training
    return {"steps_this_run": state["step"] - first, "seconds": time.monotonic() - began}
