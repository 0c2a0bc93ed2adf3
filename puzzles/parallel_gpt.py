"""Notebook 06's model pieces: Megatron's f and g over a process group, and lib.models' GPT cut into pipeline stages
and tensor-parallel shards.

Layout: activations are (b, s, h), batch first, as in lib.models. Tensor-parallel rank t of T holds heads
[t·a/T, (t+1)·a/T) of q, k and v, rows [t·4h/T, (t+1)·4h/T) of fc1 and the matching columns of proj and fc2
(Shoeybi et al. 2019, section 3); LayerNorms, the biases added after g, the embeddings and the head are whole on
every TP rank. Pipeline stage p of P holds blocks [p·L/P, (p+1)·L/P); the first also the embeddings, the last the
final LayerNorm and the head (untied, so no gradient crosses between the first and the last stage).
"""

from __future__ import annotations

import copy
import torch
import torch.nn.functional as F
from torch import nn

from lib.models import GPTConfig, TinyGPT


# tp_copy and tp_reduce are notebook 04's answers, deliberately written again: the Copy and Reduce of
# solutions/tensor_parallel.py (whose functions must stand alone in their cells, over the whole world), here over a TP
# group. Notebook 06 hands them over with the stages they serve; a learner who opens this file early sees 04's f and g.
def tp_copy(dist, x: torch.Tensor, group) -> torch.Tensor:
    """Megatron's f: identity forward; backward, the gradient all-reduced over the tensor-parallel `group`."""
    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad, group=group)
            return grad

    return Copy.apply(x)


def tp_reduce(dist, x: torch.Tensor, group) -> torch.Tensor:
    """Megatron's g: forward, the partial sums all-reduced over the tensor-parallel `group`; identity backward."""
    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.all_reduce(x, group=group)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad

    return Reduce.apply(x)


class TPBlock(nn.Module):
    """One tensor-parallel rank's shard of a lib.models.Block: `heads` of its heads and 4h/T of its MLP units."""

    def __init__(self, hidden: int, heads: int, tp: int, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        h, w = hidden, hidden // tp
        self.heads = heads // tp
        self.ln1, self.ln2 = nn.LayerNorm(h, dtype=dtype), nn.LayerNorm(h, dtype=dtype)
        self.qkv, self.proj = nn.Linear(h, 3 * w, dtype=dtype), nn.Linear(w, h, dtype=dtype)
        self.fc1, self.fc2 = nn.Linear(h, 4 * w, dtype=dtype), nn.Linear(4 * w, h, dtype=dtype)


def parallel_block(dist, group, block: TPBlock, x: torch.Tensor) -> torch.Tensor:
    """lib.models.Block's forward on one TP rank's shard (dropout 0): f before qkv and fc1, g after proj and fc2,
    each over `group`. x is (b, s, h), whole on every rank of the group; so is the result."""
    b, s, h = x.shape
    qkv = block.qkv(tp_copy(dist, block.ln1(x), group))                       # (b, s, 3h/T): q, k, v of our heads
    w = qkv.shape[-1] // 3
    d = w // block.heads
    q, k, v = (t.reshape(b, s, block.heads, d).transpose(1, 2) for t in qkv.split(w, dim=-1))   # (b, a/T, s, d)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, w)   # (b, s, h/T)
    x = x + tp_reduce(dist, F.linear(out, block.proj.weight), group) + block.proj.bias
    hidden = F.gelu(block.fc1(tp_copy(dist, block.ln2(x), group)))            # (b, s, 4h/T)
    return x + tp_reduce(dist, F.linear(hidden, block.fc2.weight), group) + block.fc2.bias


class GPTStage(nn.Module):
    """One pipeline stage of a TinyGPT on one TP rank: the embeddings (first stage), its blocks' shards, the final
    LayerNorm and the head (last stage)."""

    def __init__(self, cfg: GPTConfig, blocks: list[TPBlock], first: bool, last: bool) -> None:
        super().__init__()
        self.hidden = cfg.hidden
        if first:
            self.tok, self.pos = nn.Embedding(cfg.vocab, cfg.hidden), nn.Embedding(cfg.seq, cfg.hidden)
        self.blocks = nn.ModuleList(blocks)
        if last:
            self.ln_f, self.head = nn.LayerNorm(cfg.hidden), nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, dist, group, x: torch.Tensor) -> torch.Tensor:
        """The stage's forward on one micro-batch: tokens (b, s) on the first stage, the previous stage's (b, s, h)
        activations on the others; its blocks tensor-parallel over `group`. Returns (b, s, h)."""
        if hasattr(self, "tok"):
            x = self.tok(x) + self.pos.weight[: x.shape[1]]                   # (b, s, h)
        for block in self.blocks:
            x = parallel_block(dist, group, block, x)
        return x

    def loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Last stage only: the mean cross-entropy of the micro-batch from the last block's output (b, s, h)."""
        logits = self.head(self.ln_f(x))                                      # (b, s, vocab)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _rows(t: torch.Tensor, tp: int, rank: int, dim: int = 0) -> torch.Tensor:
    return t.chunk(tp, dim)[rank].clone()


