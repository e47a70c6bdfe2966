"""A Megatron-Bridge training checkpoint as a Hugging Face Llama folder, through Megatron-Bridge's own AutoBridge.

Runs in the training's image (megatron-bridge, megatron-core and transformers as the training had them). The
training built its model from `vanilla_gpt_pretrain_config` with a Llama shape (RMSNorm, RoPE on the whole head,
SwiGLU, no biases, untied embeddings: bcp_pipeline/config/export.py says which shapes those are), so its
checkpoint is a Llama in Megatron's names. AutoBridge's config-only flow for "custom small models of popular
architectures" exports it: `AutoBridge.from_auto_config(checkpoint, reference)` synthesizes the HF config from the
checkpoint's own run_config.yaml, conformed to a reference LlamaConfig (written here from the same shape), and
`export_ckpt` loads the checkpoint on the CPU (a gloo process group of one) and writes config.json and safetensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import _bridge_tracker
import _common
import _hf_folder

REFERENCE_DIR = ".llama-reference"  # the reference config's folder, inside the staging folder's parent


def llama_config(shape: dict) -> dict:
    """The LlamaConfig of a Llama-shaped Megatron model: `shape` has num_layers, hidden_size, ffn_hidden_size,
    num_attention_heads, num_query_groups, seq_length, vocab_size, rotary_base, norm_epsilon."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "num_hidden_layers": shape["num_layers"],
        "hidden_size": shape["hidden_size"],
        "intermediate_size": shape["ffn_hidden_size"],
        "num_attention_heads": shape["num_attention_heads"],
        "num_key_value_heads": shape["num_query_groups"],
        "max_position_embeddings": shape["seq_length"],
        "vocab_size": shape["vocab_size"],
        "rope_theta": float(shape["rotary_base"]),
        "rms_norm_eps": shape["norm_epsilon"],
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
        "torch_dtype": "bfloat16",
    }


def checkpoint_to_export(checkpoints: Path) -> tuple[int, Path]:
    """(step, iter folder) of the checkpoint Bridge itself would resume from (its tracker's step)."""
    tracked = _bridge_tracker.tracked_step(str(checkpoints))
    if tracked.step is None:
        raise _common.StageError(
            f"{checkpoints}: no Megatron-Bridge checkpoint tracker there "
            f"({_bridge_tracker.LEGACY_TRACKER}); nothing to export yet"
        )
    folder = checkpoints / f"iter_{tracked.step:07d}"
    if not (folder / "run_config.yaml").is_file():
        raise _common.StageError(
            f"{folder}: the tracker says step {tracked.step}, but that folder has no "
            "run_config.yaml (an incomplete save)"
        )
    return tracked.step, folder


def export(iter_dir: Path, shape: dict, staging: Path, bpe_dir: Path) -> None:
    """Write the HF folder of the checkpoint `iter_dir` into `staging` with AutoBridge (config-only flow). The
    reference holds the GPT-2 tokenizer too: `export_ckpt` saves the reference's tokenizer beside the weights, and
    fails where it finds none it can build."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the reference is a local folder: nothing to fetch
    reference = staging.parent / REFERENCE_DIR
    reference.mkdir(parents=True, exist_ok=True)
    (reference / "config.json").write_text(json.dumps(llama_config(shape), indent=2), encoding="utf-8")
    _hf_folder.write_gpt2_tokenizer(reference, bpe_dir, shape["seq_length"])
    from megatron.bridge import AutoBridge  # the image's Bridge; imported late: the smoke path needs none of it

    bridge = AutoBridge.from_auto_config(str(iter_dir), str(reference))
    bridge.export_ckpt(str(iter_dir), str(staging), show_progress=False)
