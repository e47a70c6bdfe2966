"""`bcp-pipeline --config CONFIG ARGS...` in this process, as a test drives it (its exit status; what it prints is
in capsys). For a run a test kills, `support.pipeline_fixtures.start_orchestrator` starts it as a subprocess."""

from __future__ import annotations

from pathlib import Path

from bcp_pipeline.cli.main import main
from bcp_pipeline.engine.state import RunState, RunStore


def cli(config: Path, *args: str) -> int:
    return main(["--config", str(config), *args])


def latest(config: Path) -> RunState | None:
    """The latest run of the project whose pipelines.yaml is `config` (its state folder beside it)."""
    return RunStore(config.parent / ".bcp-pipeline").latest()
