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


H100 = "pretrain.bcp.instance=dgxh100.80g.8.norm"


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        (
            "pretrain.bcp.image=nvcr.io/nvidia/nemo:24.12",
            [
                "bcp.image nvcr.io/nvidia/nemo:24.12 is a 24.12 image",
                "has no Megatron-Bridge",
                "the first image that works is nvcr.io/nvidia/nemo:26.04",
            ],
        ),
        # 25.11-26.02 have a Bridge (0.2-0.3) without the recipe and the data-list key the job uses (Bridge 0.4.0)
        (
            "pretrain.bcp.image=nvcr.io/nvidia/nemo:26.02",
            [
                "bcp.image nvcr.io/nvidia/nemo:26.02 is a 26.02 image",
                "older than 0.4.0",
                "vanilla_gpt_pretrain_config",
                "dataset.data_path",
                "the first image that works is nvcr.io/nvidia/nemo:26.04",
            ],
        ),
        (
            "pretrain.slurm.container_image=nvcr.io#nvidia/nemo:25.11",
            ["slurm.container_image nvcr.io#nvidia/nemo:25.11 is a 25.11 image", "nvcr.io/nvidia/nemo:26.04"],
        ),
        # FP8 on the bundled dgxa100 instance: TE has no FP8 on an A100; `fp8` is fp8-current
        (
            "pretrain.megatron_bridge.precision=fp8",
            [
                "megatron_bridge.precision fp8 trains in FP8",
                "bcp.instance dgxa100.80g.8.norm is an A100",
                "Transformer Engine has no FP8",
                "precision bf16",
            ],
        ),
        (
            "pretrain.megatron_bridge.precision=fp8-delayed",
            ["megatron_bridge.precision fp8-delayed", "bcp.instance dgxa100.80g.8.norm is an A100"],
        ),
        (
            "pretrain.megatron_bridge.overrides=[mixed_precision=bf16_with_fp8_delayed_scaling_mixed]",
            [
                "megatron_bridge.overrides mixed_precision=bf16_with_fp8_delayed_scaling_mixed trains in FP8",
                "dgxa100.80g.8.norm is an A100",
            ],
        ),
        (
            "pretrain.megatron_bridge.precision=fp9",
            ["megatron_bridge.precision", "'fp9' is not one of 'bf16', 'fp8', 'fp8-current', 'fp8-delayed'"],
        ),
        (
            "pretrain.megatron_bridge.activation_offload=32",
            ["megatron_bridge.activation_offload 32", "from 1 to 31", "the model's 32 layers"],
        ),
        (
            "pretrain.megatron_bridge.fsdp=true",  # with the next --set, given first below
            [
                "megatron_bridge.fsdp (Megatron-FSDP) needs CUDA_DEVICE_MAX_CONNECTIONS unset or above 1",
                "bcp.env sets it to 1",
            ],
        ),
        (
            HUB_RECIPE,
            [
                "recipe llama3_8b_pretrain_config",
                "Hugging Face Hub",
                "on bcp the job has no way in",
                "megatron_bridge.hf_home",
                "NAME:KEY:HF_TOKEN",
                "vanilla_gpt_pretrain_config",
            ],
        ),
        (
            "pretrain.megatron_bridge.gpus_per_node=4",
            ["megatron_bridge.gpus_per_node is 4", "dgxa100.80g.8.norm has 8 GPUs", "set it to 8"],
        ),
        (
            "pretrain.bcp.replicas=3",
            [
                "megatron_bridge on 3 node(s)",
                "global batch 512",
                "data-parallel size 6",
                "valid node counts",
                "1, 2, 4, 8, 16",
            ],
        ),
    ],
)
def test_a_bridge_stage_that_cannot_train_is_refused_before_submission(capsys, setting, said):
    more = {"pretrain.megatron_bridge.fsdp=true": ["pretrain.bcp.env.CUDA_DEVICE_MAX_CONNECTIONS=1"]}
    code, out, err = plan(capsys, "slimpajama-8b-bridge", setting, *more.get(setting, []))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "stages.pretrain.megatron_bridge" in err
    for words in said:
        assert words in err, (words, err)


@pytest.mark.parametrize(
    "access", ["pretrain.bcp.secrets=[hf-token:token:HF_TOKEN]", "pretrain.megatron_bridge.hf_home=${workspace}/hf"]
)
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


