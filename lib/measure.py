"""Measuring memory outside the simulator: what autograd saves, what a function allocates."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from lib.sim.tracker import RankTracker


def saved_activation_bytes(fn: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the tensors autograd saves for backward while `fn()` runs (the activations),
    each storage counted once, leaving out the storages of `exclude` (parameters, buffers)."""
    skip = {t.untyped_storage()._cdata for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in skip:
            seen[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def allocated(fn: Callable[[], Any]) -> tuple[Any, int, int]:
    """Run `fn()` counting the bytes it allocates: (its result, peak bytes, bytes still live at the end)."""
    tracker = RankTracker(on_flops=lambda flops, on_host: None, now=lambda: 0.0)
    with tracker:
        result = fn()
    return result, tracker.peak, tracker.current


def counted_flops(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Run `fn()` counting its FLOPs exactly as a simulated rank's clock does: (its result, FLOPs)."""
    tracker = RankTracker(on_flops=lambda flops, on_host: None, now=lambda: 0.0)
    with tracker:
        result = fn()
    return result, tracker.flops
