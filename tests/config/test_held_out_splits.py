"""The bundled SlimPajama trainings' two held-out splits (issue 48): validation/chunk1 validates, test/chunk1 is
scored once at the end. Each split has its own download and tokenization stages; the data list every backend's job
writes, and the Bridge data index, carry both; a test split without a validation split is refused at config load,
naming the key."""

from __future__ import annotations

import json

import pytest
from support.cli import cli
from support.pipeline_fixtures import REPO

BUNDLED = REPO / "pipelines.yaml"
TEST_DIR = "/mount_workspace/data/slimpajama/test/preprocessed"


def plan_json(capsys, pipeline: str, backend: str, *more: str) -> dict:
    capsys.readouterr()
    assert cli(BUNDLED, "plan", pipeline, "--backend", backend, "--json", *more) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("pipeline", ["slimpajama-8b", "slimpajama-8b-bridge", "slimpajama-8b-bridge-llama"])
def test_each_8b_training_tests_on_the_test_split_its_own_stages_prepared(capsys, pipeline):
    plan = plan_json(capsys, pipeline, "bcp")
    stages = [job["stage"] for job in plan["jobs"]]
    assert {"download-test", "tokenize-test"} <= set(stages)
    text = json.dumps(plan)
    assert "test/chunk1/example_holdout_[0-7].jsonl.zst" in text and "--output-stem test_chunk" in text
    # the data list the pretrain job writes (the NeMo job script names the workspace by its first argument)
    nemo_job = '--test-data-dir \\"$workspace/data/slimpajama/test/preprocessed\\"'
    assert (nemo_job if pipeline == "slimpajama-8b" else f"--test-data-dir {TEST_DIR}") in text
    if "bridge" in pipeline:
        index = next(job for job in plan["jobs"] if job["stage"] == "pretrain-index" and job["kind"] == "stage")
        assert f"--test-data-dir {TEST_DIR}" in json.dumps(index)  # the index covers the test samples too


@pytest.mark.parametrize("engine", ["nemo", "megatron_bridge"])
def test_a_test_split_without_a_validation_split_is_refused_naming_the_key(capsys, engine):
    pipeline = "slimpajama-8b" if engine == "nemo" else "slimpajama-8b-bridge"
    assert cli(BUNDLED, "plan", pipeline, "--set", f"pretrain.{engine}.valid_data_dir=null") == 2  # a config error
    err = capsys.readouterr().err
    assert f"stages.pretrain.{engine}: {engine}.test_data_dir is given without {engine}.valid_data_dir" in err, err