def shard_block(block: nn.Module, cfg: GPTConfig, tp: int, rank: int) -> TPBlock:
    """TP rank `rank`'s shard of a lib.models.Block: q, k and v of its heads, its rows of fc1, its columns of proj
    and fc2; the rest whole."""
    shard = TPBlock(cfg.hidden, cfg.heads, tp, dtype=block.qkv.weight.dtype)
    qkv_w, qkv_b = (torch.cat([_rows(part, tp, rank) for part in t.chunk(3)])
                    for t in (block.qkv.weight.detach(), block.qkv.bias.detach()))
    with torch.no_grad():
        for name, value in (("qkv.weight", qkv_w), ("qkv.bias", qkv_b),
                            ("proj.weight", _rows(block.proj.weight, tp, rank, 1)), ("proj.bias", block.proj.bias),
                            ("fc1.weight", _rows(block.fc1.weight, tp, rank)),
                            ("fc1.bias", _rows(block.fc1.bias, tp, rank)),
                            ("fc2.weight", _rows(block.fc2.weight, tp, rank, 1)), ("fc2.bias", block.fc2.bias),
                            ("ln1.weight", block.ln1.weight), ("ln1.bias", block.ln1.bias),
                            ("ln2.weight", block.ln2.weight), ("ln2.bias", block.ln2.bias)):
            shard.get_parameter(name).copy_(value)
    return shard


def shard_gpt(model: TinyGPT, pp: int, tp: int) -> list[list[GPTStage]]:
    """stages[p][t]: the stage p, TP rank t shard of `model` (whose layers pp divides, whose heads tp divides)."""
    cfg, per = model.cfg, model.cfg.layers // pp
    stages = []
    for p in range(pp):
        row = []
        for t in range(tp):
            blocks = [shard_block(b, cfg, tp, t) for b in model.blocks[p * per:(p + 1) * per]]
            stage = GPTStage(cfg, blocks, first=p == 0, last=p == pp - 1).to(model.head.weight.dtype)
            with torch.no_grad():
                for name in ("tok", "pos", "ln_f", "head"):
                    if hasattr(stage, name):
                        getattr(stage, name).load_state_dict(copy.deepcopy(getattr(model, name).state_dict()))
            row.append(stage)
        stages.append(row)
    return stages


def tiny_gpt(cfg: GPTConfig, seed: int) -> TinyGPT:
    """An untied TinyGPT in float64, initialised from `seed`: matrices randn/√fan-in, norms' weights near 1,
    biases small."""
    gen = torch.Generator().manual_seed(seed)
    model = TinyGPT(cfg).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if p.dim() > 1:
                p.copy_(noise / p.shape[1] ** 0.5)
            elif "ln" in name and name.endswith("weight"):
                p.copy_(1 + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)
    return model
