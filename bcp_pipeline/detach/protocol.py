"""What a detached run's two sides share: the driver job (driver.py) and the laptop (laptop.py).

The driver prints every save of the run state to its job log as one `BCPP-STATE {...}` line, and the reason it gave
up as one `BCPP-ERROR ...` line; the laptop reads the last of each through the transport. The run's folder in the
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


def workspace_state_root(mount: Path) -> Path:
    return mount / WORKSPACE_STATE_DIR


def workspace_run_path(run_id: str) -> str:
    """The run's folder, relative to the workspace."""
    return f"{WORKSPACE_STATE_DIR}/runs/{run_id}"


def snapshot_line(payload: dict) -> str:
    return SNAPSHOT_PREFIX + json.dumps(payload, separators=(",", ":"))



def last_snapshot(log: str) -> dict[str, Any] | None:
    """The run state in the last complete `BCPP-STATE` line of a driver's log."""
    for line in reversed(log.splitlines()):
        if line.startswith(SNAPSHOT_PREFIX):
            try:
                return json.loads(line[len(SNAPSHOT_PREFIX):])
            except ValueError:
                continue  # cut off mid-line by a kill: the one before is whole
    return None


def last_error(log: str) -> str | None:
    for line in reversed(log.splitlines()):
        if line.startswith(ERROR_PREFIX):
            return line[len(ERROR_PREFIX):].strip()
    return None
