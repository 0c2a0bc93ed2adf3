"""A transformer's shape, and what follows from it alone: parameters and FLOPs per token."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional

from lib.analytic.formulas import flops_per_token, recompute_flops_per_token
from lib.planner.errors import PlanError, positive

BLOCKS = ("gpt", "llama")


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer of `layers` identical blocks, trained on sequences of `seq` tokens.

    block="gpt": LayerNorm, biases, a GELU MLP of two matrices, learned positions (Megatron-LM's GPT, lib.models).
    block="llama": RMSNorm, no biases, a SwiGLU MLP of three matrices, rotary positions (Llama 3).
    ffn: the MLP's inner width, 4·hidden unless given. kv_heads: key/value heads (grouped-query attention),
    `heads` unless given. head_dim: one head's width, hidden // heads unless given (PaLM's heads are 256 wide
    whatever its hidden size: Chowdhery et al. 2022, Table 1). tied: the output layer reuses the token embedding.
    """

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: Optional[int] = None
    kv_heads: Optional[int] = None
    block: str = "gpt"
    tied: bool = True
    head_dim: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq", "vocab", "ffn", "kv_heads", "head_dim"):
            if getattr(self, name) is not None:
                positive(name, getattr(self, name))
        if self.block not in BLOCKS:
            raise PlanError(f"block must be one of {', '.join(BLOCKS)}, got {self.block!r}")
        if self.head_dim is None and self.hidden % self.heads:
            raise PlanError(f"hidden={self.hidden} must be a multiple of heads={self.heads}: heads share it equally "
                            f"(or give head_dim)")
        if self.heads % self.kv_heads_count:
            raise PlanError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads_count}: each key/value "
                            f"head serves a group of query heads")

    @cached_property
    def ffn_width(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @cached_property
    def kv_heads_count(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @cached_property
    def head_width(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @cached_property
    def attention_width(self) -> int:
        """Width of the query projection and of the output projection's input: heads × head size (h for most
        models; PaLM's H·Q, Chowdhery et al. 2022, appendix B)."""
        return self.heads * self.head_width

    @cached_property
    def kv_width(self) -> int:
        """Width of the key projection (and of the value projection): kv_heads × head size."""
        return self.kv_heads_count * self.head_width

    @cached_property
    def layer_matmul_params(self) -> int:
        """Weights one block multiplies by: query and output (h × attention width), key and value (h × kv_width),
        the MLP's."""
        h, f = self.hidden, self.ffn_width
        return 2 * h * self.attention_width + 2 * h * self.kv_width + (3 if self.block == "llama" else 2) * h * f

    @cached_property
    def layer_params(self) -> int:
        """One block: its matrices, plus two RMSNorms (llama) or two LayerNorms and the biases (gpt)."""
        h = self.hidden
        if self.block == "llama":
            return self.layer_matmul_params + 2 * h
        biases = self.attention_width + 2 * self.kv_width + h + self.ffn_width + h   # query, key, value, output; MLP
        return self.layer_matmul_params + biases + 2 * 2 * h

    @cached_property
    def embedding_params(self) -> int:
        """The token embedding, and the learned positions of a gpt."""
        return self.vocab * self.hidden + (self.seq * self.hidden if self.block == "gpt" else 0)

    @cached_property
    def head_params(self) -> int:
        """The final norm, and the output layer unless it is the token embedding (tied)."""
        norm = 2 * self.hidden if self.block == "gpt" else self.hidden
        return norm + (0 if self.tied else self.vocab * self.hidden)

    @cached_property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.head_params

    @cached_property
    def matmul_params(self) -> int:
        """The N of 6N: weights that take part in a matrix multiplication, the output layer's included (looking
        up an embedding multiplies nothing)."""
        return self.layers * self.layer_matmul_params + self.vocab * self.hidden

    @cached_property
    def flops_per_token(self) -> float:
        """Model FLOPs per trained token, PaLM's 6N + 12·L·H·S; for a GPT this is Megatron-LM's count without
        recomputation, 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) per batch of B sequences."""
        return flops_per_token(self.matmul_params, self.layers, self.attention_width, self.seq)

    def hardware_flops_per_token(self, recompute: str) -> float:
        """Model FLOPs plus what `recompute` runs a second time: the FLOPs the GPUs execute."""
        return self.flops_per_token + recompute_flops_per_token(
            self.layers * self.layer_matmul_params, self.layers, self.attention_width, self.seq, recompute)

    def layer_flops_per_token(self, recompute: str) -> float:
        """One block's share of `hardware_flops_per_token`."""
        return (flops_per_token(self.layer_matmul_params, 1, self.attention_width, self.seq)
                + recompute_flops_per_token(self.layer_matmul_params, 1, self.attention_width, self.seq, recompute))

    @cached_property
    def head_flops_per_token(self) -> float:
        """The output layer's 6·h·V: forward and backward, never recomputed."""
        return flops_per_token(self.vocab * self.hidden, 0, self.hidden, self.seq)
