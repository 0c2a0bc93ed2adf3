"""Per-rank accounting of the tensors a rank allocates and the FLOPs it computes.

A TorchDispatchMode is thread-local, so the mode entered in a rank's thread sees exactly
that rank's work: factory calls, op outputs and autograd's buffers in a CPU backward. Each
output's storage is counted once (views share it) and released by a finalizer when the
storage dies, wherever the last reference was hidden.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry


class RankTracker(TorchDispatchMode):
    """Counts live bytes (current and peak) and FLOPs of one rank; `on_flops` advances its clock."""

    def __init__(self, on_flops: Callable[[float], None], now: Callable[[], float]) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self.flops = 0.0
        self.samples: list[tuple[float, int]] = [(0.0, 0)]
        self._sizes: dict[int, int] = {}
        self._on_flops = on_flops
        self._now = now

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        counter = flop_registry.get(func._overloadpacket)
        if counter is not None:
            flops = counter(*args, **kwargs, out_val=out)
            self.flops += flops
            self._on_flops(flops)
        if isinstance(out, torch.Tensor):
            self.adopt(out)
        else:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.adopt(t)
        return out

    def adopt(self, t: torch.Tensor) -> None:
        """Count `t`'s storage as this rank's until it is freed (once, however many views)."""
        storage = t.untyped_storage()
        key = storage._cdata
        size = storage.nbytes()
        known = self._sizes.get(key)
        if known is None:
            weakref.finalize(storage, self._release, key)
        elif known == size:
            return
        self._sizes[key] = size
        self._change(size - (known or 0))

    def _release(self, key: int) -> None:
        size = self._sizes.pop(key, 0)
        if size:
            self._change(-size)

    def _change(self, delta: int) -> None:
        self.current += delta
        if self.current > self.peak:
            self.peak = self.current
        self.samples.append((self._now(), self.current))
