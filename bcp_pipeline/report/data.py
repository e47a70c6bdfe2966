"""The data of `bcp-pipeline report`: a pure function from a run's state, its training logs, the commands it
submitted and its estimates to plain dicts and lists (what the charts and tables of report_html.py show, and what
the golden tests compare). Times are seconds on the run's clock (0 = the run was created), rounded to the
millisecond, so the data of a stored run is the same on every machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bcp_pipeline.engine.state import JobRecord, RunState, StageState
from bcp_pipeline.redact import redact
from bcp_pipeline.report.estimates import PlanEstimate
from bcp_pipeline.report.mfu import cpu_peak
from bcp_pipeline.report.throughput import StageFacts, throughput_series
from bcp_pipeline.training_log import parse_training_log


@dataclass(frozen=True)
class SubmittedCommand:
    text: str
    source: str  # "recorded at submission" or "re-rendered from the config (not recorded at submission)"


def report_data(
    state: RunState,
    *,
    now: float,
    estimate: PlanEstimate | None = None,
    actual: dict[str, dict] | None = None,
    training_logs: dict[str, str] | None = None,
    commands: dict[str, SubmittedCommand] | None = None,
    secrets: list[str] | None = None,
    notes: list[str] | None = None,
    stage_facts: dict[str, StageFacts] | None = None,
    cpu_peak_tflops: float | None = None,
    heldout: dict[str, dict] | None = None,
) -> dict:
    """Everything the report shows. `training_logs` and `commands` are keyed by job id; `secrets` are redacted from
    every command line; `now` ends the bars of jobs still running. `stage_facts` and `cpu_peak_tflops` turn
    step times into tokens/s and MFU (report/throughput.py). `heldout`: per evaluate stage, the training it
    evaluates and its held-out losses (report/heldout.py), drawn beside that training's loss."""
    actual = actual or {}
    clock = _Clock(state.created_at, now)
    return {
        "run": {
            "run_id": state.run_id,
            "pipeline": state.pipeline,
            "backend": state.backend,
            "status": state.status,
            "created": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(state.created_at)),
            "elapsed_s": clock.at(_run_end(state, now)),
        },
        "timeline": [timeline_row(name, job, clock) for name, stage in state.stages.items() for job in stage.jobs],
        "stages": [stage_row(name, stage, actual.get(name) or {}, clock) for name, stage in state.stages.items()],
        "watched": [
            watched_row(name, job, clock)
            for name, stage in state.stages.items()
            for job in stage.jobs
            if job.stall or job.gpu_utilization
        ],
        "training": training_series(state, training_logs or {}, clock, heldout or {}),
        "throughput": throughput_series(
            _logs_by_stage(state, training_logs or {}),
            stage_facts or {},
            lambda processes: cpu_peak(cpu_peak_tflops, processes),
        ),
        "estimates": estimate_rows(state, estimate, actual) if estimate is not None else [],
        "commands": command_rows(state, commands or {}, secrets or []),
        "notes": list(notes or []),
    }


class _Clock:
    """Seconds since the run was created, to the millisecond."""

    def __init__(self, origin: float, now: float) -> None:
        self.origin, self.now = origin, now

    def at(self, moment: float | None) -> float | None:
        return None if moment is None else round(moment - self.origin, 3)


def _run_end(state: RunState, now: float) -> float:
    if state.status in ("running", "pending"):
        return now
    ends = [j.ended_at for s in state.stages.values() for j in s.jobs if j.ended_at is not None]
    ends += [s.finished_at for s in state.stages.values() if s.finished_at is not None]
    return max(ends, default=state.updated_at or now)


def timeline_row(stage: str, job: JobRecord, clock: _Clock) -> dict:
    """One job attempt as two intervals: queued (submitted -> first seen running), running (-> ended, or now).

    A job never seen running (it ended between two polls) has no queued interval: its whole time counts as
    running, and `start_observed` says so.
    """
    end = job.ended_at if job.ended_at is not None else clock.now
    start = job.started_at if job.started_at is not None else job.submitted_at
    return {
        "stage": stage,
        "job_id": job.job_id,
        "kind": job.kind,
        "attempt": job.attempt,
        "label": _job_label(stage, job),
        "state": job.state,
        "native": job.native,
        "finished": job.ended_at is not None,
        "submitted_s": clock.at(job.submitted_at),
        "started_s": clock.at(start),
        "ended_s": clock.at(end),
        "queued_s": round(start - job.submitted_at, 3),
        "running_s": round(end - start, 3),
        "start_observed": job.started_at is not None,
    }


def watched_row(stage: str, job: JobRecord, clock: _Clock) -> dict:
    """A training job as the run watched it: the stall guard's reason and the last lines it kept, where it found the
    job stalled; each replica's GPU utilization as last sampled, where the service measures it (BCP)."""
    sample = job.gpu_utilization or {}
    return {
        "stage": stage,
        "job_id": job.job_id,
        "state": job.state,
        "gpu_utilization": dict(sample.get("replicas") or {}) or None,
        "sampled_s": clock.at(sample.get("at")),
        "stall_reason": (job.stall or {}).get("reason"),
        "last_lines": list((job.stall or {}).get("last_lines") or []),
    }


