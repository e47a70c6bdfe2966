#!/usr/bin/env python3
"""concat stage: sorted `IN/*.jsonl` in groups of N -> `OUT/train_chunk_{i}.jsonl`, sharded by rank, resumable.

    python3 concat.py --in DIR --out DIR --files-per-output N

Groups are fixed by the sorted input list (sorted by name without `.jsonl`, the same order preprocess uses for
`.jsonl.zst` groups), so `train_chunk_{i}` holds the same files whichever rank builds it and whenever it starts.
Ranks build different groups in parallel (the guide ran this on one node for 4+ hours). Each input is copied inside
the kernel (copy_file_range, else sendfile, else large buffered copies); an input whose last line has no newline
gets one, so two documents never merge into one line, and that is counted and reported. Outputs appear only by
rename; an output that exists is complete and is skipped on rerun.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import _common

STAGE = "concat"
IN_SUFFIX = ".jsonl"
OUTPUT_TEMPLATE = "train_chunk_{index}.jsonl"  # the NeMo launcher's name for concatenated shards
KERNEL_COPY_BYTES = 1 << 30  # per copy_file_range / sendfile call
BUFFER_BYTES = 16 << 20  # fallback userspace copies
# Errors that mean "this kernel/filesystem cannot do that copy in the kernel", not "the data is bad".
NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBADF}


# ---------------------------------------------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------------------------------------------

def list_inputs(in_dir: Path) -> list[str]:
    """Visible `*.jsonl` in `in_dir`, sorted by stem (hidden temporaries of a running extract excluded)."""
    with os.scandir(in_dir) as entries:
        names = [e.name for e in entries if e.name.endswith(IN_SUFFIX) and not e.name.startswith(".") and e.is_file()]
    return sorted(names, key=lambda name: name[: -len(IN_SUFFIX)])


def make_groups(names: list[str], per_output: int) -> list[list[str]]:
    """Consecutive groups of `per_output` names; group i becomes `train_chunk_{i}.jsonl`."""
    return [names[start:start + per_output] for start in range(0, len(names), per_output)]


def output_name(index: int) -> str:
    return OUTPUT_TEMPLATE.format(index=index)


# ---------------------------------------------------------------------------------------------------------------
# Copying
# ---------------------------------------------------------------------------------------------------------------

def kernel_copy(src: int, dst: int, size: int) -> bool:
    """Copy `size` bytes from src's offset 0 to dst's position in the kernel; False if the kernel cannot."""
    start = os.lseek(dst, 0, os.SEEK_CUR)
    for copy in (_copy_file_range, _sendfile):
        try:
            copy(src, dst, size)
            return True
        except OSError as exc:
            if exc.errno not in NO_KERNEL_COPY:
                raise
            # Undo whatever part was copied before the method gave up, so the next one starts afresh.
            os.ftruncate(dst, start)
            os.lseek(dst, start, os.SEEK_SET)
    return False


def _copy_file_range(src: int, dst: int, size: int) -> None:
    done = 0
    while done < size:
        count = os.copy_file_range(src, dst, min(size - done, KERNEL_COPY_BYTES), done)
        if count == 0:
            raise _common.StageError(f"input shrank while being copied ({done} of {size} bytes)")
        done += count


def _sendfile(src: int, dst: int, size: int) -> None:
    done = 0
    while done < size:
        count = os.sendfile(dst, src, done, min(size - done, KERNEL_COPY_BYTES))
        if count == 0:
            raise _common.StageError(f"input shrank while being copied ({done} of {size} bytes)")
        done += count


def buffered_copy(src: int, dst: int, size: int) -> None:
    buffer = bytearray(BUFFER_BYTES)
    view = memoryview(buffer)
    done = 0
    while done < size:
        count = os.preadv(src, [view[: min(BUFFER_BYTES, size - done)]], done)
        if count == 0:
            raise _common.StageError(f"input shrank while being copied ({done} of {size} bytes)")
        written = 0
        while written < count:
            written += os.write(dst, view[written:count])
        done += count


def append_file(path: Path, dst: int) -> tuple[int, bool]:
    """Append all of `path` to `dst` (an fd), adding a final newline when missing; (bytes appended, fixed?)."""
    src = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(src).st_size
        if size == 0:
            return 0, False
        if not kernel_copy(src, dst, size):
            buffered_copy(src, dst, size)
        if os.pread(src, 1, size - 1) == b"\n":
            return size, False
    finally:
        os.close(src)
    os.write(dst, b"\n")
    return size + 1, True


# ---------------------------------------------------------------------------------------------------------------
# The rank's run
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Built:
    """What one output took (for the rank's summary)."""

    name: str
    inputs: int = 0
    bytes_out: int = 0
    fixed_newlines: int = 0
    skipped: bool = False


def build_output(index: int, names: list[str], in_dir: Path, out_dir: Path) -> Built:
    """Write `train_chunk_{index}.jsonl` from `names` (skip when it exists: outputs appear only by rename)."""
    final = out_dir / output_name(index)
    built = Built(final.name, inputs=len(names))
    if final.exists():
        built.skipped = True
        return built
    with _common.atomic_output(final, "wb") as handle:
        dst = handle.fileno()  # every write goes through the fd, so the file object's buffer stays empty
        for name in names:
            appended, fixed = append_file(in_dir / name, dst)
            # The disk writes this input while the next is copied; the fsync at the end then has little left.
            _common.start_writeback(dst, built.bytes_out, appended)
            built.bytes_out += appended
            if fixed:
                built.fixed_newlines += 1
                print(f"{STAGE}: {name}: last line had no newline; added one in {final.name}", file=sys.stderr)
    return built


def run(args: argparse.Namespace, rank: int, world: int) -> int:
    names = list_inputs(args.in_dir)
    if not names:
        return _common.fail_with_items(STAGE, {str(args.in_dir): f"no *{IN_SUFFIX} inputs"})
    groups = list(enumerate(make_groups(names, args.files_per_output)))
    mine = _common.shard(groups, rank, world)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    _common.remove_stale_temporaries_of(args.out_dir / output_name(index) for index, _ in mine)
    progress = _common.Progress(len(mine), rank)
    built: list[Built] = []
    failures: dict[str, str] = {}
    for index, group in mine:
        try:
            built.append(build_output(index, group, args.in_dir, args.out_dir))
        except (_common.StageError, OSError) as exc:
            failures[output_name(index)] = f"{exc} (inputs {group[0]} .. {group[-1]})"
        progress.advance()
    if failures:
        return _common.fail_with_items(STAGE, failures)
    new = [b for b in built if not b.skipped]
    _common.write_completion(args.out_dir, STAGE, rank, world, {
        "outputs": len(built), "written": len(new), "already_complete": len(built) - len(new),
        "inputs": sum(b.inputs for b in new), "bytes": sum(b.bytes_out for b in new),
        "fixed_final_newlines": sum(b.fixed_newlines for b in new)})
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="concat.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--in", dest="in_dir", type=Path, required=True, help="folder of *.jsonl")
    parser.add_argument("--out", dest="out_dir", type=Path, required=True, help="folder for train_chunk_{i}.jsonl")
    parser.add_argument("--files-per-output", type=_common.positive_int, required=True,
                        help="inputs per output (800 in the NeMo guide)")
    args = parser.parse_args(argv)
    if not args.in_dir.is_dir():
        parser.error(f"--in {args.in_dir}: not a folder")
    if args.out_dir.resolve() == args.in_dir.resolve():
        parser.error("--out must differ from --in: the outputs are *.jsonl too and would become inputs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rank, world = _common.rank_and_world_size()
    except _common.StageError as exc:
        print(f"{STAGE}: {exc}", file=sys.stderr)
        return 2
    return run(args, rank, world)


if __name__ == "__main__":
    sys.exit(main())
