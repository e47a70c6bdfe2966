"""scripts/setup on a disk too small for torch's CUDA wheels: it says so before pip starts, naming the need, the place
and what is free, instead of pip's "[Errno 28] No space left on device" part-way (what a CI machine with a full disk
printed once). A real small file system: a 300 MB tmpfs, mounted for the test (root only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def small_disk(tmpfs, tmp_path: Path) -> Path:
    return tmpfs(tmp_path / "small", size="300m")


def copy_of_setup(into: Path) -> Path:
    (into / "scripts").mkdir(parents=True)
    for name in ("setup", "pip-quiet"):
        shutil.copy2(REPO / "scripts" / name, into / "scripts" / name)
    return into / "scripts" / "setup"


def test_setup_names_the_space_torch_needs_before_pip_runs(small_disk: Path) -> None:
    setup = copy_of_setup(small_disk / "checkout")
    done = subprocess.run(
        [str(setup)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(small_disk), "PYTHON": sys.executable},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    message = done.stderr.strip()
    assert message.startswith(
        "scripts/setup: torch==2.13.0 needs about 8 GB free for its download and its install "
        "on the file system of .venv, which has 0 GB free."
    ), message
    assert "point TMPDIR at another disk" in message
    assert "Errno" not in message and "Traceback" not in message
    assert not list((small_disk / "checkout" / ".venv").glob("lib/python*/site-packages/torch"))


def test_download_dir_on_another_file_system_is_checked_on_its_own(small_disk: Path, tmp_path: Path) -> None:
    """.venv on the big disk, TMPDIR on the small one: the 3 GB download is what does not fit, and it says that."""
    setup = copy_of_setup(tmp_path / "checkout")
    free_gb = shutil.disk_usage(tmp_path).free / 2**30
    if free_gb < 5:
        pytest.skip(f"this test's own disk has {free_gb:.1f} GB free; .venv's check (5 GB) would fail first")
    done = subprocess.run(
        [str(setup)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(small_disk), "PYTHON": sys.executable},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().startswith(
        f"scripts/setup: torch==2.13.0 needs about 3 GB free for its download into "
        f"TMPDIR on the file system of {small_disk}, which has 0 GB free."
    ), done.stderr
