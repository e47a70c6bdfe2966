"""What the chaos monkey can hit on each backend, and each backend's own record of which jobs are alive.

A chaos backend knows, for one project folder (a copy of pipelines.yaml and its state folder):
* `targets(kind)`: the live things of a kind that can be hit now (tests/chaos_monkey.py `Target`);
* `live_jobs()`: stage -> ids of that stage's jobs alive now, from the backend's own records (the local backend's
  job records and pids, the emulator's job records, Slurm's queue), sampled all through the run;
* `job_intervals()`: (stage, job id, start, end) from the same records after the run, for a second look at overlaps;
* `host_path(path)`: where a path as jobs see it (`${workspace}/mirror`) lies on this machine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Callable

from chaos_monkey import Target

from bcp_pipeline.procs import is_alive
from bcp_pipeline.state import RunStore

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
        from bcp_pipeline.config import load_config

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
            supervising = record.get("state") not in FINAL_LOCAL_STATES and "pid" in record and is_alive(
                record["pid"], record.get("start_ticks"))
            ranks = any(is_alive(r["pid"], r.get("start_ticks")) for r in record.get("ranks", []))
            if supervising or ranks:
                live.setdefault(stage, set()).add(job_id)
        return live

    def job_intervals(self) -> list[tuple[str, str, float, float]]:
        return [(stage, job_id, record["started_at"], record["ended_at"]) for job_id, stage, _labels, record
                in self._jobs() if "started_at" in record and "ended_at" in record]


class BcpChaos(ChaosBackend):
    """The emulated BCP (tests/fakes/ngc_api.py, a fake): NVIDIA's ngc CLI code drives it; jobs are its records.

    Besides ranks and verification jobs killed by SIGKILL, jobs are ended through the emulator's fault controls as
    the service would end them: KILLED_BY_SYSTEM, PREEMPTED (the backend resumes it), TASK_LOST.
    """

    name = "bcp"
    kinds = ("rank", "verify", "system-kill", "preempt", "lost")
    config_options = {"bcp": {"transport": "cli", "poll_min_seconds": 0.2, "poll_max_seconds": 0.5}}
    sample_seconds = 0.05
    SERVICE_ENDS = {"system-kill": "KILLED_BY_SYSTEM", "lost": "TASK_LOST"}

    def __init__(self, project: Path, pipeline: str) -> None:
        super().__init__(project, pipeline)
        self.fake = None

    def start(self) -> None:
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parent / "fakes"))
        from ngc_control import FakeNgc

        self.fake = FakeNgc(self.project / "ngc", tls_dir=self.project / "ngc-tls").start()
        self.fake.create_workspace(self._workspace_name())

    def close(self) -> None:
        if self.fake is not None:
            self.fake.shutdown()
            self.fake = None

    def env(self) -> dict[str, str]:
        assert self.fake is not None, "start() first"
        return self.fake.env()

    def _workspace_name(self) -> str:
        from bcp_pipeline.config import load_config

        return load_config(self.config, pipeline=self.pipeline).pipeline(self.pipeline).workspace.name

    def workspace(self) -> Path:
        return self.project / "ngc" / "workspaces" / self._workspace_name()

    def _jobs(self) -> list[tuple[int, str, str, dict]]:
        """(job id, stage, kind, record) of every job the emulator holds for this pipeline."""
        from ngc_control import read_state

        found = []
        for key, entry in read_state(self.project / "ngc")["jobs"].items():
            labels = _bcp_labels(entry["job"])
            stage = labels.get("bcpp_stage_")
            if stage is not None:
                found.append((int(key), stage, labels.get("bcpp_kind_", "stage"), entry))
        return found

    def _processes(self, entry: dict) -> list[int]:
        """The stage program processes of a job's replicas (python running a .py of the uploaded stages)."""
        groups = set(entry["emu"].get("pgids", []))
        return [pid for pid, pgid, argv in _processes() if pgid in groups and "/.bcp-pipeline/code/" in " ".join(argv)
                and any(a.endswith(".py") for a in argv) and "bcprun" not in " ".join(argv[:2])]

    def job_targets(self, kind: str) -> list[Target]:
        targets = []
        for job_id, stage, job_kind, entry in self._jobs():
            status = entry["job"]["jobStatus"]["status"]
            if status != "RUNNING":
                continue
            if kind in ("rank", "verify") and (kind == "verify") == (job_kind == "verify"):
                targets += [Target(kind, f"job {job_id} ({stage} {job_kind}) pid {pid}", sigkill(pid))
                            for pid in self._processes(entry)]
            elif kind == "preempt":
                targets.append(Target(kind, f"job {job_id} ({stage} {job_kind})",
                                      lambda job_id=job_id: self._end(job_id, "PREEMPTED")))
            elif kind in self.SERVICE_ENDS:
                targets.append(Target(kind, f"job {job_id} ({stage} {job_kind})",
                                      lambda job_id=job_id, kind=kind: self._end(job_id, self.SERVICE_ENDS[kind])))
        return targets

    def _end(self, job_id: int, status: str) -> None:
        from ngc_control import stop_job

        try:
            stop_job(self.project / "ngc", job_id, status, details=f"ended by scripts/chaos ({status})",
                     only_from=frozenset({"RUNNING"}))
        except ValueError:
            raise ProcessLookupError(job_id) from None  # it ended first: the monkey tries again

    def job_intervals(self) -> list[tuple[str, str, float, float]]:
        """From the emulator's records: first start to final end (a preempted and resumed job spans both)."""
        spans = []
        for job_id, stage, _kind, entry in self._jobs():
            status = entry["job"]["jobStatus"]
            if status.get("startedAt") and status.get("endedAt"):
                spans.append((stage, str(job_id), _iso_seconds(status["startedAt"]), _iso_seconds(status["endedAt"])))
        return spans

    def live_jobs(self) -> dict[str, set[str]]:
        """A job is alive while the emulator has it unfinished (a PREEMPTED job can be resumed) or while its
        replicas' processes still run (they get a grace period after the job ends)."""
        from ngc_control import TERMINAL_STATES

        live: dict[str, set[str]] = {}
        for job_id, stage, _kind, entry in self._jobs():
            status = entry["job"]["jobStatus"]["status"]
            if status not in TERMINAL_STATES or _any_group_alive(entry["emu"].get("pgids", [])):
                live.setdefault(stage, set()).add(f"{job_id} ({status})")
        return live


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
        import sys

        script = [sys.executable, str(Path(__file__).resolve().parent.parent / "scripts" / "slurm-cluster")]
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
        from bcp_pipeline.config import load_config

        config = load_config(self.config, pipeline=self.pipeline)
        options = config.options["slurm"]
        return (self.project / options.workspace_dir / config.pipeline(self.pipeline).workspace.name).resolve()

    def _queue(self) -> list[tuple[str, str, str, str]]:
        """(job id, stage, kind, state) of the latest run's jobs Slurm has not ended."""
        state = RunStore(self.project / ".bcp-pipeline").latest()
        if state is None:
            return []
        listing = subprocess.run(["squeue", "--noheader", "--format=%i|%j|%T"], capture_output=True, text=True,
                                 env=self.env(), timeout=30)
        if listing.returncode != 0:
            raise RuntimeError(f"squeue failed: {listing.stderr.strip()}")
        prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", state.run_id) + "."
        jobs = []
        for line in listing.stdout.splitlines():
            job_id, name, status = line.split("|")
            if name.startswith(prefix) and status not in SLURM_ENDED:
                rest = name[len(prefix):]
                kind = "verify" if rest.endswith(".verify") else "stage"
                jobs.append((job_id, rest.removesuffix(".verify").split(".")[0], kind, status))
        return jobs

    def job_targets(self, kind: str) -> list[Target]:
        jobs = self._queue()
        if kind == "scancel":
            return [Target(kind, f"job {job_id} ({stage} {job_kind}, {status})",
                           lambda job_id=job_id: self._scancel(job_id)) for job_id, stage, job_kind, status in jobs]
        running = {job_id: (stage, job_kind) for job_id, stage, job_kind, status in jobs
                   if status == "RUNNING" and (kind == "verify") == (job_kind == "verify")}
        return [Target(kind, f"job {job_id} ({running[job_id][0]} {running[job_id][1]}) task pid {pid}", sigkill(pid))
                for pid, job_id in _slurm_tasks(set(running))]

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
SLURM_ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
               "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"}


