"""The smoke pretrain's ranks: one device per rank, the process group, and collectives that fail instead of hang.

In a world of one there is no process group and every collective is the identity. Every collective has a timeout;
a rank that dies or hangs makes the others raise CollectiveFailed with a message, never wait forever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import _common
import torch


class CollectiveFailed(Exception):
    """A collective failed or timed out: another rank died, hangs, or cannot be reached."""


class Comm:
    """The job's ranks as this process sees them. In a world of one there is no process group and every
    collective is the identity, so a single process runs exactly the code (and numbers) it always ran."""

    def __init__(self, rdzv: _common.Rendezvous, device: torch.device, timeout_s: float) -> None:
        self.rank, self.world, self.local_rank = rdzv.rank, rdzv.world_size, rdzv.local_rank
        self.device, self.timeout_s = device, timeout_s
        if self.world == 1:
            return
        host = f"[{rdzv.master_addr}]" if ":" in rdzv.master_addr else rdzv.master_addr  # an IPv6 literal
        with self.guard("the rendezvous"):
            torch.distributed.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                init_method=f"tcp://{host}:{rdzv.master_port}",
                rank=self.rank,
                world_size=self.world,
                timeout=timedelta(seconds=timeout_s),
            )

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Turn torch's errors of a broken job into CollectiveFailed. gloo reports a dead peer ("Connection reset by
        peer") and a timeout as plain RuntimeError (DistError is one too); the message keeps torch's first line."""
        if self.world == 1:
            yield
            return
        try:
            yield
        except RuntimeError as exc:
            raise CollectiveFailed(
                f"rank {self.rank} of {self.world}: {what} failed ({type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'no detail'}); "
                f"another rank died, hangs or cannot be reached (--collective-timeout "
                f"{self.timeout_s:g} s)"
            ) from exc

    def sum(self, values: list[float], what: str) -> list[float]:
        if self.world == 1:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        with self.guard(what):
            torch.distributed.all_reduce(tensor)
        return tensor.tolist()

    def from_rank0(self, value: Any, what: str) -> Any:
        if self.world == 1:
            return value
        box = [value]
        with self.guard(what):
            torch.distributed.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def barrier(self, what: str) -> None:
        if self.world > 1:
            with self.guard(what):
                torch.distributed.barrier(device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def close(self) -> None:
        if self.world > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def pick_device(choice: str, local_rank: int) -> torch.device:
    """CPU, or the GPU of this rank's LOCAL_RANK (one GPU per rank, as torchrun and bcprun lay them out)."""
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise _common.StageError("--device cuda: no CUDA device is visible")
    visible = torch.cuda.device_count()
    # A launcher that binds one GPU to each task (srun --gpus-per-task) leaves each rank a single visible device.
    index = 0 if visible == 1 else local_rank
    if index >= visible:
        raise _common.StageError(
            f"LOCAL_RANK {local_rank}: only {visible} CUDA device(s) visible; start one rank per GPU"
        )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
