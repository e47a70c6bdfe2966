"""scripts/pip-quiet, through which scripts/setup runs pip: known-harmless notices go, everything else stays.

The set-up itself is checked end to end by .ci/run (a fresh machine, both README set-ups, no ERROR/WARNING line);
these tests pin the filter with a stand-in for the interpreter, so they need no network and take no time.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PIP_QUIET = REPO / "scripts" / "pip-quiet"
MISSING_INDEX = "WARNING: Location 'file:///opt/pypi/simple/torch/' is ignored: it is neither a file nor a directory."
MISSING_LINKS = (
    "WARNING: Location 'wheels-here' is ignored: it is either a non-existing path or lacks a specific scheme."
)
REAL_WARNING = "WARNING: Retrying (Retry(total=4)) after connection broken by 'ReadTimeoutError'"
REAL_ERROR = "ERROR: Could not find a version that satisfies the requirement torch==0.0.1"


def fake_python(folder: Path, lines: list[str], status: int) -> Path:
    """An executable that records its arguments, prints `lines` (half on stdout, half on stderr, as pip does)
    and exits with `status`."""
    script = folder / "python"
    printed = "\n".join(f"echo {shlex.quote(line)} >&{1 + i % 2}" for i, line in enumerate(lines))
    record = f'echo "$@" > {shlex.quote(str(folder / "argv"))}'
    script.write_text(f"#!/usr/bin/env bash\n{record}\n{printed}\nexit {status}\n")
    script.chmod(0o755)
    return script


def pip_quiet(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PIP_QUIET), str(python), *args], capture_output=True, text=True, timeout=30)


def test_missing_configured_locations_are_not_shown(tmp_path: Path) -> None:
    python = fake_python(tmp_path, [MISSING_INDEX, MISSING_LINKS, MISSING_INDEX], 0)
    done = pip_quiet(python, "install", "-e", ".[test]")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert (tmp_path / "argv").read_text().split() == [
        "-m",
        "pip",
        "--quiet",
        "--disable-pip-version-check",
        "install",
        "-e",
        ".[test]",
    ]


def test_real_warnings_and_errors_show_and_fail(tmp_path: Path) -> None:
    python = fake_python(tmp_path, [MISSING_INDEX, REAL_WARNING, MISSING_LINKS, REAL_ERROR], 1)
    done = pip_quiet(python, "install", "torch==0.0.1")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [REAL_WARNING, REAL_ERROR]


def test_pips_status_is_kept_when_everything_was_filtered(tmp_path: Path) -> None:
    done = pip_quiet(fake_python(tmp_path, [MISSING_INDEX], 2), "download", "x")
    assert (done.returncode, done.stderr) == (2, "")


def test_a_similar_line_about_something_else_still_shows(tmp_path: Path) -> None:
    other = "WARNING: Location 'file:///opt/pypi/simple/torch/' is ignored: a new reason pip may give one day."
    done = pip_quiet(fake_python(tmp_path, [other], 0), "install", "x")
    assert done.stderr.splitlines() == [other]
