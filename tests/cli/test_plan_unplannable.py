"""`plan` of a pipeline one of whose jobs the backend cannot render (issue 38): the NeMo pretrain on Grid Engine
without an image. The other jobs are still planned, the one that cannot be says why and which --set supplies
what it lacks, and the plan exits 2 at the end so scripts notice."""

from __future__ import annotations

import json

from support.cli import cli
from support.pipeline_fixtures import REPO

BUNDLED = REPO / "pipelines.yaml"
IMAGE_SET = "pretrain.gridengine.container_image=docker://nvcr.io/nvaie/nemo-framework-training:23.11"


def test_plan_shows_the_data_stages_and_why_the_pretrain_cannot_be_planned_then_exits_2(capsys):
    assert cli(BUNDLED, "plan", "slimpajama-8b", "--backend", "gridengine") == 2
    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    assert out.startswith(
        "# plan: pipeline slimpajama-8b on gridengine; 18 job(s), 1 that cannot be planned; nothing is submitted."
    ), out[:300]
    held_out = ("download-validation", "tokenize-validation", "download-test", "tokenize-test")
    for stage in ("download", "extract", "concat", "tokenize-preprocess", *held_out):
        # each stage's job script is there
        assert f"\n# stage {stage}" in out and f"\n#$ -N slimpajama-8b-RUN.{stage}\n" in out, stage
    refusal = out.split("# stage pretrain: CANNOT BE PLANNED\n", 1)[1].split("\n\n", 1)[0]
    assert "NeMo pretraining on Grid Engine runs in the NeMo container through Apptainer" in refusal
    assert f"--set {IMAGE_SET}" in refusal
    assert "# estimates" in out  # the rest of the plan follows
    # On stderr, the refusal as `run` would print it, then the count, last.
    first, last = err.strip().splitlines()[-2:]
    assert first.startswith("bcp-pipeline: error: ") and f"--set {IMAGE_SET}" in first, err
    assert last == (
        "bcp-pipeline: error: 1 job(s) of stage(s) pretrain cannot be planned on gridengine (each is "
        "shown in the plan where it would be); `run` would refuse them"
    ), err


def test_the_set_the_refusal_names_makes_the_plan_whole(capsys):
    assert cli(BUNDLED, "plan", "slimpajama-8b", "--backend", "gridengine", "--set", IMAGE_SET) == 0
    out = capsys.readouterr().out
    assert out.startswith("# plan: pipeline slimpajama-8b on gridengine; 19 job(s); nothing is submitted.")
    assert "CANNOT BE PLANNED" not in out


def test_plan_json_lists_what_cannot_be_planned_and_exits_2(capsys):
    assert cli(BUNDLED, "plan", "slimpajama-8b", "--backend", "gridengine", "--json") == 2
    payload = json.loads(capsys.readouterr().out)
    assert [job["stage"] for job in payload["jobs"]].count("download") >= 1
    assert [(u["stage"], u["kind"]) for u in payload["unplanned"]] == [("pretrain", "stage")]
    assert f"--set {IMAGE_SET}" in payload["unplanned"][0]["error"]
