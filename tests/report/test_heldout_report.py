"""Held-out losses from an evaluate stage's log into `status` and the report's loss chart data (pure)."""

from __future__ import annotations

import json

import pytest

from bcp_pipeline.engine.state import JobRecord, RunState, StageState, StageStatus
from bcp_pipeline.report.data import report_data
from bcp_pipeline.report.heldout import evaluation_points, heldout_line
from bcp_pipeline.report.html import tasks_figure
from bcp_pipeline.report.text import render_status


def line(step: int, loss: float, tasks: dict | None = None) -> str:
    payload = {"step": step, "split": "validation", "loss": loss, "perplexity": 2.718281828**loss, "tokens": 4096}
    return f"##bcp-pipeline evaluation {json.dumps({**payload, **({'tasks': tasks} if tasks else {})})}"


# A resumed evaluate job repeats the earlier results first, then adds its own; a cut line is ignored.
LOG = "\n".join(
    [
        line(20, 6.25),
        "evaluate: step 20: ...",
        line(20, 6.25),
        line(40, 5.9),
        '##bcp-pipeline evaluation {"step": 60, "lo',
        line(60, 5.69),
    ]
)


def test_points_by_step_the_last_of_each_kept():
    points = evaluation_points([LOG])
    assert [(p["step"], p["loss"]) for p in points] == [(20, 6.25), (40, 5.9), (60, 5.69)]
    assert evaluation_points(["no results yet"]) == []


def test_status_names_the_latest_held_out_loss():
    state = RunState(
        run_id="demo-1",
        pipeline="demo",
        backend="local",
        config_file="pipelines.yaml",
        created_at=0.0,
        stages={"evaluate": StageState(status=StageStatus.RUNNING)},
    )
    heldout = {"evaluate": {"stage": "evaluate", "training": "pretrain", "points": evaluation_points([LOG])}}
    text = render_status(state, heldout=heldout)
    assert (
        "evaluate: held-out loss 5.6900 (perplexity 295.9, validation split, 4096 tokens) at step 60; "
        "3 checkpoint(s) evaluated"
    ) in text
    assert heldout_line("evaluate", []) == "evaluate: no checkpoint evaluated yet"


def test_a_bridge_result_with_a_test_split_shows_its_test_loss_too():
    with_test = line(60, 5.69).replace('"tokens": 4096', '"tokens": 4096, "test_loss": 5.7712')
    shown = heldout_line("evaluate", evaluation_points([with_test]))
    assert shown.endswith("at step 60; 1 checkpoint(s) evaluated; test loss 5.7712 at step 60"), shown
    assert "test loss" not in heldout_line("evaluate", evaluation_points([LOG]))


def test_the_loss_chart_data_carries_the_held_out_points_of_its_training():
    job = JobRecord(
        job_id="pretrain.1", kind="stage", attempt=1, submitted_at=0.0, state="succeeded", started_at=1.0, ended_at=9.0
    )
    state = RunState(
        run_id="demo-1",
        pipeline="demo",
        backend="local",
        config_file="pipelines.yaml",
        created_at=0.0,
        stages={"pretrain": StageState(status=StageStatus.SUCCEEDED, jobs=[job])},
    )
    log = "\n".join(f"step {s}/60 loss {10 - s / 10:.4f} lr 1.000e-03 2.00 steps/s 0.5 s/step" for s in (1, 2))
    heldout = {
        "evaluate": {"stage": "evaluate", "training": "pretrain", "points": evaluation_points([LOG])},
        "other": {"stage": "other", "training": "elsewhere", "points": evaluation_points([LOG])},
    }
    data = report_data(state, now=10.0, training_logs={"pretrain.1": log}, heldout=heldout)
    [training] = data["training"]
    assert training["heldout"] == [
        {
            "stage": "evaluate",
            "points": [
                {"step": 20, "tasks": {}, "loss": 6.25, "perplexity": round(2.718281828**6.25, 3)},
                {"step": 40, "tasks": {}, "loss": 5.9, "perplexity": round(2.718281828**5.9, 3)},
                {"step": 60, "tasks": {}, "loss": 5.69, "perplexity": round(2.718281828**5.69, 3)},
            ],
        }
    ]


TASKS_LOG = "\n".join(
    [
        line(20, 6.25, {"demo_cloze": {"acc": 0.25, "acc_norm": 0.3}, "demo_lastword": {"perplexity": 900.0}}),
        line(40, 5.9, {"demo_cloze": {"acc": 0.4, "acc_norm": 0.45}, "demo_lastword": {"perplexity": 400.0}}),
    ]
)


def test_status_names_each_task_s_latest_score():
    heldout = {"evaluate": {"stage": "evaluate", "training": "pretrain", "points": evaluation_points([TASKS_LOG])}}
    state = RunState(
        run_id="demo-1",
        pipeline="demo",
        backend="local",
        config_file="pipelines.yaml",
        created_at=0.0,
        stages={"evaluate": StageState(status=StageStatus.RUNNING)},
    )
    text = render_status(state, heldout=heldout)
    assert (
        "at step 40; 2 checkpoint(s) evaluated; tasks at step 40: demo_cloze acc 0.4, demo_cloze acc_norm 0.45, "
        "demo_lastword perplexity 400"
    ) in text


def test_the_report_draws_each_task_s_scores_against_the_step():
    go = pytest.importorskip("plotly.graph_objects")
    training = {
        "stage": "pretrain",
        "attempts": [],
        "heldout": [{"stage": "evaluate", "points": evaluation_points([TASKS_LOG])}],
    }
    figure = tasks_figure(go, training)
    lines = {trace.name: (list(trace.x), list(trace.y)) for trace in figure.data}
    assert lines == {  # perplexity is another scale: in the results and status, not on this axis
        "demo_cloze acc (evaluate)": ([20, 40], [0.25, 0.4]),
        "demo_cloze acc_norm (evaluate)": ([20, 40], [0.3, 0.45]),
    }
    assert tasks_figure(go, {"stage": "pretrain", "attempts": [], "heldout": []}) is None
