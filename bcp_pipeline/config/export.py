"""A stage that exports a training's latest checkpoint as a Hugging Face model folder (`export_of: STAGE`).

Its program is stages/export_hf.py; what it reads and writes is derived here from the training it names, so that
the export finds the checkpoints the training wrote:

- the smoke pretrain (stages/pretrain_local.py, the demo's, and the local backend's stand-in of every engine):
  `--from smoke`, its `--results`/`--run-name` folder; the model is GPT-2 in all but names (GPT2LMHeadModel);
- a `megatron_bridge:` training of a Llama-shaped model (RMSNorm, RoPE on the whole head, SwiGLU, no biases, untied
  embeddings: `llama3-8b-gpt2`): `--from bridge`, its run folder, the shape; run in the training's image, straight
  (not through stages/bootstrap.sh), where Megatron-Bridge's AutoBridge writes LlamaForCausalLM;
- any other shape has no Hugging Face architecture to export to, and is refused when the config loads: the
  launcher's `gpt3/7b_improved` normalizes with LayerNorm1P (a zero-centred gamma) and rotates half of each head.

Outputs: RUN_FOLDER/export/hf/ and RUN_FOLDER/export/export.json (written last, the verification counts it); scores
of `--tasks` (the stage's own args, after the derived ones) in RUN_FOLDER/evaluate/lm-eval/. Pure: preflight.py
calls `problem` then `prepare`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from bcp_pipeline.config import bridge
from bcp_pipeline.config.model import Check, PipelineConfig, StageConfig
from bcp_pipeline.config.resources import RESOURCE_TYPES

ENTRY_PROGRAM = "export_hf.py"  # in stages/
SMOKE_PROGRAM = "pretrain_local.py"
EXPORTABLE = "llama3-8b-gpt2"  # the bundled Llama-shaped model (config/bridge.py)
# What a Llama is in Megatron's settings: every key must have this value for AutoBridge's Llama mapping to hold.
LLAMA_SETTINGS = {
    "model.normalization": "RMSNorm",
    "model.position_embedding_type": "rope",
    "model.rotary_percent": "1.0",
    "model.gated_linear_unit": "true",
    "model.activation_func": "silu",
    "model.add_bias_linear": "false",
    "model.share_embeddings_and_output_weights": "false",
    "model.layernorm_zero_centered_gamma": "false",
}
WHY_NOT = {
    "model.normalization": "it normalizes with {value}, not RMSNorm",
    "model.layernorm_zero_centered_gamma": "its LayerNorm has a zero-centred gamma (LayerNorm1P)",
    "model.rotary_percent": "RoPE turns {value} of each head, not all of it",
    "model.position_embedding_type": "its positions are {value}, not RoPE",
    "model.gated_linear_unit": "its MLP is not gated (no SwiGLU)",
    "model.activation_func": "its MLP's activation is {value}, not SiLU",
    "model.add_bias_linear": "its linear layers have biases",
    "model.share_embeddings_and_output_weights": "its output layer is tied to the embedding",
}
GPT2_VOCAB = 50257


def settings(target: StageConfig) -> dict[str, str]:
    """The training's model settings: its model's, then its verbatim overrides (which the job applies last)."""
    section = target.megatron_bridge
    assert section is not None  # called for a Bridge training only
    model = bridge.LAUNCHER_MODELS.get(section.model)
    pairs = [o.split("=", 1) for o in (*(model.architecture if model else ()), *section.overrides) if "=" in o]
    return {key.lstrip("+~"): value for key, value in pairs}


def shape_problem(target: StageConfig) -> str | None:
    """Why the Bridge training `target` has no Hugging Face architecture to export to (None: it is a Llama)."""
    assert target.megatron_bridge is not None  # called for a Bridge training only
    model = target.megatron_bridge.model
    if model not in bridge.LAUNCHER_MODELS:
        return (
            f"megatron_bridge.model {model!r} takes the recipe's own architecture, which is not known to be a "
            f"Llama; export_of exports Llama-shaped models: train megatron_bridge.model {EXPORTABLE}"
        )
    found = settings(target)
    wrong = [
        WHY_NOT[key].format(value=found.get(key))
        for key, want in LLAMA_SETTINGS.items()
        if str(found.get(key, "")).lower() != want.lower()
    ]
    if not wrong:
        return None
    return (
        f"megatron_bridge.model {model} has no Hugging Face architecture to export to ({'; '.join(wrong)}); "
        f"export_of exports Llama-shaped models (RMSNorm, RoPE on the whole head, SwiGLU, no biases): train "
        f"megatron_bridge.model {EXPORTABLE} to export"
    )


def bridge_exporting(pipelines: Iterable[PipelineConfig]) -> list[str]:
    """The names of the pipelines that export a megatron_bridge: training (not only a smoke model)."""
    return [
        pipeline.name
        for pipeline in pipelines
        if any(
            stage.export_of and pipeline.stages[stage.export_of].megatron_bridge is not None
            for stage in pipeline.stages.values()
            if stage.export_of in pipeline.stages
        )
    ]


def unexported_notes(pipeline: PipelineConfig, exporting: list[str]) -> list[str]:
    """Why a Bridge training of `pipeline` ends at raw checkpoints: no stage exports it, and (for a shape with no
    Hugging Face architecture) none could. `exporting`: the pipelines of the same file that export, to point at."""
    exported = {stage.export_of for stage in pipeline.stages.values() if stage.export_of}
    notes = []
    for name, stage in pipeline.stages.items():
        if stage.megatron_bridge is None or name in exported:
            continue
        elsewhere = f" (as {', '.join(exporting)} does)" if exporting else ""
        why = shape_problem(stage)
        notes.append(
            f"stage {name} is not exported: {why}{elsewhere}"
            if why
            else f"stage {name} is not exported: add a stage with export_of: {name} to write a Hugging Face folder"
        )
    return notes


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def smoke_run_dir(target: StageConfig) -> str | None:
    """RESULTS/RUN of a smoke pretrain, from its own --results and --run-name (None where it lacks them)."""
    results, name = _arg(target.args, "--results"), _arg(target.args, "--run-name")
    return f"{results.rstrip('/')}/{name}" if results and name else None


def padded_vocab(target: StageConfig) -> int:
    """GPT-2's vocabulary as Megatron pads it: to a multiple of 128 x TP (make_vocab_size_divisible_by)."""
    multiple = 128 * bridge.bridge_model(target).tensor_parallel
    return math.ceil(GPT2_VOCAB / multiple) * multiple


