"""What the user sees: live progress while a run is driven, the status table of a run, and `plan`'s estimates."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import IO

from bcp_pipeline.backends.contract import JobState
from bcp_pipeline.config.durations import format_elapsed
from bcp_pipeline.engine.state import JobRecord, RunState, StageState, StageStatus
from bcp_pipeline.report.estimates import PlanEstimate, short_number
from bcp_pipeline.report.heldout import heldout_line
from bcp_pipeline.report.throughput import summary_text


def stage_elapsed(stage: StageState, now: float | None = None) -> str:
    if stage.started_at is None:
        return "-"
    end = stage.finished_at or (now or time.time())
    return format_elapsed(end - stage.started_at)


def progress_text(stage: StageState) -> str:
    """`12/60 steps`; a training's also its last loss and, where its tokens per step are known, tokens/s."""
    if not stage.progress:
        return "-"
    p = stage.progress
    parts = [f"{p['done']:,}/{p['total']:,} {p.get('unit', '')}".strip()]
    if p.get("loss") is not None:
        parts.append(f"loss {p['loss']:.3g}")
    if p.get("step_seconds") and p.get("tokens_per_step"):
        parts.append(f"{short_number(p['tokens_per_step'] / p['step_seconds'])} tokens/s")
    return ", ".join(parts)


UNVERIFIED = "none"  # VERIFIED of a stage that succeeded with no verification: nothing checked its outputs


def verification_text(stage: StageState) -> str:
    result = stage.verification
    if not result:
        return UNVERIFIED if unverified(stage) else "-"
    parts = [f"{c['found']}/{c['expected']}" for c in result.get("checks", [])]
    if "steps" in result:
        parts.append(f"step {result['steps']}/{result['target']}")
    return ", ".join(parts) or "-"


def unverified(stage: StageState) -> bool:
    """Succeeded on its job's exit status alone: the stage has no `verify:` (no verification job ever ran)."""
    return (
        stage.status is StageStatus.SUCCEEDED
        and not stage.verification
        and not any(job.kind == "verify" for job in stage.jobs)
    )


def status_rows(state: RunState, job_url=None) -> list[list[str]]:
    rows = [["STAGE", "STATUS", "JOBS", "SHARDING", "TRIES", "ELAPSED", "PROGRESS", "VERIFIED"]]
    for name, stage in state.stages.items():
        jobs = ", ".join(
            f"{shown_job_id(state.run_id, name, j.job_id)}{'*' if j.kind == 'verify' else ''}({job_state_text(j)})"
            for j in stage.jobs[-3:]
        )
        sharding = f"{stage.sharding['replicas']}x{stage.sharding['processes']}" if stage.sharding else "-"
        rows.append(
            [
                name,
                stage.status.value,
                jobs or "-",
                sharding,
                str(stage.attempts),
                stage_elapsed(stage),
                progress_text(stage),
                verification_text(stage),
            ]
        )
    return rows


def job_state_text(job: JobRecord) -> str:
    """A job's state in the table: the service's own name for it, or the run's where the run decided it (a job the
    stall guard cancelled is `stalled`, whatever the service calls a cancelled job)."""
    return job.state if job.state == JobState.STALLED.value else job.native or job.state


STALL_LINES_SHOWN = 10  # of the last lines kept with a stalled job (engine/stall_guard.py keeps more)


def stall_lines(name: str, stage: StageState) -> list[str]:
    """The stage's latest stalled job: why it counted as stalled, and the last lines of its training log."""
    stalled = [job for job in stage.jobs if job.stall]
    if not stalled:
        return []
    job = stalled[-1]
    count = f" (stalled jobs: {len(stalled)})" if len(stalled) > 1 else ""
    kept = job.stall.get("last_lines") or []
    return [
        f"{name}: job {job.job_id} stalled{count}: {job.stall.get('reason', '')}",
        f"  its last lines{' (the last ' + str(STALL_LINES_SHOWN) + ')' if len(kept) > STALL_LINES_SHOWN else ''}:",
        *[f"    {line}" for line in kept[-STALL_LINES_SHOWN:]],
    ]


