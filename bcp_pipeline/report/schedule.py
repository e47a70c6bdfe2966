"""When each stage starts and ends along the DAG, for `plan`'s total and its data-preparation line. Pure.

A stage starts when its needs have finished; on a streamed edge (`needs: [{stage: X, stream: true}]`) it starts
when X's first output group has landed and ends no earlier than one group's work after X ends:

    lead  = X's time / groups                    (groups land at an even pace, in the order they are needed:
                                                  the download fetches in name order, stages/download.py)
    tail  = its time / ceil(groups / its ranks)  (the last group to land is tokenized by one rank, alone)
    start = max(plain needs' ends, X's start + lead)
    end   = max(start + its time, X's end + tail)

so prep time is the longer of the two plus the tail, not their sum, and a layout of many slow ranks (one group
each) gains little: its tail is the whole stage. `groups` is the stage's expected output count (its first
verification check); without one the edge counts as not streamed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bcp_pipeline.config.durations import format_elapsed
from bcp_pipeline.config.model import PipelineConfig
from bcp_pipeline.config.resources import rank_layout


@dataclass(frozen=True)
class Schedule:
    start: dict[str, float]
    finish: dict[str, float]
    data_seconds: float  # until the last data stage (not a training) ends
    serial_data_seconds: float  # the same, every streamed edge waited out
    notes: dict[str, str]  # stage -> how its streamed edge was counted


def data_stages(pipeline: PipelineConfig) -> list[str]:
    """The stages that prepare the training's data: neither a training (an engine's, or one that continues) nor
    after one (an evaluation or an export of its checkpoints)."""
    trainings = {n for n, s in pipeline.stages.items() if s.trains}
    after: set[str] = set()
    changed = True
    while changed:  # every stage downstream of a training, through plain and streamed needs alike
        changed = False
        for name, stage in pipeline.stages.items():
            if name not in after and any(need in trainings or need in after for need in stage.needs):
                after.add(name)
                changed = True
    return [name for name in pipeline.stages if name not in trainings and name not in after]


def schedule(
    pipeline: PipelineConfig, seconds: dict[str, float | None], groups: dict[str, int | None], backend: str
) -> Schedule:
    """`seconds`: each stage's estimated time (None counts 0); `groups`: each stage's expected output count."""
    start, finish, notes = _walk(pipeline, seconds, groups, backend, streamed=True)
    _, serial_finish, _ = _walk(pipeline, seconds, groups, backend, streamed=False)
    data = data_stages(pipeline)
    return Schedule(
        start=start,
        finish=finish,
        data_seconds=max((finish[n] for n in data), default=0.0),
        serial_data_seconds=max((serial_finish[n] for n in data), default=0.0),
        notes=notes,
    )


def _walk(
    pipeline: PipelineConfig,
    seconds: dict[str, float | None],
    groups: dict[str, int | None],
    backend: str,
    streamed: bool,
) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    start: dict[str, float] = {}
    finish: dict[str, float] = {}
    notes: dict[str, str] = {}
    for name in pipeline.order():
        stage = pipeline.stages[name]
        own = seconds.get(name) or 0.0
        count = groups.get(name)
        streams = [need for need in stage.streamed if streamed and count]
        begin = max(
            [finish[need] for need in stage.needs if need not in streams]
            + [start[need] + (seconds.get(need) or 0.0) / count for need in streams],
            default=0.0,
        )
        end = begin + own
        if streams:
            ranks = rank_layout(stage, backend).world_size
            tail = own / math.ceil(count / ranks)
            end = max(end, *(finish[need] + tail for need in streams))
            if own:
                notes[name] = (
                    f"streams from {', '.join(streams)}: starts as its first of {count} groups lands, ends "
                    f"{format_elapsed(tail)} after it (one group on one of {ranks} ranks)"
                )
        start[name], finish[name] = begin, end
    return start, finish, notes
