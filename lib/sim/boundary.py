"""The edges of torch a simulated rank could use to keep memory where the tracker cannot see it.

The tracker sees every op, but a few calls move bytes in or out of torch without one: converting a
tensor to numpy (or DLPack) and copying it there, pickling it into bytes, taking its values out as Python
numbers, making or resizing a raw storage. Inside a simulated rank:
- numpy, DLPack and pickling are refused: the bytes would leave the simulator's view (and on a GPU,
  `.numpy()` of a device tensor fails anyway);
- `.tolist()` and `.item()` are allowed (split sizes, a loss to print) and their Python objects count toward
  the rank's memory until the run ends, since Python does not tell when they are freed;
- a raw storage a rank makes (`torch.UntypedStorage(n)`) is its memory, and a resized storage is re-measured.
Outside a simulated rank every patch does exactly what torch does.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from lib.sim.context import current_rank, current_runtime, current_tracker
from lib.sim.errors import OutOfView
from lib.sim.tracker import LIST_SLOT_BYTES, PYTHON_NUMBER_BYTES

_OUT_OF_VIEW = ("The simulator measures a rank's memory in torch tensors; bytes moved into numpy arrays, "
                "DLPack capsules or pickled bytes would escape its memory budget.\n"
                "Hint: keep the data in tensors: .clone() or .detach() to keep a copy, torch.empty(...) for a "
                "buffer, .to(lib.host()) for host memory.")


def _refusing(original: Callable, what: str, gpu_note: str = "") -> Callable:
    @functools.wraps(original)
    def refused(self, *args, **kwargs):
        rank = current_rank()
        if rank is not None:
            from lib.sim.ownership import learner_line
            _fail(OutOfView(f"rank {rank} called {what}{learner_line()}. {gpu_note}{_OUT_OF_VIEW}"))
        return original(self, *args, **kwargs)
    refused._lib_sim_patch = True
    return refused


def _counting(original: Callable, what: str) -> Callable:
    @functools.wraps(original)
    def counted(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        tracker = current_tracker()
        if tracker is not None:
            n = self.numel() if isinstance(self, torch.Tensor) else self.nbytes()
            tracker.keep_outside(n * (PYTHON_NUMBER_BYTES + LIST_SLOT_BYTES), what)
        return out
    counted._lib_sim_patch = True
    return counted


def _storage_new(original_new: Callable) -> Callable:
    def new(cls, *args, **kwargs):
        storage = original_new(cls, *args, **kwargs)
        tracker = current_tracker()
        if tracker is not None:
            tracker.adopt_storage(storage)
        return storage
    new._lib_sim_patch = True
    return staticmethod(new)


def _storage_resize(original: Callable) -> Callable:
    @functools.wraps(original)
    def resize(self, size):
        tracker = current_tracker()
        if tracker is not None:
            tracker.check_write(self, torch.ops.aten.resize_.default)
        out = original(self, size)
        if tracker is not None:
            tracker.adopt_storage(self, resized=True)
        return out
    resize._lib_sim_patch = True
    return resize


def _fail(error: Exception) -> None:
    runtime = current_runtime()
    if runtime is None:
        raise error
    runtime.fail(error)


def install() -> None:
    """Patch torch once (at import of lib.sim); idempotent."""
    if getattr(torch.Tensor.numpy, "_lib_sim_patch", False):
        return
    gpu = "On a GPU this fails for a tensor in device memory. "
    torch.Tensor.numpy = _refusing(torch.Tensor.numpy, "Tensor.numpy()", gpu)
    torch.Tensor.__array__ = _refusing(torch.Tensor.__array__, "numpy on a tensor (Tensor.__array__)", gpu)
    torch.Tensor.__dlpack__ = _refusing(torch.Tensor.__dlpack__, "Tensor.__dlpack__ (DLPack export)")
    for cls in (torch.UntypedStorage, torch.TypedStorage):
        cls.__reduce__ = _refusing(cls.__reduce__, "pickle on a tensor's storage (pickle.dumps or torch.save)")
    save = _refusing(lambda obj, *a, **k: _original_save(obj, *a, **k), "torch.save")
    torch.save = torch.serialization.save = save
    torch.Tensor.tolist = _counting(torch.Tensor.tolist, "Tensor.tolist()")
    torch.UntypedStorage.tolist = _counting(torch.UntypedStorage.tolist, "UntypedStorage.tolist()")
    torch.UntypedStorage.__new__ = _storage_new(torch._C.StorageBase.__new__)
    torch.UntypedStorage.resize_ = _storage_resize(torch.UntypedStorage.resize_)


_original_save = torch.serialization.save
