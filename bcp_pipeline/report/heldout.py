"""Held-out evaluation results for `status` and the report: the `##bcp-pipeline evaluation` lines an evaluate stage
(stages/evaluate.py) prints, one per checkpoint it evaluated and again for each earlier result at every start of
its job, so the latest job's log alone holds them all. Pure: log text in, points and lines out.
"""

from __future__ import annotations

from bcp_pipeline.backends.shared.logs import parse_lines
from bcp_pipeline.config.model import PipelineConfig

EVALUATE_PROGRAM = "evaluate.py"


def evaluated_trainings(pipeline: PipelineConfig) -> dict[str, str]:
    """Each evaluate stage's name -> the training it evaluates (its streamed upstream, else its first need)."""
    found = {}
    for name, stage in pipeline.stages.items():
        if stage.program == EVALUATE_PROGRAM and (stage.streamed or stage.needs):
            found[name] = (stage.streamed or stage.needs)[0]
    return found


def evaluation_points(texts: list[str]) -> list[dict]:
    """The results in `texts` (job logs, oldest first) by step, the last one of a step kept, in step order."""
    by_step: dict[int, dict] = {}
    for text in texts:
        for result in parse_lines(text, "evaluation"):
            if isinstance(result.get("step"), int) and isinstance(result.get("loss"), (int, float)):
                by_step[result["step"]] = result
    return [by_step[step] for step in sorted(by_step)]


def heldout_line(stage: str, points: list[dict]) -> str:
    """`status`: the latest held-out loss of an evaluate stage."""
    if not points:
        return f"{stage}: no checkpoint evaluated yet"
    last = points[-1]
    line = (
        f"{stage}: held-out loss {last['loss']:.4f} (perplexity {last['perplexity']:.1f}, {last.get('split')} "
        f"split, {last.get('tokens')} tokens) at step {last['step']}; {len(points)} checkpoint(s) evaluated"
    )
    if isinstance(last.get("test_loss"), (int, float)):  # a test split in the training's data list (Bridge)
        line += f"; test loss {last['test_loss']:.4f} at step {last['step']}"
    tasks = last.get("tasks")
    if isinstance(tasks, dict) and tasks:  # each lm-evaluation-harness task's latest scores
        scores = [
            f"{task} {metric} {value:.4g}"
            for task, found in tasks.items()
            if isinstance(found, dict)
            for metric, value in found.items()
            if isinstance(value, (int, float))
        ]
        line += f"; tasks at step {last['step']}: {', '.join(scores)}"
    return line