def bridge_shape(target: StageConfig) -> str:
    """--shape of export_hf.py: the sizes the training's overrides render, as key=value pairs."""
    model, found = bridge.bridge_model(target), settings(target)
    shape = {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_query_groups": found.get("model.num_query_groups", model.num_attention_heads),
        "seq_length": model.seq_length,
        "vocab_size": padded_vocab(target),
        "rotary_base": found.get("model.rotary_base", 10000),
        "norm_epsilon": found.get("model.layernorm_epsilon", "1e-05"),
    }
    return ",".join(f"{key}={value}" for key, value in shape.items())


def export_dir(run_dir: str) -> str:
    return f"{run_dir}/export"


def problem(pipeline: PipelineConfig, stage: StageConfig) -> tuple[str, str] | None:
    """(key, why) where `stage` cannot export its training as declared; None where it can."""
    name = stage.export_of
    if name is None:
        return None
    target = pipeline.stages.get(name)
    trainings = [n for n, s in pipeline.stages.items() if s.engine or s.program == SMOKE_PROGRAM]
    if target is None or not (target.engine or target.program == SMOKE_PROGRAM):
        return "export_of", (
            f"{name!r} is no training stage of this pipeline (those are: {', '.join(trainings) or 'none'})"
        )
    if stage.program != ENTRY_PROGRAM:
        return "program", f"a stage with export_of runs {ENTRY_PROGRAM}, not {stage.program}"
    if name not in stage.needs:
        return "needs", f"an export waits for its training: add {name} to the needs of {stage.name}"
    if target.nemo is not None:
        return "export_of", (
            f"stage {name} trains with the NeMo launcher, whose checkpoints this tool does not "
            f"export; export_of takes a megatron_bridge: training of a Llama shape ({EXPORTABLE}) "
            "or the smoke pretrain"
        )
    if target.megatron_bridge is not None:
        if why := shape_problem(target):
            return "export_of", f"stage {name} cannot be exported: {why}"
    elif smoke_run_dir(target) is None:
        return "export_of", f"stage {name}'s args lack --results or --run-name: its checkpoints cannot be found"
    elif "--bpe-dir" not in stage.args:
        return "args", (
            "an export of the smoke pretrain ships the tokenizer the data was tokenized with: give "
            "--bpe-dir DIR (vocab.json + merges.txt) in its args"
        )
    return None


def prepare(pipeline: PipelineConfig, stage: StageConfig) -> None:
    """Derive what the stage runs from its training (call after `problem` found none). The stage's own args (e.g.
    `--tasks`) follow the derived ones."""
    assert stage.export_of is not None  # `problem` found none
    target = pipeline.stages[stage.export_of]
    extra = list(stage.args)
    smoke_dir = smoke_run_dir(target) if target.program == SMOKE_PROGRAM else None
    if target.megatron_bridge is not None:
        section = target.megatron_bridge
        folder = bridge.run_dir(target)
        stage.args = [
            "--from",
            "bridge",
            "--checkpoints",
            f"{folder}/checkpoints",
            "--bpe-dir",
            section.bpe_dir.rstrip("/"),
            "--out",
            export_dir(folder),
            "--scores-dir",
            f"{folder}/evaluate/lm-eval",
            "--shape",
            bridge_shape(target),
            *extra,
        ]
        for backend, resources in RESOURCE_TYPES.items():
            if image_field := getattr(resources, "image_field", None):
                setattr(stage.resources(backend), image_field, getattr(target.resources(backend), image_field))
            if not getattr(resources, "runs_here", False) and not stage.resources(backend).command:
                # In the training's image, straight: its Megatron-Bridge and transformers are the export's (a
                # backend whose jobs run here, in the orchestrator's environment, has no image)
                stage.resources(backend).command = ["${python}", "-u", f"${{code}}/{ENTRY_PROGRAM}", *stage.args]
        if smoke_dir and not stage.local.command:  # locally the smoke stand-in trained: export that
            stage.local.command = [
                "${python}",
                f"${{code}}/{ENTRY_PROGRAM}",
                *smoke_args(smoke_dir, section.bpe_dir.rstrip("/")),
                *extra,
            ]
        folder_checked = export_dir(folder)
    else:
        assert smoke_dir is not None  # `problem` checked the smoke training's args
        stage.args = [*smoke_args(smoke_dir, None), *extra]
        folder_checked = export_dir(smoke_dir)
    if not stage.verify:
        stage.verify = [Check(glob=f"{folder_checked}/export.json", expect=1)]


def smoke_args(run_dir: str, bpe_dir: str | None) -> list[str]:
    bpe = ["--bpe-dir", bpe_dir] if bpe_dir else []
    return [
        "--from",
        "smoke",
        "--checkpoints",
        f"{run_dir}/checkpoints",
        *bpe,
        "--out",
        export_dir(run_dir),
        "--scores-dir",
        f"{run_dir}/evaluate/lm-eval",
    ]
