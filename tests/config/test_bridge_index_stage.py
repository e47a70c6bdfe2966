"""The stage that builds a Megatron-Bridge training's data index beforehand (`data_index_of:`,
config/bridge_index.py), through `plan`: on every backend the bundled slimpajama-8b-bridge runs stages/bridge_index.py
with exactly the training's recipe, data list and overrides (less the per-job time limit), in the training's image,
straight (no bootstrap pip-install), before the training, and verifies it by its manifest; a stage declared so that
it could not do that is refused with the key and the way out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.bridge_venv import entry_arguments, pretrain_job
from support.cli import cli
from support.index_jobs import BACKENDS, IMAGE, after, option, overrides_of, planned, program_words, stage_job

CONFIG = Path(__file__).resolve().parents[2] / "pipelines.yaml"
STAGES = Path(__file__).resolve().parents[2] / "stages"


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_index_job_gives_bridge_the_training_s_recipe_data_and_overrides(capsys, backend):
    plan = planned(capsys, backend)
    index_job = stage_job(plan, "pretrain-index")
    index = after(program_words(backend, index_job, "bridge_index.py"), "bridge_index.py")
    training = entry_arguments(backend, pretrain_job(plan))
    data_list = after(program_words(backend, pretrain_job(plan), "data_list.py"), "data_list.py")
    expected = [o for o in overrides_of(training) if not o.startswith("train.exit_duration_in_mins=")]
    assert overrides_of(index) == expected
    assert option(index, "--recipe") == option(training, "--recipe") == "vanilla_gpt_pretrain_config"
    assert option(index, "--data-list") == option(training, "--overrides-file") == option(data_list, "--out")
    assert option(index, "--data-dir") == option(data_list, "--data-dir")
    assert option(index, "--world-size") == "4"  # TP 4 x PP 1 x CP 1: one data-parallel rank
    cache = next(o.split("=", 1)[1] for o in training if o.startswith("dataset.path_to_cache="))
    assert option(index, "--manifest") == f"{os.path.dirname(cache)}/data_index.json"
    assert IMAGE[backend] in index_job["printable"] and IMAGE[backend] in pretrain_job(plan)["printable"]
    assert "bootstrap.sh" not in " ".join(program_words(backend, index_job, "bridge_index.py"))


@pytest.mark.parametrize("pipeline", ["slimpajama-8b-bridge", "slimpajama-8b-bridge-llama"])
def test_every_bundled_bridge_training_validates_on_the_held_out_split_its_pipeline_prepares(capsys, pipeline):
    """A pipeline that writes its own `megatron_bridge:` section (a YAML merge key is shallow) once lost
    valid_data_dir: its training validated on a 99990,8,2 slice of the training data, and the per-split data list
    the index job builds from the held-out stage made Bridge refuse the split."""
    plan = planned(capsys, "bcp", pipeline=pipeline)
    assert "tokenize-validation" in {job["stage"] for job in plan["jobs"]}
    data_list = after(program_words("bcp", pretrain_job(plan), "data_list.py"), "data_list.py")
    assert option(data_list, "--valid-data-dir") == "/mount_workspace/data/slimpajama/validation/preprocessed"
    training = entry_arguments("bcp", pretrain_job(plan))
    assert [o for o in overrides_of(training) if o.startswith("dataset.split=")] == ["dataset.split=null"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_training_comes_after_the_index_and_its_verification_checks_the_manifest(capsys, backend):
    plan = planned(capsys, backend)
    order = [(j["stage"], j["kind"]) for j in plan["jobs"]]
    assert (
        order.index(("tokenize-preprocess", "verify"))
        < order.index(("pretrain-index", "stage"))
        < order.index(("pretrain-index", "verify"))
        < order.index(("pretrain", "stage"))
    )
    verify = after(program_words(backend, stage_job(plan, "pretrain-index", "verify"), "verify.py"), "verify.py")
    manifest = option(
        after(program_words(backend, stage_job(plan, "pretrain-index"), "bridge_index.py"), "bridge_index.py"),
        "--manifest",
    )
    # the verification's view of the workspace (Grid Engine's runs on the host, the index job in its container)
    listed = option(verify, "--listed")
    assert verify == ["--check", f"{listed}=1", "--listed", listed]
    tail = "/results/gpt_8b-slimpajama-8b-bridge-RUN/data_index.json"
    assert listed.endswith(tail) and manifest.endswith(tail)


def test_locally_the_index_stage_runs_the_smoke_stand_in_s_own_index_build(capsys):
    plan = planned(capsys, "local")
    words = program_words("local", stage_job(plan, "pretrain-index"), "pretrain_local.py")
    training = program_words("local", pretrain_job(plan), "pretrain_local.py")
    assert words[: len(training)] == training  # the stand-in's own arguments: its dataset is the training's
    manifest = option(words, "--index-manifest")
    assert words[len(training) :] == ["--build-data-index", "--index-manifest", manifest]
    assert manifest.endswith("/results/gpt_8b-slimpajama-8b-bridge-RUN/data_index.json")


SMALL = """\
version: 1
stages_dir: @STAGES@
pipelines:
  small:
    backend: bcp
    workspace: {name: ws}
    defaults:
      bcp: {image: "nvcr.io/nvidia/nemo:26.08", instance: dgxa100.80g.8.norm, total_runtime: 4h,
            workspaces: [{name: ws, mount: /mount_workspace, mode: RW}]}
    stages:
      data:
        program: sample.py
        args: [--out, "${workspace}/mirror"]
      pretrain-index:
        program: bridge_index.py
        data_index_of: pretrain
        needs: [data]
        bcp: {instance: dgxa100.80g.1.norm}
      pretrain:
        program: pretrain_local.py
        needs: [data, pretrain-index]
        megatron_bridge:
          model: gpt3/126m
          run_name: gpt
          data_dir: ${workspace}/data
          bpe_dir: ${workspace}/bpe
          results_dir: ${workspace}/results