def gpu_utilization_text(job: JobRecord) -> str | None:
    """`replica 0 97%, replica 1 0% (at 21:05:03)` from the service's telemetry of a job; None without any."""
    sample = job.gpu_utilization
    if not sample or not sample.get("replicas"):
        return None
    parts = [
        f"replica {replica} {value:.0f}%"
        for replica, value in sorted(sample["replicas"].items(), key=lambda item: int(item[0]))
    ]
    return ", ".join(parts) + f" (at {time.strftime('%H:%M:%S', time.localtime(sample['at']))})"


def shown_job_id(run_id: str, stage: str, job_id: str) -> str:
    """A job's id in the status table: less the `RUN-STAGE` its name starts with (Kubernetes names its Jobs so, up
    to 63 characters each; the row names the stage and the header the run), or less `RUN` where the name had to
    be shortened (its stage part cut and hashed); else whole (BCP's numbers, Slurm's)."""
    prefix = _shown_without(run_id, stage, job_id)
    return job_id[len(prefix) - 1 :] if prefix else job_id


def _shown_without(run_id: str, stage: str, job_id: str) -> str | None:
    """The prefix shown_job_id leaves out of `job_id` (None: it is shown whole)."""
    for prefix in (f"{run_id}-{stage}-".lower(), f"{run_id}-".lower()):
        if job_id.lower().startswith(prefix):
            return prefix
    return None


def job_id_legend(state: RunState) -> list[str]:
    """What a shortened job id in the status table stands for (none where all are whole)."""
    left_out = {_shown_without(state.run_id, name, j.job_id) for name, s in state.stages.items() for j in s.jobs}
    if not left_out - {None}:
        return []
    legend = f"-X = job {state.run_id}-STAGE-X"
    if f"{state.run_id}-".lower() in left_out:
        legend += f" (or {state.run_id}-X, a name shortened to fit)"
    return [legend]


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
        per_core = (
            f"{rates['tokens_per_s_per_core']:,.0f} tokens/s"
            if "tokens_per_s_per_core" in rates
            else f"{rates['mb_per_s_per_core']:.3g} MB/s"
            if "mb_per_s_per_core" in rates
            else "-"
        )
        rows.append(
            [
                name,
                format_seconds(estimates[name].seconds if name in estimates else None),
                format_elapsed(rates["elapsed_s"]),
                _rate(rates.get("items_per_s")),
                _rate(rates.get("mb_per_s")),
                per_core,
                _rate(rates.get("steps_per_s")),
            ]
        )
    return rows


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def other_outputs_text(found: dict | None) -> str:
    """What a stage did with outputs another config made, in words ("" when it found none)."""
    if not isinstance(found, dict) or found.get("outputs") not in ("redone", "reused"):
        return ""
    previous = found.get("previous_digest") or "not recorded"
    made = (
        f"{found.get('count')} output(s) made by another config (digest {previous}, this run's {found.get('digest')})"
    )
    if found["outputs"] == "reused":
        return f"{made} reused as they are (other_outputs: reuse)"
    return f"{made} redone; the old ones are kept in {found.get('set_aside')}"


def run_status_text(state: RunState, undriven: bool = False) -> str:
    """A run's status for people; one no process drives (`RunStore.undriven`) says so and how to go on, as its
    state still says running after its orchestrator was killed or its output closed."""
    return f"{state.status} (no driver: `bcp-pipeline resume {state.run_id}`)" if undriven else state.status


