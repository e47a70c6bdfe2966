"""What a detached run's two sides share: the driver job (driver.py) and the laptop (laptop.py).

The driver prints every save of the run state to its job log as numbered `BCPP-STATE` lines, what it submitted for
each job as `BCPP-SUBMITTED` lines, and the reason it gave up as one `BCPP-ERROR ...` line; the laptop reads them
through the transport. No line it prints
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
SUBMITTED_PREFIX = "BCPP-SUBMITTED "  # log lines with what was submitted for a job (for the laptop's `report`)
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
    return _parted(SNAPSHOT_PREFIX, payload, str(number))


def submitted_lines(job_id: str, text: str) -> list[str]:
    """What was submitted for a job (its kept command, secrets already out of it) as `BCPP-SUBMITTED JOB PART/PARTS
    JSON-PIECE` lines: the laptop's `report` reads them, as it cannot read the workspace's `submitted/` folder."""
    return _parted(SUBMITTED_PREFIX, {"job_id": job_id, "text": text}, job_id)


def _parted(prefix: str, payload: dict, number: str) -> list[str]:
    text = json.dumps(payload, separators=(",", ":"))  # ASCII (ensure_ascii): characters are bytes
    head = f"{prefix}{number} "
    room = MAX_LINE_BYTES - len(head) - 2 * len(str(len(text))) - 2  # room for "PART/PARTS "
    pieces = [text[i : i + room] for i in range(0, len(text), room)] or [""]
    return [f"{head}{part}/{len(pieces)} {piece}" for part, piece in enumerate(pieces, 1)]


def _whole(log: str, prefix: str) -> list[Any]:
    """The payloads of `prefix` lines whose every part is in `log`, in the order their last part arrived."""
    parts: dict[str, dict[int, str]] = {}
    complete: list[str] = []
    for line in log.splitlines():
        if not line.startswith(prefix):
            continue
        fields = line[len(prefix) :].split(" ", 2)
        try:
            number, (part, total), piece = fields[0], map(int, fields[1].split("/")), fields[2]
        except (IndexError, ValueError):
            continue  # cut off mid-line by a kill, or not a part
        pieces = parts.setdefault(number, {})
        pieces[part] = piece
        if len(pieces) == total and set(pieces) == set(range(1, total + 1)):
            complete.append(number)
    found = []
    for number in complete:
        try:
            found.append(json.loads("".join(piece for _, piece in sorted(parts[number].items()))))
        except ValueError:
            continue  # a part was cut
    return found


def last_snapshot(log: str) -> dict[str, Any] | None:
    """The run state of the last snapshot whose every part is in `log` (a driver's log, or its tail)."""
    found = _whole(log, SNAPSHOT_PREFIX)
    return found[-1] if found else None


def submitted_commands(log: str) -> dict[str, str]:
    """Job id -> what was submitted for it, from a driver's whole log."""
    return {
        entry["job_id"]: entry["text"]
        for entry in _whole(log, SUBMITTED_PREFIX)
        if isinstance(entry, dict) and isinstance(entry.get("text"), str)
    }


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
            return line[len(ERROR_PREFIX) :].strip()
    return None
