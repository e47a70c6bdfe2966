"""Shared helpers for the stage programs that run inside jobs.

Stage programs run in the NeMo container on BCP, under srun on Slurm and as plain processes locally, so this
module uses the standard library only and nothing from `bcp_pipeline/`. It fixes the conventions the
orchestrator relies on:

* shard assignment: `items[rank::world_size]` over a sorted listing, so every rank agrees whenever it starts;
* atomic outputs: write `.NAME.tmp-PID` in the same folder, fsync, rename, fsync the folder;
* a per-rank completion record, written last (datatrove's convention);
* machine-readable lines on stdout, prefixed with `##bcp-pipeline `, that the orchestrator parses:
  `##bcp-pipeline progress {"done": 3, "total": 40, "rank": 0}`, `##bcp-pipeline verify {...}`, and
  `##bcp-pipeline summary {"text": "..."}` (one line about the result, shown when the stage succeeds).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable, Iterator, Mapping, Sequence, TypeVar

LINE_PREFIX = "##bcp-pipeline "
STARTED_AT = time.time()  # about when this stage program started (its imports before this one aside)
COMPLETIONS_DIR = ".completions"
T = TypeVar("T")
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # write errors that name no file


class StageError(Exception):
    """A stage could not complete some of its items; the message names them."""


def positive_int(text: str) -> int:
    """argparse type for counts: a whole number >= 1, else a clear usage error."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def usable_cpus() -> int:
    """The CPUs this process may use (Slurm and containers restrict affinity), not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (not Linux)
        return max(1, os.cpu_count() or 1)


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
                raise StageError(f"{rank_key}={env[rank_key]!r} / {world_key}={env[world_key]!r}: not integers") from exc
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
            raise StageError(f"rank {rank} of {world}: no rendezvous address (set MASTER_ADDR, or run under torchrun, "
                             "bcprun or srun)")
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
            raise StageError(f"SLURM_JOB_NODELIST: {exc}; scontrol show hostnames failed: "
                             f"{done.stderr.strip() or 'no output'}") from None
        return done.stdout.split()[0]


def shard(items: Sequence[T], rank: int, world_size: int) -> list[T]:
    """The items this rank owns: a fixed stride over the (already sorted) sequence."""
    return list(items[rank::world_size])


def temp_path_for(path: Path) -> Path:
    """Hidden temporary name next to `path`: globs like `*.jsonl` never match it.

    Host and pid both go in: containers on different nodes often run their ranks under the same pids.
    """
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def fsync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_output(path: Path, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file that becomes `path` only if the block completes; otherwise it is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        with open(tmp, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if (named := error_naming(exc, path)) is not None:
            raise named from exc
        raise


def error_naming(exc: BaseException, path: Path) -> OSError | None:
    """For a full disk or quota (errors only a write gives, and without a file name), the same error naming `path`:
    "[Errno 28] No space left on device" alone does not say which output could not be written. Else None."""
    if isinstance(exc, OSError) and exc.filename is None and exc.errno in OUT_OF_SPACE:
        return OSError(exc.errno, exc.strerror, str(path))
    return None


def atomic_write_json(path: Path, payload: object) -> None:
    with atomic_output(path, "w") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)
        handle.write("\n")


def remove_stale_temporaries(folder: Path) -> int:
    """Delete `.NAME.tmp-PID` leftovers of killed runs (they are never valid outputs)."""
    removed = 0
    if folder.is_dir():
        for leftover in folder.glob(".*.tmp-*"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
                removed += 1
    return removed


def completion_path(output_dir: Path, stage: str, rank: int, world_size: int) -> Path:
    return output_dir / COMPLETIONS_DIR / f"{stage}-{rank:05d}-of-{world_size:05d}.json"


def write_completion(output_dir: Path, stage: str, rank: int, world_size: int, summary: dict) -> None:
    """The last thing a rank writes: proof that every item of its shard is complete, and where it ran."""
    path = completion_path(output_dir, stage, rank, world_size)
    remove_stale_temporaries_of([path])  # a rank killed while writing this record left its temporary (scripts/chaos)
    atomic_write_json(path, {"stage": stage, "rank": rank, "world_size": world_size, "started_at": STARTED_AT,
                             "finished_at": time.time(), "ran_on": ran_on(),
                             # what defines the outputs it vouches for (claim_outputs); absent when run by hand
                             **({"output_digest": os.environ[OUTPUT_DIGEST_ENV]} if os.environ.get(OUTPUT_DIGEST_ENV)
                                else {}), **summary})
    for claimed in CLAIMED:  # again at the end, where the orchestrator reads a log's tail (engine/outcomes.py)
        emit("outputs", claimed)


OUTPUT_DIGEST_ENV = "BCP_PIPELINE_OUTPUT_DIGEST"  # what defines this stage's outputs (bcp_pipeline/engine/output_digest.py)
OTHER_OUTPUTS_ENV = "BCP_PIPELINE_OTHER_OUTPUTS"  # redo | refuse | reuse: outputs made under another digest
DIGEST_WAIT_SECONDS = 1800.0  # how long ranks other than 0 wait for rank 0 to settle the output folder
CLAIMED: list[dict] = []  # what claim_outputs did in this process: said again at the end (write_completion)


def claim_outputs(out_dir: Path, stage: str, outputs: Iterable[Path], rank: int,
                  environ: Mapping[str, str] | None = None, wait_seconds: float = DIGEST_WAIT_SECONDS) -> dict:
    """Make `out_dir` this config's before any output is skipped as complete: what was found, as a dict.

    The orchestrator gives each data stage's job the digest of what defines its outputs. Rank 0 compares it with
    the one the folder's outputs were made under (`.completions/STAGE.digest`); where they differ, the existing
    `outputs` are redone (moved aside into `.superseded-DIGEST-TIME/` first: never deleted), refused (StageError
    naming the setting that reuses them) or reused, as OTHER_OUTPUTS_ENV says. It then records the new digest;
    the other ranks wait for that record, so no rank skips an output that is about to be moved aside. Without a
    digest (the program run by hand) nothing is checked."""
    env = os.environ if environ is None else environ
    digest = env.get(OUTPUT_DIGEST_ENV, "")
    if not digest:
        return {"outputs": "unchecked"}
    record = out_dir / COMPLETIONS_DIR / f"{stage}.digest"
    previous = _recorded_digest(record)
    if previous == digest:
        return {"outputs": "same", "digest": digest}  # no line: nothing to tell
    found = sorted(path for path in outputs if path.exists())
    policy = env.get(OTHER_OUTPUTS_ENV, "redo")
    if found and policy == "refuse":
        stage_name = env.get("BCP_PIPELINE_STAGE") or stage  # the pipeline's name of the stage, for --set
        raise StageError(f"{len(found)} output(s) in {out_dir} were made by another config (digest "
                         f"{previous or 'not recorded'}, this one {digest}), and redoing this stage is costly: "
                         f"reuse them with `--set {stage_name}.other_outputs=reuse`, or redo them with "
                         f"`--set {stage_name}.other_outputs=redo` (they are moved aside, not deleted)")
    if rank != 0:
        _wait_for_digest(record, digest, wait_seconds)
        return {"outputs": "same", "digest": digest}
    outcome: dict = {"outputs": "new" if not found else ("reused" if policy == "reuse" else "redone"),
                     "digest": digest, "previous_digest": previous, "count": len(found)}
    if found and policy != "reuse":
        aside = out_dir / f".superseded-{previous or 'unrecorded'}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        for path in [*found, *sorted((out_dir / COMPLETIONS_DIR).glob(f"{stage}-*.json"))]:
            target = aside / path.relative_to(out_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, target)
        fsync_dir(out_dir)
        outcome["set_aside"] = str(aside)
    atomic_write_json(record, {"digest": digest})
    CLAIMED.append({"stage": stage, **outcome})
    emit("outputs", CLAIMED[-1])  # `status` shows what was done with outputs of another config
    return outcome


def claim_or_refuse(out_dir: Path, stage: str, outputs: Iterable[Path], rank: int) -> int:
    """claim_outputs for a stage's main: 0 to go on, or 1 after printing why the outputs were refused."""
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        claim_outputs(out_dir, stage, outputs, rank)
    except StageError as exc:
        print(f"{stage}: {exc}", file=sys.stderr)
        return 1
    return 0


