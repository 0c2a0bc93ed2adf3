"""Cheats on notebook 05's puzzles, each with the words its rejection must contain."""

import torch

import puzzles.pipeline as P
from tests.cheats.common import everywhere
from tests.wrong.pipeline import _zero_bubble


def zero_bubble_w_by_broadcast_and_sum(dist, stage, batch, targets, m):
    """W right after its B, its dW = Σ dy ⊗ x built by broadcasting and summing: no matmul, so it used to
    cost nothing, and 1F1B's order passed for zero bubble."""
    return _zero_bubble(dist, stage, batch, targets, m, keep_waiting=lambda p, r: 0,
                        outer=lambda dy, x: (dy[:, :, None] * x[:, None, :]).sum(0))


def zero_bubble_w_by_mv(dist, stage, batch, targets, m):
    """W right after its B, dW one row at a time with torch.mv (a matrix-vector product is not a matmul)."""
    return _zero_bubble(dist, stage, batch, targets, m, keep_waiting=lambda p, r: 0,
                        outer=lambda dy, x: torch.stack([torch.mv(x.T, dy[:, i]) for i in range(dy.shape[1])]))


CHEATS = everywhere(P) + [
    ("zero_bubble", zero_bubble_w_by_broadcast_and_sum, "simulated time"),
    ("zero_bubble", zero_bubble_w_by_mv, "simulated time"),
]
