"""The tokenize stage starts without OpenBLAS's threads (stages/_one_blas_thread.py): it imports the module before
anything of it loads numpy, and a user's own setting is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.stage_fixtures import STAGES_DIR

COUNT_THREADS = "import os, {module}; print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))"


def threads_after_import(module: str, **env: str) -> tuple[int, str]:
    """The threads of a fresh interpreter that imported `module` (from stages/), and the setting it then has."""
    environment = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | env
    out = subprocess.run(
        [sys.executable, "-c", COUNT_THREADS.format(module=module)],
        cwd=STAGES_DIR,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(out[0]), out[1]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc (Linux)")
def test_the_stage_loads_numpy_with_one_blas_thread():
    plain_numpy, _ = threads_after_import("numpy")
    if plain_numpy == 1:
        pytest.skip("OpenBLAS starts no thread of its own on one core: nothing to tell apart")
    assert threads_after_import("preprocess") == (1, "1")


def test_a_users_own_setting_is_kept():
    assert threads_after_import("preprocess", OPENBLAS_NUM_THREADS="2")[1] == "2"