def _job_label(stage: str, job: JobRecord) -> str:
    """The job's row name: its id where that already names the stage (`extract.verify.1`), else stage and kind."""
    if job.job_id.startswith(f"{stage}."):
        return job.job_id
    return f"{stage} {'verify ' if job.kind == 'verify' else ''}{job.job_id}"


def stage_row(name: str, stage: StageState, rates: dict, clock: _Clock) -> dict:
    """A stage's outcome: status, sharding, attempts, verification counts and its effective throughput."""
    verification = stage.verification or {}
    return {
        "stage": name,
        "status": stage.status.value,
        "attempts": stage.attempts,
        "sharding": (f"{stage.sharding['replicas']}x{stage.sharding['processes']}" if stage.sharding else None),
        "started_s": clock.at(stage.started_at),
        "finished_s": clock.at(stage.finished_at),
        "checks": [
            {"glob": c.get("glob"), "expected": c.get("expected"), "found": c.get("found"), "bytes": c.get("bytes")}
            for c in verification.get("checks", [])
        ],
        "steps": verification.get("steps"),
        "target_steps": verification.get("target"),
        "verified": verification.get("ok") if verification else None,
        "throughput": {key: round(value, 6) for key, value in rates.items()},
        "summary": stage.extra.get("summary"),
        "error": stage.error,
    }


def _task_scores(tasks) -> dict[str, dict[str, float | None]]:
    """A result's lm-evaluation-harness scores, numbers only (a log line is read, not trusted)."""
    if not isinstance(tasks, dict):
        return {}
    return {
        str(task): {str(m): _round(v) for m, v in scores.items() if isinstance(v, (int, float))}
        for task, scores in tasks.items()
        if isinstance(scores, dict)
    }


def training_series(
    state: RunState, logs: dict[str, str], clock: _Clock, heldout: dict[str, dict] | None = None
) -> list[dict]:
    """Per training stage, per attempt (stage job): loss and step points parsed from its log; with the held-out
    losses of the evaluate stages that evaluate it ("heldout": [{stage, points: [{step, loss, ...}]}]).

    `run_s` puts a point on the run's clock: the job's start plus the time the log gives since its first step
    (the program's start-up before that step is not in the log, so points sit slightly early).
    """
    series = []
    for name, stage in state.stages.items():
        attempts = []
        for job in stage.jobs:
            if job.kind != "stage" or job.job_id not in logs:
                continue
            start = job.started_at if job.started_at is not None else job.submitted_at
            points = [
                {**p.as_json(), "run_s": None if p.seconds is None else clock.at(start + p.seconds)}
                for p in parse_training_log(logs[job.job_id])
            ]
            attempts.append({"job_id": job.job_id, "attempt": job.attempt, "points": points})
        evaluations = [
            {
                "stage": found["stage"],
                "points": [
                    {
                        "step": p["step"],
                        "loss": _round(p["loss"]),
                        "perplexity": _round(p.get("perplexity")),
                        "tasks": _task_scores(p.get("tasks")),
                    }
                    for p in found["points"]
                ],
            }
            for found in (heldout or {}).values()
            if found["training"] == name and found["points"]
        ]
        if any(a["points"] for a in attempts):
            series.append({"stage": name, "attempts": attempts, "heldout": evaluations})
    return series


def estimate_rows(state: RunState, estimate: PlanEstimate, actual: dict[str, dict]) -> list[dict]:
    """Each stage's estimate next to its actual elapsed time (submission to verified, queueing included)."""
    rows = []
    for s in estimate.stages:
        if s.stage not in state.stages:
            continue
        elapsed = (actual.get(s.stage) or {}).get("elapsed_s")
        rows.append(
            {
                "stage": s.stage,
                "instance": s.instance,
                "nodes": s.nodes,
                "basis": s.basis or None,
                "modelled": s.modelled,
                "estimate_s": _round(s.seconds),
                "actual_s": _round(elapsed),
                "actual_over_estimate": (round(elapsed / s.seconds, 3) if elapsed and s.seconds else None),
                "node_hours": _round(s.node_hours),
                "gpu_hours": _round(s.gpu_hours),
            }
        )
    return rows


def command_rows(state: RunState, commands: dict[str, SubmittedCommand], secrets: list[str]) -> list[dict]:
    """Every job's submitted command line (a script on Slurm), secret values redacted."""
    rows = []
    for name, stage in state.stages.items():
        for job in stage.jobs:
            command = commands.get(job.job_id)
            rows.append(
                {
                    "stage": name,
                    "job_id": job.job_id,
                    "kind": job.kind,
                    "attempt": job.attempt,
                    "text": redact(command.text, secrets) if command else None,
                    "source": command.source if command else "not available",
                }
            )
    return rows


def _logs_by_stage(state: RunState, logs: dict[str, str]) -> dict[str, dict[str, str]]:
    """The training logs (keyed by job id) grouped by stage, in the run's order."""
    grouped: dict[str, dict[str, str]] = {}
    for name, stage in state.stages.items():
        mine = {job.job_id: logs[job.job_id] for job in stage.jobs if job.kind == "stage" and job.job_id in logs}
        if mine:
            grouped[name] = mine
    return grouped


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
