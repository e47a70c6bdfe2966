"""What the batch-scheduler backends (Slurm, Grid Engine) share: job names, the job-side paths, and the base class
with their common set-up, per-rank log files, `logs` and `progress`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True, kw_only=True)
class Paths:
    """Where things are as a cluster's nodes see them (the same paths as on the submit host)."""

    workspace: str
    code: str  # the stages/ folder
    run_dir: str  # holds logs/
    python: str | None  # None: the default (the orchestrator's interpreter, python3 in a container)
    orchestrator_python: str

    @property
    def logs(self) -> str:
        return f"{self.run_dir}/logs"


def job_name(run_id: str, stage: str, kind: str) -> str:
    """`RUN.STAGE` or `RUN.STAGE.verify` (stage names never hold '.'), safe for `squeue --name`, `qsub -N` and
    file names."""
    return NAME_UNSAFE.sub("_", f"{run_id}.{stage}" + (".verify" if kind == "verify" else ""))


def paths_for(options: Any, *, config_dir: Path, stages_dir: Path, run_dir: Path, workspace_name: str,
              orchestrator_python: str) -> Paths:
    """The job-side paths: the workspace folder (relative to the config file), stages/ and the run folder."""
    workspace = (config_dir / options.workspace_dir / workspace_name).resolve()
    return Paths(workspace=str(workspace), code=str(stages_dir), run_dir=str(run_dir), python=options.python,
                 orchestrator_python=orchestrator_python)