@pytest.mark.parametrize(
    ("sets", "said"),
    [
        # an H100 instance, but the Kubernetes pods select A100 nodes (the GPU feature discovery label; EC2 p4d)
        (
            [
                H100,
                "pretrain.megatron_bridge.precision=fp8-current",
                "pretrain.kubernetes.node_selector={nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}",
            ],
            "kubernetes.node_selector nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB is an A100",
        ),
        (
            [
                H100,
                "pretrain.megatron_bridge.precision=fp8",
                "pretrain.kubernetes.node_selector={node.kubernetes.io/instance-type: p4de.24xlarge}",
            ],
            "kubernetes.node_selector node.kubernetes.io/instance-type=p4de.24xlarge is an A100",
        ),
        (
            [H100, "pretrain.megatron_bridge.precision=fp8", "pretrain.slurm.extra_args=[--gres=gpu:a100:8]"],
            "slurm.extra_args --gres=gpu:a100:8 is an A100",
        ),
        (
            [H100, "pretrain.megatron_bridge.precision=fp8", "pretrain.gridengine.resources=[gpu_type=A100]"],
            "gridengine.resources gpu_type=A100 is an A100",
        ),
        (
            ["pretrain.megatron_bridge.activation_offload=4", "pretrain.megatron_bridge.pipeline_parallel=2"],
            "megatron_bridge.activation_offload 4 with pipeline_parallel 2",
        ),
    ],
)
def test_a_knob_that_cannot_run_where_the_stage_declares_it_is_refused(capsys, sets, said):
    code, out, err = plan(capsys, "slimpajama-8b-bridge", *sets)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert said in err and "stages.pretrain.megatron_bridge" in err, err


def rendered(out: str) -> set[str]:
    return {word for line in out.splitlines() for word in line.split() if "=" in word and not word.startswith("-")}


@pytest.mark.parametrize(
    ("sets", "present", "absent"),
    [
        (
            [],
            {"mixed_precision=bf16_mixed", "ddp.average_in_collective=true"},
            {"checkpoint.async_save=true", "ddp.use_megatron_fsdp=true", "model.cpu_offloading=true"},
        ),
        (
            [H100, "pretrain.megatron_bridge.precision=fp8"],
            {"mixed_precision=bf16_with_fp8_current_scaling_mixed"},
            set(),
        ),
        (
            [H100, "pretrain.megatron_bridge.precision=fp8-delayed"],
            {"mixed_precision=bf16_with_fp8_delayed_scaling_mixed"},
            set(),
        ),
        (
            ["pretrain.megatron_bridge.async_save=true"],
            {"checkpoint.async_save=true", "checkpoint.ckpt_format=torch_dist"},
            set(),
        ),
        # no checkpoints (what `profile` makes of the stage): nothing is saved, so no background save either
        (
            ["pretrain.megatron_bridge.async_save=true", "pretrain.megatron_bridge.checkpoints=false"],
            {"checkpoint.save=null"},
            {"checkpoint.async_save=true"},
        ),
        (
            ["pretrain.megatron_bridge.fsdp=true"],
            {
                "ddp.use_megatron_fsdp=true",
                "ddp.data_parallel_sharding_strategy=optim_grads_params",
                "checkpoint.ckpt_format=fsdp_dtensor",
            },
            {"ddp.average_in_collective=true"},
        ),
        (
            ["pretrain.megatron_bridge.activation_offload=4"],
            {
                "model.cpu_offloading=true",
                "model.cpu_offloading_num_layers=4",
                "model.cpu_offloading_activations=true",
                "model.cpu_offloading_weights=false",
            },
            set(),
        ),
    ],
)
def test_each_knob_renders_bridge_s_own_settings(capsys, sets, present, absent):
    code, out, err = plan(capsys, "slimpajama-8b-bridge", *sets)
    assert code == 0, err
    words = rendered(out)
    assert present <= words, present - words
    assert not absent & words, absent & words


def test_the_first_image_with_a_usable_bridge_plans(capsys):
    code, out, err = plan(capsys, "slimpajama-8b-bridge", "pretrain.bcp.image=nvcr.io/nvidia/nemo:26.04")
    assert code == 0, err
    assert "--image nvcr.io/nvidia/nemo:26.04" in out
