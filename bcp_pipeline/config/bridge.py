"""Pretraining with NVIDIA's Megatron-Bridge: the models it trains for the launcher configs it replaces, the
overrides every job renders, the per-job time limit, and the checks that need no data.

The job runs stages/bridge_pretrain.py (our entry program, built on the `megatron-bridge` wheel's public API: a
recipe, `process_config_with_overrides`, `pretrain`), once per rank. Facts with their sources (NVIDIA-NeMo/
Megatron-Bridge v0.6.0-0.6.2; NVIDIA/NeMo-Megatron-Launcher at the 23.11 tag for the launcher configs):
- Every recipe defaults `checkpoint.save` to `$PWD/nemo_experiments/default/checkpoints` and `checkpoint.load` to
  nothing, so runs started in one folder would resume each other: every job here sets both, to its run's folder
  (setting `load` resumes from the newest checkpoint there, and is harmless where there is none).
- `checkpoint.most_recent_k` defaults to keeping every checkpoint (about 90 GB each for 8B): bounded here.
- `train.exit_duration_in_mins` counts minutes from when `pretrain()` creates its state, BEFORE the model is built,
  the checkpoint loaded and the data index built, and is not kept in checkpoints: a limit per job. On expiry rank 0
  saves a checkpoint, logs `exiting program after N minutes` and every rank exits 0.
- The per-step line comes from the LAST rank only (`print_rank_last`), with `throughput per GPU (TFLOP/s/GPU)`
  only under `logger.log_throughput=true`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from bcp_pipeline.config.bridge_knobs import knob_overrides, knobs_error, offload_error, without_fsdp_conflicts
from bcp_pipeline.config.data_list_command import DataListForm, held_out_error
from bcp_pipeline.config.durations import parse_duration
from bcp_pipeline.config.model import Continuation, MegatronBridgeTraining, PipelineConfig, StageConfig
from bcp_pipeline.config.nemo import MAX_NODES_LISTED, launcher_version, parallel_sizes_error
from bcp_pipeline.config.placeholders import substitute
from bcp_pipeline.config.resources import RESOURCE_TYPES, rank_layout

RUN_ID = "${run_id}"  # the bcp-pipeline run's id, as a placeholder the renderers resolve
ENTRY_PROGRAM = "bridge_pretrain.py"  # in stages/: what every rank of a Bridge pretrain runs
DATA_PATH_KEY = "dataset.data_path"  # the data list: [weight, prefix, weight, prefix, ...] (Megatron-LM semantics)
DATA_LIST_FILE = "data_path.txt"  # the data list override, written into the run's folder by the job's first step
# With a held-out split: data_list.py's default form, megatron-core's dataset.blend_per_split.
DATA_LIST = DataListForm(key=DATA_PATH_KEY, split_form=None)
# Recipes that read their architecture from the Hugging Face Hub (a gated repository) when they are built.
HUB_RECIPE = re.compile(r"^(llama|llama2|llama3|llama31|llama32|codellama|mistral|qwen|gemma)", re.IGNORECASE)


@dataclass(frozen=True)
class BridgeModel:
    """What a Bridge job trains: the shape, the parallel and batch sizes, and the steps; with the architecture and
    optimizer overrides that make it the same model as the launcher config it replaces."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    seq_length: int
    tensor_parallel: int
    pipeline_parallel: int
    context_parallel: int
    global_batch_size: int
    micro_batch_size: int
    train_iters: int
    gated_mlp: bool
    architecture: tuple[str, ...] = ()  # model.*, optimizer.*, scheduler.* overrides beyond the shape


