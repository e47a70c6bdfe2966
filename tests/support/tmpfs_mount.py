"""`tmpfs`: a small real file system for a test (a full disk, a read-only folder, a disk too small for set-up), for
every test module (conftest.py imports it). Root only: elsewhere the test is skipped with the reason."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def tmpfs():
    """`tmpfs(folder, size)` mounts a small tmpfs on `folder`; skipped where mounting is not possible. Unmounted
    after the test."""
    mounted: list[Path] = []

    def mount(folder: Path, size: str = "1m") -> Path:
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("needs root and mount(8) to mount a small tmpfs")
        folder.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip() or result.returncode}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in reversed(mounted):
        subprocess.run(["umount", str(folder)], check=True)
