"""bcp_pipeline/procs.py's command wrapper: what its errors say."""

from __future__ import annotations

import sys

import pytest

from bcp_pipeline.errors import CommandError
from bcp_pipeline.procs import run_command


def test_a_timed_out_command_reports_its_stderr_as_text_not_bytes() -> None:
    """subprocess hands a timeout's partial output over as bytes even with text=True; the message decodes it."""
    argv = [sys.executable, "-c", "import sys, time; sys.stderr.write('halfway'); sys.stderr.flush(); time.sleep(30)"]
    with pytest.raises(CommandError) as caught:
        run_command(argv, timeout=1.5)
    assert caught.value.returncode == 124
    assert "halfway" in str(caught.value)
    assert "b'" not in str(caught.value)
