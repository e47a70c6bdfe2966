"""What the chaos monkey can hit on each backend, and each backend's own record of which jobs are alive.

A chaos backend knows, for one project folder (a copy of pipelines.yaml and its state folder):
* `targets(kind)`: the live things of a kind that can be hit now (tests/support/chaos_monkey.py `Target`);
* `live_jobs()`: stage -> ids of that stage's jobs alive now, from the backend's own records (the local backend's
  job records and pids, the emulator's job records, Slurm's queue), sampled all through the run;
* `job_intervals()`: (stage, job id, start, end) from the same records after the run, for a second look at overlaps;
* `host_path(path)`: where a path as jobs see it (`${workspace}/mirror`) lies on this machine.

This module has the contract and the local backend; the emulated BCP is in chaos_bcp.py, Slurm in chaos_slurm.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from support.chaos_monkey import Target

from bcp_pipeline.engine.state import RunStore
from bcp_pipeline.procs import is_alive

FINAL_LOCAL_STATES = {"succeeded", "failed", "cancelled"}


def children_of(pid: int) -> list[int]:
    """The direct children of `pid` (Linux /proc)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [int(p) for p in text.split()]


def sigkill(pid: int) -> Callable[[], None]:
    return lambda: os.kill(pid, signal.SIGKILL)


class ChaosBackend:
    """Shared by all backends: the project folder, its run folder, and the orchestrator as a target."""

    name = ""
    kinds: tuple[str, ...] = ()  # kinds of target besides the orchestrator
    config_options: dict = {}  # `backends:` settings for the project's copy of the config
    sample_seconds = 0.025  # how often live_jobs() is read during the run

    def start(self) -> None:
        """Bring up what the backend needs (the emulator, the cluster) before a run is driven."""

    def __init__(self, project: Path, pipeline: str) -> None:
        self.project = project
        self.pipeline = pipeline
        self.orchestrator: subprocess.Popen | None = None

    @property
    def config(self) -> Path:
        return self.project / "pipelines.yaml"

    def run_dir(self) -> Path | None:
        state = RunStore(self.project / ".bcp-pipeline").latest()
        return None if state is None else self.project / ".bcp-pipeline" / "runs" / state.run_id

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def targets(self, kind: str) -> list[Target]:
        if kind == "orchestrator":
            process = self.orchestrator
            if process is None or process.poll() is not None:
                return []
            return [Target("orchestrator", f"orchestrator pid {process.pid}", sigkill(process.pid))]
        return self.job_targets(kind)

    def job_targets(self, kind: str) -> list[Target]:
        raise NotImplementedError

    def live_jobs(self) -> dict[str, set[str]]:
        raise NotImplementedError

    def job_intervals(self) -> list[tuple[str, str, float, float]]:
        return []

    def faults(self) -> dict[str, int]:
        """Faults injected through the backend itself (not kills), by kind."""
        return {}

    def workspace(self) -> Path:
        raise NotImplementedError

    def host_path(self, path: str) -> Path:
        return Path(path)

    def close(self) -> None:
        pass


class LocalChaos(ChaosBackend):
    """The embedded backend: jobs are detached supervisors (`run/jobs/ID/status.json`) with one process per rank."""

    name = "local"
    kinds = ("rank", "verify", "supervisor")

    def workspace(self) -> Path:
        from bcp_pipeline.config.load import load_config

        config = load_config(self.config, pipeline=self.pipeline)
        options = config.options["local"]
        return (self.project / options.workspace_dir / config.pipeline(self.pipeline).workspace.name).resolve()

    def _jobs(self) -> list[tuple[str, str, dict, dict]]:
        """(job id, stage, labels, status record) of every job of the latest run."""
        run_dir = self.run_dir()
        if run_dir is None or not (run_dir / "jobs").is_dir():
            return []
        found = []
        for job_dir in sorted((run_dir / "jobs").iterdir()):
            spec, status = _read_json(job_dir / "spec.json"), _read_json(job_dir / "status.json")
            if spec is None:
                continue
            record = status or _read_json(job_dir / "launch.json") or {}
            found.append((job_dir.name, spec["labels"]["stage"], spec["labels"], record))
        return found

    def job_targets(self, kind: str) -> list[Target]:
        targets = []
        for job_id, _stage, labels, record in self._jobs():
            if record.get("state") != "running" or not is_alive(record["pid"], record.get("start_ticks")):
                continue
            if kind == "supervisor":
                targets.append(Target(kind, f"supervisor of {job_id} (pid {record['pid']})", sigkill(record["pid"])))
            elif (kind == "verify") == (labels["kind"] == "verify"):
                for rank, pid in enumerate(children_of(record["pid"])):
                    targets.append(Target(kind, f"{job_id} rank {rank} (pid {pid})", sigkill(pid)))
        return targets

    def live_jobs(self) -> dict[str, set[str]]:
        """A job is alive while its supervisor runs without a final state, or while any of its ranks runs
        (a rank can outlive a killed supervisor: it is still that job's work, touching that stage's files)."""
        live: dict[str, set[str]] = {}
        for job_id, stage, _labels, record in self._jobs():
            supervising = (
                record.get("state") not in FINAL_LOCAL_STATES
                and "pid" in record
                and is_alive(record["pid"], record.get("start_ticks"))
            )
            ranks = any(is_alive(r["pid"], r.get("start_ticks")) for r in record.get("ranks", []))
            if supervising or ranks:
                live.setdefault(stage, set()).add(job_id)
        return live

    def job_intervals(self) -> list[tuple[str, str, float, float]]:
        return [
            (stage, job_id, record["started_at"], record["ended_at"])
            for job_id, stage, _labels, record in self._jobs()
            if "started_at" in record and "ended_at" in record
        ]


def processes() -> list[tuple[int, int, list[str]]]:
    """(pid, process group, argv) of every process (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            found.append((int(entry.name), int(fields[2]), [a.decode(errors="replace") for a in argv if a]))
    return found


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None  # not written yet, or caught between its write and rename on a slow poll: next sample
