"""One writer per workspace on a real Slurm (scripts/slurm-cluster via the `slurm_cluster` fixture, skipped with
the reason where Slurm cannot run): the lock lives beside the workspace folder on the shared file system, so a
second orchestrator is refused whatever its flags or state folder, and a SIGKILLed holder is not waited for."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.pipeline_fixtures import SLURM_CHAIN, start_orchestrator, wait_for, write_chain_project
from support.pipeline_fixtures import SLURM_WORKSPACE_DIR as WORKSPACE_DIR
from support.slurm_cluster import slurm_cluster  # noqa: F401  (the session fixture)

from bcp_pipeline.cli.main import main
from bcp_pipeline.engine.state import RunStore

pytestmark = pytest.mark.usefixtures("slurm_cluster")


def slurm_job_running(config: Path, stage: str) -> bool:
    for path in (config.parent / ".bcp-pipeline/runs").glob("*/state.json"):
        try:
            jobs = json.loads(path.read_text())["stages"][stage]["jobs"]
        except (ValueError, KeyError):
            continue
        if jobs and jobs[-1]["native"] == "RUNNING":
            return True
    return False


def test_a_second_writer_of_a_slurm_workspace_is_refused_until_the_first_is_killed(tmp_path):
    config = write_chain_project(tmp_path, SLURM_CHAIN)
    stall = config.parent / WORKSPACE_DIR / "main/first/STALL"
    stall.parent.mkdir(parents=True)
    stall.touch()
    first = start_orchestrator(config, "run", "chain", "--backend", "slurm")
    try:
        wait_for(lambda: slurm_job_running(config, "first"), timeout=120, what="the first run's sbatch job running")
        holder = RunStore(config.parent / ".bcp-pipeline").latest().run_id
        for args in (["--restart"], ["--restart", "--only", "third"], ["--state-dir", str(tmp_path / "other state")]):
            refused = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bcp_pipeline",
                    "--config",
                    str(config),
                    "run",
                    "chain",
                    "--backend",
                    "slurm",
                    *args,
                ],
                capture_output=True,
                text=True,
                timeout=90,
            )
            assert refused.returncode == 1, (args, refused.stderr)
            assert f"workspace main (slurm) is being written by run {holder}" in refused.stderr, refused.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert main(["--config", str(config), "cancel", holder]) == 0  # scancel its jobs
    stall.unlink()
    assert main(["--config", str(config), "run", "chain", "--backend", "slurm", "--restart"]) == 0
