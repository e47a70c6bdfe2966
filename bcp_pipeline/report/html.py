"""Rendering of `bcp-pipeline report`: report_data's dict -> one self-contained HTML page. Pure (no I/O).

The charts are plotly figures (the optional extra `report`); plotly.js is inlined once, so the page opens offline.
Everything else is plain HTML tables, every value escaped.
"""

from __future__ import annotations

import html
import json

from bcp_pipeline.config.durations import format_elapsed
from bcp_pipeline.errors import ReportError
from bcp_pipeline.report.throughput_html import throughput_figures, throughput_summary

EXTRA_HINT = (
    "the run report draws its charts with plotly, the optional extra `report`: "
    "pip install 'bcp-pipeline[report]' (scripts/setup installs it into .venv)"
)
STATE_COLOURS = {
    "succeeded": "#2e7d32",
    "failed": "#c62828",
    "timed_out": "#ef6c00",
    "lost": "#6d4c41",
    "cancelled": "#757575",
    "stalled": "#d84315",
    "preempted": "#f9a825",
    "running": "#1565c0",
    "queued": "#b0bec5",
}
QUEUED_COLOUR = "#cfd8dc"
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


def require_plotly() -> None:
    """Fail before any work when the extra is missing, with the command that installs it."""
    _plotly()


def _plotly():
    try:
        import plotly.graph_objects as go
        import plotly.io as pio
    except ImportError as exc:
        raise ReportError(f"{EXTRA_HINT} ({exc})") from None
    return go, pio


def render_report(data: dict) -> str:
    """The whole page: header, timeline, training charts, tables of stages, estimates and commands."""
    go, pio = _plotly()
    run = data["run"]
    figures = [("timeline", timeline_figure(go, data["timeline"]))]
    for training in data["training"]:
        figures += [
            (f"loss-{training['stage']}", loss_figure(go, training)),
            (f"steps-{training['stage']}", steps_figure(go, training)),
            (f"tasks-{training['stage']}", tasks_figure(go, training)),
        ]
    throughput = {series["stage"]: throughput_figures(go, series) for series in data.get("throughput", [])}
    figures += [figure for stage_figures in throughput.values() for figure in stage_figures]
    charts = {}
    for index, (name, figure) in enumerate(f for f in figures if f[1] is not None):
        charts[name] = pio.to_html(
            figure, full_html=False, include_plotlyjs=index == 0, div_id=f"chart-{name}", config=PLOTLY_CONFIG
        )
    title = f"bcp-pipeline report: {run['run_id']}"
    body = [
        f"<h1>{_e(title)}</h1>",
        f"<p class=meta>pipeline <b>{_e(run['pipeline'])}</b> on <b>{_e(run['backend'])}</b>, status "
        f'<b class="st-{_e(run["status"])}">{_e(run["status"])}</b>, created {_e(run["created"])}, '
        f"{_e(_seconds(run['elapsed_s']))} elapsed</p>",
        "<h2>Jobs</h2>",
        "<p class=hint>Every job of the run, stage and verification jobs, each attempt: pale = queued "
        "(submitted, not yet seen running), colour = running, by how it ended. Seconds since the run was "
        "created.</p>",
        charts.get("timeline", "<p>No job was submitted.</p>"),
        "<h2>Training</h2>",
    ]
    if data["training"]:
        for training in data["training"]:
            body += [charts[f"loss-{training['stage']}"], charts[f"steps-{training['stage']}"]]
            body += [charts[name] for name in (f"tasks-{training['stage']}",) if name in charts]
    else:
        body.append("<p>No training log with loss lines (no training stage ran, or its log could not be read).</p>")
    if throughput:
        body += [
            "<h2>Step time, tokens/s and MFU</h2>",
            "<p class=hint>From the training log's step times; tokens/s = tokens a step / step time; MFU = "
            "tokens/s x model FLOPs per token (6N + 12 L s h) / peak FLOP/s (docs/estimates-and-report.md, "
            '"Profiling").</p>',
        ]
        for series in data["throughput"]:
            body.append(
                f"<p class=meta id=throughput-{_e(series['stage'])}>{_e(series['stage'])}: "
                f"{_e(throughput_summary(series))}</p>"
            )
            body += [charts[name] for name, _ in throughput[series["stage"]] if name in charts]
    if data.get("watched"):
        body += [
            "<h2>Stalls and GPU utilization</h2>",
            "<p class=hint>Training jobs the stall guard cancelled (no new step for longer than the stage's "
            "stall_guard allows), with the last lines of their training log; and each replica's GPU "
            "utilization as last sampled from the service's job telemetry (BCP).</p>",
            watched_table(data["watched"]),
        ]
    body += [
        "<h2>Stages</h2>",
        stages_table(data["stages"]),
        "<h2>Estimates against actuals</h2>",
        estimates_table(data["estimates"], data["run"]["backend"]),
        "<h2>Submitted commands</h2>",
        commands_list(data["commands"]),
    ]
    if data["notes"]:
        body += ["<h2>Notes</h2>", "<ul>" + "".join(f"<li>{_e(n)}</li>" for n in data["notes"]) + "</ul>"]
    data_json = json.dumps(data, sort_keys=True).replace("</", "<\\/")
    return (
        f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>{_e(title)}</title>"
        f"<style>{STYLE}</style></head><body>\n"
        + "\n".join(body)
        + f'\n<script type="application/json" id=report-data>{data_json}</script>\n</body></html>\n'
    )