"""


def small_project(tmp_path: Path, old: str = "", new: str = "") -> Path:
    assert old in SMALL
    config = tmp_path / "pipelines.yaml"
    config.write_text(SMALL.replace("@STAGES@", str(STAGES)).replace(old, new, 1))
    return config


def test_the_small_project_plans(tmp_path, capsys):
    plan = planned(capsys, "bcp", small_project(tmp_path), "small")
    assert stage_job(plan, "pretrain-index")["printable"].count("bridge_index.py") == 1


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            "needs: [data, pretrain-index]",
            "needs: [data]",
            [
                "pretrain-index",
                "data_index_of",
                "stage pretrain does not wait for its data index",
                "add pretrain-index to its needs",
            ],
        ),
        (
            "data_index_of: pretrain",
            "data_index_of: data",
            ["data_index_of", "'data' is no megatron_bridge: stage of this pipeline", "those are: pretrain"],
        ),
        (
            "        data_index_of: pretrain\n",
            "        data_index_of: pretrain\n        args: [--world-size, '8']\n",
            ["args", "derived from stage pretrain's megatron_bridge: section", "leave them out"],
        ),
        (
            "        needs: [data]\n        bcp: {instance: dgxa100.80g.1.norm}",
            "        bcp: {instance: dgxa100.80g.1.norm}",
            [
                "needs",
                "stage pretrain needs data, and so does its data index",
                "add data to the needs of pretrain-index",
            ],
        ),
        (
            "program: bridge_index.py",
            "program: sample.py",
            ["program", "a stage with data_index_of runs bridge_index.py, not sample.py"],
        ),
    ],
)
def test_an_index_stage_that_could_not_build_its_training_s_index_is_refused(tmp_path, capsys, old, new, said):
    config = small_project(tmp_path, old, new)
    assert cli(config, "plan", "small") == 2
    err = capsys.readouterr().err
    assert f"{config}:" in err
    for text in said:
        assert text in err, err


def test_a_bridge_training_without_an_index_stage_is_told_how_to_get_one(tmp_path, capsys):
    config = small_project(tmp_path, "needs: [data, pretrain-index]", "needs: [data]")
    text = config.read_text()
    config.write_text(text.split("      pretrain-index:")[0] + "      pretrain:" + text.split("      pretrain:")[1])
    assert cli(config, "plan", "small") == 0
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert "stage pretrain: no stage builds its data index beforehand" in said
    assert "dist.distributed_timeout_minutes=30" in said and "data_index_of: pretrain" in said
