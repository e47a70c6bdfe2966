"""Verification program: count a stage's complete outputs and print one machine-readable result line.

    python3 verify.py --check '/mount_workspace/data/jsonl/*.jsonl=59166' [--check GLOB=COUNT ...]
    python3 verify.py --progress '/mount_workspace/results/gpt_8b/results/checkpoints=300000'
    python3 verify.py --check '/mount_workspace/results/gpt_8b-RUN/data_index.json=1' --listed DITTO

Runs as a small job after each stage (on BCP a dgxa100.80g.1.norm job, locally a process). Hidden temporaries
(`.NAME.tmp-PID`) never match a glob, so only outputs that were renamed into place are counted. Prints
`##bcp-pipeline verify {"ok": ..., "checks": [{"glob", "expected", "found", "bytes"}]}` and exits 0 only when every
count matches. `--progress DIR=TARGET` reports the step the checkpoints in DIR have reached as "steps", and counts
as ok when it reaches TARGET: Megatron-Bridge's trackers, in the order its loader reads them (`latest_train_state.pt`,
else `latest_checkpointed_iteration.txt`, both written by rank 0 once a save has completed; a torn .pt is said on
stderr and the .txt read: _bridge_tracker.py), else the highest `iter_NNNNNNN` folder holding the run_config.yaml
written with it (a save cut short does not count), else the highest `step=N` among the names (NeMo's
`megatron_gpt--...-step=50000-...-last` checkpoints, the smoke pretrain's `step=000040-last.pt`) or the highest
`step-NNNNNNNN.json` (an evaluation's results, written in step order by evaluate.py: the step it has evaluated to).
`--listed MANIFEST` checks a data index (the manifest stages/_index_manifest.py writes last): every file it lists
in its folder at the listed size, and no other file.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

from _bridge_tracker import LEGACY_TRACKER, TRAIN_STATE_TRACKER, tracked_step
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
EVALUATED = re.compile(r"^step-(\d{8,})\.json$")  # evaluate.py's RESULT_NAME
BRIDGE_ITERATION = re.compile(r"^iter_(\d{7})$")  # Bridge's checkpoint folders, iter_0001000
BRIDGE_SAVED = "run_config.yaml"  # written into an iter_ folder by rank 0 once its save completed (with the tracker)


def latest_step(folder: str) -> int:
    """The step the checkpoints in `folder` reached (0 when there is none yet): Bridge's trackers, else the
    highest Bridge `iter_NNNNNNN` folder whose save completed (it holds run_config.yaml), else the highest `step=N`
    or evaluation result `step-NNNNNNNN.json` among the entries; temporaries are ignored."""
    if not os.path.isdir(folder):
        return 0
    tracked = tracked_step(folder)
    if tracked.problem:
        print(f"progress: {folder}: {tracked.problem}", file=sys.stderr)
    if tracked.step is not None:
        return tracked.step
    if any(os.path.isfile(os.path.join(folder, name)) for name in (TRAIN_STATE_TRACKER, LEGACY_TRACKER)):
        return 0  # a `release` tracker (a converted checkpoint, no training step), or a torn .pt and no .txt
    names = [name for name in os.listdir(folder) if not name.startswith(".")]
    saved = [
        int(m.group(1))
        for name in names
        if (m := BRIDGE_ITERATION.match(name)) and os.path.isfile(os.path.join(folder, name, BRIDGE_SAVED))
    ]
    if saved:
        return max(saved)
    return max((int(m.group(1)) for name in names if (m := STEP.search(name) or EVALUATED.match(name))), default=0)


def count_files(pattern: str) -> tuple[int, int]:
    """(files, total bytes) of regular files matching `pattern`."""
    files = total = 0
    for path in glob.iglob(pattern, recursive=True):
        if os.path.isfile(path):
            files += 1
            total += os.path.getsize(path)
    return files, total


def listed_files(manifest: str) -> tuple[dict, list[str]]:
    """A data index manifest (stages/_index_manifest.py) against its folder: the check's record ("found" equals
    "expected" only when every listed file is there at its size and no other visible file is), and what is wrong."""
    try:
        with open(manifest, encoding="utf-8") as handle:
            record = json.load(handle)
        listed, cache = dict(record["files"]), os.path.join(os.path.dirname(manifest), record["cache"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {"glob": manifest, "expected": 1, "found": 0, "bytes": 0}, [f"no readable manifest ({exc})"]
    present = {}
    if os.path.isdir(cache):
        present = {e.name: e.stat().st_size for e in os.scandir(cache) if e.is_file() and not e.name.startswith(".")}
    problems = [f"{name}: missing" for name in sorted(listed) if name not in present]
    problems += [
        f"{name}: {present[name]} bytes, {listed[name]} listed"
        for name in sorted(listed)
        if name in present and present[name] != listed[name]
    ]
    problems += [f"{name}: not listed (another build's?)" for name in sorted(present) if name not in listed]
    found = sum(1 for name in listed if present.get(name) == listed[name])
    expected = len(listed) if not problems else len(listed) + len(problems)
    return (
        {
            "glob": f"{cache}/* as listed in {manifest}",
            "expected": expected,
            "found": found,
            "bytes": sum(present.get(name, 0) for name in listed),
        },
        problems,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="append", type=parse_check, default=[], metavar="GLOB=COUNT")
    parser.add_argument("--progress", type=parse_check, metavar="DIR=TARGET_STEPS")
    parser.add_argument(
        "--listed",
        action="append",
        default=[],
        metavar="MANIFEST",
        help="a data index manifest: each file it lists there at its size, and no other",
    )
    args = parser.parse_args(argv)
    if not args.check and not args.progress and not args.listed:
        parser.error("give at least one --check GLOB=COUNT, --progress DIR=TARGET_STEPS or --listed MANIFEST")
    checks = []
    for pattern, expected in args.check:
        found, size = count_files(pattern)
        checks.append({"glob": pattern, "expected": expected, "found": found, "bytes": size})
        mark = "ok" if found == expected else "MISMATCH"
        print(f"{mark}: {pattern}: found {found} of {expected} expected ({size} bytes)", file=sys.stderr)
    for manifest in args.listed:
        check, problems = listed_files(manifest)
        checks.append(check)
        for line in problems or [f"{check['found']} file(s) as listed ({check['bytes']} bytes)"]:
            print(f"{'MISMATCH' if problems else 'ok'}: {manifest}: {line}", file=sys.stderr)
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
