"""`bcp-pipeline check` on the real single-node Slurm of scripts/slurm-cluster: partitions against each job's time,
`sbatch --test-only` of every rendered script, the probe job's ranks, the shared folder, and that the probe job never
outlives `check`, also under Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from support.check_fixtures import check, project, rows
from support.pipeline_fixtures import sigint_as_from_a_terminal
from support.slurm_cluster import slurm_cluster  # noqa: F401  (the session fixture)

from bcp_pipeline.backends.slurm.check import slurm_seconds

SLURM_BACKEND = "  slurm: {{workspace_dir: ws{python}}}\n"


def probe_jobs() -> list[str]:
    out = subprocess.run(
        ["squeue", "--noheader", "--states=all", "--Format=JobID:|,Name:|,State:"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [
        line
        for line in out.splitlines()
        if "bcpp-check-" in line and not any(s in line for s in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT"))
    ]


@pytest.mark.usefixtures("slurm_cluster")
def test_slurm_check_on_the_real_cluster(tmp_path):
    config = project(tmp_path, SLURM_BACKEND.format(python=""))
    code, payload, stderr = check(config, "demo", "--backend", "slurm")
    found = rows(payload)
    assert {t: r["verdict"] for t, r in found.items()} == {
        "partitions": "ok",
        "sbatch --test-only": "ok",
        "pyxis": "ok",
        "srun ranks": "ok",
        "shared folder": "ok",
        "node python": "ok",
    }, json.dumps(payload["rows"], indent=1)
    assert code == 0, stderr
    assert "procid=0 ntasks=2 localid=0" in found["srun ranks"]["showed"]
    assert "procid=1 ntasks=2 localid=1" in found["srun ranks"]["showed"]
    assert "22 accepted" in found["sbatch --test-only"]["showed"]  # the demo's 11 stages and 11 verifications
    assert (
        payload["key"].startswith("slurm-")
        and (tmp_path / ".bcp-pipeline" / "checks" / f"{payload['key']}.json").is_file()
    )
    assert probe_jobs() == []
    assert not any((tmp_path / "ws" / "demo").glob(".bcpp-check-*"))  # the marker is removed once read


@pytest.mark.usefixtures("slurm_cluster")
def test_a_partition_time_limit_below_a_job_is_different(tmp_path):
    """The real partition's MaxTime lowered under demo's 1 h jobs (restored after)."""
    config = project(tmp_path, SLURM_BACKEND.format(python=""))
    partition = (
        subprocess.run(["sinfo", "--noheader", "--format=%P"], capture_output=True, text=True, check=True)
        .stdout.split()[0]
        .rstrip("*")
    )
    subprocess.run(["scontrol", "update", f"PartitionName={partition}", "MaxTime=00:30:00"], check=True)
    try:
        code, payload, _ = check(config, "demo", "--backend", "slurm", "--no-jobs")
    finally:
        subprocess.run(["scontrol", "update", f"PartitionName={partition}", "MaxTime=UNLIMITED"], check=True)
    found = rows(payload)
    assert code == 1
    assert found["partitions"]["verdict"] == "different"
    assert "stage sample: --time 1h over" in found["partitions"]["showed"]
    assert found["srun ranks"]["verdict"] == "could not check"  # --no-jobs


@pytest.mark.usefixtures("slurm_cluster")
def test_ctrl_c_cancels_the_probe_job(tmp_path):
    """`check` as a real subprocess, interrupted while its probe job runs (the nodes' python is made slow)."""
    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\nsleep 120\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    config = project(tmp_path, SLURM_BACKEND.format(python=f", python: {slow}"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bcp_pipeline", "--config", str(config), "check", "demo", "--backend", "slurm"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        preexec_fn=sigint_as_from_a_terminal,
    )
    try:
        deadline = time.monotonic() + 60
        while not any("RUNNING" in line for line in probe_jobs()):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "probe jobs were cancelled" in err
    deadline = time.monotonic() + 20
    while probe_jobs() and time.monotonic() < deadline:  # scancel answered; the job is ending
        time.sleep(0.2)
    assert probe_jobs() == []
    assert not list((tmp_path / ".bcp-pipeline" / "checks").glob("slurm-*.json"))  # no profile of half a check


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("infinite", None),
        ("1:00:00", 3600),
        ("30:00", 1800),
        ("30", 1800),
        ("2-00:00:00", 172800),
        ("1-12:00", 129600),
        ("soon", -1),
    ],
)
def test_sinfo_time_limits_and_what_is_not_recognised(text, seconds):
    assert slurm_seconds(text) == seconds


@pytest.mark.usefixtures("slurm_cluster")
def test_a_script_sbatch_refuses_is_different(tmp_path):
    config = project(tmp_path, SLURM_BACKEND.format(python=""))
    code, payload, _ = check(config, "demo", "--backend", "slurm", "--no-jobs", "--set", "concat.slurm.partition=nope")
    found = rows(payload)
    assert code == 1
    assert found["sbatch --test-only"]["verdict"] == "different"
    assert "stage concat: sbatch: error: invalid partition specified: nope" in found["sbatch --test-only"]["showed"]
    assert "21 accepted" in found["sbatch --test-only"]["showed"]
    assert "stage concat: partition nope does not exist" in found["partitions"]["showed"]