def render_status(
    state: RunState,
    job_url=None,
    estimate: PlanEstimate | None = None,
    actual: dict[str, dict] | None = None,
    throughput: list[dict] | None = None,
    undriven: bool = False,
    heldout: dict[str, dict] | None = None,
) -> str:
    """The `status` view: a table of stages, estimate against actual (when given), then errors with log tails and
    why a waiting job waits."""
    lines = [
        f"run {state.run_id}  pipeline {state.pipeline}  backend {state.backend}  "
        f"status {run_status_text(state, undriven)}",
        "",
        format_table(status_rows(state)),
    ]
    if estimate is not None and actual and any(actual.values()):
        lines += [
            "",
            "estimate against actual (elapsed includes queueing and verification):",
            format_table(estimate_rows(state, estimate, actual)),
        ]
    if throughput:
        lines += [""] + [throughput_line(series) for series in throughput]
    if heldout:  # each evaluate stage's latest held-out loss (report/heldout.py)
        lines += [""] + [heldout_line(name, found["points"]) for name, found in heldout.items()]
    summaries = [
        f"{name}: {stage.extra['summary']}"
        for name, stage in state.stages.items()
        if stage.extra.get("summary") and stage.status is StageStatus.SUCCEEDED
    ]
    summaries += [
        f"{name}: {text}"
        for name, stage in state.stages.items()
        if (text := other_outputs_text(stage.extra.get("outputs")))
    ]
    if summaries:
        lines += [""] + summaries
    for name, stage in state.stages.items():
        if stage.error:
            lines += ["", f"{name}: {stage.error}"]
        if stalls := stall_lines(name, stage):
            lines += ["", *stalls]
    # GPU utilization of running trainings, where the service measures it (BCP's job telemetry).
    usage = [
        f"{name}: job {job.job_id} GPU utilization: {text}"
        for name, stage in state.stages.items()
        for job in stage.jobs[-1:]
        if job.ended_at is None and (text := gpu_utilization_text(job))
    ]
    if usage:
        lines += [""] + usage
    # Why a job waits, where its backend says (a Kueue queue's admission, a pod the scheduler finds no room for).
    waits = [
        f"{name}: job {job.job_id} {job.native}: {job.detail}"
        for name, stage in state.stages.items()
        for job in stage.jobs[-1:]
        if job.state == "queued" and job.detail and job.ended_at is None
    ]
    if waits:
        lines += [""] + waits
    if job_url:
        urls = [
            (name, job.job_id, job_url(job.job_id)) for name, stage in state.stages.items() for job in stage.jobs[-1:]
        ]
        urls = [u for u in urls if u[2]]
        if urls:
            lines += [""] + [f"{name}: {url}" for name, _, url in urls]
    legend = ["* = verification job"] if any(j.kind == "verify" for s in state.stages.values() for j in s.jobs) else []
    if any(unverified(stage) for stage in state.stages.values()):
        legend.append(f"{UNVERIFIED} = no `verify:` checks: counted done when its job succeeded, whatever it wrote")
    legend += job_id_legend(state)
    if legend:
        lines += ["", f"({'; '.join(legend)})"]
    return "\n".join(lines)


def throughput_line(series: dict) -> str:
    """A training stage's latest attempt: median step time, tokens/s and MFU, and what MFU is held against."""
    attempt = series["attempts"][-1]
    summary = attempt["summary"]
    if not summary:
        return f"{series['stage']}: no step times in the log of job {attempt['job_id']} yet"
    return (
        f"{series['stage']}: {summary_text(summary)} (median of {summary['steps']} logged step(s) of job "
        f"{attempt['job_id']}, the first left out); {series['mfu_basis']}"
    )


class Reporter:
    """Prints events as they happen and, every few seconds, one progress line per running stage: the engine's
    `Progress` (engine/progress.py) on a terminal or in a detached driver's job log."""

    def __init__(self, stream: IO[str] | None = None, interval: float = 5.0) -> None:
        self.stream = stream or sys.stdout
        self.interval = interval
        self._last_progress = 0.0
        self._started = time.monotonic()

    def _print(self, text: str) -> None:
        stamp = format_elapsed(time.monotonic() - self._started)
        self.stream.write(f"[{stamp:>6}] {text}\n")
        self.stream.flush()

    def started(self, state: RunState, state_file: Path) -> None:
        self.stream.write(f"run {state.run_id} ({state.pipeline} on {state.backend}); state in {state_file}\n")
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
                self._print(
                    f"{name}: {stage.status.value} job {job}, {stage_elapsed(stage)} elapsed, "
                    f"progress {progress_text(stage)}"
                )