def _slurm_tasks(job_ids: set[str]) -> list[tuple[int, str]]:
    """(pid, Slurm job id) of the stage programs srun started for these jobs (python running a stages/*.py)."""
    found = []
    for pid, _pgid, argv in _processes():
        if not any(a.endswith(".py") for a in argv[1:3]) or not Path(argv[0]).name.startswith("python"):
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        job = next((e[len(b"SLURM_JOB_ID="):].decode() for e in environ if e.startswith(b"SLURM_JOB_ID=")), None)
        if job in job_ids and any(e.startswith(b"SLURM_PROCID=") for e in environ):
            found.append((pid, job))
    return found


def _iso_seconds(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _bcp_labels(job: dict) -> dict[str, str]:
    """`bcpp_stage_download` -> {"bcpp_stage_": "download"} from a job record's user labels (stage names as
    labels have `-` turned into `_`: still one key per stage)."""
    labels = {}
    for text in job.get("labels", {}).get("userLabels", {}).get("values", []):
        for prefix in ("bcpp_stage_", "bcpp_kind_", "bcpp_run_"):
            if text.startswith(prefix):
                labels[prefix] = text[len(prefix):]
    return labels


def _processes() -> list[tuple[int, int, list[str]]]:
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
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            found.append((int(entry.name), int(fields[2]), [a.decode(errors="replace") for a in argv if a]))
    return found


def _any_group_alive(pgids: list[int]) -> bool:
    for pgid in pgids:
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None  # not written yet, or caught between its write and rename on a slow poll: next sample


BACKENDS: dict[str, type[ChaosBackend]] = {"local": LocalChaos, "bcp": BcpChaos, "slurm": SlurmChaos}