# The launcher's training configs (NeMo-Megatron-Launcher 23.11, launcher_scripts/conf/training/gpt3/*.yaml) as
# Megatron-Bridge settings: model (layers/hidden/FFN/heads, seq 2048), the 23.11 sizes (config/nemo.py KNOWN_MODELS)
# and what the yaml sets beyond them. 7b_improved: fast-swiglu (a gated SiLU), rope on half the head dimension,
# layernorm1p (LayerNorm with a zero-centred gamma), no biases, untied embeddings, no dropout, init std 0.01, Adam
# lr 1e-4 -> 1e-5 cosine after 500 warm-up steps. 126m: GELU, learned positions, biases, tied embeddings, dropout
# 0.1, init std 0.023, lr 6e-4 -> 6e-5 after 636 warm-up steps. Both: eps 1e-5, vocabulary padded to a multiple of
# 128 x TP, weight decay 0.1, betas 0.9/0.95, gradient clip 1.0, seed 1234, split 99990/8/2, a validation every
# 2000 steps of 50 batches. Not carried over, on purpose (docs/pretraining.md, "Settings and why"):
# - the launchers' `apply_query_key_layer_scaling: true`: NeMo 1.x applied it only in fp16, and megatron-core's
#   TEDotProductAttention refuses it at model build unless NVTE_APPLY_QK_LAYER_SCALING matches;
# and added: the weight decay also as the scheduler's start and end value (the recipe's scheduler sets 0.033 for
# both and overwrites optimizer.weight_decay from step 0), and the data-parallel overlap of Bridge's production
# recipes (the vanilla recipe is its correlation baseline, with gradient reduce and parameter gather exposed).
_COMMON = (
    "model.layernorm_epsilon=1e-05",
    "model.make_vocab_size_divisible_by=128",
    "optimizer.weight_decay=0.1",
    "scheduler.start_weight_decay=0.1",
    "scheduler.end_weight_decay=0.1",
    "optimizer.adam_beta1=0.9",
    "optimizer.adam_beta2=0.95",
    "optimizer.clip_grad=1.0",
    "scheduler.lr_decay_style=cosine",
    "rng.seed=1234",
    "dataset.split='99990,8,2'",
    "validation.eval_interval=2000",
    "validation.eval_iters=50",
    "ddp.overlap_grad_reduce=true",
    "ddp.overlap_param_gather=true",
    "ddp.average_in_collective=true",
)
LAUNCHER_MODELS: dict[str, BridgeModel] = {
    "gpt3/126m": BridgeModel(
        num_layers=12,
        hidden_size=768,
        ffn_hidden_size=3072,
        num_attention_heads=12,
        seq_length=2048,
        tensor_parallel=1,
        pipeline_parallel=1,
        context_parallel=1,
        global_batch_size=256,
        micro_batch_size=4,
        train_iters=600000,
        gated_mlp=False,
        architecture=(
            "model.activation_func=gelu",
            "model.gated_linear_unit=false",
            "model.position_embedding_type=learned_absolute",
            "model.normalization=LayerNorm",
            "model.layernorm_zero_centered_gamma=false",
            "model.add_bias_linear=true",
            "model.share_embeddings_and_output_weights=true",
            "model.hidden_dropout=0.1",
            "model.attention_dropout=0.1",
            "model.init_method_std=0.023",
            "optimizer.lr=0.0006",
            "optimizer.min_lr=6e-05",
            "scheduler.lr_warmup_iters=636",
            *_COMMON,
        ),
    ),
    "gpt3/7b_improved": BridgeModel(
        num_layers=32,
        hidden_size=4096,
        ffn_hidden_size=10880,
        num_attention_heads=32,
        seq_length=2048,
        tensor_parallel=4,
        pipeline_parallel=1,
        context_parallel=1,
        global_batch_size=512,
        micro_batch_size=1,
        train_iters=300000,
        gated_mlp=True,
        architecture=(
            "model.activation_func=silu",
            "model.gated_linear_unit=true",
            "model.position_embedding_type=rope",
            "model.rotary_percent=0.5",
            "model.normalization=LayerNorm",
            "model.layernorm_zero_centered_gamma=true",
            "model.add_bias_linear=false",
            "model.share_embeddings_and_output_weights=false",
            "model.hidden_dropout=0.0",
            "model.attention_dropout=0.0",
            "model.init_method_std=0.01",
            "optimizer.lr=0.0001",
            "optimizer.min_lr=1e-05",
            "scheduler.lr_warmup_iters=500",
            *_COMMON,
        ),
    ),
}
# Not a launcher config: Llama 3 8B's shape (32 layers, hidden 4096, SwiGLU FFN 14336, 32 heads in 8 query groups,
# RMSNorm eps 1e-5, RoPE on the whole head with base 500,000, no biases, untied embeddings; meta-llama/Meta-Llama-3-8B
# config.json) with GPT-2's vocabulary and the guide's sequence 2048, sizes and schedule (7b_improved's), at Llama 3's
# learning rate (3e-4 -> 3e-5, 2000 warm-up steps). It has a Hugging Face architecture (LlamaForCausalLM), so an
# `export_of` stage can export it through Megatron-Bridge's AutoBridge (config/export.py); 7b_improved has none.
LAUNCHER_MODELS["llama3-8b-gpt2"] = BridgeModel(
    num_layers=32,
    hidden_size=4096,
    ffn_hidden_size=14336,
    num_attention_heads=32,
    seq_length=2048,
    tensor_parallel=4,
    pipeline_parallel=1,
    context_parallel=1,
    global_batch_size=512,
    micro_batch_size=1,
    train_iters=300000,
    gated_mlp=True,
    architecture=(
        "model.activation_func=silu",
        "model.gated_linear_unit=true",
        "model.position_embedding_type=rope",
        "model.rotary_percent=1.0",
        "model.rotary_base=500000",
        "model.num_query_groups=8",
        "model.normalization=RMSNorm",
        "model.layernorm_zero_centered_gamma=false",
        "model.add_bias_linear=false",
        "model.add_qkv_bias=false",
        "model.share_embeddings_and_output_weights=false",
        "model.hidden_dropout=0.0",
        "model.attention_dropout=0.0",
        "model.init_method_std=0.02",
        "optimizer.lr=0.0003",
        "optimizer.min_lr=3e-05",
        "scheduler.lr_warmup_iters=2000",
        *_COMMON,
    ),
)
MODEL_FIELDS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "seq_length",
    "tensor_parallel",
    "pipeline_parallel",
    "context_parallel",
    "global_batch_size",
    "micro_batch_size",
    "train_iters",
)
# The process group's timeout: how long a rank waits in a collective for the others. Bridge's default, 10 minutes,
# is shorter than rank 0's build of a large blend's data index (Megatron-Bridge PR #4385), which every other rank
# waits for in a barrier; with the index built beforehand what is left is reading it and loading the checkpoint.
DISTRIBUTED_TIMEOUT_MINUTES = 30
# The first NeMo Framework image with Megatron-Bridge is 25.11 (Bridge 0.2.0), but the recipe the jobs build
# (vanilla_gpt_pretrain_config) and the key of their data list (dataset.data_path) first exist in Bridge 0.4.0, the
# 26.04 image's; 26.08 has Bridge 0.6.0.
FIRST_IMAGE_WITH_BRIDGE = (25, 11)
FIRST_BRIDGE_IMAGE = (26, 4)
FIRST_BRIDGE_IMAGE_NAME = "nvcr.io/nvidia/nemo:26.04"


