"""The report's throughput charts: step time, tokens/s and MFU over steps, and the timer breakdown per step as
stacked bars. Pure: report_data's `throughput` entries -> plotly figures and a line of text (html.py lays them out).
"""

from __future__ import annotations

from bcp_pipeline.report.throughput import summary_text

LAYOUT = {"height": 320, "margin": {"l": 10, "r": 10, "t": 50, "b": 40}, "template": "plotly_white"}


def throughput_figures(go, series: dict) -> list[tuple[str, object]]:
    """(chart name, figure) for one stage: step time, tokens/s, MFU (where known), timers (where logged)."""
    stage = series["stage"]
    figures = []
    for key, title, axis in (
        ("step_s", "step time", "seconds per step"),
        ("tokens_per_s", "tokens/s", "tokens/s"),
        ("mfu", "MFU", "model FLOPs utilisation"),
    ):
        figure = go.Figure()
        for attempt in series["attempts"]:
            points = [p for p in attempt["points"] if p[key] is not None]
            if points:
                figure.add_scatter(
                    name=f"job {attempt['job_id']}",
                    mode="lines+markers",
                    marker_size=4,
                    x=[p["step"] for p in points],
                    y=[p[key] for p in points],
                )
        if figure.data:
            figure.update_layout(title=f"{stage}: {title}", xaxis_title="step", yaxis_title=axis, **LAYOUT)
            if key == "mfu":
                figure.update_yaxes(tickformat=".1%")
            figures.append((f"{key.replace('_', '-')}-{stage}", figure))
    timers = timers_figure(go, series)
    if timers is not None:
        figures.append((f"timers-{stage}", timers))
    return figures


def timers_figure(go, series: dict):
    """One stacked bar per logged step of the last attempt with timers, one colour per timer."""
    attempts = [a for a in series["attempts"] if a["timers"]]
    if not attempts:
        return None
    blocks = attempts[-1]["timers"]
    names = list(dict.fromkeys(name for block in blocks for name in block["milliseconds"]))
    figure = go.Figure()
    steps = [str(block["step"]) if block["step"] is not None else "-" for block in blocks]
    for name in names:
        figure.add_bar(
            name=name,
            x=steps,
            y=[block["milliseconds"].get(name, 0.0) for block in blocks],
            hovertemplate=f"step %{{x}}: {name} %{{y:.1f}} ms<extra></extra>",
        )
    figure.update_layout(
        barmode="stack",
        title=f"{series['stage']}: where each step's time went (timers, slowest rank, job {attempts[-1]['job_id']})",
        xaxis_title="step",
        yaxis_title="milliseconds",
        xaxis_type="category",
        **LAYOUT,
    )
    return figure


def throughput_summary(series: dict) -> str:
    """One line per attempt: median step time, tokens/s and MFU, and what MFU is held against."""
    lines = []
    for attempt in series["attempts"]:
        summary = attempt["summary"]
        if not summary:
            continue
        lines.append(
            f"job {attempt['job_id']}: median of {summary['steps']} step(s) after the first: {summary_text(summary)}"
        )
    return "; ".join(lines + [series["mfu_basis"]] if series["mfu_basis"] else lines)
