"""Verification program: count a stage's complete outputs and print one machine-readable result line.

    python3 verify.py --check '/mount_workspace/data/jsonl/*.jsonl=59166' [--check GLOB=COUNT ...]
    python3 verify.py --progress '/mount_workspace/results/gpt_8b/results/checkpoints=300000'

Runs as a small job after each stage (on BCP a dgxa100.80g.1.norm job, locally a process). Hidden temporaries
(`.NAME.tmp-PID`) never match a glob, so only outputs that were renamed into place are counted. Prints
`##bcp-pipeline verify {"ok": ..., "checks": [{"glob", "expected", "found", "bytes"}]}` and exits 0 only when every
count matches. `--progress DIR=TARGET` reports the step the checkpoints in DIR have reached as "steps", and counts
as ok when it reaches TARGET: Megatron-Bridge's `latest_checkpointed_iteration.txt` (written by rank 0 once a save
has completed), else the highest `iter_NNNNNNN` folder holding the run_config.yaml written with it (a save cut
short does not count), else the highest `step=N` among the names (NeMo's `megatron_gpt--...-step=50000-...-last`
checkpoints, the smoke pretrain's `step=000040-last.pt`).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys

from _common import emit


def parse_check(text: str) -> tuple[str, int]:
    pattern, sep, count = text.rpartition("=")
    if not sep or not pattern:
        raise argparse.ArgumentTypeError(f"{text!r}: expected GLOB=COUNT")
    try:
        expected = int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: COUNT {count!r} is not an integer") from None
    return pattern, expected


STEP = re.compile(r"step=(\d+)")
BRIDGE_TRACKER = "latest_checkpointed_iteration.txt"  # Megatron-Bridge's (Megatron-LM's) record of the last save
BRIDGE_ITERATION = re.compile(r"^iter_(\d{7})$")  # Bridge's checkpoint folders, iter_0001000
BRIDGE_SAVED = "run_config.yaml"  # written into an iter_ folder by rank 0 once its save completed (with the tracker)


def latest_step(folder: str) -> int:
    """The step the checkpoints in `folder` reached (0 when there is none yet): Bridge's tracker file, else the
    highest Bridge `iter_NNNNNNN` folder whose save completed (it holds run_config.yaml), else the highest `step=N`
    among the entries; temporaries are ignored."""
    if not os.path.isdir(folder):
        return 0
    tracker = os.path.join(folder, BRIDGE_TRACKER)
    if os.path.isfile(tracker):
        with open(tracker, encoding="utf-8") as handle:
            text = handle.read().strip()
        return int(text) if text.isdigit() else 0  # "release": a converted checkpoint, no training step
    names = [name for name in os.listdir(folder) if not name.startswith(".")]
    saved = [int(m.group(1)) for name in names if (m := BRIDGE_ITERATION.match(name))
             and os.path.isfile(os.path.join(folder, name, BRIDGE_SAVED))]
    if saved:
        return max(saved)
    return max((int(m.group(1)) for name in names if (m := STEP.search(name))), default=0)


def count_files(pattern: str) -> tuple[int, int]:
    """(files, total bytes) of regular files matching `pattern`."""
    files = total = 0
    for path in glob.iglob(pattern, recursive=True):
        if os.path.isfile(path):
            files += 1
            total += os.path.getsize(path)
    return files, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="append", type=parse_check, default=[], metavar="GLOB=COUNT")
    parser.add_argument("--progress", type=parse_check, metavar="DIR=TARGET_STEPS")
    args = parser.parse_args(argv)
    if not args.check and not args.progress:
        parser.error("give at least one --check GLOB=COUNT or --progress DIR=TARGET_STEPS")
    checks = []
    for pattern, expected in args.check:
        found, size = count_files(pattern)
        checks.append({"glob": pattern, "expected": expected, "found": found, "bytes": size})
        mark = "ok" if found == expected else "MISMATCH"
        print(f"{mark}: {pattern}: found {found} of {expected} expected ({size} bytes)", file=sys.stderr)
    ok = all(c["found"] == c["expected"] for c in checks)
    result: dict = {"ok": ok, "checks": checks}
    if args.progress:
        folder, target = args.progress
        steps = latest_step(folder)
        print(f"progress: {folder}: step {steps} of {target}", file=sys.stderr)
        result.update(ok=ok and steps >= target, steps=steps, target=target)
    emit("verify", result)
    ok = result["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
