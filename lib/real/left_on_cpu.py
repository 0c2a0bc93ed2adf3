"""Catch, without a GPU, a tensor that a GPU run would leave on the CPU.

On a GPU, an op that mixes a tensor on the GPU with one on the CPU fails ("Expected all tensors to be on
the same device"); on the CPU the same op runs. `watch()` runs a real rank's work on the CPU and tells the
two sides apart: lib.device() answers cpu:0 and lib.host() cpu:1 (as in the simulator), each storage is
marked with where a GPU run would hold it, and the first op that mixes the two sides raises MixedDevices.

How a tensor is marked, from how it was made:
- device: made with device=lib.device() or moved with .to(lib.device()), or computed from such a tensor;
- host: made by a factory given no device (torch.zeros(n), torch.tensor([...]), nn.Linear(...)), made with
  device=lib.host(), moved with .to(lib.host()) or .cpu(); or computed from host tensors only;
- either (goes with the other operands, never flagged): made with a device that reads plain "cpu" here
  (device=x.device, a mesh's device type), or first seen without a known origin (torch's internals).
One-element tensors of no dimension mix freely, as CPU scalars do with GPU tensors. Ops that legitimately
cross (copies, indexing with host indices) are not flagged. What the watch cannot see: a mesh or a process
group on the wrong device type (here both sides are the CPU; lib.real.backends.mesh_device_type is tested apart).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode

from lib.device import stand_in
from lib.errors import PuzzleError

DEVICE, HOST, EITHER = "device", "host", "either"
STAND_IN_DEVICE, STAND_IN_HOST = torch.device("cpu", 0), torch.device("cpu", 1)

aten = torch.ops.aten
# Ops that take tensors from both sides on a GPU too: copies between them, and indexing with host indices.
_CROSSING = {aten.copy_.default, aten._to_copy.default, aten.index.Tensor, aten.index_put_.default,
             aten._index_put_impl_.default, aten.lift_fresh.default, aten.lift_fresh_copy.default}
# Factories whose output a GPU run puts on the CPU when they are given no device.
_FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.rand, torch.randn, torch.randint,
              torch.randperm, torch.arange, torch.linspace, torch.logspace, torch.eye, torch.tensor,
              torch.as_tensor, torch.from_numpy, torch.empty_strided}


class MixedDevices(PuzzleError):
    """An op was given a tensor that a GPU run holds on the GPU and one it holds on the CPU."""


def _key(t: torch.Tensor) -> Optional[int]:
    local = getattr(t, "_local_tensor", None)           # a DTensor: its shard on this rank
    if isinstance(local, torch.Tensor):
        t = local
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _where(place: Any) -> Optional[str]:
    """The mark of a `device=` argument: the stand-ins' indices tell device from host; plain cpu is either."""
    if place is None:
        return None
    place = torch.device(place)
    if place == STAND_IN_DEVICE:
        return DEVICE
    if place == STAND_IN_HOST:
        return HOST
    return EITHER


class _Marks:
    """Where each storage would live on a GPU run, forgotten when the storage is freed."""

    def __init__(self) -> None:
        self._marks: dict[int, str] = {}

    def get(self, t: torch.Tensor) -> str:
        key = _key(t)
        return self._marks.get(key, EITHER) if key is not None else EITHER

    def known(self, t: torch.Tensor) -> bool:
        return _key(t) in self._marks

    def set(self, t: torch.Tensor, mark: str) -> None:
        key = _key(t)
        if key is None:
            return
        if key not in self._marks:
            local = getattr(t, "_local_tensor", t)
            weakref.finalize(local.untyped_storage(), self._marks.pop, key, None)
        self._marks[key] = mark


def _as_list(x: Any) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


