"""The stage that evaluates a Megatron-Bridge training's checkpoints as they land (`evaluate_of:`,
config/evaluate.py), through `plan`: on every backend the bundled slimpajama-8b-bridge runs stages/evaluate.py
--from bridge beside the training (a streamed edge), with the training's recipe, data list and overrides (less a
job's time limit, saving and TensorBoard folder) and those of an evaluation, on one data-parallel rank, in the
training's image, straight; its verification counts one result per checkpoint of the schedule; `plan` estimates
it. A stage declared so that it could not evaluate is refused with the key and the way out."""

from __future__ import annotations

from pathlib import Path

import evaluate
import pytest
from support.bridge_venv import entry_arguments, pretrain_job
from support.cli import cli
from support.index_jobs import BACKENDS, IMAGE, after, option, overrides_of, planned, program_words, stage_job

from bcp_pipeline.config.evaluate import EVALUATION_OVERRIDES, scheduled_steps

CONFIG = Path(__file__).resolve().parents[2] / "pipelines.yaml"
STAGES = Path(__file__).resolve().parents[2] / "stages"
NOT_AN_EVALUATION = (
    "train.exit_duration_in_mins=",
    "checkpoint.save=",
    "checkpoint.load=",
    "checkpoint.save_interval=",
    "checkpoint.most_recent_k=",
    "logger.tensorboard_dir=",
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_evaluate_job_gives_bridge_the_training_s_settings_and_an_evaluation_s(capsys, backend):
    plan = planned(capsys, backend)
    job = stage_job(plan, "evaluate")
    words = after(program_words(backend, job, "evaluate.py"), "evaluate.py")
    training = entry_arguments(backend, pretrain_job(plan))
    kept = [o for o in overrides_of(training) if not o.startswith(NOT_AN_EVALUATION)]
    assert overrides_of(words) == [*kept, *EVALUATION_OVERRIDES]
    assert words[words.index("--") + 1 :] == overrides_of(words)  # all after `--`, as evaluate.py reads them
    assert option(words, "--from") == "bridge"
    assert option(words, "--recipe") == option(training, "--recipe")
    assert option(words, "--data-list") == option(training, "--overrides-file")
    assert option(words, "--world-size") == "4"  # TP 4 x PP 1 x CP 1: one data-parallel rank
    save = next(o.split("=", 1)[1] for o in training if o.startswith("checkpoint.save="))
    assert option(words, "--checkpoints") == save
    assert option(words, "--every") == next(
        o.split("=")[1] for o in training if o.startswith("checkpoint.save_interval=")
    )
    assert option(words, "--target-step") == next(
        o.split("=")[1] for o in training if o.startswith("train.train_iters=")
    )
    assert option(words, "--out").endswith("/results/gpt_8b-slimpajama-8b-bridge-RUN/evaluate")
    assert option(words, "--valid-data-dir").endswith("/data/slimpajama/validation/preprocessed")
    assert IMAGE[backend] in job["printable"]
    assert "bootstrap.sh" not in " ".join(program_words(backend, job, "evaluate.py"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_evaluation_starts_beside_the_training_and_counts_one_result_per_checkpoint(capsys, backend):
    plan = planned(capsys, backend)
    order = [(j["stage"], j["kind"]) for j in plan["jobs"]]
    assert order.index(("pretrain", "stage")) < order.index(("evaluate", "stage"))
    verify = after(program_words(backend, stage_job(plan, "evaluate", "verify"), "verify.py"), "verify.py")
    count = len(evaluate.scheduled_steps(1000, 300000))  # the stage program's own schedule
    assert count == len(scheduled_steps(1000, 300000)) == 300
    assert verify[0] == "--check" and verify[1].endswith(
        "/results/gpt_8b-slimpajama-8b-bridge-RUN/evaluate/step-*.json=300"
    )


def test_plan_estimates_the_evaluation_and_says_whether_it_keeps_pace(capsys):
    assert cli(CONFIG, "plan", "slimpajama-8b-bridge", "--backend", "bcp") == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("evaluate "))
    # two passes of 50 batches x 512 x 2048 tokens: the validation split's, then the test split's (test_data_dir)
    assert "dgxa100.80g.4.norm" in row and "300 results" in row
    assert "105 M tokens forward a checkpoint (validation and test splits)" in row
    # 2 x 52.4 M tokens x 43 G FLOPs / 3 on 4 x 312 TFLOP/s at MFU 0.4; a checkpoint every 1000 x 5.65 s
    assert "evaluate: one evaluation takes 50m" in out and "a checkpoint lands every 1h34m" in out
    assert "it keeps pace, busy 53%" in out
    capsys.readouterr()
    assert cli(CONFIG, "plan", "slimpajama-8b-bridge", "--set", "pretrain.megatron_bridge.test_data_dir=null") == 0
    alone = capsys.readouterr().out  # the validation split alone: one pass
    assert "52.4 M tokens forward a checkpoint," in alone and "evaluate: one evaluation takes 25m" in alone
    # the data's preparation ends before the training starts: the evaluation after it is no part of it
    data_line = next(line for line in out.splitlines() if line.startswith("data preparation: "))
    assert "d" not in data_line.split(": ", 1)[1]  # hours, not the training's days


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
      pretrain:
        program: pretrain_local.py
        needs: [data]
        megatron_bridge:
          model: gpt3/126m
          run_name: gpt
          data_dir: ${workspace}/data
          valid_data_dir: ${workspace}/valid
          bpe_dir: ${workspace}/bpe
          results_dir: ${workspace}/results
      evaluate:
        program: evaluate.py
        evaluate_of: pretrain
        needs: [{stage: pretrain, stream: true}]
        bcp: {instance: dgxa100.80g.1.norm}
"""


def small_project(tmp_path: Path, old: str = "", new: str = "") -> Path:
    assert old in SMALL
    config = tmp_path / "pipelines.yaml"
    config.write_text(SMALL.replace("@STAGES@", str(STAGES)).replace(old, new, 1))
    return config


def test_the_small_project_plans_an_evaluation_on_one_gpu(tmp_path, capsys):
    plan = planned(capsys, "bcp", small_project(tmp_path), "small")
    words = after(program_words("bcp", stage_job(plan, "evaluate"), "evaluate.py"), "evaluate.py")
    assert option(words, "--world-size") == "1" and option(words, "--target-step") == "600000"


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            "evaluate_of: pretrain",
            "evaluate_of: data",
            ["evaluate_of", "'data' is no megatron_bridge: stage of this pipeline", "those are: pretrain"],
        ),
        (
            "        evaluate_of: pretrain\n",
            "        evaluate_of: pretrain\n        args: [--every, '10']\n",
            ["args", "derived from stage pretrain's megatron_bridge: section", "leave them out"],
        ),
        (
            "needs: [{stage: pretrain, stream: true}]",
            "needs: [pretrain]",
            ["needs", "give needs: [{stage: pretrain, stream: true}]"],
        ),
        (
            "          valid_data_dir: ${workspace}/valid\n",
            "",
            ["evaluate_of", "stage pretrain has no held-out split to evaluate on", "megatron_bridge.valid_data_dir"],
        ),
        (
            "program: evaluate.py",
            "program: sample.py",
            ["program", "a stage with evaluate_of runs evaluate.py, not sample.py"],
        ),
    ],
)
def test_an_evaluate_stage_that_could_not_evaluate_its_training_is_refused(tmp_path, capsys, old, new, said):
    config = small_project(tmp_path, old, new)
    assert cli(config, "plan", "small") == 2
    err = capsys.readouterr().err
    assert f"{config}:" in err
    for text in said:
        assert text in err, err


def test_a_streamed_evaluation_of_a_bridge_training_with_args_is_told_to_use_evaluate_of(tmp_path, capsys):
    config = small_project(
        tmp_path,
        "        evaluate_of: pretrain\n",
        "        args: [--checkpoints, c, --valid-data-dir, v, --out, o, --every, '1', --target-step, '2']\n"
        "        verify: [{glob: o/step-*.json, expect: 2}]\n",
    )
    assert cli(config, "plan", "small") == 2
    err = capsys.readouterr().err
    assert "give this stage evaluate_of: pretrain and no args" in err


def test_a_training_that_saves_no_checkpoint_plans_and_is_told_its_evaluation_waits_for_nothing(tmp_path, capsys):
    config = small_project(
        tmp_path,
        "          results_dir: ${workspace}/results\n",
        "          results_dir: ${workspace}/results\n          checkpoints: false\n",
    )
    assert cli(config, "plan", "small") == 0  # as `profile` sets it: the training alone runs
    said = "".join(capsys.readouterr())
    assert "stage pretrain saves no checkpoint" in said and "--only pretrain" in said