def timeline_figure(go, rows: list[dict]):
    """Horizontal bars, one row per job: its queued interval, then its running interval coloured by outcome."""
    if not rows:
        return None
    figure = go.Figure()
    labels = [r["label"] for r in rows]
    figure.add_bar(
        name="queued",
        orientation="h",
        y=labels,
        x=[r["queued_s"] for r in rows],
        base=[r["submitted_s"] for r in rows],
        marker_color=QUEUED_COLOUR,
        hovertemplate="%{y}: queued %{x:.1f} s<extra></extra>",
    )
    for state in sorted({r["state"] for r in rows}):
        mine = [r for r in rows if r["state"] == state]
        figure.add_bar(
            name=state,
            orientation="h",
            y=[r["label"] for r in mine],
            x=[r["running_s"] for r in mine],
            base=[r["started_s"] for r in mine],
            marker_color=STATE_COLOURS.get(state, "#8e24aa"),
            marker_pattern_shape=["/" if r["kind"] == "verify" else "" for r in mine],
            customdata=[[r["job_id"], r["attempt"], r["native"] or r["state"]] for r in mine],
            hovertemplate="%{y}: attempt %{customdata[1]}, %{customdata[2]}, running %{x:.1f} s<extra></extra>",
        )
    figure.update_layout(
        barmode="overlay",
        height=120 + 26 * len(rows),
        margin={"l": 10, "r": 10, "t": 30, "b": 40},
        xaxis_title="seconds since the run was created (hatched: verification job)",
        yaxis={"categoryorder": "array", "categoryarray": labels[::-1], "automargin": True},
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"},
        template="plotly_white",
    )
    return figure


def loss_figure(go, training: dict):
    figure = go.Figure()
    for attempt in training["attempts"]:
        points = attempt["points"]
        figure.add_scatter(
            name=f"attempt {attempt['attempt']} ({attempt['job_id']})",
            mode="lines+markers",
            x=[p["step"] for p in points],
            y=[p["loss"] for p in points],
            marker_size=4,
        )
    for evaluation in training.get("heldout", []):
        points = evaluation["points"]
        figure.add_scatter(
            name=f"held-out loss ({evaluation['stage']})",
            mode="lines+markers",
            x=[p["step"] for p in points],
            y=[p["loss"] for p in points],
            marker_size=8,
            marker_symbol="diamond",
            line_dash="dash",
        )
    title = "training and held-out loss" if training.get("heldout") else "training loss"
    figure.update_layout(
        title=f"{training['stage']}: {title}",
        xaxis_title="step",
        yaxis_title="loss",
        height=380,
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
        template="plotly_white",
    )
    return figure


