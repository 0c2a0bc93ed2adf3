"""Mixture-of-experts arithmetic for notebook 07's figures and widget: expert capacity, the load a router puts on
each expert, what capacity drops, what expert parallelism's all-to-all moves.

Counts only: which tokens a capacity drops is the notebook's puzzle, not this module's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def capacity(tokens: int, experts: int, k: int, capacity_factor: float) -> int:
    """Slots per expert: ceil(k · tokens · capacity_factor / experts) (Switch Transformer, with top-k's k)."""
    return math.ceil(k * tokens * capacity_factor / experts)


def skewed_logits(tokens: int, experts: int, skew: float, seed: int = 0) -> torch.Tensor:
    """Router logits (tokens, experts): standard normal, plus a per-expert bias of `skew` standard deviations
    (0: a balanced router; 2: a few experts take most tokens)."""
    gen = torch.Generator().manual_seed(seed)
    bias = torch.randn(experts, generator=gen, dtype=torch.float64) * skew
    return torch.randn(tokens, experts, generator=gen, dtype=torch.float64) + bias


def expert_load(logits: torch.Tensor, k: int) -> torch.Tensor:
    """How many tokens choose each expert among their top k, before any capacity: (experts,) int64."""
    return torch.bincount(logits.topk(k, dim=-1).indices.flatten(), minlength=logits.shape[-1])


@dataclass(frozen=True)
class Routing:
    """One router's load against a capacity, and what expert parallelism over `ranks` moves for it."""

    load: list[int]              # tokens choosing each expert (top-k), before capacity
    capacity: int                # slots per expert
    kept: int                    # (token, expert) pairs within capacity
    wanted: int                  # tokens × k
    ranks: int
    row_bytes: int               # one token's hidden vector

    @property
    def dropped_fraction(self) -> float:
        return 1 - self.kept / self.wanted

    @property
    def padded_slots(self) -> int:
        """Slots an expert computes on padding: capacity × experts − kept (a padded, GShard-style dispatch)."""
        return self.capacity * len(self.load) - self.kept

    @property
    def all_to_all_bytes(self) -> float:
        """Bytes a rank whose tokens these are sends in dispatch and combine, experts spread evenly over the ranks:
        each kept pair goes to its expert's rank and back, and (N-1)/N of them leave the rank."""
        return 2 * self.kept * (self.ranks - 1) / self.ranks * self.row_bytes


def routing(logits: torch.Tensor, k: int, capacity_factor: float, ranks: int = 1, row_bytes: int = 0) -> Routing:
    """The load `logits` (tokens, experts) puts on each expert against its capacity."""
    tokens, experts = logits.shape
    load = expert_load(logits, k)
    cap = capacity(tokens, experts, k, capacity_factor)
    return Routing(load.tolist(), cap, int(load.clamp(max=cap).sum()), tokens * k, ranks, row_bytes)


def dispatch_counts(logits_per_rank: list[torch.Tensor], k: int, capacity_factor: float) -> torch.Tensor:
    """(N, N) int64: kept (token, expert) pairs rank s sends to rank r, experts split evenly over the N ranks,
    capacity per expert from each rank's own tokens (each rank is a routing group, as in GShard)."""
    n = len(logits_per_rank)
    counts = torch.zeros(n, n, dtype=torch.long)
    for s, logits in enumerate(logits_per_rank):
        tokens, experts = logits.shape
        kept = expert_load(logits, k).clamp(max=capacity(tokens, experts, k, capacity_factor))
        counts[s] = kept.view(n, experts // n).sum(1)
    return counts
