"""Per-rank accounting of the tensors a rank allocates and the FLOPs it computes.

A TorchDispatchMode is thread-local, so the mode entered in a rank's thread sees exactly
that rank's work: factory calls, op outputs and autograd's buffers in a CPU backward. Each
output's storage is counted once (views share it) and released by a finalizer when the
storage dies, wherever the last reference was hidden.

Device and host memory are told apart by placement: in simulation `lib.host()` is the
device `cpu:1`, so a tensor made with `device=lib.host()` or moved with `.to(lib.host())`
is host memory, and so is whatever an op computes from host tensors.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from lib.sim.errors import InvalidCall

HOST = torch.device("cpu", 1)
# Ops that may take a host tensor and a device tensor together, as on a GPU.
_CROSSING = {torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default}


def _raise(error: Exception) -> None:
    raise error


class RankTracker(TorchDispatchMode):
    """Counts live bytes (current and peak, device and host) and FLOPs of one rank.

    on_flops(flops, on_host) advances the rank's clock; on_transfer(nbytes, to_host) charges a copy
    between host and device memory.
    """

    def __init__(self, on_flops: Callable[[float, bool], None], now: Callable[[], float],
                 on_transfer: Callable[[int, bool], None] = lambda nbytes, to_host: None,
                 on_violation: Callable[[Exception], None] = _raise) -> None:
        super().__init__()
        self._on_violation = on_violation
        self.current = self.peak = 0
        self.host_current = self.host_peak = 0
        self.flops = 0.0
        self.samples: list[tuple[float, int]] = [(0.0, 0)]
        self._sizes: dict[int, tuple[int, bool]] = {}
        self._on_flops = on_flops
        self._on_transfer = on_transfer
        self._now = now

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on_host = self._placement(func, args, kwargs)
        out = func(*args, **kwargs)
        counter = flop_registry.get(func._overloadpacket)
        if counter is not None:
            flops = counter(*args, **kwargs, out_val=out)
            self.flops += flops
            self._on_flops(flops, on_host)
        if func in _CROSSING:
            source, target = (args[0], out) if func is torch.ops.aten._to_copy.default else (args[1], args[0])
            if isinstance(source, torch.Tensor) and self._is_host(source) != self._is_host(target, on_host):
                self._on_transfer(source.numel() * source.element_size(), not self._is_host(source))
        if isinstance(out, torch.Tensor):
            self.adopt(out, on_host)
        else:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.adopt(t, on_host)
        return out

    def _placement(self, func, args, kwargs) -> bool:
        """Whether the op's outputs live in host memory; mixing host and device inputs is an error."""
        target = kwargs.get("device")
        if target is not None:
            return torch.device(target) == HOST
        if not any(host for _, host in self._sizes.values()):
            return False                   # nothing on the host yet: the common, fast case
        places = {self._is_host(t) for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.dim() > 0}
        if len(places) > 1 and func not in _CROSSING:
            self._on_violation(InvalidCall(
                f"{func._overloadpacket.__name__} was given a tensor in host memory and one in device "
                "memory. On a GPU this fails (tensors must be on the same device).\n"
                "Hint: bring one to the other's side first, with .to(lib.device()) or .to(lib.host())."))
        return places == {True}

    def _is_host(self, t: torch.Tensor, default: bool = False) -> bool:
        known = self._sizes.get(t.untyped_storage()._cdata)
        return known[1] if known is not None else default

    def adopt(self, t: torch.Tensor, on_host: bool = False) -> None:
        """Count `t`'s storage as this rank's until it is freed (once, however many views)."""
        storage = t.untyped_storage()
        key = storage._cdata
        size = storage.nbytes()
        known = self._sizes.get(key)
        if known is None:
            weakref.finalize(storage, self._release, key)
        elif known[0] == size:
            return
        else:
            on_host = known[1]             # a storage resized in place stays where it is
        self._sizes[key] = (size, on_host)
        self._change(size - (known[0] if known else 0), on_host)

    def _release(self, key: int) -> None:
        size, on_host = self._sizes.pop(key, (0, False))
        if size:
            self._change(-size, on_host)

    def _change(self, delta: int, on_host: bool) -> None:
        if on_host:
            self.host_current += delta
            self.host_peak = max(self.host_peak, self.host_current)
            return
        self.current += delta
        if self.current > self.peak:
            self.peak = self.current
        self.samples.append((self._now(), self.current))
