"""scripts/slurm-cluster and a real single-node Slurm: sbatch + srun tasks, failure, cancel, stop.

The cluster tests are skipped, with the reason printed, where Slurm cannot be installed (see
tests/support/slurm_cluster.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.slurm_cluster import SCRIPT, SlurmCluster, script, slurm_cluster, unavailable_reason  # noqa: F401

FINISHED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}


def sbatch(*args: str) -> str:
    res = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().split(";")[0]


def states(ids: list[str]) -> dict[str, str]:
    """State of many jobs in one call, as the Slurm backend polls them."""
    res = subprocess.run(
        ["squeue", "-h", "-r", "-t", "all", "-j", ",".join(ids), "-O", "JobID:|,State:|"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    return dict(line.split("|")[:2] for line in res.stdout.splitlines())


def wait_for(ids: list[str], wanted: set[str], timeout: float = 30) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        now = states(ids)
        if len(now) == len(ids) and set(now.values()) <= wanted or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def show_job(job: str) -> dict[str, str]:
    line = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    return dict(re.findall(r"(\S+?)=(\S*)", line))


def test_srun_tasks_see_their_rank_and_world_size(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = sbatch(
        "--nodes",
        "1",
        "--ntasks-per-node",
        "4",
        "--chdir",
        str(tmp_path),
        "--output",
        "batch-%j.out",
        "--wrap",
        "srun --output task-%t.out bash -c 'echo rank=$SLURM_PROCID world=$SLURM_NTASKS'",
    )
    assert wait_for([job], FINISHED) == {job: "COMPLETED"}
    assert show_job(job)["ExitCode"] == "0:0"
    for rank in range(4):
        assert (tmp_path / f"task-{rank}.out").read_text() == f"rank={rank} world=4\n"


def test_failing_job_is_failed_with_its_exit_code(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = sbatch("--chdir", str(tmp_path), "--output", "fail.out", "--wrap", "echo about to fail; exit 3")
    assert wait_for([job], FINISHED) == {job: "FAILED"}
    info = show_job(job)
    assert (info["JobState"], info["Reason"], info["ExitCode"]) == ("FAILED", "NonZeroExitCode", "3:0")
    assert (tmp_path / "fail.out").read_text() == "about to fail\n"


def test_cancelled_job_is_cancelled(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = sbatch("--chdir", str(tmp_path), "--output", "sleep.out", "--wrap", "sleep 300")
    assert wait_for([job], {"RUNNING"}) == {job: "RUNNING"}
    subprocess.run(["scancel", job], check=True, timeout=30)
    assert wait_for([job], {"CANCELLED"}) == {job: "CANCELLED"}
    assert "CANCELLED" in (tmp_path / "sleep.out").read_text()


@pytest.fixture
def short_base() -> Iterator[Path]:
    """A base folder munged accepts: tmp_path's /tmp/pytest-of-root is 0700, which munged (as user munge) refuses."""
    base = Path(tempfile.mkdtemp(prefix="slurm-test-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    subprocess.run(["rm", "-rf", str(base)], check=False)


def test_second_cluster_stops_exactly_what_it_started(slurm_cluster: SlurmCluster, short_base: Path) -> None:
    res = script("start", "--base", str(short_base), "--cpus", "2", timeout=120)
    assert res.returncode == 0, res.stderr
    pids = [int((short_base / f).read_text()) for f in ("munge-run/munged.pid", "run/slurmctld.pid", "run/slurmd.pid")]
    env = {**os.environ, "SLURM_CONF": str(short_base / "etc" / "slurm.conf")}
    subprocess.run(["sbatch", "--output", "/dev/null", "--wrap", "sleep 300"], env=env, check=True, capture_output=True)
    assert script("start", "--base", str(short_base)).stderr.count("already running") == 1

    res = script("stop", "--base", str(short_base), timeout=120)
    assert res.returncode == 0, res.stderr
    assert "cancelling 1 job(s)" in res.stderr
    for pid in pids:  # gone, or a zombie where PID 1 does not reap
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    assert script("status", "--base", str(short_base)).returncode == 3
    assert "not running" in script("stop", "--base", str(short_base)).stderr
    # The session's cluster is untouched.
    job = sbatch("--output", "/dev/null", "--wrap", "true")
    assert wait_for([job], FINISHED) == {job: "COMPLETED"}


def test_status_and_stop_of_a_cluster_that_never_ran(tmp_path: Path) -> None:
    assert script("status", "--base", str(tmp_path / "none"), timeout=60).returncode == 3
    res = script("stop", "--base", str(tmp_path / "none"), timeout=60)
    assert res.returncode == 0 and "not running" in res.stderr


def test_install_without_apt_says_so(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "install"],
        env={"PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1
    assert "apt-get not found" in res.stderr


FAKE_APT = """#!/bin/sh
echo "$*" >> "$FAKE_DIR/calls"
case "$1" in
  update) : > "$FAKE_DIR/updated" ;;
  install)  # fails until the package lists are updated, like a fresh container
    [ -e "$FAKE_DIR/updated" ] || { echo "E: Unable to locate package slurmctld" >&2; exit 100; }
    for b in slurmctld slurmd sbatch srun squeue scontrol scancel sinfo munged runuser ip nsenter unshare; do
      printf '#!/bin/sh\n' > "$FAKE_DIR/$b"; /bin/chmod +x "$FAKE_DIR/$b"
    done ;;
esac
"""


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="install needs root")
def test_install_updates_lists_once_and_is_idempotent(tmp_path: Path) -> None:
    apt = tmp_path / "apt-get"
    apt.write_text(FAKE_APT)
    apt.chmod(0o755)
    env = {"PATH": str(tmp_path), "FAKE_DIR": str(tmp_path)}
    for _ in range(2):
        res = subprocess.run([sys.executable, str(SCRIPT), "install"], env=env, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    assert "already installed" in res.stderr
    install = "install -y -q --no-install-recommends slurmctld slurmd slurm-client munge iproute2"
    assert (tmp_path / "calls").read_text().splitlines() == [install, "update -q", install]


def test_skip_reasons_are_specific() -> None:
    assert "apt-get" in (unavailable_reason(which=lambda name: None, euid=0) or "")
    assert "root" in (unavailable_reason(which=lambda name: "/usr/bin/" + name, euid=1000) or "")
    assert unavailable_reason(which=lambda name: "/usr/bin/" + name, euid=0) is None
