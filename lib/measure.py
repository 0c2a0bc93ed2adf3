"""Measuring memory outside the simulator: what autograd saves, what a function allocates."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from lib.sim.cost import CostModel
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
    pack._lib_measure = True                # a learner's hooks inside these are composed with them (lib.sim.boundary)

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def forward_memory(fn: Callable[[], Any], exclude: Iterable[torch.Tensor] = (),
                   where: torch.device | str = "cpu") -> tuple[int, int]:
    """(bytes autograd saves while `fn()` runs, bytes still allocated after it, its output included): the
    second from the CUDA caching allocator (memory_allocated) on a GPU, from lib's tracker on the CPU."""
    kept: dict[str, Any] = {}

    def forward() -> None:          # keeps fn's output, and with it the saved tensors, alive to be counted
        kept["saved"] = saved_activation_bytes(lambda: kept.setdefault("out", fn()), exclude)

    live = live_bytes(forward, where)[1]
    return kept["saved"], live


def live_bytes(fn: Callable[[], Any], where: torch.device | str = "cpu") -> tuple[Any, int]:
    """(fn's result, bytes it allocated that are still allocated when it returns): from the CUDA caching
    allocator (memory_allocated, which rounds each block up) on a GPU, from lib's tracker on the CPU."""
    where = torch.device(where)
    if where.type != "cuda":
        result, _, live = allocated(fn)
        return result, live
    torch.cuda.synchronize(where)
    before = torch.cuda.memory_allocated(where)
    result = fn()
    torch.cuda.synchronize(where)
    return result, torch.cuda.memory_allocated(where) - before


def allocated(fn: Callable[[], Any]) -> tuple[Any, int, int]:
    """Run `fn()` counting the bytes it allocates: (its result, peak bytes, bytes still live at the end)."""
    tracker = RankTracker(on_work=_ignore, now=lambda: 0.0)
    with tracker:
        result = fn()
    return result, tracker.peak, tracker.current


def counted_flops(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Run `fn()` counting its FLOPs exactly as a simulated rank does: (its result, FLOPs)."""
    tracker = RankTracker(on_work=_ignore, now=lambda: 0.0)
    with tracker:
        result = fn()
    return result, tracker.flops


def counted_time(fn: Callable[[], Any], cost: CostModel) -> tuple[Any, float]:
    """Run `fn()` timing it as a simulated rank's clock would under `cost` (every op on the roofline, host
    work at the host's speed, host-device copies over PCIe): (its result, seconds)."""
    clock = [0.0]

    def work(flops: float, nbytes: float, on_host: bool) -> None:
        clock[0] += cost.compute_time(flops, on_host, nbytes)

    def transfer(nbytes: int, to_host: bool) -> None:
        clock[0] += cost.transfer_time(nbytes)
    tracker = RankTracker(on_work=work, now=lambda: clock[0], on_transfer=transfer)
    with tracker:
        result = fn()
    return result, clock[0]


def _ignore(*_) -> None:
    pass


class WithoutPeers:
    """A stand-in `dist` for measuring one rank's share of a layer alone, outside any run: its all-reduces leave
    the tensor as it is (the values are then not the real ones, but the shapes, the FLOPs and the tensors autograd
    saves are)."""

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        return None
