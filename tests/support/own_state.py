"""Tests own all their state (README: Tests): every test gets its own $XDG_STATE_HOME, where the writer locks of
workspaces that are no folder here live (backends/shared/locks.py: a BCP workspace's, a Kubernetes claim's).

Without it a test shared the user's: a detached emulator run of the user's own, left from the README's emulator
steps, held `bcpp-test-org/demo.lock`, and the test's `run --detach` of demo was refused (issue 50, item 10).
Subprocesses a test starts inherit the variable.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def own_state(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