# The calls that start a backward pass: (outputs, their gradients) from their arguments.
_BACKWARDS = {
    torch.Tensor.backward: lambda self, gradient=None, *a, **k: (self, gradient),
    torch.autograd.backward: lambda tensors, grad_tensors=None, *a, **k: (tensors, grad_tensors),
    torch.autograd.grad: lambda outputs, inputs=None, grad_outputs=None, *a, **k: (outputs, grad_outputs),
}


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class _Dispatch(TorchDispatchMode):
    """Every aten op, autograd's backward included: flags a mix, marks the outputs."""

    def __init__(self, marks: _Marks) -> None:
        super().__init__()
        self.marks = marks

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _tensors((args, kwargs))
        sides = {self.marks.get(t) for t in inputs if t.dim() > 0} - {EITHER}
        if len(sides) > 1 and func not in _CROSSING:
            shapes = ", ".join(f"{tuple(t.shape)} on the {self.marks.get(t)}" for t in inputs
                               if t.dim() > 0 and self.marks.get(t) != EITHER)
            raise MixedDevices(
                f"{func._overloadpacket.__name__} was given tensors a GPU run holds in different places: {shapes}. "
                "On a GPU this fails (\"Expected all tensors to be on the same device\"). A tensor made without "
                "a device, or with .cpu(), stays in host memory: make it with device=lib.device() (or the device "
                "of the tensors it meets), or move it with .to(lib.device()).")
        out = func(*args, **kwargs)
        if any(r.alias_info is not None for r in func._schema.returns):
            return out                                   # a view or an in-place result: no new storage
        mark = _where(kwargs.get("device"))
        if mark in (None, EITHER) and inputs:
            every = {self.marks.get(t) for t in inputs}
            mark = DEVICE if DEVICE in every else HOST if HOST in every else EITHER
        for t in _tensors(out):
            if not self.marks.known(t):
                self.marks.set(t, mark or EITHER)
        return out


class _Functions(TorchFunctionMode):
    """What only the Python call shows: a factory given no device, .cpu(), .to(x.device), a deep copy."""

    def __init__(self, marks: _Marks) -> None:
        super().__init__()
        self.marks = marks

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _BACKWARDS:
            self._check_gradients(*_BACKWARDS[func](*args, **kwargs))
        out = func(*args, **kwargs)
        if func in _FACTORIES:
            if kwargs.get("device") is None and not _tensors(args) and isinstance(out, torch.Tensor):
                self.marks.set(out, HOST)
        elif func is torch.Tensor.cpu:
            out = self._copy_if_same(args[0], out, HOST)
        elif func is torch.Tensor.to:
            target = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
            if _where(target) == EITHER and self.marks.get(args[0]) == HOST:
                # .to(x.device) moves a host tensor to x's side on a GPU; here it is a no-op.
                out = self._copy_if_same(args[0], out, EITHER)
        elif func is torch.Tensor.__deepcopy__ and isinstance(out, torch.Tensor):
            self.marks.set(out, self.marks.get(args[0]))
        return out

    def _check_gradients(self, outputs: Any, grads: Any) -> None:
        """Autograd refuses, on a GPU, a gradient on another device than its output ("invalid gradient")."""
        outputs, grads = _as_list(outputs), _as_list(grads)
        for out, grad in zip(outputs, grads):
            if isinstance(out, torch.Tensor) and isinstance(grad, torch.Tensor) and grad.dim() > 0:
                if {self.marks.get(out), self.marks.get(grad)} == {DEVICE, HOST}:
                    raise MixedDevices(
                        f"backward was given a gradient on the {self.marks.get(grad)} for an output on the "
                        f"{self.marks.get(out)}. On a GPU this fails (\"invalid gradient at index 0 - expected "
                        "device cuda:0 but got cpu\"): move the gradient with .to(lib.device()).")

    def _copy_if_same(self, source: torch.Tensor, out: torch.Tensor, mark: str) -> torch.Tensor:
        """A GPU run copies here; on the CPU torch hands back the same tensor, which keeps its mark."""
        if isinstance(out, torch.Tensor) and _key(out) == _key(source):
            out = out.clone()                          # gradients flow back through it, as through a GPU's copy
        self.marks.set(out, mark)
        return out


@contextlib.contextmanager
def watch() -> Iterator[None]:
    """Within: lib.device() is cpu:0, lib.host() cpu:1, and an op mixing their sides raises MixedDevices."""
    marks = _Marks()
    with stand_in(STAND_IN_DEVICE, STAND_IN_HOST), _Functions(marks), _Dispatch(marks):
        yield