def tasks_figure(go, training: dict):
    """Each lm-evaluation-harness task's scores (accuracies: 0 to 1) against the step; None without any."""
    figure = go.Figure()
    for evaluation in training.get("heldout", []):
        series: dict[str, list[tuple[int, float]]] = {}
        for point in evaluation["points"]:
            for task, scores in (point.get("tasks") or {}).items():
                for metric, value in scores.items():
                    if metric != "perplexity":  # another scale: in the results, not on this axis
                        series.setdefault(f"{task} {metric}", []).append((point["step"], value))
        for name, values in series.items():
            figure.add_scatter(
                name=f"{name} ({evaluation['stage']})",
                mode="lines+markers",
                x=[step for step, _ in values],
                y=[value for _, value in values],
            )
    if not figure.data:
        return None
    figure.update_layout(
        title=f"{training['stage']}: lm-evaluation-harness scores of each checkpoint",
        xaxis_title="step",
        yaxis_title="score",
        height=320,
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
        template="plotly_white",
    )
    return figure


def steps_figure(go, training: dict):
    """Steps over time, where the log gives times; None when it gives none."""
    figure = go.Figure()
    for attempt in training["attempts"]:
        timed = [p for p in attempt["points"] if p["run_s"] is not None]
        if timed:
            figure.add_scatter(
                name=f"attempt {attempt['attempt']} ({attempt['job_id']})",
                mode="lines",
                x=[p["run_s"] for p in timed],
                y=[p["step"] for p in timed],
            )
    if not figure.data:
        return None
    figure.update_layout(
        title=f"{training['stage']}: steps over time",
        xaxis_title="seconds since the run was created",
        yaxis_title="step",
        height=320,
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
        template="plotly_white",
    )
    return figure


def stages_table(rows: list[dict]) -> str:
    head = ["stage", "status", "sharding", "attempts", "elapsed", "verified (found/expected)", "throughput", "note"]
    body = []
    for r in rows:
        elapsed = (
            (r["finished_s"] - r["started_s"])
            if r["started_s"] is not None and r["finished_s"] is not None
            else r["throughput"].get("elapsed_s")
        )
        checks = [f"{c['found']}/{c['expected']} {c['glob'].rsplit('/', 1)[-1]}" for c in r["checks"]]
        if r["steps"] is not None:
            checks.append(f"step {r['steps']}/{r['target_steps']}")
        body.append(
            [
                r["stage"],
                r["status"],
                r["sharding"] or "-",
                str(r["attempts"]),
                _seconds(elapsed),
                "; ".join(checks) or "-",
                _throughput(r["throughput"]),
                r["error"] or r["summary"] or "",
            ]
        )
    return _table(head, body, status_column=1)


def watched_table(rows: list[dict]) -> str:
    body = []
    for r in rows:
        usage = ", ".join(
            f"replica {replica} {value:.0f}%"
            for replica, value in sorted((r["gpu_utilization"] or {}).items(), key=lambda item: int(item[0]))
        )
        if usage and r["sampled_s"] is not None:
            usage += f" (at {_seconds(r['sampled_s'])})"
        body.append([r["stage"], r["job_id"], r["state"], usage or "-", r["stall_reason"] or "-"])
    table = _table(["stage", "job", "state", "GPU utilization (last sample)", "stalled"], body, status_column=2)
    lines = [
        f"<details><summary>{_e(r['stage'])} job {_e(r['job_id'])}: its last lines</summary>"
        f"<pre>{_e(chr(10).join(r['last_lines']))}</pre></details>"
        for r in rows
        if r["last_lines"]
    ]
    return table + "\n".join(lines)