# -- `plan`'s estimates ---------------------------------------------------------------------------------
def format_bytes(value: float | None) -> str:
    return "-" if value is None else short_number(value) + "B"


def format_hours(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def format_seconds(value: float | None) -> str:
    return "-" if value is None else format_elapsed(value)


def render_estimates(plan: PlanEstimate) -> list[str]:
    """The table of `plan`'s text output, its total, the training arithmetic, notes and warnings."""
    rows = [
        [
            "STAGE",
            "INSTANCE",
            "NODES",
            "ITEMS IN",
            "ITEMS OUT",
            "BYTES IN",
            "BYTES OUT",
            "WALL",
            "NODE-H",
            "GPU-H",
            "FROM",
        ]
    ]
    for s in plan.stages:
        rows.append(
            [
                s.stage,
                s.instance or "-",
                str(s.nodes),
                _count(s.items_in),
                f"{_count(s.items_out)} {s.unit_out}" if s.items_out is not None else "-",
                format_bytes(s.bytes_in),
                format_bytes(s.bytes_out),
                format_seconds(s.seconds),
                format_hours(s.node_hours),
                format_hours(s.gpu_hours),
                s.basis or "-",
            ]
        )
    rows.append(
        [
            "total",
            "",
            "",
            "",
            "",
            "",
            "",
            format_seconds(plan.seconds) + ("" if plan.complete else "+"),
            format_hours(plan.node_hours),
            format_hours(plan.gpu_hours),
            "longest path; sum of hours",
        ]
    )
    lines = [
        '# estimates (docs/estimates-and-report.md: "Where the estimate figures come from"; no queueing, '
        "start-up or verification)",
        format_table(rows),
    ]
    if plan.data_seconds:
        overlap = (
            f"; {format_seconds(plan.serial_data_seconds)} one stage after another: streamed edges overlap"
            if plan.serial_data_seconds > plan.data_seconds + 1
            else ""
        )
        lines.append(f"data preparation: {format_seconds(plan.data_seconds)}{overlap}")
    for s in plan.stages:
        t = s.training
        if t:
            line = (
                f"{s.stage}: {t['steps']:,} steps x {t['global_batch_size']} x {t['seq_length']} = "
                f"{short_number(t['tokens'])} tokens x {short_number(t['flops_per_token'])} FLOPs/token "
                f"= {t['flops']:.3g} FLOPs"
            )
            if "epochs" in t:
                line += (
                    f"; {t['epochs']:.2f} epoch(s) of the data's {short_number(t['data_tokens'])} tokens "
                    f"({t['data_source']})"
                )
            if s.seconds is not None:
                line += f"; {s.basis}: {format_seconds(s.seconds)} ({s.seconds / 86400:.1f} days)"
            if "attempts" in t:
                covered = "covers it" if t["attempts"] <= t["max_attempts"] else "does NOT cover it"
                line += (
                    f"; {t['attempts']} attempt(s) of {t['total_runtime']} ({format_seconds(t['attempt_seconds'])}"
                    f" of training each), max_attempts {t['max_attempts']} {covered}"
                )
            lines.append(line)
            if "step_seconds" in t:
                lines.append(mfu_assumption_line(s.stage, t))
    notes: dict[str, list[str]] = {}
    for s in plan.stages:
        for note in s.notes:
            notes.setdefault(note, []).append(s.stage)
    lines += [f"{', '.join(stages)}: {note}" for note, stages in notes.items()]
    lines += [f"WARNING: {w}" for w in plan.warnings]
    return lines


def mfu_assumption_line(stage: str, training: dict) -> str:
    """What the training time rests on: the MFU, where it comes from, and the step time it means."""
    if "measured" in training:
        return f"{stage}: time {training['measured']} (measured; the declared MFU {training['mfu']:.0%} is not used)"
    return (
        f"{stage}: MFU {training['mfu']:.0%} assumed (estimates.mfu, declared, not measured) = "
        f"{training['step_seconds']:.3g} s/step on {training['peak']}; measure it with `bcp-pipeline profile` "
        '(docs/estimates-and-report.md, "Profiling")'
    )


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"
