"""Where a NaN, an inf, a leftover of torch.empty or a failed op came from: the learner's function replayed under
a tracer that watches every op of every rank.

The tracer notes the first op that makes a NaN from inputs without one, or an inf from finite inputs (a row
masked entirely, exp overflowing, log of 0, a division by zero), with the learner's line that called it; fills
what torch.empty hands out with a marker, so that a result holding the marker is uninitialised memory for certain
(and nothing else is called so); and keeps the last op each rank called, with its inputs' shapes, for an error
raised inside torch to be said in the lesson's terms (lib.diagnose.torch_errors).
"""

from __future__ import annotations

import contextlib
import linecache
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from lib.checker.plain import as_plain
from lib.whose_code import COURSE, ENGINE

MARKER = 3e-39           # what the replay's torch.empty returns: a denormal (float32) no computation here makes
_EMPTY = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"}
_SOFTMAX = {"_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax"}


@dataclass
class Event:
    op: str
    what: str            # the origin in words
    line: Optional["Line"]       # the learner's line that called it


class Tracer(TorchDispatchMode):
    """One rank's watch over its ops, for a replay (never during a check: it looks at every value)."""

    def __init__(self, fill: float = MARKER) -> None:
        super().__init__()
        self.fill = fill                        # what torch.empty's tensors are filled with
        self.origin: Optional[Event] = None
        self.last: Optional[tuple] = None       # (op, input shapes, the learner's Line or None)
        self.failed: Optional[tuple] = None     # the same, for an op that raised under this tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = func.overloadpacket.__name__
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        self.last = (op, [tuple(t.shape) for t in tensors], None)
        try:
            out = func(*args, **kwargs)
        except Exception:
            self.last = self.failed = (op, self.last[1], learner_line())
            raise
        if op in _EMPTY and isinstance(out, torch.Tensor) and out.dtype in (torch.float32, torch.float64):
            with torch.no_grad():
                out.fill_(self.fill)
        elif self.origin is None:
            self._watch(op, func, flat, tensors, out)
        return out

    def _watch(self, op: str, func, flat: list, tensors: list, out: Any) -> None:
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not outs or all(bool(torch.isfinite(t).all()) for t in outs):
            return
        floats = [t for t in tensors if t.is_floating_point()]
        if any(isinstance(x, float) and not math.isfinite(x) for x in flat):
            return                    # asked for: masked_fill(-inf), full(inf)
        nan_in = any(bool(t.isnan().any()) for t in floats)
        new_nan = not nan_in and any(bool(t.isnan().any()) for t in outs)
        new_inf = all(bool(torch.isfinite(t).all()) for t in floats) and floats
        if new_nan or new_inf:
            self.origin = Event(op, describe(op, floats, flat, new_nan), learner_line())


def describe(op: str, inputs: list[torch.Tensor], flat: list, nan: bool) -> str:
    """The origin of a NaN or inf in words, from the op and its inputs."""
    x = inputs[0] if inputs else None
    base = op.rstrip("_")
    if base in _SOFTMAX and x is not None:
        dim = next((a for a in flat[1:] if isinstance(a, int) and not isinstance(a, bool)), -1)
        rows = (x == -math.inf).all(dim=dim)
        if bool(rows.any()):
            return (f"softmax over {int(rows.sum())} row(s) whose every score is -inf: a row masked entirely (the "
                    "causal mask covering the diagonal too, triu(0) where triu(1) belongs, or a block where no key "
                    "is visible), so its softmax is 0/0 = NaN. Skip such rows or blocks, or mask strictly above the "
                    "diagonal")
    if base in ("sub", "add", "rsub") and any(bool(t.isinf().any()) for t in inputs):
        return ("∞ - ∞ = NaN: a value of -inf less another -inf, as when a row whose every score is masked (-inf) "
                "has its max (-inf) subtracted. A row masked entirely (the causal mask covering the diagonal too, "
                "triu(0) where triu(1) belongs, or a block where no key is visible) has no softmax: skip it")
    if base == "exp" and x is not None:
        top = float(x.max())
        return (f"exp overflowed to inf: its input reached {top:.4g}, beyond log({torch.finfo(x.dtype).max:.3g}). "
                "Subtract each row's max before exp (the log-sum-exp trick)")
    if base in ("log", "log2", "log10") and x is not None:
        return ("log of 0 gives -inf (a probability that underflowed to 0, or log of a masked softmax?)"
                if bool((x == 0).any()) else "log of a negative number gives NaN")
    if base in ("div", "true_divide", "reciprocal", "addcdiv") and len(inputs) >= 1:
        divisor = inputs[-1] if base != "reciprocal" else x
        scalar_zero = any(isinstance(a, (int, float)) and not isinstance(a, bool) and a == 0 for a in flat[1:])
        if scalar_zero or bool((divisor == 0).any()):
            return ("a division by zero (x / 0 is inf, 0 / 0 is NaN): a sum, a count or a correction that came out "
                    "0 (Adam's bias correction 1 - β^t is 0 at t = 0: steps count from 1)")
    if base in ("sqrt", "rsqrt") and x is not None:
        return "the square root of a negative number" if bool((x < 0).any()) else "1/sqrt(0) is inf"
    what = "NaN" if nan else "inf"
    return f"{op} turned finite values into {what} (an overflow beyond the dtype's range?)"


