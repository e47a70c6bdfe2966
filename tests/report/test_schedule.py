"""`plan`'s data-preparation time over a streamed edge: the longer of the two stages plus the tail after the last
group, not their sum (report/schedule.py), worked by hand from the stages' own estimates."""

from __future__ import annotations

import math

from support.pipeline_fixtures import REPO

from bcp_pipeline.cli.main import main
from bcp_pipeline.config.instances import KNOWN_INSTANCES
from bcp_pipeline.config.preflight import load_and_check
from bcp_pipeline.report.estimates import estimate_pipeline

BUNDLED = REPO / "pipelines.yaml"


def fast(overrides: list[str] | None = None):
    pipeline = load_and_check(BUNDLED, overrides=overrides, pipeline="slimpajama-8b-fast").pipeline(
        "slimpajama-8b-fast"
    )
    estimate = estimate_pipeline(pipeline, KNOWN_INSTANCES)
    return {s.stage: s for s in estimate.stages}, estimate


def test_the_fast_pipeline_prepares_its_data_in_the_longer_stage_plus_one_group_of_the_other():
    stages, estimate = fast()
    download, tokenize = stages["download"].seconds, stages["tokenize-preprocess"].seconds
    groups, ranks = 74, 2 * 8  # 59,166 shards in groups of 800; 2 replicas x 8 processes
    tail = tokenize / math.ceil(groups / ranks)
    assert estimate.data_seconds == max(download + tail, download / groups + tokenize)
    assert estimate.serial_data_seconds == download + tokenize
    assert estimate.data_seconds <= 45 * 60 < estimate.serial_data_seconds
    assert any("streams from download" in note for note in stages["tokenize-preprocess"].notes)
    pretrain = estimate.seconds - estimate.data_seconds
    assert math.isclose(pretrain, stages["pretrain"].seconds)  # the training starts when the data is verified


def test_one_group_a_rank_gains_little_as_the_last_group_to_land_takes_the_whole_stage():
    stages, estimate = fast(["tokenize-preprocess.bcp.processes=37"])
    download, tokenize = stages["download"].seconds, stages["tokenize-preprocess"].seconds
    assert estimate.data_seconds == download + tokenize / math.ceil(74 / 74)  # 74 ranks: one group each


def test_the_guides_dag_has_no_streamed_edge_and_sums_its_stages():
    pipeline = load_and_check(BUNDLED).pipeline("slimpajama-8b")
    estimate = estimate_pipeline(pipeline, KNOWN_INSTANCES)
    data = [s.seconds for s in estimate.stages if s.stage in ("download", "extract", "concat", "tokenize-preprocess")]
    assert estimate.data_seconds == estimate.serial_data_seconds
    assert math.isclose(estimate.data_seconds, sum(data))


def test_plan_prints_the_data_preparation_line(capsys):
    assert main(["--config", str(BUNDLED), "plan", "slimpajama-8b-fast", "--backend", "bcp"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("data preparation: "))
    assert line.startswith("data preparation: 39m") and "47m44s one stage after another" in line, line
