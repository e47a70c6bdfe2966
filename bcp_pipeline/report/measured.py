"""A profile run's measured step time, kept for `plan`: `<state>/measured/<pipeline>.json`.

Written atomically when `profile` finishes (cli/main.py), read by `plan`, which then estimates the pretrain stage
from the measurement instead of the declared MFU, where the measurement ran on the same instance and nodes.
A file that cannot be read is an error naming it: a silently ignored measurement would make `plan` quote the
declared MFU as if none existed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from bcp_pipeline.atomic import atomic_write_json
from bcp_pipeline.errors import StateError


@dataclass(frozen=True)
class Measurement:
    run_id: str  # the profile run
    stage: str
    backend: str
    instance: str | None  # the stage's BCP instance when measured
    nodes: int
    step_s: float  # median over the logged steps after the first
    mfu: float | None

    @property
    def source(self) -> str:
        return f"profile run {self.run_id}"


def measurement_path(state_root: Path, pipeline: str) -> Path:
    return state_root / "measured" / f"{pipeline}.json"


def save_measurement(state_root: Path, pipeline: str, measurement: Measurement) -> Path:
    path = measurement_path(state_root, pipeline)
    atomic_write_json(path, asdict(measurement))
    return path


def load_measurement(state_root: Path, pipeline: str) -> Measurement | None:
    """The pipeline's last measurement; None when no profile run measured one."""
    path = measurement_path(state_root, pipeline)
    if not path.is_file():
        return None
    try:
        return Measurement(**json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as exc:
        raise StateError(f"{path}: not a measurement this version reads ({exc}); remove it, or run "
                         f"`bcp-pipeline profile {pipeline}` again") from None
