"""Tiny models shared by the puzzles: small enough for 2 CPU cores, real layers and real math."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def mlp(sizes: Sequence[int], seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Sequential:
    """Linear layers with ReLU between them, initialised from `seed` (same seed, same weights)."""
    gen = torch.Generator().manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layer = nn.Linear(a, b, dtype=dtype)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(b, a, generator=gen, dtype=dtype) / a ** 0.5)
            layer.bias.copy_(torch.randn(b, generator=gen, dtype=dtype) * 0.1)
        layers.append(layer)
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def sharded_batches(seed: int, sizes: Sequence[int], world: int, local: int, steps: int,
                    dtype: torch.dtype = torch.float64) -> tuple[list[list[tuple]], list[tuple]]:
    """`steps` regression batches (inputs of sizes[0], targets of sizes[-1]) of world·local samples, drawn from
    `seed`; and each rank's shard of every batch, its own copy: (shards[rank][step], batches[step])."""
    gen = torch.Generator().manual_seed(seed)
    shards: list[list[tuple]] = [[] for _ in range(world)]
    batches = []
    for _ in range(steps):
        x = torch.randn(world * local, sizes[0], generator=gen, dtype=dtype)
        y = torch.randn(world * local, sizes[-1], generator=gen, dtype=dtype)
        batches.append((x, y))
        for r in range(world):
            shards[r].append((x[r * local:(r + 1) * local].clone(), y[r * local:(r + 1) * local].clone()))
    return shards, batches


def param_bytes(model: nn.Module) -> int:
    return sum(p.nbytes for p in model.parameters())


@dataclass(frozen=True)
class GPTConfig:
    """A GPT's shape. `tied`: the output head reuses the token embedding (GPT-2 does). `kv_heads`: grouped-query
    attention's key/value heads (Ainslie et al. 2023; 0 means one per query head). `bias`: False drops every
    Linear's and LayerNorm's bias (as LLaMA and PaLM do)."""

    vocab: int = 64
    seq: int = 16
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    dropout: float = 0.0
    tied: bool = True
    flash: bool = False        # attention by F.scaled_dot_product_attention: no s×s matrix kept for backward
    kv_heads: int = 0
    bias: bool = True


class Dropout(nn.Module):
    """Dropout whose saved mask takes one byte per element, as in Korthikanti et al.'s count
    (PyTorch's CPU dropout keeps its mask in the activations' dtype)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = torch.rand_like(x, dtype=torch.float32) >= self.p
        return x * keep / (1 - self.p)


class Block(nn.Module):
    """Pre-norm transformer block laid out as in Korthikanti et al. 2022 (section 4.1), so that the
    tensors autograd saves are the ones their activation formula counts.

    With cfg.flash, attention runs as F.scaled_dot_product_attention (FlashAttention where the device has it:
    on GPUs, and on CPUs without attention dropout; with dropout a CPU falls back to the s×s "math" kernel)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        h, bias = cfg.hidden, cfg.bias
        self.heads, self.flash = cfg.heads, cfg.flash
        self.kv_heads = cfg.kv_heads or cfg.heads
        if cfg.heads % self.kv_heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({cfg.heads})")
        kv = self.kv_heads * (h // cfg.heads)                   # the width of K, and of V
        self.ln1, self.ln2 = nn.LayerNorm(h, bias=bias), nn.LayerNorm(h, bias=bias)
        self.qkv, self.proj = nn.Linear(h, h + 2 * kv, bias=bias), nn.Linear(h, h, bias=bias)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h, bias=bias), nn.Linear(4 * h, h, bias=bias)
        self.attn_drop, self.proj_drop, self.mlp_drop = (Dropout(cfg.dropout) for _ in range(3))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = (t.reshape(b, s, -1, d).transpose(1, 2)      # (b, a, s, d), then (b, kv_heads, s, d) twice
                   for t in self.qkv(x).split([h, self.kv_heads * d, self.kv_heads * d], dim=-1))
        if self.kv_heads != self.heads:                       # each K/V head serves heads/kv_heads query heads
            k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))   # (b, a, s, d)
        if self.flash:
            # Keeps q, k, v, its output and a log-sum-exp per row; the output is laid out (b, s, a, h/a) in
            # memory, so the reshape below is a view and proj's input is that same tensor.
            p = self.attn_drop.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, s, h)))      # (b, a, s, d) -> (b, s, h)
        out = self.core(q, k, v).transpose(1, 2).reshape(b, s, h)                      # (b, a, s, d) -> (b, s, h)
        return self.proj_drop(self.proj(out))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q kᵀ/√d + causal mask), dropped out, times v: (b, a, s, d) each, and out. The part that
        Korthikanti et al.'s selective recomputation runs again in backward (its s×s tensors are the 5as²b term)."""
        s = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        # An additive mask: autograd saves nothing for it (masked_fill would save an s×s mask).
        causal = torch.full((s, s), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
        return self.attn_drop((scores + causal).softmax(-1)) @ v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.mlp_drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class TinyGPT(nn.Module):
    """Token and position embeddings, `layers` blocks, a final LayerNorm and the output head."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden, bias=cfg.bias)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tied:
            self.head.weight = self.tok.weight

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings: the input of the first block."""
        return self.tok(tokens) + self.pos.weight[: tokens.shape[1]]

    def head_loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """From the last block's output to the mean cross-entropy, computed in fp32 at least: a bf16 model's logits
        upcast, a float64 model's kept (in fp32 its gradients differed between a GPU and the CPU by fp32's rounding,
        which Adam near its eps turned into a failed real check on an H200)."""
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)).flatten(0, 1),
                               targets.flatten())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """embed, every block, head_loss: the whole forward pass to the loss."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head_loss(x, targets)
