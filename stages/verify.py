"""Verification program: count a stage's complete outputs and print one machine-readable result line.

    python3 verify.py --check '/mount_workspace/data/jsonl/*.jsonl=59166' [--check GLOB=COUNT ...]

Runs as a small job after each stage (on BCP a dgxa100.80g.1.norm job, locally a process). Hidden temporaries
(`.NAME.tmp-PID`) never match a glob, so only outputs that were renamed into place are counted. Prints
`##bcp-pipeline verify {"ok": ..., "checks": [{"glob", "expected", "found", "bytes"}]}` and exits 0 only when every
count matches.
"""

from __future__ import annotations

import argparse
import glob
import os
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
    parser.add_argument("--check", action="append", type=parse_check, required=True, metavar="GLOB=COUNT")
    args = parser.parse_args(argv)
    checks = []
    for pattern, expected in args.check:
        found, size = count_files(pattern)
        checks.append({"glob": pattern, "expected": expected, "found": found, "bytes": size})
        mark = "ok" if found == expected else "MISMATCH"
        print(f"{mark}: {pattern}: found {found} of {expected} expected ({size} bytes)", file=sys.stderr)
    ok = all(c["found"] == c["expected"] for c in checks)
    emit("verify", {"ok": ok, "checks": checks})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
