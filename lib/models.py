"""Tiny models shared by the puzzles: small enough for 2 CPU cores, real layers and real math."""

from __future__ import annotations

from typing import Sequence

import torch
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


def param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