def bridge_model(stage: StageConfig) -> BridgeModel:
    """The model the stage trains: each value the section gives, else its launcher config's. ValueError naming
    what to give when neither tells."""
    section = stage.megatron_bridge
    assert section is not None
    known = LAUNCHER_MODELS.get(section.model)
    given = {name: getattr(section, name) for name in MODEL_FIELDS}
    if known is None:
        missing = [name for name, value in given.items() if value is None and name != "context_parallel"]
        if missing:
            raise ValueError(
                f"megatron_bridge.model {section.model!r} is not one of the launcher configs this tool "
                f"knows ({', '.join(LAUNCHER_MODELS)}): give {', '.join(missing)} in the stage's "
                "megatron_bridge: section"
            )
        return BridgeModel(**{**given, "context_parallel": given["context_parallel"] or 1}, gated_mlp=False)
    return replace(known, **{name: value for name, value in given.items() if value is not None})


def run_name(stage: StageConfig, run_id: str = RUN_ID) -> str:
    """The training a bcp-pipeline run continues: its own (RUN_NAME-RUN_ID), so that no other run resumes from its
    checkpoints, or `continue_run` explicitly."""
    section = stage.megatron_bridge
    return section.continue_run or f"{section.run_name}-{run_id}"


def run_dir(stage: StageConfig, values: dict[str, str] | None = None, run_id: str = RUN_ID) -> str:
    """The run's folder under results_dir: checkpoints/, data_cache/, tb_logs/ and the data list."""
    results = substitute(stage.megatron_bridge.results_dir, values or {}).rstrip("/")
    return f"{results}/{run_name(stage, run_id)}"


