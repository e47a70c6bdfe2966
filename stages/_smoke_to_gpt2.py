"""The smoke pretrain's model (stages/_smoke_gpt.py) as Hugging Face's GPT-2, which it is in all but names.

Both are pre-LayerNorm GPTs with learned positions, one fused QKV projection laid out [q | k | v] with the heads
contiguous in each, a 4x MLP, a final LayerNorm (eps 1e-5) and the output layer tied to the token embedding. What
differs: GPT-2 keeps its linear layers as Conv1D, weights stored [in, out] (the transpose of nn.Linear's), and the
smoke model's GELU is the exact one (`activation_function: gelu`, not GPT-2's tanh approximation `gelu_new`).
"""

from __future__ import annotations

import torch

# smoke name (per block: blocks.N.<name>) -> GPT-2 name (transformer.h.N.<name>), and whether it is a Conv1D weight
BLOCK_NAMES = {
    "ln1.weight": ("ln_1.weight", False),
    "ln1.bias": ("ln_1.bias", False),
    "qkv.weight": ("attn.c_attn.weight", True),
    "qkv.bias": ("attn.c_attn.bias", False),
    "proj.weight": ("attn.c_proj.weight", True),
    "proj.bias": ("attn.c_proj.bias", False),
    "ln2.weight": ("ln_2.weight", False),
    "ln2.bias": ("ln_2.bias", False),
    "fc.weight": ("mlp.c_fc.weight", True),
    "fc.bias": ("mlp.c_fc.bias", False),
    "out.weight": ("mlp.c_proj.weight", True),
    "out.bias": ("mlp.c_proj.bias", False),
}
TOP_NAMES = {
    "embed.weight": "transformer.wte.weight",
    "positions.weight": "transformer.wpe.weight",
    "final_ln.weight": "transformer.ln_f.weight",
    "final_ln.bias": "transformer.ln_f.bias",
}
DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def gpt2_name(name: str) -> tuple[str, bool]:
    """(GPT-2 name, transpose?) of a smoke state-dict entry; KeyError for one this mapping does not know."""
    if name in TOP_NAMES:
        return TOP_NAMES[name], False
    prefix, index, rest = name.split(".", 2)
    if prefix != "blocks" or rest not in BLOCK_NAMES:
        raise KeyError(name)
    target, transpose = BLOCK_NAMES[rest]
    return f"transformer.h.{index}.{target}", transpose


def gpt2_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, tuple[str, list[int], bytes]]:
    """Every weight under its GPT-2 name, as safetensors entries (dtype, shape, bytes). The tied output layer is
    not stored: GPT-2 ties `lm_head` to `wte` on load, as the smoke model does."""
    out = {}
    for name, tensor in state_dict.items():
        target, transpose = gpt2_name(name)
        value = tensor.detach().cpu()
        value = (value.t() if transpose else value).contiguous()
        out[target] = (
            DTYPES[value.dtype],
            list(value.shape),
            value.numpy().tobytes() if value.dtype != torch.bfloat16 else value.view(torch.int16).numpy().tobytes(),
        )
    return out


def gpt2_config(cfg: dict) -> dict:
    """config.json of the smoke run `cfg` (a checkpoint's `config`) as GPT2LMHeadModel."""
    hidden = cfg["hidden"]
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg["vocab_size"],
        "n_positions": cfg["seq_length"],
        "n_embd": hidden,
        "n_layer": cfg["layers"],
        "n_head": cfg["heads"],
        "n_inner": 4 * hidden,
        "activation_function": "gelu",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "bos_token_id": cfg["eod"],
        "eos_token_id": cfg["eod"],
        "torch_dtype": "float32",
    }