def _recorded_digest(record: Path) -> str | None:
    try:
        value = json.loads(record.read_text(encoding="utf-8")).get("digest")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _wait_for_digest(record: Path, digest: str, wait_seconds: float) -> None:
    deadline = time.monotonic() + wait_seconds
    while _recorded_digest(record) != digest:
        if time.monotonic() > deadline:
            raise StageError(f"rank 0 did not record output digest {digest} in {record} within {wait_seconds:.0f} s")
        time.sleep(0.2)


def ran_on(environ: dict[str, str] | None = None) -> dict:
    """Where this process runs: hostname, Slurm's node name (when under Slurm) and the machine's IPv4 addresses.

    Containers and network namespaces may share one hostname across nodes; the node name and the addresses tell
    the nodes apart in the completion records.
    """
    env = os.environ if environ is None else environ
    where: dict = {"hostname": socket.gethostname()}
    if env.get("SLURMD_NODENAME"):
        where["slurmd_nodename"] = env["SLURMD_NODENAME"]
    where["addresses"] = ipv4_addresses()
    return where


def ipv4_addresses() -> list[str]:
    """The IPv4 address of every interface but loopback (Linux ioctl, no subprocess); [] where unavailable."""
    try:
        import fcntl
        import struct
        names = [name for _, name in socket.if_nameindex() if name != "lo"]
    except (ImportError, OSError):
        return []
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            try:  # SIOCGIFADDR: the interface's primary IPv4 address, at bytes 20..24 of the struct ifreq answer
                answer = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            found.append(socket.inet_ntoa(answer[20:24]))
    return sorted(found)


