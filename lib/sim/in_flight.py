"""Buffers a rank may not use for a while, as real backends define them: what passes here must not be undefined there.

- After `reduce`, a rank other than the destination holds an unspecified buffer (torch documents it so; gloo leaves
  partial sums in it, NCCL whatever its ring left): reading it, or returning it, is refused until the rank overwrites
  it whole (copy_, fill_, zero_, a receive).
- Between `isend` and its `wait()`, the tensor being sent belongs to the backend: writing into it is refused (gloo sent
  the old values in some runs, the new ones in others).
- Between an async collective or `irecv` and its `wait()`, the buffer being filled is the backend's: reading or
  writing it is refused (gloo shows half-reduced values there).
Each mark covers the bytes of the tensor the call was given, so the rest of a larger buffer stays free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from lib.sim.errors import InvalidCall
from lib.sim.ownership import learner_line, tensors_within
from lib.sim.reads import _SHAPE_ONLY

UNSPECIFIED, SENDING, RECEIVING = "unspecified", "sending", "receiving"
aten = torch.ops.aten
_OVERWRITES = {aten.copy_.default, aten.fill_.Scalar, aten.fill_.Tensor, aten.zero_.default, aten.normal_.default,
               aten.uniform_.default, aten.random_.default, getattr(aten.random_, "from"), aten.random_.to}


@dataclass
class Mark:
    start: int          # bytes of the storage the call's tensor covers
    end: int
    kind: str
    call: str           # the call, as messages name it: "reduce((4,) float32, dst=0, SUM)"
    key: object = None  # what lifts the mark (the send's call), or None


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage a tensor covers, from its first element to its last."""
    if t.numel() == 0:
        return 0, 0
    size = t.element_size()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    start = t.storage_offset() * size
    return start, start + (last + 1) * size


class BufferRules:
    """One rank's marked buffers: storage key -> its marks."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.marks: dict[int, list[Mark]] = {}

    def mark(self, t: torch.Tensor, kind: str, call: str, key: object = None) -> None:
        start, end = _span(t)
        if end > start:
            self.marks.setdefault(t.untyped_storage()._cdata, []).append(Mark(start, end, kind, call, key))

    def lift(self, key: object) -> None:
        """Lift the marks `key` holds (a send waited on)."""
        for storage, marks in list(self.marks.items()):
            marks[:] = [m for m in marks if m.key is not key]
            if not marks:
                del self.marks[storage]

    def overwritten(self, t: torch.Tensor) -> None:
        """`t` was overwritten whole (a receive, a broadcast into it): its unspecified marks go."""
        self._clear(t.untyped_storage()._cdata, *_span(t))

    def _clear(self, storage: int, lo: int, hi: int) -> None:
        marks = self.marks.get(storage)
        if marks:
            marks[:] = [m for m in marks if not (m.kind == UNSPECIFIED and lo <= m.start and m.end <= hi)]
            if not marks:
                del self.marks[storage]

    def _hits(self, t: torch.Tensor) -> list[Mark]:
        marks = self.marks.get(t.untyped_storage()._cdata)
        if not marks:
            return []
        lo, hi = _span(t)
        return [m for m in marks if lo < m.end and m.start < hi]

    def check_op(self, func, written: tuple, viewing: bool, args: tuple, kwargs: dict,
                 inputs: list) -> Optional[InvalidCall]:
        """The rule op `func` breaks on these tensors, or None (`written`: its written_args; `viewing`: a pure
        view, which reads nothing)."""
        marks = self.marks
        for t in inputs:
            if t.untyped_storage()._cdata not in marks:     # nearly every tensor of nearly every op
                continue
            positions, names = written
            writes = [args[i] for i in positions if i < len(args)] + [kwargs[n] for n in names if n in kwargs]
            for m in self._hits(t):
                into = any(t is w for w in writes)
                what = f"{func._overloadpacket.__name__}{learner_line()}"
                if m.kind == SENDING:
                    if into:
                        return self._written_while_sending(m, what)
                    continue
                if viewing or func in _SHAPE_ONLY:
                    continue
                if m.kind == RECEIVING:
                    return self._touched_while_receiving(m, what)
                if into and (func in _OVERWRITES or any(t is kwargs.get(n) for n in names)):
                    self._clear(t.untyped_storage()._cdata, *_span(t))
                    continue
                return self.read_unspecified(m, what)
        return None

    def check_read(self, t: torch.Tensor, what: str) -> Optional[InvalidCall]:
        """A read outside the dispatcher (tolist) or by a dist call (`what` says which)."""
        for m in self._hits(t):
            if m.kind == UNSPECIFIED:
                return self.read_unspecified(m, what)
            if m.kind == RECEIVING:
                return self._touched_while_receiving(m, what)
        return None

    def check_result(self, result) -> Optional[InvalidCall]:
        for t in tensors_within(result):
            error = self.check_read(t, "returned it")
            if error is not None:
                return error
        return None

    def read_unspecified(self, m: Mark, what: str) -> InvalidCall:
        return InvalidCall(
            f"rank {self.rank} read its buffer of {m.call} ({what}), but only the destination rank's buffer holds "
            "the result: torch.distributed leaves the other ranks' buffers unspecified, gloo leaves partial sums "
            "in them, and NCCL whatever its ring left there.\nHint: read the result on the destination rank only; "
            "if every rank needs it, use all_reduce (or broadcast it from the destination).")

    def _touched_while_receiving(self, m: Mark, what: str) -> InvalidCall:
        return self._before_wait(m, what, "used", "its values are undefined: gloo shows half-reduced or half-received "
                                 "values there, and NCCL's kernel may still be writing them",
                                 "call .wait() on the work object first")

    def _written_while_sending(self, m: Mark, what: str) -> InvalidCall:
        return self._before_wait(m, what, "wrote into", "the tensor belongs to the backend: what arrives is undefined "
                                 "(gloo sent the old values in some runs and the new ones in others; NCCL reads it "
                                 "while the kernel runs)", "call .wait() on the work isend returned before changing "
                                 "the tensor, or send a copy (.clone())")

    def _before_wait(self, m: Mark, what: str, did: str, why: str, hint: str) -> InvalidCall:
        return InvalidCall(f"rank {self.rank} {did} the tensor of its {m.call} before its wait() "
                           f"({what}). Until wait() returns, {why}.\n"
                           f"Hint: {hint}.")
