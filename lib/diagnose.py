"""Say what kind of wrong a wrong result is: the classic mistake it matches, or where it differs.

A check that found a wrong value asks `diagnose` for a sentence. It first runs the puzzle's known mistakes
on the same case (a wrong answer run, not a guess) and names the one the learner's result equals; then it
looks at the result itself: a constant factor (N, k, m), another rank's or another chunk's values, values
never written, the inputs returned unchanged, a parameter where a gradient belongs. Failing all of these,
it says which ranks, which tensors and which slices differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from lib.compare import first_difference
from lib.errors import PuzzleError
from lib.sim import PerRank, run

GARBAGE_SMALL, GARBAGE_LARGE = 1e-30, 1e30     # torch.empty's leftovers: denormals like 4.5786e-41, or huge values


@dataclass(frozen=True)
class Mistake:
    """A known wrong answer of one puzzle: `fn` makes the mistake (same signature as the puzzle's function)
    and `message` names it for a learner whose result equals fn's on every rank of the case.

    With alone=True each rank runs `fn` on its own, as a world of one rank: the answer without communication."""

    fn: Callable
    message: str
    alone: bool = False


def diagnose(expected: Sequence[Any], got: Sequence[Any], args: tuple, *, mistakes: Sequence[Mistake] = (),
             wrap: Callable[[Callable], Callable] = lambda f: f, factors: Optional[dict[str, float]] = None,
             rtol: float = 1e-5, atol: float = 1e-6) -> str:
    """One or two sentences for a learner whose per-rank results `got` differ from `expected`; "" if none fits.

    `factors` names the numbers a constant ratio may equal ({"k, the number of micro-batches": 4});
    N, the world size, is always among them."""
    world = len(expected)
    for mistake in mistakes:
        theirs = _mistaken_results(mistake, args, world, wrap, expected)
        if theirs is not None and all(_same(t, g, rtol, atol) for t, g in zip(theirs, got)):
            return f"Diagnosis: your result is exactly what {mistake.message}"
    named = {"N, the world size": float(world), **(factors or {})}
    wrong = [(r, key, e, g) for r in range(world) for key, e, g in _pairs(expected[r], got[r], rtol, atol)]
    if not wrong:
        return ""
    inputs = [_given(_mine(args, r)) for r in range(world)]
    for rank, key, e, g in wrong:
        found = _pattern(rank, key, e, g, expected, inputs, named, rtol, atol)
        if found:
            return f"Diagnosis: {found}"
    where = _where(wrong, world, rtol, atol)
    return f"Where: {where}" if where else ""


# ---- the learner's result against known mistakes -----------------------------------------------------------
def _mistaken_results(mistake: Mistake, args: tuple, world: int, wrap: Callable,
                      protect: Any) -> Optional[list]:
    """What the mistake returns on each rank of this case; None if it cannot run here."""
    try:
        if mistake.alone:
            return [run(wrap(mistake.fn), 1, *_mine(args, r), timeout=10.0).results[0] for r in range(world)]
        return run(wrap(mistake.fn), world, *args, timeout=10.0, protect=protect).results
    except (PuzzleError, Exception):      # a mistake that does not apply to this case (shapes, world size)
        return None


def _mine(args: tuple, rank: int) -> tuple:
    return tuple(a.values[rank] if isinstance(a, PerRank) else a for a in args)


def _given(args: tuple) -> dict[str, torch.Tensor]:
    """A rank's inputs named as its result would name them: a model's parameters by name, a tensor by ""."""
    named: dict[str, torch.Tensor] = {}
    for a in args:
        for key, t in _leaves(a):
            named.setdefault(key, t)
    return named


def _same(a: Any, b: Any, rtol: float, atol: float) -> bool:
    """Equal up to the reordering of sums that two programs computing the same thing may differ by."""
    return first_difference(a, b, max(rtol, 1e-4), max(atol, 1e-5)) is None


# ---- the result itself -------------------------------------------------------------------------------------
def _leaves(value: Any, key: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every number in a result: tensors, numbers, containers, a module's parameters and
    gradients (named `weight` and `weight.grad`)."""
    if isinstance(value, torch.nn.Module):
        for name, p in value.named_parameters():
            yield f"{key}{name}", p.detach()
            if p.grad is not None:
                yield f"{key}{name}.grad", p.grad.detach()
    elif isinstance(value, torch.Tensor):
        yield key, value.detach()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield key, torch.tensor(float(value))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{key}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{key}[{k!r}]")


def _pairs(expected: Any, got: Any, rtol: float, atol: float) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, expected, got) for every leaf that differs, where both sides have it with the same shape."""
    have = dict(_leaves(got))
    out = []
    for key, e in _leaves(expected):
        g = have.get(key)
        if isinstance(g, torch.Tensor) and g.shape == e.shape and not _close(e, g, rtol, atol):
            out.append((key, e, g))
    return out


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> bool:
    return a.shape == b.shape and bool(torch.isclose(_f64(b), _f64(a), rtol=rtol, atol=atol, equal_nan=True).all())


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().to(torch.float64)


def _name(key: str) -> str:
    return f"the result{key}" if not key or key.startswith("[") else key


def _pattern(rank: int, key: str, e: torch.Tensor, g: torch.Tensor, expected: Sequence[Any], inputs: list[dict],
             named: dict[str, float], rtol: float, atol: float) -> Optional[str]:
    """The first classic mistake this one differing tensor shows, in words; None if none."""
    world = len(expected)
    where = f"rank {rank}'s {_name(key).replace('the result', 'result')}" if world > 1 else _name(key)
    ev, gv = _f64(e), _f64(g)
    bad = ~torch.isclose(gv, ev, rtol=rtol, atol=atol, equal_nan=True)
    found = _never_written(where, ev, gv, bad)
    if found:
        return found
    mine = inputs[rank].get(key)
    if mine is not None and _close(mine, g, rtol, atol) and not _close(mine, e, rtol, atol):
        if world == 1:
            return f"{where} is unchanged from what the function was given: nothing was computed into it."
        return (f"{where} is unchanged from what rank {rank} was given: nothing was added to it. The answer of "
                "a rank that never communicated (or whose update never happened).")
    others = [s for s in range(world) if s != rank]
    for s in others:
        theirs = dict(_leaves(expected[s])).get(key)
        if theirs is not None and _close(theirs, g, rtol, atol):
            return (f"{where} holds what rank {s} should return: a wrong rank index or order "
                    "(which rank's part is whose?).")
    found = _shuffled_chunks(where, ev, gv, world, rtol, atol)
    if found:
        return found
    for other, t in dict(_leaves(expected[rank])).items():
        if other != key and _close(t, g, rtol, atol):
            swap = ("a parameter where its gradient belongs" if other + ".grad" == key else
                    "a gradient where its parameter belongs" if key + ".grad" == other else "the wrong tensor")
            return f"{where} holds what {_name(other)} should: {swap}."
    return _factor(where, ev, gv, named, atol)


def _never_written(where: str, ev: torch.Tensor, gv: torch.Tensor, bad: torch.Tensor) -> Optional[str]:
    finite = torch.isfinite(ev)
    garbage = bad & (((gv.abs() < GARBAGE_SMALL) & (gv != 0)) | (gv.abs() > GARBAGE_LARGE)
                     | (~torch.isfinite(gv) & finite))
    if bool(garbage.any()):
        i = _first(garbage)
        return (f"{where} holds {gv[i].item():.5g}{_at(i)} ({int(garbage.sum())} such values, {_span(garbage)}): "
                "a number no computation made. That is uninitialised memory, what torch.empty returns until "
                "something is written into it: no step wrote that part.")
    zeros = bad & (gv == 0)
    if bool(zeros.any()) and bool((zeros == bad).all()):
        return (f"{where} is 0 where data should be, {_span(zeros)}, and right everywhere else: that part was never "
                "written (or never received).")
    return None


def _factor(where: str, ev: torch.Tensor, gv: torch.Tensor, named: dict[str, float], atol: float) -> Optional[str]:
    """A constant ratio between got and expected, named after N, k or m where it equals one of them."""
    big = ev.abs() > max(100 * atol, 1e-12)
    if not bool(big.any()):
        return None
    ratios = gv[big] / ev[big]
    c = float(ratios.median())
    if not math.isfinite(c) or abs(c - 1) < 1e-3 or c == 0:
        return None
    if ratios.numel() < 2 and not any(math.isclose(abs(c) ** s, v, rel_tol=1e-3)
                                      for v in named.values() for s in (1, -1)):
        return None                       # any two numbers have a ratio: one value proves no factor but a named one
    if not bool(torch.isclose(gv, c * ev, rtol=1e-3, atol=max(atol, 1e-9)).all()):
        return None
    for name, v in named.items():
        symbol = name.split(",")[0]
        if v > 1 and math.isclose(c, v, rel_tol=1e-3):
            return (f"every value of {where} is {v:g}× what it should be: off by a factor of {v:g} = {name}. "
                    f"A sum where a mean belongs: did you divide by {symbol}?")
        if v > 1 and math.isclose(c, 1 / v, rel_tol=1e-3):
            return (f"every value of {where} is 1/{v:g} of what it should be: off by a factor of {v:g} = {name}. "
                    f"Divided by {symbol} once too often (or averaged what should be summed)?")
    if math.isclose(c, -1, rel_tol=1e-3):
        return f"{where} has the right magnitudes with the opposite sign: a sign flipped (+= for -=?)."
    return (f"every value of {where} is {c:.4g}× what it should be: "
            "a constant factor is wrong (a scale missing or applied twice).")


def _shuffled_chunks(where: str, ev: torch.Tensor, gv: torch.Tensor, world: int, rtol: float,
                     atol: float) -> Optional[str]:
    """The N chunks (along the first dimension) of got are the expected ones in another order."""
    if world < 2 or ev.dim() == 0 or ev.shape[0] % world:
        return None
    want, have = ev.chunk(world), gv.chunk(world)
    moved = []
    for i, h in enumerate(have):
        if _close(want[i], h, rtol, atol):
            continue
        j = next((j for j, w in enumerate(want) if _close(w, h, rtol, atol)), None)
        if j is None:
            return None
        moved.append(f"chunk {i} holds chunk {j}")
    return (f"{where} has the right chunks in the wrong places ({', '.join(moved)}, of {world} chunks): "
            "a wrong chunk index or order.") if moved else None


# ---- where, when no pattern fits ---------------------------------------------------------------------------
def _where(wrong: list, world: int, rtol: float, atol: float) -> str:
    """Which ranks, tensors and slices differ; "" when the first difference already said it all (one number)."""
    if len(wrong) == 1 and wrong[0][2].numel() == 1:
        return ""
    ranks = sorted({r for r, *_ in wrong})
    who = ("every rank" if len(ranks) == world
           else "rank" + ("s " if len(ranks) > 1 else " ") + ", ".join(map(str, ranks)))
    first = ranks[0]
    parts = []
    for r, key, e, g in wrong:
        if r != first:
            continue
        bad = ~torch.isclose(_f64(g), _f64(e), rtol=rtol, atol=atol, equal_nan=True)
        parts.append(f"{_name(key)} ({int(bad.sum())} of {bad.numel()} values, {_span(bad)})")
    shown = "; ".join(parts[:6]) + (f"; and {len(parts) - 6} more" if len(parts) > 6 else "")
    return f"wrong on {who}. On rank {first}: {shown}." if world > 1 else f"{shown}."


def _first(mask: torch.Tensor) -> tuple:
    return tuple(int(i) for i in mask.nonzero()[0]) if mask.dim() else ()


def _at(index: tuple) -> str:
    return f" at index {index}" if index else ""


def _span(mask: torch.Tensor) -> str:
    """The smallest slice holding every True of `mask`, as Python would write it."""
    if mask.dim() == 0:
        return "the whole value"
    idx = mask.nonzero()
    lo, hi = idx.min(0).values.tolist(), idx.max(0).values.tolist()
    if all(a == 0 and b == n - 1 for a, b, n in zip(lo, hi, mask.shape)):
        return "all over"
    return "in [" + ", ".join(f"{a}:{b + 1}" if b > a else f"{a}" for a, b in zip(lo, hi)) + "]"
