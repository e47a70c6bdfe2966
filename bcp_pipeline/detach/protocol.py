"""What a detached run's two sides share: the driver job (driver.py) and the laptop (laptop.py).

The driver prints every save of the run state to its job log as numbered `BCPP-STATE` lines, and the reason it
gave up as one `BCPP-ERROR ...` line; the laptop reads the last of each through the transport. No line it prints
is longer than MAX_LINE_BYTES. The run's folder in the
workspace holds the state, the lease and what the driver runs.

Standard library only: the driver imports this before it has checked that its image has PyYAML and ngcsdk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SNAPSHOT_PREFIX = "BCPP-STATE "  # a log line holding the whole run state, after each save
ERROR_PREFIX = "BCPP-ERROR "  # a log line with the reason a driver gave up
WORKSPACE_STATE_DIR = ".bcp-pipeline"  # under the workspace mount: runs/RUN/{state.json, driver.lease, driver/}
DRIVER_FOLDER = "driver"  # in the run folder: what the driver runs (this package, stages/, pipelines.yaml)
DRIVER_KIND = "driver"
MAX_LINE_BYTES = 4000  # every line a driver prints, newline excluded: under 4 KiB


def workspace_state_root(mount: Path) -> Path:
    return mount / WORKSPACE_STATE_DIR


def workspace_run_path(run_id: str) -> str:
    """The run's folder, relative to the workspace."""
    return f"{WORKSPACE_STATE_DIR}/runs/{run_id}"


def snapshot_lines(payload: dict, number: int) -> list[str]:
    """The run state as `BCPP-STATE NUMBER PART/PARTS JSON-PIECE` lines, each under MAX_LINE_BYTES.

    A long run's state grows by about 250 bytes per job record, and log pipelines split long lines (commonly at
    16 KiB, some lower): no line may depend on surviving that. `number` tells one snapshot's parts from the next's,
    so a driver killed between parts leaves an incomplete snapshot that readers skip.
    """
    text = json.dumps(payload, separators=(",", ":"))  # ASCII (ensure_ascii): characters are bytes
    head = f"{SNAPSHOT_PREFIX}{number} "
    room = MAX_LINE_BYTES - len(head) - 2 * len(str(len(text))) - 2  # room for "PART/PARTS "
    pieces = [text[i:i + room] for i in range(0, len(text), room)] or [""]
    return [f"{head}{part}/{len(pieces)} {piece}" for part, piece in enumerate(pieces, 1)]


def last_snapshot(log: str) -> dict[str, Any] | None:
    """The run state of the last snapshot whose every part is in `log` (a driver's log, or its tail)."""
    parts: dict[str, dict[int, str]] = {}
    complete: list[str] = []  # snapshot numbers, in the order their last part arrived
    for line in log.splitlines():
        if not line.startswith(SNAPSHOT_PREFIX):
            continue
        fields = line[len(SNAPSHOT_PREFIX):].split(" ", 2)
        try:
            number, (part, total), piece = fields[0], map(int, fields[1].split("/")), fields[2]
        except (IndexError, ValueError):
            continue  # cut off mid-line by a kill, or not a snapshot part
        pieces = parts.setdefault(number, {})
        pieces[part] = piece
        if len(pieces) == total and set(pieces) == set(range(1, total + 1)):
            complete.append(number)
    for number in reversed(complete):
        try:
            return json.loads("".join(piece for _, piece in sorted(parts[number].items())))
        except ValueError:
            continue  # a part was cut: the snapshot before is whole
    return None


def capped(line: str) -> list[str]:
    """`line` (no newline) in pieces of at most MAX_LINE_BYTES bytes of UTF-8, cut between characters."""
    data = line.encode("utf-8")
    pieces = []
    while len(data) > MAX_LINE_BYTES:
        cut = MAX_LINE_BYTES
        while cut and (data[cut] & 0xC0) == 0x80:  # inside a multi-byte character: cut before it
            cut -= 1
        pieces.append(data[:cut].decode("utf-8"))
        data = data[cut:]
    return [*pieces, data.decode("utf-8")]


def last_error(log: str) -> str | None:
    for line in reversed(log.splitlines()):
        if line.startswith(ERROR_PREFIX):
            return line[len(ERROR_PREFIX):].strip()
    return None
