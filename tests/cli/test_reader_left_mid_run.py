"""`run PIPELINE | tee log`, then Ctrl-C: tee dies first, so the run's next line meets a closed pipe before the
interrupt. The "interrupted ... resume RUN" line must still reach stderr (issue 50, item 12h: it was lost, exit 141
and nothing said)."""

from __future__ import annotations

import subprocess
import sys

from support.cli import latest
from support.pipeline_fixtures import sigint_as_from_a_terminal, stall_stage, wait_for, write_chain_project

from bcp_pipeline.engine.state import StageStatus


def test_a_reader_that_left_mid_run_still_gets_the_run_named_on_stderr(tmp_path):
    config = write_chain_project(tmp_path)
    stall = stall_stage(config.parent / "ws/main", "first")
    run = subprocess.Popen(
        [sys.executable, "-m", "bcp_pipeline", "--config", str(config), "run", "chain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_from_a_terminal,
    )
    try:
        run_id = wait_for(
            lambda: (s := latest(config)) and s.stages["first"].status is StageStatus.RUNNING and s.run_id,
            what="first running",
        )
        run.stdout.close()  # tee, gone
        stall.unlink()  # the next event is printed into the closed pipe
        err = run.stderr.read()
        run.wait(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 141, err
    assert (
        f"bcp-pipeline: interrupted run {run_id}. Jobs already submitted keep running; `bcp-pipeline resume "
        f"{run_id}` re-attaches to them" in err
    ), err
    assert "Traceback" not in err
