"""Past configuration: the model and the weight-decay schedule each bundled Megatron-Bridge pipeline trains, built
on CPU by NVIDIA's REAL code (megatron-bridge 0.6.2, megatron-core 0.19.2, the environment scripts/bridge-venv
builds) from the config the overrides `plan` renders resolve to (tests/support/bridge_build_probe.py).

What is real: the entry program's own parser and `build_config`, Bridge's recipe, override code and
`runtime_config_update`, as its `--dry-run`; then Bridge's `provide_distributed_model` and megatron-core's whole
construction of the GPT model with Bridge's default layer spec (Transformer Engine's): the GPTModel, its
TransformerBlock, each TransformerLayer, SelfAttention and MLP, the embeddings and output layer, and the __init__ of
each of megatron-core's TE extension classes (TEDotProductAttention, TELayerNormColumnParallelLinear,
TERowParallelLinear, TENorm) up to its call into Transformer Engine. So every setting megatron-core refuses while
it builds raises here as it would on every rank of the job: `model.apply_query_key_layer_scaling=true` planted
into the rendered overrides fails with megatron-core's ValueError. For the schedule, megatron-core's parameter
groups of that model (with Bridge's weight-decay overrides) and Bridge's own scheduler construction
(megatron-core's OptimizerParamScheduler, which applies step 0 when it is built).

What is not, and why: Transformer Engine is CUDA only. A STAND-IN (tests/fakes/transformer_engine_standin.py, build
mode, only inside the probe's process) answers as TE 2.14.0, binds each constructor call to TE's own parameter
list (an argument TE does not take fails) and stops there; TE's own checks inside its constructors do not run, and
the parameters TE would create do not exist (the counts below are megatron-core's own: embeddings and output
layer). The process group is torch's fake backend: rank 0 of the job's 64 ranks, whose layout and shapes the build
has, with no communication. Parameters are on the meta device (Bridge's `init_model_with_meta_device`); the DDP
wrapper and the CUDA seeding are not run. Megatron-core's optimizers need CUDA, so the schedule acts on a plain
torch AdamW over megatron-core's parameter groups. The vocabulary size is the job's GPT-2 vocab.json's (Bridge
0.6.2 builds that tokenizer through the Hugging Face Hub).

One probe process runs every case (one import of Bridge): about 35 s of CPU; 2-3.5 minutes on 2 cores shared with
other work (load 8-14), measured 2026-12-01.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.bridge_build import as_job_has_them, job_files, planned_arguments, run_probe
from support.bridge_venv import REPO, bridge_python, bundled_bridge_sections

WORLD = 8 * 8  # the bundled 8B job: 8 nodes of 8 GPUs
GPT2_VOCAB = 50257
PIPELINES = list(bundled_bridge_sections())
# The launcher configs' shapes (NeMo launcher 23.11 YAML), as the model must be built: layers, hidden, FFN, heads,
# query groups, TP, normalization, layernorm1p, gated MLP, learned positions, tied embeddings; and Llama 3 8B's
# (meta-llama/Meta-Llama-3-8B config.json) with GPT-2's vocabulary, which config/bridge.py bundles beside them.
SHAPES = {
    "7b_improved": dict(
        model="gpt3/7b_improved",
        layers=32,
        hidden=4096,
        ffn=10880,
        heads=32,
        query_groups=32,
        tp=4,
        normalization="LayerNorm",
        gated=True,
        zero_centered_gamma=True,
        learned_positions=False,
        tied=False,
        bias=False,
    ),
    "126m": dict(
        model="gpt3/126m",
        layers=12,
        hidden=768,
        ffn=3072,
        heads=12,
        query_groups=12,
        tp=1,
        normalization="LayerNorm",
        gated=False,
        zero_centered_gamma=False,
        learned_positions=True,
        tied=True,
        bias=True,
    ),
    "llama3-8b-gpt2": dict(
        model="llama3-8b-gpt2",
        layers=32,
        hidden=4096,
        ffn=14336,
        heads=32,
        query_groups=8,
        tp=4,
        normalization="RMSNorm",
        gated=True,
        zero_centered_gamma=False,
        learned_positions=False,
        tied=False,
        bias=False,
    ),
}
BY_MODEL = {want["model"]: name for name, want in SHAPES.items()}


def bundled_shape(pipeline: str) -> str:
    return BY_MODEL[bundled_bridge_sections()[pipeline].get("model", "gpt3/7b_improved")]


def shapes_of(pipeline: str) -> list[str]:
    """The pipeline's own model, and the GPT pipelines at 126m too (a pipeline that exports its model is held to the
    one model it exports: config/export.py refuses another)."""
    bundled = bundled_shape(pipeline)
    return [bundled, "126m"] if bundled == "7b_improved" else [bundled]


PIPELINE_SHAPES = [(pipeline, shape) for pipeline in PIPELINES for shape in shapes_of(pipeline)]
SCHEDULER_OVERRIDES = ("scheduler.start_weight_decay=", "scheduler.end_weight_decay=")
QK_SCALING = "model.apply_query_key_layer_scaling=true"


def shape_sets(pipeline: str, shape: str) -> list[str]:
    return [] if shape == bundled_shape(pipeline) else [f"pretrain.megatron_bridge.model={SHAPES[shape]['model']}"]


def cases(project: Path, folder: Path) -> list[dict]:
    data_list, bpe = job_files(folder)

    def case(name: str, what: str, pipeline: str, shape: str, sets=(), drop=()) -> dict:
        arguments = planned_arguments(project, pipeline, [*shape_sets(pipeline, shape), *sets])
        kept = [a for a in arguments if not a.startswith(tuple(drop))] if drop else arguments
        return {"name": name, "what": what, "argv": as_job_has_them(kept, data_list, bpe), "world_size": WORLD}

    found = []
    for pipeline in PIPELINES:
        for shape in shapes_of(pipeline):
            found += [
                case(f"{pipeline}-{shape}-model", "model", pipeline, shape),
                case(f"{pipeline}-{shape}-scheduler", "scheduler", pipeline, shape),
                # the state before the fix: no scheduler weight decay rendered, the recipe's left
                case(f"{pipeline}-{shape}-scheduler-old", "scheduler", pipeline, shape, drop=SCHEDULER_OVERRIDES),
            ]
        found.append(
            case(
                f"{pipeline}-qk-planted",
                "model",
                pipeline,
                bundled_shape(pipeline),
                sets=[f'pretrain.megatron_bridge.overrides=["{QK_SCALING}"]'],
            )
        )
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, dict]:
    python = bridge_python()
    project = tmp_path_factory.mktemp("project")
    shutil.copy(REPO / "pipelines.yaml", project / "pipelines.yaml")
    (project / "stages").symlink_to(REPO / "stages")
    folder = tmp_path_factory.mktemp("probe")
    return run_probe(python, cases(project, folder), folder)


def padded_vocab(tp: int) -> int:
    multiple = 128 * tp  # model.make_vocab_size_divisible_by=128, times TP (Bridge's calculate_padded_vocab_size)
    return math.ceil(GPT2_VOCAB / multiple) * multiple


@pytest.mark.parametrize("pipeline, shape", PIPELINE_SHAPES)
def test_the_bundled_model_builds_up_to_transformer_engine(built, pipeline, shape):
    result, want = built[f"{pipeline}-{shape}-model"], SHAPES[shape]
    assert "error" not in result, result
    layers, hidden, tp = want["layers"], want["hidden"], want["tp"]
    assert (result["tensor_parallel"], result["data_parallel"]) == (tp, WORLD // tp)
    # every layer's attention and linears, and the final norm, reached TE: megatron-core's checks all passed
    norm = f"TENorm -> transformer_engine.pytorch.{want['normalization']}"
    assert result["reached"] == {
        "TEDotProductAttention -> transformer_engine.pytorch.DotProductAttention": layers,
        "TELayerNormColumnParallelLinear -> transformer_engine.pytorch.LayerNormLinear": 2 * layers,  # qkv, fc1
        "TERowParallelLinear -> transformer_engine.pytorch.Linear": 2 * layers,  # proj, fc2
        norm: 1,
    }
    assert result["modules"]["TransformerLayer"] == layers
    # what megatron-core handed TE is the pipeline's model
    [attention] = result["te_calls"]["pytorch.DotProductAttention"]
    kv_channels = hidden // want["heads"]
    assert (
        attention["num_attention_heads"],
        attention["num_gqa_groups"],
        attention["kv_channels"],
        attention["tp_size"],
    ) == (want["heads"], want["query_groups"], kv_channels, tp)
    norms = result["te_calls"]["pytorch.LayerNormLinear"]
    assert {(n["in_features"], n["normalization"], n["zero_centered_gamma"], n["eps"], n["bias"]) for n in norms} == {
        (hidden, want["normalization"], want["zero_centered_gamma"], 1e-05, want["bias"])
    }
    qkv_width = hidden + 2 * want["query_groups"] * kv_channels  # the queries, and a key and a value per group
    assert {n["out_features"] for n in norms} == {qkv_width, (2 if want["gated"] else 1) * want["ffn"]}
    # megatron-core's own parameters on rank 0: the embedding (and learned positions), the output layer unless tied
    embedding = padded_vocab(tp) // tp * hidden
    assert result["parameters"] == embedding * (1 if want["tied"] else 2) + (
        2048 * hidden if want["learned_positions"] else 0
    )


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_planted_query_key_layer_scaling_fails_the_build(built, pipeline):
    """The launcher's `apply_query_key_layer_scaling: true`, rendered as before the fix: megatron-core's
    TEDotProductAttention refuses it (NVTE_APPLY_QK_LAYER_SCALING unset), as it would on every rank."""
    planted = built[f"{pipeline}-qk-planted"]
    assert planted.get("error") == "ValueError", planted
    assert planted["message"].startswith(
        "apply_query_key_layer_scaling is True but environment variable NVTE_APPLY_QK_LAYER_SCALING is None"
    )
    assert "error" not in built[f"{pipeline}-{bundled_shape(pipeline)}-model"]  # the bundled overrides build


def decays(result: dict) -> set[tuple[float, float]]:
    """(wd_mult, weight_decay) of each parameter group holding parameters, as the scheduler left them."""
    assert "error" not in result, result
    return {(g["wd_mult"], round(g["weight_decay"], 6)) for g in result["groups"] if g["parameters"]}


@pytest.mark.parametrize("pipeline, shape", PIPELINE_SHAPES)
def test_the_scheduler_applies_the_pipeline_s_weight_decay_at_step_0(built, pipeline, shape):
    result = built[f"{pipeline}-{shape}-scheduler"]
    assert (1.0, 0.1) in decays(result)  # the launcher's weight decay, 0.1
    assert decays(result) <= {(1.0, 0.1), (0.0, 0.0)}


@pytest.mark.parametrize("pipeline, shape", PIPELINE_SHAPES)
def test_without_the_scheduler_s_weight_decay_the_recipe_s_overwrites_it(built, pipeline, shape):
    """The overrides before the fix: optimizer.weight_decay=0.1, but the recipe's scheduler (0.033 from start to
    end) sets every group's weight decay from step 0."""
    result = built[f"{pipeline}-{shape}-scheduler-old"]
    assert "error" not in result, result
    assert result["optimizer.weight_decay"] == 0.1
    assert (1.0, 0.033) in decays(result)
    assert (1.0, 0.1) not in decays(result)


