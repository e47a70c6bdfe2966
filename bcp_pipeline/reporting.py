"""What the user sees: live progress while a run is driven, and the status table of a run."""

from __future__ import annotations

import sys
import time
from typing import IO

from .durations import format_elapsed
from .estimates import PlanEstimate, format_seconds
from .state import RunState, StageState, StageStatus


def stage_elapsed(stage: StageState, now: float | None = None) -> str:
    if stage.started_at is None:
        return "-"
    end = stage.finished_at or (now or time.time())
    return format_elapsed(end - stage.started_at)


def progress_text(stage: StageState) -> str:
    if not stage.progress:
        return "-"
    p = stage.progress
    return f"{p['done']}/{p['total']} {p.get('unit', '')}".strip()


def verification_text(stage: StageState) -> str:
    result = stage.verification
    if not result:
        return "-"
    parts = [f"{c['found']}/{c['expected']}" for c in result.get("checks", [])]
    if "steps" in result:
        parts.append(f"step {result['steps']}/{result['target']}")
    return ", ".join(parts) or "-"


def status_rows(state: RunState, job_url=None) -> list[list[str]]:
    rows = [["STAGE", "STATUS", "JOBS", "SHARDING", "TRIES", "ELAPSED", "PROGRESS", "VERIFIED"]]
    for name, stage in state.stages.items():
        jobs = ", ".join(f"{j.job_id}{'*' if j.kind == 'verify' else ''}({j.native or j.state})" for j in stage.jobs[-3:])
        sharding = f"{stage.sharding['replicas']}x{stage.sharding['processes']}" if stage.sharding else "-"
        rows.append([name, stage.status.value, jobs or "-", sharding, str(stage.attempts), stage_elapsed(stage),
                     progress_text(stage), verification_text(stage)])
    return rows


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def estimate_rows(state: RunState, estimate: PlanEstimate, actual: dict[str, dict]) -> list[list[str]]:
    """Each started stage's estimate next to its elapsed time, and its effective throughput."""
    rows = [["STAGE", "ESTIMATE", "ELAPSED", "ITEMS/S", "MB/S", "PER CORE", "STEPS/S"]]
    estimates = {s.stage: s for s in estimate.stages}
    for name, rates in actual.items():
        if not rates:
            continue
        per_core = (f"{rates['tokens_per_s_per_core']:,.0f} tokens/s" if "tokens_per_s_per_core" in rates else
                    f"{rates['mb_per_s_per_core']:.3g} MB/s" if "mb_per_s_per_core" in rates else "-")
        rows.append([name, format_seconds(estimates[name].seconds if name in estimates else None),
                     format_elapsed(rates["elapsed_s"]), _rate(rates.get("items_per_s")), _rate(rates.get("mb_per_s")),
                     per_core, _rate(rates.get("steps_per_s"))])
    return rows


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def render_status(state: RunState, job_url=None, estimate: PlanEstimate | None = None,
                  actual: dict[str, dict] | None = None) -> str:
    """The `status` view: a table of stages, estimate against actual (when given), then errors with log tails."""
    lines = [f"run {state.run_id}  pipeline {state.pipeline}  backend {state.backend}  status {state.status}", "",
             format_table(status_rows(state))]
    if estimate is not None and actual and any(actual.values()):
        lines += ["", "estimate against actual (elapsed includes queueing and verification):",
                  format_table(estimate_rows(state, estimate, actual))]
    summaries = [f"{name}: {stage.extra['summary']}" for name, stage in state.stages.items()
                 if stage.extra.get("summary") and stage.status is StageStatus.SUCCEEDED]
    if summaries:
        lines += [""] + summaries
    for name, stage in state.stages.items():
        if stage.error:
            lines += ["", f"{name}: {stage.error}"]
    if job_url:
        urls = [(name, job.job_id, job_url(job.job_id)) for name, stage in state.stages.items() for job in stage.jobs[-1:]]
        urls = [u for u in urls if u[2]]
        if urls:
            lines += [""] + [f"{name}: {url}" for name, _, url in urls]
    lines += ["", "(* = verification job)"] if any(j.kind == "verify" for s in state.stages.values() for j in s.jobs) else []
    return "\n".join(lines)


class Reporter:
    """Prints events as they happen and, every few seconds, one progress line per running stage."""

    def __init__(self, stream: IO[str] | None = None, interval: float = 5.0) -> None:
        self.stream = stream or sys.stdout
        self.interval = interval
        self._last_progress = 0.0
        self._started = time.monotonic()

    def _print(self, text: str) -> None:
        stamp = format_elapsed(time.monotonic() - self._started)
        self.stream.write(f"[{stamp:>6}] {text}\n")
        self.stream.flush()

    def event(self, text: str) -> None:
        self._print(text)

    def update(self, state: RunState, final: bool = False) -> None:
        if final:
            self.stream.write("\n" + render_status(state) + "\n")
            self.stream.flush()
            return
        now = time.monotonic()
        if now - self._last_progress < self.interval:
            return
        self._last_progress = now
        for name, stage in state.stages.items():
            if stage.status in (StageStatus.RUNNING, StageStatus.VERIFYING):
                job = stage.jobs[-1].job_id if stage.jobs else "-"
                self._print(f"{name}: {stage.status.value} job {job}, {stage_elapsed(stage)} elapsed, "
                            f"progress {progress_text(stage)}")
