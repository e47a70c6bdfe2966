"""Tests own all their state: a test's workspace writer locks are in a folder of its own, never the user's
(~/.local/state), so a run of the user's own cannot refuse a test's run (issue 50, item 10)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bcp_pipeline.backends.shared.locks import user_writer_lock

USERS = Path.home() / ".local" / "state"


def test_a_test_s_writer_locks_are_in_a_state_folder_of_its_own(tmp_path_factory):
    state = Path(os.environ.get("XDG_STATE_HOME", USERS))
    assert state != USERS and state.is_relative_to(tmp_path_factory.getbasetemp()), state
    lock = user_writer_lock("bcpp-test-org", "demo")  # the emulator's org and the demo's workspace
    assert lock.is_relative_to(state) and not lock.exists()
    # A subprocess the test starts (an orchestrator, an emulator script) sees the same folder.
    seen = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ['XDG_STATE_HOME'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert seen == str(state)