def emit(kind: str, payload: dict, stream: IO[str] | None = None) -> None:
    """Print one machine-readable line for the orchestrator."""
    out = sys.stdout if stream is None else stream
    out.write(f"{LINE_PREFIX}{kind} {json.dumps(payload, sort_keys=True)}\n")
    out.flush()


class Progress:
    """Reports `done of total` at most every `interval` seconds, at the end, and when the rank fails short of the
    end (fail_with_items): the orchestrator shows a rank's last reported count, which would otherwise be the one of
    up to `interval` seconds before (`1/8 files` after seven of eight were written)."""

    latest: "Progress | None" = None  # this process's rank's, for fail_with_items

    def __init__(self, total: int, rank: int, unit: str = "files", interval: float = 2.0) -> None:
        self.total, self.rank, self.unit, self.interval = total, rank, unit, interval
        self.done = 0
        self._last = 0.0
        self._reported: int | None = None
        Progress.latest = self

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if now - self._last >= self.interval or self.done >= self.total:
            self._last = now
            self.report()

    def report(self) -> None:
        emit("progress", {"done": self.done, "total": self.total, "rank": self.rank, "unit": self.unit})
        self._reported = self.done

    def report_if_behind(self) -> None:
        if self._reported != self.done:
            self.report()


def fail_with_items(stage: str, failures: dict[str, str]) -> int:
    """Print every failed item with its reason and return the exit code to use (never 0 with a hole)."""
    if Progress.latest is not None:
        try:
            Progress.latest.report_if_behind()
        except OSError:  # a log on the full disk: the failures below still go to stderr
            pass
    print(f"{stage}: {len(failures)} item(s) could not be completed:", file=sys.stderr)
    for item, reason in sorted(failures.items()):
        print(f"  {item}: {reason}", file=sys.stderr)
    return 1


def remove_stale_temporaries_of(paths: Iterable[Path]) -> int:
    """Delete `.NAME.tmp-*` leftovers of these outputs only (one listing per folder).

    Safe when several ranks share a folder, unlike `remove_stale_temporaries(folder)`: a rank that starts late must
    not delete the temporary another rank is still writing, so each rank cleans only the outputs of its own shard.
    """
    wanted: dict[Path, set[str]] = {}
    for path in paths:
        wanted.setdefault(path.parent, set()).add(path.name)
    removed = 0
    for folder, names in wanted.items():
        if not folder.is_dir():
            continue
        with os.scandir(folder) as entries:
            leftovers = [entry.name for entry in entries
                         if entry.name.startswith(".") and ".tmp-" in entry.name
                         and entry.name[1:entry.name.rindex(".tmp-")] in names]
        for name in leftovers:
            with contextlib.suppress(FileNotFoundError):
                (folder / name).unlink()
                removed += 1
    return removed


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages in the range, do not wait


@functools.lru_cache(maxsize=None)
def _sync_file_range():
    """libc's sync_file_range (Linux), or None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing this range of a file to disk now, without waiting (advisory; a no-op without Linux's
    sync_file_range). A stage that writes an output at hundreds of MB/s and fsyncs it at the end otherwise waits
    for the whole file there; started early, the disk works while the rest is still being produced."""
    function = _sync_file_range()
    if function is not None and length > 0:
        function(fd, offset, length, _SYNC_FILE_RANGE_WRITE)