def checkpoint_dir(stage: StageConfig) -> str:
    return f"{run_dir(stage)}/checkpoints"


def derived_continuation(stage: StageConfig) -> Continuation:
    """Continue toward train_iters from the run's checkpoints (their tracker file says the step)."""
    return Continuation(
        checkpoints=checkpoint_dir(stage),
        target_steps=bridge_model(stage).train_iters,
        max_attempts=stage.megatron_bridge.max_attempts,
        attempts_key=f"{stage.name}.megatron_bridge.max_attempts",
    )


def exit_minutes(stage: StageConfig, runtime: str | None) -> int:
    """`train.exit_duration_in_mins` of a job of `runtime`: the runtime minus `time_margin`, in whole minutes.

    Bridge's clock starts when `pretrain()` starts, so model build, checkpoint load and the data index build are
    inside the limit. The margin covers what the job's runtime holds outside it: before, the container's start
    (the image pull, minutes for a NeMo image on a node that lacks it) and the imports; after, the step in
    flight when the limit passes and the final checkpoint save (about 90 GB for 8B). 20 minutes by default."""
    if not runtime:
        raise ValueError(
            "pretraining needs a runtime (total_runtime on BCP, time on Slurm, h_rt on Grid Engine, "
            "active_deadline on Kubernetes): each job's training time is derived from it"
        )
    seconds = parse_duration(runtime) - parse_duration(stage.megatron_bridge.time_margin)
    if seconds < 60:
        raise ValueError(
            f"megatron_bridge.time_margin {stage.megatron_bridge.time_margin} leaves no training time "
            f"in the runtime {runtime}"
        )
    return seconds // 60


def bridge_overrides(
    stage: StageConfig, *, values: dict[str, str], runtime: str | None, run_id: str | None = None
) -> list[str]:
    """Every KEY=VALUE override the job gives the recipe, but the data list (built in the job from the manifests:
    data_list.py --format bridge). `values` resolve the section's placeholders; `run_id` names the run's folder."""
    section = stage.megatron_bridge
    model = bridge_model(stage)
    folder = run_dir(stage, values, values.get("run_id", RUN_ID) if run_id is None else run_id)
    bpe = substitute(section.bpe_dir, values).rstrip("/")
    verbatim = {o.split("=", 1)[0].lstrip("+~") for o in section.overrides}
    rendered = [
        f"model.num_layers={model.num_layers}",
        f"model.hidden_size={model.hidden_size}",
        f"model.ffn_hidden_size={model.ffn_hidden_size}",
        f"model.num_attention_heads={model.num_attention_heads}",
        f"model.seq_length={model.seq_length}",
        f"dataset.seq_length={model.seq_length}",
        f"model.tensor_model_parallel_size={model.tensor_parallel}",
        f"model.pipeline_model_parallel_size={model.pipeline_parallel}",
        f"model.context_parallel_size={model.context_parallel}",
        f"train.global_batch_size={model.global_batch_size}",
        f"train.micro_batch_size={model.micro_batch_size}",
        f"train.train_iters={model.train_iters}",
        *without_fsdp_conflicts(section, list(model.architecture) if section.model in LAUNCHER_MODELS else []),
        "tokenizer.tokenizer_type=GPT2BPETokenizer",
        f"tokenizer.vocab_file={bpe}/vocab.json",
        f"tokenizer.merge_file={bpe}/merges.txt",
        f"dataset.path_to_cache={folder}/data_cache",
        *checkpoint_overrides(section, folder),
        *knob_overrides(section),
        f"train.exit_duration_in_mins={exit_minutes(stage, runtime)}",
        "train.exit_signal_handler=true",
        f"dist.distributed_timeout_minutes={DISTRIBUTED_TIMEOUT_MINUTES}",
        "logger.log_throughput=true",
        f"logger.tensorboard_dir={folder}/tb_logs",
    ]
    if section.valid_data_dir:  # the held-out split's own blend (the data list file's): no split of the training's
        rendered = [o for o in rendered if not o.startswith("dataset.split=")] + ["dataset.split=null"]
    kept = [o for o in rendered if o.split("=", 1)[0] not in verbatim]
    return kept + [substitute(o, values) for o in section.overrides]


