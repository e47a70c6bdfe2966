#!/usr/bin/env python3
"""concat stage: sorted `IN/*.jsonl` in groups of N -> `OUT/train_chunk_{i}.jsonl`, sharded by rank, resumable.

    python3 concat.py --in DIR --out DIR --files-per-output N

Groups are fixed by the sorted input list (sorted by name without `.jsonl`, the same order preprocess uses for
`.jsonl.zst` groups), so `train_chunk_{i}` holds the same files whichever rank builds it and whenever it starts.
Ranks build different groups in parallel (the guide ran this on one node for 4+ hours). Inputs are read straight
into large aligned buffers that go to the disk by direct I/O while the next ones fill (`_durable.py`: durable at
the disk's speed, with no page-cache writeback to wait for at the fsync). An input whose last line has no newline
gets one, so two documents never merge into one line, and that is counted and reported. Outputs appear only by
rename; an output that exists is complete and is skipped on rerun.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import _common
import _durable

STAGE = "concat"
IN_SUFFIX = ".jsonl"
NEWLINE = ord("\n")
OUTPUT_TEMPLATE = "train_chunk_{index}.jsonl"  # the NeMo launcher's name for concatenated shards


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
    return [names[start : start + per_output] for start in range(0, len(names), per_output)]


def output_name(index: int) -> str:
    return OUTPUT_TEMPLATE.format(index=index)


# ---------------------------------------------------------------------------------------------------------------
# Copying
# ---------------------------------------------------------------------------------------------------------------


def append_file(name: str, in_dir_fd: int, out: _durable.DurableFile) -> tuple[int, bool]:
    """Append all of input `name` to `out`, adding a final newline when missing; (bytes appended, fixed?).

    Opened relative to its folder's descriptor, and its last byte read from the buffer it was just copied into:
    at SlimPajama's 59,166 inputs, path handling and one more read per file were a third of concat's time."""
    src = os.open(name, os.O_RDONLY, dir_fd=in_dir_fd)
    try:
        size = os.fstat(src).st_size
        if size == 0:
            return 0, False
        out.append_from(src, size)
        last = out.last_byte()
        if last == NEWLINE or (last is None and os.pread(src, 1, size - 1) == b"\n"):
            return size, False
    finally:
        os.close(src)
    out.write(b"\n")
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
    in_dir_fd = os.open(in_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with _durable.durable_output(final) as out:
            for name in names:
                appended, fixed = append_file(name, in_dir_fd, out)
                built.bytes_out += appended
                if fixed:
                    built.fixed_newlines += 1
                    print(f"{STAGE}: {name}: last line had no newline; added one in {final.name}", file=sys.stderr)
    finally:
        os.close(in_dir_fd)
    return built


def run(args: argparse.Namespace, rank: int, world: int) -> int:
    if _common.claim_or_refuse(args.out_dir, STAGE, args.out_dir.glob(OUTPUT_TEMPLATE.format(index="*")), rank):
        return 1
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
        else:  # progress counts complete outputs only
            progress.advance()
    if failures:
        return _common.fail_with_items(STAGE, failures)
    new = [b for b in built if not b.skipped]
    _common.write_completion(
        args.out_dir,
        STAGE,
        rank,
        world,
        {
            "outputs": len(built),
            "written": len(new),
            "already_complete": len(built) - len(new),
            "inputs": sum(b.inputs for b in new),
            "bytes": sum(b.bytes_out for b in new),
            "fixed_final_newlines": sum(b.fixed_newlines for b in new),
        },
    )
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="concat.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--in", dest="in_dir", type=Path, required=True, help="folder of *.jsonl")
    parser.add_argument("--out", dest="out_dir", type=Path, required=True, help="folder for train_chunk_{i}.jsonl")
    parser.add_argument(
        "--files-per-output", type=_common.positive_int, required=True, help="inputs per output (800 in the NeMo guide)"
    )
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
