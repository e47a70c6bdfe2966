"""The embedded local backend: a stage of R replicas x P processes runs R*P local processes.

A folder stands in for the workspace (`${workspace}` is that folder). Each job gets a detached supervisor
(supervisor.py) that outlives the orchestrator, so resume re-attaches to jobs still running. Job ids are
`STAGE.N` and `STAGE.verify.N`; each job's rank logs go to `<run>/logs/<job id>/rank-NNNNN.log`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bcp_pipeline.atomic import atomic_write_json
from bcp_pipeline.backends.contract import (
    Backend,
    JobProgress,
    JobRequest,
    JobState,
    JobStatus,
    Submission,
    outage_seconds,
)
from bcp_pipeline.backends.local.states import STATE_MAP
from bcp_pipeline.backends.local.supervisor import LOST_RANK_GRACE_SECONDS
from bcp_pipeline.backends.shared.command import placeholder_values, rendezvous, resolved_env, shell_join, stage_command
from bcp_pipeline.backends.shared.logs import (
    follow_files,
    indent,
    job_running,
    joined_logs,
    last_lines,
    progress_from_logs,
    read_tail,
)
from bcp_pipeline.config.resources import LocalOptions
from bcp_pipeline.errors import SubmissionError
from bcp_pipeline.procs import is_alive, process_start_ticks, signal_group

CANCEL_MARKER = "cancel-requested"
# What the stage program stands in for, on this machine, where a stage declares a training engine.
STANDING_IN = {"nemo": "NeMo launcher training", "megatron_bridge": "Megatron-Bridge training"}
MASTER_PORT_BASE, MASTER_PORT_SPAN = 20000, 20000  # a job's MASTER_PORT: BASE + crc32(run/job id) % SPAN


class LocalBackend(Backend):
    name = "local"

    def __init__(
        self, options: LocalOptions, *, config_dir: Path, stages_dir: Path, run_dir: Path, workspace_name: str
    ) -> None:
        self.options = options
        self.stages_dir = stages_dir
        self.run_dir = run_dir.absolute()  # the supervisor runs in the workspace: a relative path names nothing there
        self.workspace_dir = (config_dir / options.workspace_dir / workspace_name).resolve()
        self.local_workspace = self.workspace_dir
        self.poll_min_seconds = options.poll_seconds
        self.poll_max_seconds = max(options.poll_seconds, 2.0)
        self.status_outage_seconds = outage_seconds(options.status_outage_limit)
        self._launched: list[subprocess.Popen] = []  # reaped in poll() so finished supervisors leave no zombies

    # -- rendering (pure) ------------------------------------------------------------------------------
    def values(self, request: JobRequest) -> dict[str, str]:
        return placeholder_values(
            request,
            workspace=str(self.workspace_dir),
            results=str(self.run_dir / "results" / request.stage.name),
            code=str(self.stages_dir),
            python=self.options.python or sys.executable,
        )

    def sharding(self, request: JobRequest) -> dict[str, int]:
        layout = request.rank_layout("local")
        return {"replicas": layout.nodes, "processes": layout.per_node}

    def render(self, request: JobRequest) -> Submission:
        values = self.values(request)
        argv = stage_command(request, "local", values)
        sharding = self.sharding(request)
        if sharding["replicas"] < 1 or sharding["processes"] < 1:
            raise SubmissionError(f"stage {request.stage.name}: replicas and processes must be >= 1, got {sharding}")
        env = {
            "BCP_PIPELINE_RUN_ID": request.run_id,
            "BCP_PIPELINE_STAGE": request.stage.name,
            **resolved_env(request, "local", values),
        }
        world = sharding["replicas"] * sharding["processes"]
        env_text = " ".join(f"{k}={shell_join([v])}" for k, v in env.items())
        stands_in = (
            f"# the local stand-in for the stage's {STANDING_IN[request.stage.engine]}: "
            f"{request.program} here, not the real training\n"
            if request.kind == "stage" and request.stage.engine and not request.resources("local").command
            else ""
        )
        printable = (
            f"{stands_in}# {sharding['replicas']} replica(s) x {sharding['processes']} process(es): "
            f"RANK 0..{world - 1} of WORLD_SIZE {world}; workspace {self.workspace_dir}\n"
            f"{env_text} {shell_join(argv)}"
        )
        payload = {
            "argv": argv,
            "env": env,
            **sharding,
            "labels": {"run": request.run_id, "stage": request.stage.name, "kind": request.kind},
        }
        # Every replica is a group of processes on this machine, so they all meet on loopback; the port is fixed
        # at submit time (supervisor.py rank_environment), when the job id it derives from exists.
        meet = rendezvous(
            request.rank_layout("local"),
            "127.0.0.1",
            f"{MASTER_PORT_BASE} + crc32(RUN/JOB_ID) % {MASTER_PORT_SPAN}, fixed at submit",
        )
        return Submission(request=request, printable=printable, payload=payload, rendezvous=meet)

    # -- side effects ------------------------------------------------------------------------------------
    def submit(self, submission: Submission) -> str:
        request = submission.request
        self.workspace_dir.mkdir(parents=True, exist_ok=True)
        job_id, job_dir = self._claim_job_dir(request)
        try:
            return self._start(submission, job_id, job_dir)
        except OSError:
            # Half made (a full disk): undone, so that no restart adopts a job whose supervisor could not run.
            self._undo(job_dir)
            raise

    def _start(self, submission: Submission, job_id: str, job_dir: Path) -> str:
        request = submission.request
        spec = {
            **submission.payload,
            "job_id": job_id,
            "cwd": str(self.workspace_dir),
            "log_dir": str(self.run_dir / "logs" / job_id),
            # A per-job port keeps concurrent local jobs from colliding if a program opens one.
            "master_port": MASTER_PORT_BASE + zlib.crc32(f"{request.run_id}/{job_id}".encode()) % MASTER_PORT_SPAN,
            "lost_rank_grace_seconds": LOST_RANK_GRACE_SECONDS,
            # The supervisor starts no rank once this process is gone (supervisor.py start_ranks).
            "orchestrator": {"pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid())},
        }
        atomic_write_json(job_dir / "spec.json", spec)
        with open(job_dir / "supervisor.log", "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "bcp_pipeline.backends.local.supervisor", str(job_dir)],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(self.workspace_dir),
                env={**os.environ, "PYTHONPATH": _package_root()},
            )
        self._launched.append(process)
        atomic_write_json(
            job_dir / "launch.json", {"pid": process.pid, "start_ticks": process_start_ticks(process.pid)}
        )
        return job_id

    def _undo(self, job_dir: Path) -> None:
        for process in [p for p in self._launched if list(p.args)[-1] == str(job_dir)]:  # type: ignore[arg-type]
            signal_group(process.pid, signal.SIGKILL)
            process.wait()
            self._launched.remove(process)
        shutil.rmtree(job_dir, ignore_errors=True)

    def _claim_job_dir(self, request: JobRequest) -> tuple[str, Path]:
        jobs = self.run_dir / "jobs"
        jobs.mkdir(parents=True, exist_ok=True)
        prefix = request.stage.name + (".verify" if request.kind == "verify" else "")
        number = 1
        while True:
            job_id = f"{prefix}.{number}"
            try:
                (jobs / job_id).mkdir()  # atomic claim: two orchestrators never share a job id
                return job_id, jobs / job_id
            except FileExistsError:
                number += 1

    def poll(self, job_ids: list[str]) -> dict[str, JobStatus]:
        self._launched = [p for p in self._launched if p.poll() is None]
        return {job_id: status for job_id in job_ids if (status := self._status(job_id)) is not None}

    def _status(self, job_id: str) -> JobStatus | None:
        job_dir = self.run_dir / "jobs" / job_id
        if not (job_dir / "spec.json").is_file():
            return None
        status = _read_json(job_dir / "status.json")
        launch = _read_json(job_dir / "launch.json")
        cancelled = (job_dir / CANCEL_MARKER).exists()
        if status is None:
            # Submitted but the supervisor has not written its status yet (or died before it could).
            if launch and not is_alive(launch["pid"], launch.get("start_ticks")):
                if cancelled:
                    return JobStatus(job_id=job_id, state=JobState.CANCELLED, native="cancelled")
                return JobStatus(
                    job_id=job_id,
                    state=JobState.LOST,
                    native="lost",
                    detail="the job's supervisor exited before starting any rank",
                )
            return JobStatus(job_id=job_id, state=JobState.QUEUED, native="queued")
        native = status["state"]
        if native in ("starting", "running") and not is_alive(status["pid"], status.get("start_ticks")):
            if _stop_orphaned_ranks(status):
                return JobStatus(
                    job_id=job_id,
                    state=JobState.RUNNING,
                    native="running",
                    detail="its supervisor died; stopping its ranks",
                )
            if cancelled:
                return JobStatus(job_id=job_id, state=JobState.CANCELLED, native="cancelled")
            return JobStatus(
                job_id=job_id,
                state=JobState.LOST,
                native="lost",
                detail=f"the job's supervisor (pid {status['pid']}) died without a result",
            )
        # A rank with no exit code (None) had not ended when the supervisor wrote its last status: a cancelled job's
        # ranks are killed and may be recorded before they are reaped.
        codes = [code for code in status.get("exit_codes") or [] if code is not None]
        failed = [
            f"rank {rank} exited {code}"
            for rank, code in enumerate(status.get("exit_codes") or [])
            if code not in (0, None) and native != "lost"
        ]  # a lost job's ranks were stopped: its reason says
        return JobStatus(
            job_id=job_id,
            state=STATE_MAP.get(native, JobState.UNKNOWN),
            native=native,
            detail="; ".join([*filter(None, [status.get("reason")]), *_lost_rank_note(status), *failed]),
            exit_code=max(codes, key=abs) if codes else None,
        )

    def find_active(self, run_id: str, stage: str, kind: str) -> list[str]:
        return [job_id for job_id, status in self._labelled(run_id, stage, kind) if not status.state.finished]

    def find_submitted(self, run_id: str, stage: str, kind: str) -> list[str]:
        return [job_id for job_id, _status in self._labelled(run_id, stage, kind)]

    def _labelled(self, run_id: str, stage: str, kind: str) -> list[tuple[str, JobStatus]]:
        """This run's job records with these labels and a readable status, oldest first."""
        jobs = self.run_dir / "jobs"
        if not jobs.is_dir():
            return []
        found = []
        for job_dir in sorted(jobs.iterdir(), key=_claim_order):
            spec = _read_json(job_dir / "spec.json")
            if spec and spec["labels"] == {"run": run_id, "stage": stage, "kind": kind}:
                status = self._status(job_dir.name)
                if status is not None:
                    found.append((job_dir.name, status))
        return found

    def _rank_logs(self, job_id: str) -> list[Path]:
        return sorted((self.run_dir / "logs" / job_id).glob("rank-*.log"))

    def logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> str:
        paths = self._rank_logs(job_id)
        if rank is not None:
            paths = [p for p in paths if p.name == f"rank-{rank:05d}.log"]
            if not paths:
                raise SubmissionError(f"job {job_id} has no log for rank {rank}")
        return joined_logs(paths, tail)

    def follow_logs(self, job_id: str, rank: int | None = None, tail: int | None = None) -> Iterator[str]:
        """The rank logs (one rank's when given), followed as files, until the job ends."""

        def paths() -> list[Path]:
            return [p for p in self._rank_logs(job_id) if rank is None or p.name == f"rank-{rank:05d}.log"]

        return follow_files(paths, lambda: job_running(self, job_id), tail=tail, interval=self.poll_min_seconds)

    def progress(self, job_id: str, *, training: bool = False) -> JobProgress | None:
        return progress_from_logs([read_tail(path, 8192) for path in self._rank_logs(job_id)], training=training)

    def failure_detail(self, job_id: str, status: JobStatus) -> str:
        spec = _read_json(self.run_dir / "jobs" / job_id / "status.json") or {}
        codes = spec.get("exit_codes") or []
        lines = [status.detail] if status.detail else []
        if status.state is JobState.LOST and not codes:  # no rank started: why is in the supervisor's own log
            lines += supervisor_log_excerpt(self.run_dir / "jobs" / job_id / "supervisor.log")
        lost = (spec.get("lost_rank") or {}).get("rank")
        for rank, code in sorted(enumerate(codes), key=lambda pair: pair[0] != lost):  # the killed rank's first
            if code != 0:
                log = self.run_dir / "logs" / job_id / f"rank-{rank:05d}.log"
                lines.append(
                    f"rank {rank} exited {code}; last lines of {log}:\n" + indent(last_lines(read_tail(log), 15))
                )
                break  # the first failing rank's tail; `bcp-pipeline logs` shows the others
        return "\n".join(lines)

    def cancel(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            job_dir = self.run_dir / "jobs" / job_id
            owner = _read_json(job_dir / "status.json") or _read_json(job_dir / "launch.json")
            if not owner or not is_alive(owner["pid"], owner.get("start_ticks")):
                continue
            (job_dir / CANCEL_MARKER).touch()  # first: a poll racing with the kill reports cancelled, not lost
            signal_group(owner["pid"], signal.SIGTERM)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and is_alive(owner["pid"], owner.get("start_ticks")):
                time.sleep(0.1)
            if is_alive(owner["pid"], owner.get("start_ticks")):
                signal_group(owner["pid"], signal.SIGKILL)
            status = _read_json(job_dir / "status.json") or {}
            if status.get("state") in (None, "starting", "running"):
                atomic_write_json(job_dir / "status.json", {**owner, "state": "cancelled", "ended_at": time.time()})

    @classmethod
    def check_service(cls, given: Any) -> Any:
        from bcp_pipeline.backends.local.check import check_local  # its probes' imports load only for `check`

        return check_local(given)


def _claim_order(job_dir: Path) -> tuple[str, int]:
    """`STAGE[.verify].N` by prefix, then N as a number (so .10 follows .9)."""
    prefix, _, number = job_dir.name.rpartition(".")
    return (prefix, int(number)) if number.isdigit() else (job_dir.name, 0)


def _lost_rank_note(record: dict) -> list[str]:
    """What the supervisor did after a rank was killed by a signal (supervisor.py wait_for_ranks), as a line."""
    lost = record.get("lost_rank")
    if not lost:
        return []
    try:
        name = signal.Signals(lost["signal"]).name
    except ValueError:
        name = f"signal {lost['signal']}"
    stopped = ", ".join(str(rank) for rank in lost["stopped"])
    return [
        f"rank {lost['rank']} was killed by {name}; the supervisor stopped rank(s) {stopped} after "
        f"{lost['grace_seconds']:g} s, as they may wait for it for ever"
    ]


def _stop_orphaned_ranks(record: dict) -> bool:
    """SIGKILL the ranks a dead supervisor left running; True while any of them still runs.

    A supervisor killed on its own (OOM killer, a stray kill) does not take its ranks with it. The job is lost,
    but until its ranks are gone it must not count as ended: the stage would be submitted again while they still
    write its files (found by tests/chaos: two pretrain jobs writing one checkpoint folder). The ranks and their
    own children are in the supervisor's process group, and while a recorded rank lives that group id cannot have
    been reused, so the group kill reaches exactly them.
    """
    alive = [rank for rank in record.get("ranks", []) if is_alive(rank["pid"], rank.get("start_ticks"))]
    if alive:
        signal_group(record["pid"], signal.SIGKILL)
    return bool(alive)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


SUPERVISOR_LOG_LINES = 12  # a supervisor that died at once wrote a short traceback: its head and its last lines


def supervisor_log_excerpt(path: Path) -> list[str]:
    """The supervisor's log, as lines for a failure's explanation (none when it wrote nothing): its first lines
    and, where it is longer, its last ones (a traceback's error is its last line)."""
    lines = read_tail(path).rstrip("\n").splitlines()
    if not lines:
        return []
    if len(lines) > 2 * SUPERVISOR_LOG_LINES:
        lines = lines[:SUPERVISOR_LOG_LINES] + ["..."] + lines[-SUPERVISOR_LOG_LINES:]
    return [f"{path}:", indent("\n".join(lines))]


def _package_root() -> str:
    """The folder holding the bcp_pipeline package, so the supervisor imports the same code."""
    root = str(Path(__file__).resolve().parents[2])
    existing = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{existing}" if existing else root


BACKEND = LocalBackend