STAND_IN = """
import sys
sys.path.insert(0, sys.argv[1])
import transformer_engine_standin as standin
standin.install_build()
import transformer_engine as te
from transformer_engine.pytorch.fp8 import FP8GlobalStateManager
print("version", te.__version__)
for call in ("te.pytorch.Linear(16, 48, tp_size=4, parallel_mode='column')",  # as megatron-core calls it
             "te.pytorch.Linear(16, 48, output_size=48)",  # not a parameter of TE's Linear
             "te.pytorch.DotProductAttention(kv_channels=128)",  # a required one missing
             "FP8GlobalStateManager.is_fp8_enabled()"):  # any other call into TE
    try:
        eval(call)
    except standin.ReachedTransformerEngine as stop:
        print("reached", stop.name, sorted(stop.arguments))
    except TypeError as refused:
        print("refused", refused)
try:
    import transformer_engine.pytorch.cpu_offload
except ModuleNotFoundError:
    print("absent cpu_offload")
"""


def test_the_stand_in_stops_at_transformer_engine_and_is_never_kinder():
    """The build mode's own contract, which the build tests rely on: TE's version as chosen, every call stopped,
    and a call TE's own constructor would refuse refused."""
    result = subprocess.run(
        [sys.executable, "-c", STAND_IN, str(REPO / "tests" / "fakes")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        "version 2.14.0",
        "reached pytorch.Linear ['in_features', 'out_features', 'parallel_mode', 'tp_size']",
        "refused pytorch.Linear.__init__() got an unexpected keyword argument 'output_size'",
        "refused pytorch.DotProductAttention.__init__() missing required argument(s): num_attention_heads",
        "reached pytorch.fp8.FP8GlobalStateManager.is_fp8_enabled ['args']",
        "absent cpu_offload",
    ]