NO_ESTIMATE = "no estimate (counted as 0)"  # a stage plan does not model, or one whose sizes are not declared


def estimates_table(rows: list[dict], backend: str) -> str:
    if not rows:
        return "<p>No estimate (the run's config could not be loaded).</p>"
    head = ["stage", "instance", "nodes", "estimate", "actual", "actual / estimate", "node-h", "GPU-h", "estimate from"]
    body = [
        [
            r["stage"],
            r["instance"] or "-",
            str(r["nodes"]),
            _seconds(r["estimate_s"]),
            _seconds(r["actual_s"]),
            "-" if r["actual_over_estimate"] is None else f"{r['actual_over_estimate']:.3g}x",
            _number(r["node_hours"]),
            _number(r["gpu_hours"]),
            r["basis"] if r["estimate_s"] is not None and r["basis"] else NO_ESTIMATE,
        ]
        for r in rows
    ]
    # The instance column says whose nodes (a BCP instance, `like` one, or this machine): a local run has none.
    return (
        _table(head, body) + "<p class=hint>Estimates are for the nodes of the instance column (plan's figures); "
        "actual runs from the "
        f"first submission to the end of the verification, queueing included, on this run's backend "
        f"({_e(backend)}). {NO_ESTIMATE}: a stage plan does not model, or whose data-set size or rate is not "
        "declared (`estimates:` of the pipeline).</p>"
    )


def commands_list(rows: list[dict]) -> str:
    items = []
    for r in rows:
        what = (
            f"{r['stage']} {'verification' if r['kind'] == 'verify' else 'stage'} job {r['job_id']}, "
            f"attempt {r['attempt']} ({r['source']})"
        )
        text = r["text"] if r["text"] is not None else "(not available)"
        items.append(f"<details><summary>{_e(what)}</summary><pre>{_e(text)}</pre></details>")
    return "\n".join(items) or "<p>No job was submitted.</p>"


def _table(head: list[str], rows: list[list[str]], status_column: int | None = None) -> str:
    cells = []
    for row in rows:
        tds = [
            f'<td class="st-{_e(cell)}">{_e(cell)}</td>' if i == status_column else f"<td>{_e(cell)}</td>"
            for i, cell in enumerate(row)
        ]
        cells.append("<tr>" + "".join(tds) + "</tr>")
    return (
        "<table><thead><tr>"
        + "".join(f"<th>{_e(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(cells)
        + "</tbody></table>"
    )


def _throughput(rates: dict) -> str:
    parts = []
    if "items_per_s" in rates:
        parts.append(f"{rates['items_per_s']:.3g} items/s")
    if "mb_per_s" in rates:
        parts.append(f"{rates['mb_per_s']:.3g} MB/s")
    if "tokens_per_s_per_core" in rates:
        parts.append(f"{rates['tokens_per_s_per_core']:,.0f} tokens/s per core")
    elif "mb_per_s_per_core" in rates:
        parts.append(f"{rates['mb_per_s_per_core']:.3g} MB/s per core")
    if "steps_per_s" in rates:
        parts.append(f"{rates['steps_per_s']:.3g} steps/s")
    return ", ".join(parts) or "-"


def _seconds(value: float | None) -> str:
    return "-" if value is None else format_elapsed(value)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI","Liberation Sans",sans-serif;margin:24px auto;max-width:1200px;
color:#212121;padding:0 16px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #e0e0e0}
.meta{color:#424242}.hint{color:#616161;font-size:13px}
table{border-collapse:collapse;font-size:13px;width:100%}th,td{border-bottom:1px solid #eee;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#fafafa}
.st-succeeded{color:#2e7d32}.st-failed{color:#c62828;font-weight:bold}.st-cancelled{color:#757575}
.st-stalled{color:#ef6c00;font-weight:bold}
pre{white-space:pre-wrap;word-break:break-all;background:#f5f5f5;padding:8px;font-size:12px}
details summary{cursor:pointer;font-size:13px;padding:2px 0}
"""