class Line(tuple):
    """(file, line number) of the learner's code, read into words only after the run: a rank may not open files."""

    def __str__(self) -> str:
        text = linecache.getline(self[0], self[1]).strip()
        return f"`{text}` (line {self[1]})" if text else f"line {self[1]}"


def learner_line() -> Optional[Line]:
    """The innermost frame of code outside the engine, torch and the problem set (a puzzle's harness): the
    learner's."""
    frame = sys._getframe(1)
    while frame is not None:
        if not frame.f_code.co_filename.startswith(ENGINE + COURSE):
            return Line((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return None


def traced(fn: Callable, tracers: dict, fill: float = MARKER) -> Callable:
    """`fn` (a rank's function, dist first) under a Tracer, kept in `tracers` by rank."""
    def rank_fn(dist, *args, **kwargs):
        tracer = tracers[dist.get_rank()] = Tracer(fill)
        with tracer:
            return fn(dist, *args, **kwargs)
    return rank_fn


_REMEMBERED: Optional[dict] = None      # replays kept while one diagnosis lasts (remembering)


@contextlib.contextmanager
def remembering() -> Iterator[None]:
    """While it lasts, a replay of the same function on the same case with the same fill runs once: a diagnosis
    asks about every wrong leaf of every rank, and each replay runs the learner's whole function."""
    global _REMEMBERED
    outer, _REMEMBERED = _REMEMBERED, ({} if _REMEMBERED is None else _REMEMBERED)
    try:
        yield
    finally:
        _REMEMBERED = outer


def replay(fn: Callable, case, fill: float = MARKER
           ) -> tuple[Optional[list], dict[int, Tracer], Optional[BaseException]]:
    """Run `fn` again on `case` under tracers: (results or None, {rank: tracer}, the error it raised or None)."""
    key = (id(fn), id(case), repr(fill))
    if _REMEMBERED is not None and key in _REMEMBERED:
        return _REMEMBERED[key]
    said = _replay(fn, case, fill)
    if _REMEMBERED is not None:
        _REMEMBERED[key] = said
    return said


def _replay(fn: Callable, case, fill: float) -> tuple[Optional[list], dict[int, Tracer], Optional[BaseException]]:
    from lib.sim import run

    tracers: dict[int, Tracer] = {}
    with Tracer():                   # whatever entering a mode imports, imported here: a rank may not open files
        torch.zeros(2).softmax(-1).isfinite().all()
    try:
        result = run(traced(fn, tracers, fill), case.world_size, *case.args, timeout=10.0, protect=case.expected,
                     faults=case.faults)
    except Exception as e:           # the replay fails as the check's run did: its tracers still say where
        return None, tracers, e
    return as_plain(result.results), tracers, None


def non_finite_origin(fn: Callable, case, rank: int) -> Optional[str]:
    """Where the first NaN or inf of rank `rank` (or, failing that, of any rank) was made, in words."""
    _, tracers, _ = replay(fn, case)
    ranked = [rank] + [r for r in sorted(tracers) if r != rank]
    for r in ranked:
        event = tracers[r].origin if r in tracers else None
        if event is not None:
            who = f"On rank {r}, " if case.world_size > 1 else ""
            line = f", at {event.line}" if event.line else ""
            return f"{who}the first NaN or inf came from {event.what}{line}."
    return None


def unwritten(fn: Callable, case, rank: int, key: str) -> Optional[torch.Tensor]:
    """Where rank `rank`'s leaf `key` holds what torch.empty handed out and nothing wrote (a replay fills empties
    with MARKER); None when the replay cannot say."""
    from lib.diagnose.leaves import leaves

    results, _, error = replay(fn, case)
    if results is None or error is not None:
        return None
    leaf = dict(leaves(results[rank])).get(key)
    if leaf is None or not leaf.is_floating_point():
        return None
    return leaf.detach().cpu() == torch.tensor(MARKER, dtype=leaf.dtype).item()


def tainted(fn: Callable, case, rank: int, key: str, got: torch.Tensor) -> Optional[torch.Tensor]:
    """Where rank `rank`'s leaf `key` was computed from torch.empty's memory before anything was written into it:
    NaN where a replay fills empties with NaN (which every value computed from them carries) and not where another
    fills them with MARKER (a NaN the function makes itself is NaN in both). Whatever the check's own run found
    there, leftovers that happened to be NaN or a stale block included; None when it cannot say."""
    from lib.diagnose.leaves import leaves

    found = []
    for fill in (math.nan, MARKER):
        results, _, error = replay(fn, case, fill=fill)
        if results is None or error is not None:
            return None
        leaf = dict(leaves(results[rank])).get(key)
        if leaf is None or not leaf.is_floating_point() or leaf.shape != got.shape:
            return None
        found.append(leaf.detach().cpu().isnan())
        if not bool(found[0].any()):        # no NaN: nothing read from an empty, and no second replay needed
            return found[0]
    return found[0] & ~found[1]
