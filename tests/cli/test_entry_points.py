"""The command's three ways in: the console script, `python -m bcp_pipeline`, and the driver module a detached
run's job starts (`python3 -m bcp_pipeline.detach.driver`, run end to end in tests/detach/test_bcp_detach.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.pipeline_fixtures import write_chain_project

CONSOLE_SCRIPT = Path(sys.executable).parent / "bcp-pipeline"


def test_python_dash_m_is_the_console_script(tmp_path):
    config = write_chain_project(tmp_path)
    ways = [[str(CONSOLE_SCRIPT)], [sys.executable, "-m", "bcp_pipeline"]]
    outputs = [
        subprocess.run([*way, "--config", str(config), "list"], capture_output=True, text=True, timeout=60)
        for way in ways
    ]
    assert [o.returncode for o in outputs] == [0, 0], [o.stderr for o in outputs]
    assert "chain" in outputs[0].stdout and "no runs yet" in outputs[0].stdout
    assert outputs[0].stdout == outputs[1].stdout
    bad = subprocess.run(
        [sys.executable, "-m", "bcp_pipeline", "--config", str(tmp_path / "missing.yaml"), "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "missing.yaml" in bad.stderr  # errors and exit codes as the console script's


def test_the_driver_module_starts_as_its_job_starts_it():
    done = subprocess.run(
        [sys.executable, "-m", "bcp_pipeline.detach.driver", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "python -m bcp_pipeline.detach.driver" in done.stdout
