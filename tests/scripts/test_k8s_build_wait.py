"""A control-plane build in the background (as .ci/run starts one) holds its lock; `status` says so and the
Kubernetes tests' fixture waits for it to end instead of skipping (tests/support/k8s_cluster.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from support import k8s_cluster

RELEASE = k8s_cluster.SCRIPT.parent / "k8s-control-plane" / "go.mod"


def hold_lock(lock: Path, seconds: float) -> subprocess.Popen:
    """Another process holding the build lock, as `scripts/k8s-cluster install` does while `go build` runs."""
    code = (
        f"import fcntl, sys, time; f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
        f"print('held', flush=True); time.sleep({seconds})"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_status_says_being_built_and_the_fixture_waits_for_the_build(tmp_path: Path, monkeypatch) -> None:
    release = next(line.split()[-1] for line in RELEASE.read_text().splitlines() if "k8s.io/kubernetes v" in line)
    bin_dir = tmp_path / release / "bin"
    bin_dir.mkdir(parents=True)
    monkeypatch.setenv("BCP_K8S_CACHE", str(tmp_path))
    holder = hold_lock(bin_dir / ".build.lock", 4)
    try:
        status = subprocess.run([sys.executable, str(k8s_cluster.SCRIPT), "status"], capture_output=True, text=True)
        assert "being built" in status.stderr and str(bin_dir / "build.log") in status.stderr, status.stderr
        said: list[str] = []
        began = time.monotonic()
        k8s_cluster.wait_for_a_build(said.append)
        waited = time.monotonic() - began
    finally:
        holder.kill()
        holder.wait()
    assert waited >= 2, (waited, said)
    assert said[0].startswith("waiting for the Kubernetes build in the background"), said
    assert said[-1].startswith("the build ended after"), said
    # No build running: the fixture goes straight on, and status says what to run.
    said.clear()
    began = time.monotonic()
    k8s_cluster.wait_for_a_build(said.append)
    assert time.monotonic() - began < 10 and said == []
    status = subprocess.run([sys.executable, str(k8s_cluster.SCRIPT), "status"], capture_output=True, text=True)
    assert "not installed" in status.stderr and "scripts/k8s-cluster install" in status.stderr
