"""Measuring memory outside the simulator: what autograd saves, what a function allocates."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
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
    pack._lib_measure = True                # a learner's hooks inside these are composed with them (lib.guard.boundary)

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def blocks_activation_bytes(blocks: Iterable[torch.nn.Module], x: torch.Tensor, recompute: str = "none") -> int:
    """Bytes autograd keeps while `blocks` (lib.models.Block) run one after another on `x`, x included, parameters
    left out, under Korthikanti et al.'s recomputation: "none"; "selective", each block's attention core
    (Block.core) run again in backward; "full", each block whole, only its input kept (torch.utils.checkpoint)."""
    from torch.utils.checkpoint import checkpoint

    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be none, selective or full, got {recompute!r}")
    blocks = list(blocks)

    def forward() -> torch.Tensor:
        h = x
        for block in blocks:
            if recompute == "full":
                h = checkpoint(block, h, use_reentrant=True)       # reentrant: it saves its input for backward
            elif recompute == "selective":
                block.core = functools.partial(checkpoint, type(block).core.__get__(block), use_reentrant=True)
                try:
                    h = block(h)
                finally:
                    del block.core
            else:
                h = block(h)
        return h
    return saved_activation_bytes(forward, exclude=[p for block in blocks for p in block.parameters()])


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


@dataclass
class Work:
    """What a function did, as a simulated rank counts it, measured once and priced under any cost model: its
    FLOPs, its peak and final bytes, and its ops in order ((flops, on_host, bytes) computed, (bytes,) copied
    between host and device)."""

    flops: float = 0.0
    peak: int = 0
    current: int = 0
    steps: list[tuple] = field(default_factory=list)

    def seconds(self, cost: CostModel) -> float:
        """The time a simulated rank's clock counts for it under `cost` (every op on the roofline, host work at
        the host's speed, host-device copies over PCIe)."""
        clock = 0.0
        for step in self.steps:
            clock += cost.compute_time(*step) if len(step) == 3 else cost.transfer_time(step[0])
        return clock


def counted_work(fn: Callable[[], Any]) -> tuple[Any, Work]:
    """Run `fn()` counting what a simulated rank counts: (its result, its Work)."""
    work = Work()

    def compute(flops: float, nbytes: float, on_host: bool) -> None:
        work.steps.append((flops, on_host, nbytes))

    def transfer(nbytes: int, to_host: bool) -> None:
        work.steps.append((nbytes,))
    tracker = RankTracker(on_work=compute, on_transfer=transfer)
    with tracker:
        result = fn()
    work.flops, work.peak, work.current = tracker.flops, tracker.peak, tracker.current
    return result, work


def allocated(fn: Callable[[], Any]) -> tuple[Any, int, int]:
    """Run `fn()` counting the bytes it allocates: (its result, peak bytes, bytes still live at the end)."""
    result, work = counted_work(fn)
    return result, work.peak, work.current


def counted_flops(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Run `fn()` counting its FLOPs exactly as a simulated rank does: (its result, FLOPs)."""
    result, work = counted_work(fn)
    return result, work.flops


def counted_time(fn: Callable[[], Any], cost: CostModel) -> tuple[Any, float]:
    """Run `fn()` timing it as a simulated rank's clock would under `cost`: (its result, seconds)."""
    result, work = counted_work(fn)
    return result, work.seconds(cost)


def _shape_of(value):
    """What a measure of shapes depends on: a module's layers and their parameters' shapes, a tensor's shape, dtype
    and whether it requires a gradient; any other argument as it is (it must be hashable)."""
    if isinstance(value, torch.nn.Module):
        return tuple((type(m), tuple((tuple(p.shape), p.dtype) for p in m.parameters(recurse=False)))
                     for m in value.modules())
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.dtype, value.requires_grad
    return value


def once_per_shape(measure: Callable) -> Callable:
    """`measure`, run once per shape of its arguments (modules, tensors, and any other argument by its value) and
    remembered: what a rank's tracker counts of a function of shapes alone, as a case builder measures for its
    budgets, is the same for every case of those shapes. Every caller gets the same result: it must not be changed."""
    known: dict = {}

    @functools.wraps(measure)
    def measured(*args, **kwargs):
        key = tuple(map(_shape_of, args)) + tuple((k, _shape_of(v)) for k, v in sorted(kwargs.items()))
        if key not in known:
            if len(known) >= 64:
                known.clear()
            known[key] = measure(*args, **kwargs)
        return known[key]
    return measured


class WithoutPeers:
    """A stand-in `dist` for measuring one rank's share of a layer alone, outside any run: its all-reduces leave
    the tensor as it is (the values are then not the real ones, but the shapes, the FLOPs and the tensors autograd
    saves are)."""

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        return None
