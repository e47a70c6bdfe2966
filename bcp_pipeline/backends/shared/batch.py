"""What the batch-scheduler backends (Slurm, Grid Engine) share: job names, the job-side paths, and the base class
with their common set-up, per-rank log files, `logs` and `progress`."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcp_pipeline.backends.contract import Backend, JobProgress, outage_seconds
from bcp_pipeline.backends.shared.logs import (
    follow_files,
    indent,
    job_running,
    joined_logs,
    last_lines,
    progress_from_logs,
    read_tail,
)
from bcp_pipeline.errors import SubmissionError

NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True, kw_only=True)
class Paths:
    """Where things are as a cluster's nodes see them (the same paths as on the submit host)."""

    workspace: str
    code: str  # the stages/ folder
    run_dir: str  # holds logs/
    python: str | None  # None: the default (the orchestrator's interpreter, python3 in a container)
    orchestrator_python: str

    @property
    def logs(self) -> str:
        return f"{self.run_dir}/logs"


def job_name(run_id: str, stage: str, kind: str) -> str:
    """`RUN.STAGE` or `RUN.STAGE.verify` (stage names never hold '.'), safe for `squeue --name`, `qsub -N` and
    file names."""
    return NAME_UNSAFE.sub("_", f"{run_id}.{stage}" + (".verify" if kind == "verify" else ""))


def paths_for(
    options: Any, *, config_dir: Path, stages_dir: Path, run_dir: Path, workspace_name: str, orchestrator_python: str
) -> Paths:
    """The job-side paths: the workspace folder (relative to the config file), stages/ and the run folder."""
    workspace = (config_dir / options.workspace_dir / workspace_name).resolve()
    return Paths(
        workspace=str(workspace),
        code=str(stages_dir),
        run_dir=str(run_dir),
        python=options.python,
        orchestrator_python=orchestrator_python,
    )


class BatchBackend(Backend):
    """The part of a batch-scheduler backend that does not depend on the scheduler: the job-side paths, the poll
    intervals and outage limit from its options, and the logs. Each rank of a job writes
    `<run>/logs/JOBID/rank-NNNNN.log`; the scheduler's own log files of the job are `scheduler_logs`."""

    def __init__(self, options: Any, *, config_dir: Path, stages_dir: Path, run_dir: Path, workspace_name: str) -> None:
        self.options = options
        self.run_dir = run_dir
        self.logs_dir = run_dir / "logs"
        self.paths = paths_for(
            options,
            config_dir=config_dir,
            stages_dir=stages_dir,
            run_dir=run_dir,
            workspace_name=workspace_name,
            orchestrator_python=sys.executable,
        )
        self.local_workspace = Path(self.paths.workspace)
        self.poll_min_seconds = options.poll_seconds
        self.poll_max_seconds = max(options.poll_seconds, options.poll_max_seconds)
        self.status_outage_seconds = outage_seconds(options.status_outage_limit)

    def scheduler_logs(self, job_id: str) -> list[Path]:
        """The scheduler's own log files of the job (its batch script's output), in `logs`' order."""
        return []

    def other_logs(self, job_id: str) -> list[Path]:
        """Where else the job's output went, when it has neither rank logs nor scheduler logs of ours."""
        return []

    def missing_rank_log(self, job_id: str, rank: int, path: Path) -> str:
        """The error text when rank `rank` has no log."""
        return f"job {job_id} has no log for rank {rank} ({path})"

    def rank_log(self, job_id: str, rank: int) -> Path:
        return self.logs_dir / job_id / f"rank-{rank:05d}.log"

    def rank_logs(self, job_id: str) -> list[Path]:
        return sorted((self.logs_dir / job_id).glob("rank-*.log"))

    def logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> str:
        if rank is not None:
            path = self.rank_log(job_id, rank)
            if not path.is_file():
                raise SubmissionError(self.missing_rank_log(job_id, rank, path))
            paths = [path]
        else:
            paths = self.rank_logs(job_id) + [p for p in self.scheduler_logs(job_id) if p.stat().st_size]
            paths = paths or self.other_logs(job_id)
            if not paths:
                raise SubmissionError(f"job {job_id} has no logs yet under {self.logs_dir}")
        return joined_logs(paths, tail)

    def follow_logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> Iterator[str]:
        """The rank logs (one rank's when given) and the scheduler's, followed as files, until the job ends."""
        if rank is not None:

            def paths() -> list[Path]:
                return [self.rank_log(job_id, rank)]
        else:

            def paths() -> list[Path]:
                return self.rank_logs(job_id) + [p for p in self.scheduler_logs(job_id) if p.is_file()]

        return follow_files(
            paths, lambda: job_running(self, job_id), tail=tail, interval=min(self.poll_max_seconds, 2.0)
        )

    def progress(self, job_id: str, *, training: bool = False) -> JobProgress | None:
        return progress_from_logs([read_tail(path, 8192) for path in self.rank_logs(job_id)], training=training)

    def rank_log_tail(self, job_id: str, rank: int) -> str:
        """`last lines of LOG:` and the end of rank `rank`'s log, for a failure's explanation."""
        log = self.rank_log(job_id, rank)
        return f"last lines of {log}:\n" + indent(last_lines(read_tail(log), 15) or "(empty)")
