"""The real single-node Slurm for the chaos run (scripts/slurm-cluster): targets and live jobs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support.chaos_backends import ChaosBackend, processes, sigkill
from support.chaos_monkey import Target

from bcp_pipeline.engine.state import RunStore


class SlurmChaos(ChaosBackend):
    """The real single-node Slurm (scripts/slurm-cluster, started if it is not running): jobs are Slurm's.

    Targets: a task of a running stage or verification job (SIGKILL), and any job of the run through `scancel`.
    Which jobs are alive comes from Slurm's own queue (`squeue`; this cluster has no slurmdbd, so no `sacct`).
    """

    name = "slurm"
    kinds = ("rank", "verify", "scancel")
    config_options = {"slurm": {"poll_seconds": 0.3, "poll_max_seconds": 1.0}}
    sample_seconds = 0.2  # each sample is a squeue call

    def __init__(self, project: Path, pipeline: str) -> None:
        super().__init__(project, pipeline)
        self.started_here = False
        self.slurm_conf = os.environ.get("SLURM_CONF")

    def start(self) -> None:
        script = [sys.executable, str(Path(__file__).resolve().parents[2] / "scripts" / "slurm-cluster")]
        self.started_here = subprocess.run([*script, "status"], capture_output=True).returncode != 0
        started = subprocess.run([*script, "start"], capture_output=True, text=True, timeout=180)
        if started.returncode != 0:
            raise SystemExit(f"chaos: scripts/slurm-cluster start failed:\n{started.stderr}")
        exports = [line for line in started.stdout.splitlines() if line.startswith("export SLURM_CONF=")]
        self.slurm_conf = exports[-1].split("=", 1)[1]
        self._script = script

    def close(self) -> None:
        if self.started_here:
            subprocess.run([*self._script, "stop"], capture_output=True, timeout=180)

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": self.slurm_conf or ""}

    def workspace(self) -> Path:
        from bcp_pipeline.config.load import load_config

        config = load_config(self.config, pipeline=self.pipeline)
        options = config.options["slurm"]
        return (self.project / options.workspace_dir / config.pipeline(self.pipeline).workspace.name).resolve()

    def _queue(self) -> list[tuple[str, str, str, str]]:
        """(job id, stage, kind, state) of the latest run's jobs Slurm has not ended."""
        state = RunStore(self.project / ".bcp-pipeline").latest()
        if state is None:
            return []
        listing = subprocess.run(
            ["squeue", "--noheader", "--format=%i|%j|%T"], capture_output=True, text=True, env=self.env(), timeout=30
        )
        if listing.returncode != 0:
            raise RuntimeError(f"squeue failed: {listing.stderr.strip()}")
        prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", state.run_id) + "."
        jobs = []
        for line in listing.stdout.splitlines():
            job_id, name, status = line.split("|")
            if name.startswith(prefix) and status not in SLURM_ENDED:
                rest = name[len(prefix) :]
                kind = "verify" if rest.endswith(".verify") else "stage"
                jobs.append((job_id, rest.removesuffix(".verify").split(".")[0], kind, status))
        return jobs

    def job_targets(self, kind: str) -> list[Target]:
        jobs = self._queue()
        if kind == "scancel":
            return [
                Target(
                    kind, f"job {job_id} ({stage} {job_kind}, {status})", lambda job_id=job_id: self._scancel(job_id)
                )
                for job_id, stage, job_kind, status in jobs
            ]
        running = {
            job_id: (stage, job_kind)
            for job_id, stage, job_kind, status in jobs
            if status == "RUNNING" and (kind == "verify") == (job_kind == "verify")
        }
        return [
            Target(kind, f"job {job_id} ({running[job_id][0]} {running[job_id][1]}) task pid {pid}", sigkill(pid))
            for pid, job_id in _slurm_tasks(set(running))
        ]

    def _scancel(self, job_id: str) -> None:
        done = subprocess.run(["scancel", job_id], capture_output=True, text=True, env=self.env(), timeout=30)
        if done.returncode != 0:
            raise ProcessLookupError(f"scancel {job_id}: {done.stderr.strip()}")  # it ended first: try again

    def live_jobs(self) -> dict[str, set[str]]:
        live: dict[str, set[str]] = {}
        for job_id, stage, _kind, status in self._queue():
            live.setdefault(stage, set()).add(f"{job_id} ({status})")
        return live


# squeue keeps ended jobs listed for a while; these have ended (COMPLETING has not: its tasks are being stopped).
SLURM_ENDED = {
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "SPECIAL_EXIT",
    "REVOKED",
}


def _slurm_tasks(job_ids: set[str]) -> list[tuple[int, str]]:
    """(pid, Slurm job id) of the stage programs srun started for these jobs (python running a stages/*.py)."""
    found = []
    for pid, _pgid, argv in processes():
        if not any(a.endswith(".py") for a in argv[1:3]) or not Path(argv[0]).name.startswith("python"):
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        job = next((e[len(b"SLURM_JOB_ID=") :].decode() for e in environ if e.startswith(b"SLURM_JOB_ID=")), None)
        if job in job_ids and any(e.startswith(b"SLURM_PROCID=") for e in environ):
            found.append((pid, job))
    return found
