"""The bytes a rank reads of the arguments it was handed: a measure for puzzles whose lesson is what not to read
(a checkpoint's files: only the part that overlaps the rank's shard).

A view is free (slicing reads nothing); an op that reads a view of an argument reads the view's bytes, and an op
that picks elements out of one (indexing, gather) reads at most the bytes it returns. Ops that read only their
input's shape (empty_like, zeros_like) read nothing.
"""

from __future__ import annotations

import torch

from lib.sim.ownership import tensors_within

aten = torch.ops.aten
# Ops that look at their input's shape, dtype and device only.
_SHAPE_ONLY = {aten.empty_like.default, aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
               aten.rand_like.default, aten.randn_like.default, aten.randint_like.default,
               aten.randint_like.low_dtype, aten.new_empty.default, aten.new_empty_strided.default,
               aten.new_zeros.default, aten.new_ones.default, aten.new_full.default}
# Ops that pick elements out of their input: they read at most what they return.
_PICKING = {aten.index.Tensor, aten._unsafe_index.Tensor, aten.index_select.default, aten.gather.default,
            aten.take.default, aten.masked_select.default, aten.embedding.default, aten.take_along_dim.default}


_NOTHING, _WHOLE, _PICKS = 0, 1, 2
_KINDS: dict[int, int] = {}        # id(op) -> what it reads: hashing an OpOverload is a Python call, on every op
_KEEP: list = []                   # the ops in _KINDS, kept alive so that their ids stay theirs


def _kind(func) -> int:
    _KEEP.append(func)
    return _NOTHING if func in _SHAPE_ONLY else _PICKS if func in _PICKING else _WHOLE


class ArgumentReads:
    """Bytes read of each positional argument of one rank (its own copy of them), by the rank's ops."""

    def __init__(self, arguments: list) -> None:
        self.positions: dict[int, int] = {}        # storage key -> the argument it belongs to
        for i, a in enumerate(arguments):
            for t in tensors_within(a):
                self.positions.setdefault(t.untyped_storage()._cdata, i)
        self.bytes = [0] * len(arguments)

    def count(self, func, viewing: bool, inputs: list, out) -> None:
        """Charge the op `func` (`viewing`: a pure view, free) with the bytes it read of the arguments' storages
        among `inputs` (its tensors)."""
        if viewing:
            return
        kind = _KINDS.get(id(func))
        if kind is None:
            kind = _KINDS[id(func)] = _kind(func)
        if kind == _NOTHING:
            return
        positions = self.positions
        for t in inputs:
            i = positions.get(t.untyped_storage()._cdata)
            if i is not None:
                n = t.numel() * t.element_size()
                if kind == _PICKS and isinstance(out, torch.Tensor):
                    n = min(n, out.numel() * out.element_size())
                self.bytes[i] += n

    def read(self, t: torch.Tensor) -> None:
        """A read that bypasses the dispatcher (Tensor.tolist()): the whole view."""
        i = self.positions.get(t.untyped_storage()._cdata)
        if i is not None:
            self.bytes[i] += t.numel() * t.element_size()

    def forget(self, key: int) -> None:
        """A storage died: its key may name another storage from now on."""
        self.positions.pop(key, None)
