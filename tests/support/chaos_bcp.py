"""The emulated BCP for the chaos run (tests/fakes/ngc_api.py, a fake, named so): targets and live jobs."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

from support.chaos_backends import ChaosBackend, processes, sigkill
from support.chaos_monkey import Target
from support.reaper import shutdown_emulator_when_gone

FAKES = Path(__file__).resolve().parents[1] / "fakes"


class BcpChaos(ChaosBackend):
    """The emulated BCP (tests/fakes/ngc_api.py, a fake): NVIDIA's ngc CLI code drives it; jobs are its records.

    Besides ranks and verification jobs killed by SIGKILL, jobs are ended through the emulator's fault controls as
    the service would end them: KILLED_BY_SYSTEM, PREEMPTED (the backend resumes it), TASK_LOST.
    """

    name = "bcp"
    kinds = ("rank", "verify", "system-kill", "preempt", "lost")
    # lookup_grace_seconds: the emulator lists a new job at once (no lag variant here), so a resumed orchestrator
    # need not wait the default minute for a job that a kill before the submit call never created
    config_options = {
        "bcp": {"transport": "cli", "poll_min_seconds": 0.2, "poll_max_seconds": 0.5, "lookup_grace_seconds": 2}
    }
    sample_seconds = 0.05
    SERVICE_ENDS = {"system-kill": "KILLED_BY_SYSTEM", "lost": "TASK_LOST"}

    def __init__(self, project: Path, pipeline: str) -> None:
        super().__init__(project, pipeline)
        self.fake = None
        self._disarm = lambda: None

    def start(self) -> None:
        if str(FAKES) not in sys.path:
            sys.path.insert(0, str(FAKES))
        from ngc_control import FakeNgc

        self.fake = FakeNgc(self.project / "ngc", tls_dir=self.project / "ngc-tls").start()
        self._disarm = shutdown_emulator_when_gone(self.fake)
        self.fake.create_workspace(self._workspace_name())

    def close(self) -> None:
        if self.fake is not None:
            self.fake.shutdown()
            self._disarm()
            self.fake = None

    def env(self) -> dict[str, str]:
        assert self.fake is not None, "start() first"
        return self.fake.env()

    def _workspace_name(self) -> str:
        from bcp_pipeline.config.load import load_config

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
        return [
            pid
            for pid, pgid, argv in processes()
            if pgid in groups
            and "/.bcp-pipeline/code/" in " ".join(argv)
            and any(a.endswith(".py") for a in argv)
            and "bcprun" not in " ".join(argv[:2])
        ]

    def job_targets(self, kind: str) -> list[Target]:
        targets = []
        for job_id, stage, job_kind, entry in self._jobs():
            status = entry["job"]["jobStatus"]["status"]
            if status != "RUNNING":
                continue
            if kind in ("rank", "verify") and (kind == "verify") == (job_kind == "verify"):
                targets += [
                    Target(kind, f"job {job_id} ({stage} {job_kind}) pid {pid}", sigkill(pid))
                    for pid in self._processes(entry)
                ]
            elif kind == "preempt":
                targets.append(
                    Target(
                        kind, f"job {job_id} ({stage} {job_kind})", lambda job_id=job_id: self._end(job_id, "PREEMPTED")
                    )
                )
            elif kind in self.SERVICE_ENDS:
                targets.append(
                    Target(
                        kind,
                        f"job {job_id} ({stage} {job_kind})",
                        lambda job_id=job_id, kind=kind: self._end(job_id, self.SERVICE_ENDS[kind]),
                    )
                )
        return targets

    def _end(self, job_id: int, status: str) -> None:
        from ngc_control import stop_job

        try:
            stop_job(
                self.project / "ngc",
                job_id,
                status,
                details=f"ended by tests/chaos ({status})",
                only_from=frozenset({"RUNNING"}),
            )
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


def _iso_seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _bcp_labels(job: dict) -> dict[str, str]:
    """`bcpp_stage_download` -> {"bcpp_stage_": "download"} from a job record's user labels (stage names as
    labels have `-` turned into `_`: still one key per stage)."""
    labels = {}
    for text in job.get("labels", {}).get("userLabels", {}).get("values", []):
        for prefix in ("bcpp_stage_", "bcpp_kind_", "bcpp_run_"):
            if text.startswith(prefix):
                labels[prefix] = text[len(prefix) :]
    return labels


def _any_group_alive(pgids: list[int]) -> bool:
    for pgid in pgids:
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            continue
    return False
