"""`--set` errors name the --set that gave the bad value, never a line of pipelines.yaml (issue 38): a key the --set
made up, a var it set to something unusable, a misspelt var, an image the training preflight refuses, and a poll
interval that is not > 0. Each through `plan` on the bundled pipelines.yaml: exit 2, one line on stderr."""

from __future__ import annotations

import re

import pytest
from support.cli import cli
from support.pipeline_fixtures import REPO

BUNDLED = REPO / "pipelines.yaml"


@pytest.mark.parametrize(
    "pipeline, override, wanted",
    [
        (
            "demo",
            "download.locl.replicas=1",
            "--set download.locl.replicas=1: pipelines.demo.stages.download.locl: unknown key 'locl'; valid keys: ",
        ),
        (
            "demo",
            "vars.steps=abc",
            "--set vars.steps=abc: pipelines.demo.stages.pretrain.continuation: target_steps: "
            "'${steps}' is not a whole "
            "number (it is 'abc')",
        ),
        (
            "demo",
            "vars.stepz=3",
            "--set vars.stepz=3: the pipeline has no var 'stepz'; its vars: data, mirror, files, per_chunk, steps, "
            "every, train_run, validation_files",
        ),
        (
            "slimpajama-8b",
            "pretrain.bcp.image=nvcr.io/nvidia/nemo:25.11",
            "--set pretrain.bcp.image=nvcr.io/nvidia/nemo:25.11: "
            "pipelines.slimpajama-8b.stages.pretrain.nemo: bcp.image "
            "nvcr.io/nvidia/nemo:25.11 is a NeMo Framework 25.11 image, which trains with Megatron-Bridge",
        ),
        (
            "slimpajama-8b",
            "pretrain.bcp.image=foo",
            "--set pretrain.bcp.image=foo: pipelines.slimpajama-8b.stages.pretrain.nemo: stage "
            "pretrain runs image 'foo' "
            "(bcp.image), whose tag is no YY.MM release",
        ),
        (
            "demo",
            "backends.local.poll_seconds=-1",
            "--set backends.local.poll_seconds=-1: backends.local.poll_seconds: poll_seconds "
            "must be > 0 seconds, got -1",
        ),
        (
            "demo",
            "backends.bcp.poll_min_seconds=0",
            "--set backends.bcp.poll_min_seconds=0: backends.bcp.poll_min_seconds: "
            "poll_min_seconds must be > 0 seconds, "
            "got 0",
        ),
    ],
)
def test_an_error_from_a_set_value_names_the_set_and_no_file_line(capsys, pipeline, override, wanted):
    assert cli(BUNDLED, "plan", pipeline, "--set", override) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bcp-pipeline: error: {wanted}"), err
    assert err.count("\n") == 1 and "pipelines.yaml" not in err, err


def test_a_negative_poll_interval_in_the_file_is_refused_at_its_line(tmp_path, capsys):
    config = tmp_path / "pipelines.yaml"
    config.write_text(BUNDLED.read_text().replace("backends:\n", "backends:\n  slurm: {poll_max_seconds: -2}\n", 1))
    assert cli(config, "plan", "demo") == 2
    err = capsys.readouterr().err
    assert (
        f"{config}:" in err and "backends.slurm.poll_max_seconds: poll_max_seconds must be > 0 seconds, got -2" in err
    ), err


def test_a_known_var_and_a_stage_key_set_together_still_plan(capsys):
    assert cli(BUNDLED, "plan", "demo", "--set", "vars.steps=4", "--set", "download.local.replicas=2") == 0


@pytest.mark.parametrize(
    "override, wanted",
    [
        (
            "pretrain.nemo.tensor_parallel=3",
            "pipelines.slimpajama-126m.stages.pretrain.nemo: gpt3/126m on 4 node(s): "
            "4 node(s) x 8 GPUs = 32 is not divisible by TP 3 x PP 1",
        ),
        (
            "pretrain.nemo.max_steps=0",
            "pipelines.slimpajama-126m.stages.pretrain.continuation: target_steps (0) and "
            "max_attempts (10) must be >= 1",
        ),
    ],
)
def test_a_training_check_that_names_no_key_names_the_sets_that_changed_the_stage(capsys, override, wanted):
    """The training preflight checks many keys at once (parallel sizes; the step count it derives): the file's
    line of the section, and the --set that changed it."""
    assert cli(BUNDLED, "plan", "slimpajama-126m", "--set", override) == 2
    err = capsys.readouterr().err
    assert re.match(
        rf"bcp-pipeline: error: {re.escape(str(BUNDLED))}:\d+ \(with --set {re.escape(override)}\): "
        rf"{re.escape(wanted)}",
        err,
    ), err