def checkpoint_overrides(section: MegatronBridgeTraining, folder: str) -> list[str]:
    """save = load, both the run's own folder (never the recipe's shared default); none saved without checkpoints."""
    if not section.checkpoints:
        return ["checkpoint.save=null", "checkpoint.load=null"]
    return [
        f"checkpoint.save={folder}/checkpoints",
        f"checkpoint.load={folder}/checkpoints",
        f"checkpoint.save_interval={section.save_interval}",
        f"checkpoint.most_recent_k={section.most_recent_k}",
    ]


def gpus_per_node(stage: StageConfig, instance: str | None) -> int:
    """GPUs (ranks) a node: megatron_bridge.gpus_per_node, else the instance name's (dgxh100.80g.8.norm -> 8)."""
    if stage.megatron_bridge.gpus_per_node:
        return stage.megatron_bridge.gpus_per_node
    match = re.search(r"\.(\d+)\.[a-z]+$", instance or "")
    if not match:
        raise ValueError(f"cannot tell the GPUs per node of instance {instance!r}; set megatron_bridge.gpus_per_node")
    return int(match.group(1))


def parallel_error(model: BridgeModel, nodes: int, gpus: int) -> str | None:
    """Why `nodes` x `gpus` cannot train `model` (None: it can): TP x PP x CP divides the world, and the data-parallel
    size x micro batch divides the global batch (Bridge's own dry run does not check the latter for library
    recipes)."""
    return parallel_sizes_error(
        nodes,
        gpus,
        tp=model.tensor_parallel,
        pp=model.pipeline_parallel,
        cp=model.context_parallel,
        global_batch=model.global_batch_size,
        micro_batch=model.micro_batch_size,
    )


def check_parallelism(stage: StageConfig, nodes: int, gpus: int) -> None:
    model = bridge_model(stage)
    problem = parallel_error(model, nodes, gpus)
    if problem:
        valid = [n for n in range(1, MAX_NODES_LISTED + 1) if parallel_error(model, n, gpus) is None]
        raise ValueError(
            f"megatron_bridge on {nodes} node(s): {problem}; valid node counts with {gpus} GPUs per "
            f"node: {', '.join(map(str, valid)) or f'none up to {MAX_NODES_LISTED}'}"
        )


def hub_token_secret(stage: StageConfig, backend: str) -> str | None:
    """The backend section's secret that reaches the job as HF_TOKEN (NAME:KEY:HF_TOKEN), if any; None also where
    the backend's jobs take no secrets (a section without `secrets`)."""
    secrets = getattr(stage.resources(backend), "secrets", None) or []
    return next((s for s in secrets if s.split(":")[-1] == "HF_TOKEN"), None)


def hub_access_error(stage: StageConfig, backends: tuple[str, ...]) -> str | None:
    """Why the stage's recipe cannot be built on `backends` (None: it can): a recipe that reads its architecture
    from the Hugging Face Hub needs a filled cache (hf_home) or, where the backend has secrets, a token."""
    section = stage.megatron_bridge
    if not HUB_RECIPE.match(section.recipe) or section.hf_home:
        return None
    lacking = [b for b in backends if hub_token_secret(stage, b) is None]
    if not lacking:
        return None
    return (
        f"recipe {section.recipe} reads its model's architecture from the Hugging Face Hub (a gated repository) "
        f"when it is built, and on {', '.join(lacking)} the job has no way in: give megatron_bridge.hf_home (a "
        "Hugging Face cache in the workspace, filled beforehand, used offline), or a secret that reaches the "
        "job as HF_TOKEN (bcp.secrets: [NAME:KEY:HF_TOKEN]; kubernetes.secrets: [SECRET:KEY:HF_TOKEN]), or "
        "use recipe vanilla_gpt_pretrain_config, which needs neither"
    )


def check_hub_access(pipeline: PipelineConfig, stage: StageConfig) -> None:
    """On the pipeline's own backend (the others are checked when a job is rendered for them), unless its jobs run
    here, in the orchestrator's environment (its token and cache)."""
    runs_here = stage.resources(pipeline.backend).runs_here
    problem = None if runs_here else hub_access_error(stage, (pipeline.backend,))
    if problem:
        raise ValueError(problem)


