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
from typing import Any

from bcp_pipeline.atomic import atomic_write_json
from bcp_pipeline.config.model import StageConfig
from bcp_pipeline.config.placeholders import resolve_int
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
        raise StateError(
            f"{path}: not a measurement this version reads ({exc}); remove it, or run "
            f"`bcp-pipeline profile {pipeline}` again"
        ) from None


def measured_steps(
    measured: Measurement, stage: StageConfig, backend: str, est: Any, variables: dict[str, str]
) -> tuple[float | None, str, bool]:
    """A continued training with no model (the smoke pretrain): (seconds, basis, modelled) of its estimate `est`
    (estimates.StageEstimate), its target steps at the measured step time where it ran on this backend, instance
    and node count; else not modelled, and a note on `est` says why."""
    if (measured.backend, measured.instance, measured.nodes) != (
        backend,
        stage.resources(backend).instance_name(),
        est.nodes,
    ):
        est.notes.append(
            f"{measured.source} ran on {measured.backend} ({measured.nodes} node(s)), not {est.nodes} "
            f"on {backend}: its step time is not used"
        )
        return None, "not modelled (counted as 0)", False
    assert stage.continuation is not None  # "a continued training": the caller's condition
    steps = resolve_int(str(stage.continuation.target_steps), variables)
    return steps * measured.step_s, f"from {measured.source}: {measured.step_s:.3g} s/step x {steps} steps", True
