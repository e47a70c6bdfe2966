"""The Megatron-Bridge stage's checks before anything is submitted (config/bridge.py), through `plan` on the bundled
pipelines.yaml: each refusal exits 2 with one error naming the field, the value and the way out; the same stage
with the way out taken plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cli import cli

CONFIG = Path(__file__).resolve().parents[2] / "pipelines.yaml"
HUB_RECIPE = "pretrain.megatron_bridge.recipe=llama3_8b_pretrain_config"


def plan(capsys, pipeline: str, *sets: str) -> tuple[int, str, str]:
    args = [item for pair in (("--set", s) for s in sets) for item in pair]
    code = cli(CONFIG, "plan", pipeline, "--backend", "bcp", *args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("setting", "said"), [
    ("pretrain.bcp.image=nvcr.io/nvidia/nemo:24.12",
     ["bcp.image nvcr.io/nvidia/nemo:24.12 is a 24.12 image", "has no Megatron-Bridge", "nemo:26.08 or later"]),
    (HUB_RECIPE, ["recipe llama3_8b_pretrain_config", "Hugging Face Hub", "on bcp the job has no way in",
                  "megatron_bridge.hf_home", "NAME:KEY:HF_TOKEN", "vanilla_gpt_pretrain_config"]),
    ("pretrain.megatron_bridge.gpus_per_node=4",
     ["megatron_bridge.gpus_per_node is 4", "dgxa100.80g.8.norm has 8 GPUs", "set it to 8"]),
    ("pretrain.bcp.replicas=3",
     ["megatron_bridge on 3 node(s)", "global batch 512", "data-parallel size 6", "valid node counts",
      "1, 2, 4, 8, 16"]),
])
def test_a_bridge_stage_that_cannot_train_is_refused_before_submission(capsys, setting, said):
    code, out, err = plan(capsys, "slimpajama-8b-bridge", setting)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "stages.pretrain.megatron_bridge" in err
    for words in said:
        assert words in err, (words, err)


@pytest.mark.parametrize("access", ["pretrain.bcp.secrets=[hf-token:token:HF_TOKEN]",
                                    "pretrain.megatron_bridge.hf_home=${workspace}/hf"])
def test_a_hub_recipe_plans_once_the_job_has_a_way_in(capsys, access):
    code, out, err = plan(capsys, "slimpajama-8b-bridge", HUB_RECIPE, access)
    assert code == 0, err
    if "secrets" in access:  # the token travels as a secret: its name in the job, never its value
        assert "--secret hf-token:token:HF_TOKEN" in out
    else:  # a filled cache, used offline
        assert '--hf-home "$workspace/hf"' in out, out


def test_the_nemo_launcher_refuses_a_bridge_only_image_and_names_the_section_to_use(capsys):
    code, out, err = plan(capsys, "slimpajama-8b", "pretrain.bcp.image=nvcr.io/nvidia/nemo:26.08")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "nvcr.io/nvidia/nemo:26.08" in err and "megatron_bridge:" in err and "docs/pretraining.md" in err


def test_the_bundled_bridge_pipeline_plans_on_the_guides_shape(capsys):
    code, out, err = plan(capsys, "slimpajama-8b-bridge")
    assert code == 0, err
    assert "--image nvcr.io/nvidia/nemo:26.08" in out and "--replicas 8" in out and "--total-runtime 5D" in out