def tokens_per_step(stage: StageConfig) -> int:
    model = bridge_model(stage)
    return model.global_batch_size * model.seq_length


def training_layout(stage: StageConfig, backend: str) -> tuple[int, int]:
    """(nodes, GPUs a node) of the stage's training on `backend`: its nodes as rank_layout has them, and one rank a
    GPU: the backend section's GPU count (its `gpus_field`) where it gives one, else the BCP instance's."""
    section = stage.resources(backend)
    given = getattr(section, section.gpus_field) if section.gpus_field else None
    return rank_layout(stage, backend).nodes, given or gpus_per_node(stage, stage.bcp.instance)


def check_images(stage: StageConfig) -> None:
    """Every image the stage names on a backend carries a Megatron-Bridge the job can use: a NeMo Framework image
    of 26.04 or later (an image whose tag is no YY.MM release is taken at its word)."""
    for backend, resources in RESOURCE_TYPES.items():
        image = getattr(stage.resources(backend), resources.image_field) if resources.image_field else None
        version = launcher_version(str(image).removeprefix("docker://")) if image else None
        if version is None or version >= FIRST_BRIDGE_IMAGE:
            continue
        what = f"{backend}.{resources.image_field} {image} is a {version[0]:02d}.{version[1]:02d} image, which "
        if version < FIRST_IMAGE_WITH_BRIDGE:
            raise ValueError(
                f"{what}has no Megatron-Bridge: the first image that works is {FIRST_BRIDGE_IMAGE_NAME} "
                "(use it or later; the bundled pipelines use 26.08), or train this image with a nemo: "
                "section"
            )
        raise ValueError(
            f"{what}has a Megatron-Bridge older than 0.4.0, without the recipe "
            f"vanilla_gpt_pretrain_config and the key {DATA_PATH_KEY} the job uses: the first image "
            f"that works is {FIRST_BRIDGE_IMAGE_NAME} (use it or later; the bundled pipelines use 26.08)"
        )


def check_knobs(stage: StageConfig) -> None:
    """precision, async_save, fsdp and activation_offload against what the stage declares (bridge_knobs.py)."""
    model = bridge_model(stage)
    problem = knobs_error(stage) or offload_error(stage.megatron_bridge, model.num_layers, model.pipeline_parallel)
    if problem:
        raise ValueError(problem)


def check_gpus(stage: StageConfig) -> None:
    """megatron_bridge.gpus_per_node, where given, is what the BCP instance has: a rank a GPU."""
    given, instance = stage.megatron_bridge.gpus_per_node, stage.bcp.instance
    match = re.search(r"\.(\d+)\.[a-z]+$", instance or "")
    if given and match and int(match.group(1)) != given:
        raise ValueError(
            f"megatron_bridge.gpus_per_node is {given}, but instance {instance} has "
            f"{match.group(1)} GPUs: a rank runs on each GPU; set it to {match.group(1)} (or drop it)"
        )


def static_preflight(pipeline: PipelineConfig, stage: StageConfig) -> None:
    """Checks that need no data: the model known, Hub access, the images, the knobs, the GPUs, the time limit, and
    the sizes against the nodes of BCP (with an instance) and of every backend whose section declares nodes or
    GPUs."""
    bridge_model(stage)
    check_hub_access(pipeline, stage)
    check_images(stage)
    check_knobs(stage)
    check_gpus(stage)
    if problem := held_out_error(stage.megatron_bridge, "megatron_bridge"):
        raise ValueError(problem)
    if stage.bcp.instance:
        check_parallelism(stage, *training_layout(stage, "bcp"))
        if stage.bcp.total_runtime:
            exit_minutes(stage, stage.bcp.total_runtime)
    for backend, resources in RESOURCE_TYPES.items():
        section = stage.resources(backend)
        declared = [
            key
            for key in (*resources.counts, resources.gpus_field, resources.nodes_field)
            if key and getattr(section, key)
        ]
        if resources.gpus_field and declared:
            check_parallelism(stage, *training_layout(stage, backend))
