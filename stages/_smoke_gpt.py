"""The smoke pretrain's model: a small pre-LayerNorm GPT, its loss, optimizer, learning-rate schedule, precision
and the digest of its weights.

Megatron's own GPTModel needs CUDA internals, so this is a plain PyTorch GPT with the output layer tied to the
token embedding over the full GPT-2 vocabulary: it trains on 2 CPU cores in seconds, and on a GPU when given one.
"""

from __future__ import annotations

import contextlib
import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-LayerNorm transformer block with causal self-attention (SDPA) and a 4x GELU MLP."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc, self.out = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(batch, seq, 3, self.heads, hidden // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, hidden))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class SmokeGPT(nn.Module):
    """GPT with learned positions and the output layer tied to the token embedding (as GPT-2 and NeMo's GPT)."""

    def __init__(self, vocab_size: int, hidden: int, layers: int, heads: int, seq_length: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.positions = nn.Embedding(seq_length, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.final_ln = nn.LayerNorm(hidden)
        self.apply(self._init)
        for block in self.blocks:  # GPT-2's scaled init of the residual projections keeps early steps stable
            for proj in (block.proj, block.out):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.final_ln(x), self.embed.weight)


def masked_loss_sum(logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross entropy over the positions GPTDataset marks (padding is masked out); the caller
    divides by the step's global token count, so micro batches and ranks add up to the one-batch mean."""
    per_token = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
    return (per_token * loss_mask.flatten().to(per_token.dtype)).sum()


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW; no decay on biases and LayerNorm weights (as NeMo/Megatron)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup then cosine decay to lr/10; a pure function of the step, so resume needs no scheduler state."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def weights_digest(model: nn.Module) -> str:
    """sha256 over every parameter's bytes in a fixed order: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The forward's precision: "bf16-mixed" (NeMo's name) runs matrix products in bfloat16 with fp32 weights,
    optimizer state and loss (masked_loss_sum upcasts the logits), as NeMo trains on A100/H100; "fp32" is plain."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
