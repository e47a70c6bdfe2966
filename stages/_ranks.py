"""Where this process stands in its job: its rank and the world size, where the ranks meet, and its share.

Ranks come from the launcher's variables (torchrun, bcprun, Slurm); a rank owns `items[rank::world_size]` of a
sorted listing, so every rank agrees on the split whenever it starts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from _stage_error import StageError

T = TypeVar("T")


def rank_and_world_size(environ: dict[str, str] | None = None) -> tuple[int, int]:
    """Return (rank, world_size) from torchrun/bcprun variables, else Slurm's, else (0, 1).

    Not from NGC_ARRAY_INDEX/NGC_ARRAY_SIZE: where BCP runs a multi-replica job's commandline once, on replica 0,
    a rank taken from them would be rank 0 of N waiting for ranks nobody starts. Multi-replica stage jobs start
    under bcprun instead, which sets RANK/WORLD_SIZE under both ways of running the commandline (the BCP renderer
    refuses `launcher: none` on several replicas for a stage program).
    """
    env = os.environ if environ is None else environ
    for rank_key, world_key in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if rank_key in env and world_key in env:
            try:
                rank, world = int(env[rank_key]), int(env[world_key])
            except ValueError as exc:
                raise StageError(
                    f"{rank_key}={env[rank_key]!r} / {world_key}={env[world_key]!r}: not integers"
                ) from exc
            if not 0 <= rank < world:
                raise StageError(f"{rank_key}={rank} is outside 0..{world - 1} ({world_key}={world})")
            return rank, world
    return 0, 1


DEFAULT_MASTER_PORT = 29500  # torchrun's default: where no launcher says otherwise


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of one job meet (torch.distributed's env:// values)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def rendezvous(environ: dict[str, str] | None = None) -> Rendezvous:
    """This rank's rendezvous, from what the launcher provides. Precedence, first found wins:

    * rank, world size: `rank_and_world_size()` (RANK/WORLD_SIZE from torchrun, bcprun and the Slurm backend's task
      wrapper; else SLURM_PROCID/SLURM_NTASKS; else a world of one);
    * local rank: LOCAL_RANK, else SLURM_LOCALID, else 0;
    * master address: MASTER_ADDR (torchrun, bcprun, the Slurm and local backends), else NGC_MASTER_ADDR (a BCP
      replica: `launcher-svc-<job id>`), else the first host of SLURM_JOB_NODELIST / SLURM_NODELIST (the job's
      first node), else 127.0.0.1 for a world of one; several ranks with none of these is an error;
    * master port: MASTER_PORT, else under Slurm 20000 + SLURM_JOB_ID % 20000 (the port the Slurm backend's batch
      script exports, so srun'd tasks without the variables still meet there), else 29500.
    """
    env = os.environ if environ is None else environ
    rank, world = rank_and_world_size(env)
    local_rank = _int_var(env, "LOCAL_RANK", _int_var(env, "SLURM_LOCALID", 0))
    addr = env.get("MASTER_ADDR") or env.get("NGC_MASTER_ADDR")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not addr and nodelist:
        addr = first_slurm_host(nodelist)
    if not addr:
        if world > 1:
            raise StageError(
                f"rank {rank} of {world}: no rendezvous address (set MASTER_ADDR, or run under torchrun, "
                "bcprun or srun)"
            )
        addr = "127.0.0.1"
    default_port = 20000 + _int_var(env, "SLURM_JOB_ID", 0) % 20000 if "SLURM_JOB_ID" in env else DEFAULT_MASTER_PORT
    port = _int_var(env, "MASTER_PORT", default_port)
    if not 1 <= port <= 65535:
        raise StageError(f"MASTER_PORT={port} is not a TCP port (1-65535)")
    return Rendezvous(rank, world, local_rank, addr, port)


def _int_var(env: Mapping[str, str], key: str, default: int) -> int:
    if key not in env:
        return default
    try:
        return int(env[key])
    except ValueError:
        raise StageError(f"{key}={env[key]!r} is not an integer") from None


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list, expanded: `node[1-2,07],gpu3` -> node1, node2, node07, gpu3.

    Covers the syntax Slurm prints (comma-separated names, each with bracketed ranges and lists, zero padding kept,
    several bracket groups multiplied out); anything else raises ValueError.
    """
    names = re.findall(r"(?:[^,\[\]]|\[[^\[\]]*\])+", hostlist)
    if ",".join(names) != hostlist:  # an unbalanced bracket or an empty name
        raise ValueError(f"cannot read the Slurm host list {hostlist!r}")
    hosts: list[str] = []
    for name in names:
        expanded = [""]
        for literal, group in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", name):
            choices = [literal]
            if group:
                choices = [literal + value for value in _expand_range_list(group, hostlist)]
            expanded = [prefix + choice for prefix in expanded for choice in choices]
        hosts += expanded
    if not hosts or any(not host or "[" in host or "]" in host for host in hosts):
        raise ValueError(f"cannot read the Slurm host list {hostlist!r}")
    return hosts


def _expand_range_list(group: str, hostlist: str) -> list[str]:
    values: list[str] = []
    for part in group.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not match:
            raise ValueError(f"cannot read the Slurm host list {hostlist!r} (range {part!r})")
        low, high = match.group(1), match.group(2) or match.group(1)
        values += [str(number).zfill(len(low)) for number in range(int(low), int(high) + 1)]
    return values


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list, by our own expansion, else by `scontrol show hostnames` where present."""
    try:
        return expand_hostlist(nodelist)[0]
    except ValueError as exc:
        scontrol = shutil.which("scontrol")
        if scontrol is None:
            raise StageError(f"SLURM_JOB_NODELIST: {exc}, and no scontrol to expand it; set MASTER_ADDR") from None
        done = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        if done.returncode != 0 or not done.stdout.split():
            raise StageError(
                f"SLURM_JOB_NODELIST: {exc}; scontrol show hostnames failed: {done.stderr.strip() or 'no output'}"
            ) from None
        return done.stdout.split()[0]


def shard(items: Sequence[T], rank: int, world_size: int) -> list[T]:
    """The items this rank owns: a fixed stride over the (already sorted) sequence."""
    return list(items[rank::world_size])
