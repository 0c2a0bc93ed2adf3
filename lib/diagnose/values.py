"""What one wrong tensor shows by its values alone: never written, returned as given, one rank's share missing or
counted twice, another rank's answer, another leaf's, or uninitialised memory.
"""

from __future__ import annotations

from typing import Optional

import torch

from lib.diagnose.leaves import at, close, f64, first, name, span

GARBAGE_SMALL, GARBAGE_LARGE = 1e-30, 1e30     # torch.empty's leftovers: denormals like 4.5786e-41, or huge values


def leftovers(e: torch.Tensor, g: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """Where the wrong values look like memory nobody wrote: finite denormals or 1e30s, or zeros where the reference
    has data. Only floating-point results: 0 is a valid index, coordinate or count."""
    if not (e.is_floating_point() and g.is_floating_point()):
        return torch.zeros_like(bad)
    ev, gv = f64(e), f64(g)
    garbage = torch.isfinite(gv) & (((gv.abs() < GARBAGE_SMALL) & (gv != 0)) | (gv.abs() > GARBAGE_LARGE))
    return bad & (garbage | ((gv == 0) & (ev != 0)))


def uninitialised(where: str, g: torch.Tensor, unwritten: torch.Tensor) -> str:
    """Said only where a replay saw the values come from torch.empty, never written (lib.diagnose.origins)."""
    i = first(unwritten)
    more = int(unwritten.sum()) - 1
    held = f"{f64(g)[i].item():.5g}{at(i)}" + (f" and {more} more value{'s' if more > 1 else ''}, {span(unwritten)}"
                                               if more else "")
    return (f"{where} holds {held}, that nothing wrote: that is uninitialised memory, what torch.empty returns until "
            "something is written into it: no step wrote that part.")


def never_written(where: str, e: torch.Tensor, g: torch.Tensor, bad: torch.Tensor) -> Optional[str]:
    """Zeros exactly where the wrong values are (a part never written or never received), or values no computation
    of these inputs makes (an underflow or an overflow, when a replay saw no empty memory there)."""
    odd = leftovers(e, g, bad)
    if not bool(odd.any()):
        return None
    gv = f64(g)
    zeros = odd & (gv == 0)
    if int(zeros.sum()) >= 2 and bool((zeros == bad).all()):
        return (f"{where} is 0 where data should be, {span(zeros)}, and right everywhere else: that part was never "
                "written (or never received).")
    if bool((odd & (gv != 0)).any()):
        return (f"{where} holds values no computation of these inputs should make ({span(odd & (gv != 0))}): tiny "
                "or huge numbers from an underflow or an overflow, not memory left unwritten.")
    return None


def share_missing(where: str, rank: int, key: str, e: torch.Tensor, g: torch.Tensor, inputs: list[dict],
                  rtol: float, atol: float) -> Optional[str]:
    """The result is the expected sum less (or plus) one rank's own input: a rank's share left out or counted
    twice, which a world of two can make look like another rank's input returned."""
    world = len(inputs)
    if world < 2 or not g.is_floating_point():
        return None
    ev, gv = f64(e), f64(g)
    for s in range(world):
        x = inputs[s].get(key)
        if x is None or x.shape != e.shape or close(x, torch.zeros_like(x), rtol, atol):
            continue
        xv = f64(x)
        if close(ev - xv, gv, rtol, atol):
            whose = "its own" if s == rank else f"rank {s}'s"
            return (f"{where} is the expected sum without {whose} input: rank {s}'s share was left out of the sum "
                    "(a rank adds what it receives but not what it holds itself?).")
        if close(ev + xv, gv, rtol, atol):
            return f"{where} is the expected sum with rank {s}'s input counted twice."
    return None


def returned_as_given(where: str, rank: int, key: str, e: torch.Tensor, g: torch.Tensor, inputs: list[dict],
                      rtol: float, atol: float) -> Optional[str]:
    mine = inputs[rank].get(key)
    if mine is None or not close(mine, g, rtol, atol) or close(mine, e, rtol, atol):
        return None
    if len(inputs) == 1:
        return f"{where} is unchanged from what the function was given: nothing was computed into it."
    return (f"{where} is unchanged from what rank {rank} was given: nothing was added to it. The answer of "
            "a rank that never communicated (or whose update never happened).")


def another_ranks(where: str, rank: int, key: str, g: torch.Tensor, expected: list[dict], rtol: float,
                  atol: float) -> Optional[str]:
    if g.numel() < 2 and bool((g == g.round()).all()):
        return None                   # one whole number equal to another rank's (a coordinate) proves nothing
    for s in range(len(expected)):
        theirs = expected[s].get(key)
        if s != rank and theirs is not None and close(theirs, g, rtol, atol):
            return (f"{where} holds what rank {s} should return: a wrong rank index or order "
                    "(which rank's part is whose?).")
    return None


def another_leaf(where: str, key: str, g: torch.Tensor, mine: dict, rtol: float, atol: float,
                 outputs: Optional[dict] = None) -> Optional[str]:
    for other, t in mine.items():
        if other != key and close(t, g, rtol, atol):
            swap = ("a parameter where its gradient belongs" if other + ".grad" == key else
                    "a gradient where its parameter belongs" if key + ".grad" == other else "the wrong tensor")
            return f"{where} holds what {name(other, outputs)} should: {swap}."
    return None


def parts_of_a_sum(key: str, said: str, expected: list[dict], got: list[dict], rtol: float,
                   atol: float) -> Optional[str]:
    """The ranks' values of `key` add up to the expected one, which every rank should hold: each kept its own part
    of a sum over ranks (x.grad through a column-parallel layer, a partial output) and the parts were never summed."""
    world = len(expected)
    mine = [g.get(key) for g in got]
    want = [e.get(key) for e in expected]
    if world < 2 or any(t is None for t in mine + want) or any(t.shape != want[0].shape for t in mine + want):
        return None
    if not all(close(w, want[0], rtol, atol) for w in want) or not want[0].is_floating_point():
        return None
    if all(close(t, mine[0], rtol, atol) for t in mine):
        return None                   # every rank holds the same value: a factor's question, not a part's
    total = sum(f64(t) for t in mine)
    if close(total, want[0], rtol, atol):
        return (f"the ranks' {said} add up to the expected one: each rank holds only its own part of a sum over the "
                "ranks, and the parts were never summed (an all-reduce is missing where the parts meet: in backward, "
                "the gradient of a replicated input gathers every rank's part).")
    return None


def approximation(wrong: list) -> Optional[str]:
    """Every wrong value within a hair of the right one (0.1% of the largest value): the same computation with
    another approximation, not another algorithm."""
    worst = 0.0
    for _, _, e, g in wrong:
        if not e.is_floating_point():
            return None
        scale = float(f64(e).abs().max())
        worst = max(worst, float((f64(g) - f64(e)).abs().max()) / max(scale, 1e-30))
    lower = next(((g.dtype, e.dtype) for _, _, e, g in wrong if g.is_floating_point() and g.dtype != e.dtype
                  and torch.finfo(g.dtype).eps > torch.finfo(e.dtype).eps), None)
    if 0 < worst < 1e-3 and lower is not None:
        have, want = (str(t).removeprefix("torch.") for t in lower)
        return (f"every wrong value is within {worst:.1e} of the largest expected value, and your result is {have} "
                f"where {want} belongs: the computation may be right, rounded to fewer digits than the check "
                "compares. Keep the inputs' dtype (no .float(), no lower-precision buffers).")
    if 0 < worst < 1e-3:
        return (f"every wrong value is within {worst:.1e} of the largest expected value: the right computation with a "
                "different approximation (GeLU's tanh form, approximate='tanh', where the exact erf form belongs; "
                "an eps; float32 arithmetic where float64 belongs).")
    return None


def contributions(where: str, key: str, e: torch.Tensor, g: torch.Tensor, inputs: list[dict], rtol: float,
                  atol: float) -> Optional[str]:
    """Where the expected value is a sum over ranks of their inputs (or of one chunk of them), which ranks' shares
    the learner's value holds: a ring stopped a step early, a share copied instead of added, one counted twice."""
    world = len(inputs)
    slices = _slices(key, e, inputs, rtol, atol)
    if world < 2 or slices is None or not g.is_floating_point():
        return None
    parts = torch.stack([f64(t).reshape(-1) for t in slices])          # (N, elements)
    if parts.shape[1] <= world or not bool(torch.isfinite(f64(g)).all()) or not bool(torch.isfinite(parts).all()):
        return None                  # too few values to tell N shares apart, or a NaN or inf no sum of shares makes
    weights = torch.linalg.lstsq(parts.T, f64(g).reshape(-1, 1)).solution.reshape(-1)
    rounded = weights.round()
    if not close(rounded @ parts, f64(g).reshape(-1), rtol, atol) or bool((rounded == 1).all()):
        return None
    counts = [int(w) for w in rounded.tolist()]
    if any(c < 0 or c > 2 for c in counts) or len(set(counts)) == 1:
        return None                   # every share the same number of times: a factor's question
    held = [s for s, c in enumerate(counts) if c >= 1]
    missing = [s for s, c in enumerate(counts) if c == 0]
    twice = [s for s, c in enumerate(counts) if c == 2]
    text = f"{where} holds the sum of {_ranks(held)}'s shares only" if held else f"{where} holds none of the shares"
    if missing:
        text += f", without {_ranks(missing)}'s"
    if twice:
        text += f", with {_ranks(twice)}'s counted twice"
    if len(held) == 1 and not twice:
        return text + ": what arrived was copied (or kept) instead of added to what the rank already held."
    return text + ": a sum over the ranks that stopped early or skipped a step (each step must add what it receives)."


def _slices(key: str, e: torch.Tensor, inputs: list[dict], rtol: float,
            atol: float) -> Optional[list[torch.Tensor]]:
    """Each rank's input, or the same chunk of each rank's input, whose sum is `e`; None if none is."""
    world = len(inputs)
    xs = [i.get(key) for i in inputs]
    if any(x is None or not x.is_floating_point() for x in xs):
        return None
    if all(x.shape == e.shape for x in xs):
        candidates = [xs]
    elif all(x.numel() == world * e.numel() for x in xs):
        candidates = [[x.reshape(-1).chunk(world)[j].reshape(e.shape) for x in xs] for j in range(world)]
    else:
        return None
    return next((c for c in candidates if close(sum(f64(t) for t in c), e, rtol, atol)), None)


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def input_offset(where: str, e: torch.Tensor, g: torch.Tensor, mine: list[tuple[str, torch.Tensor]], world: int,
                 rtol: float, atol: float) -> Optional[str]:
    """The difference is one of the rank's own inputs broadcast along the rows (a bias): left out, added twice, or
    added on every rank before a sum over N ranks."""
    if not (e.is_floating_point() and g.is_floating_point()) or e.dim() < 1:
        return None
    d = f64(e) - f64(g)
    for said, t in mine:
        if t.dim() != 1 or t.shape[0] != e.shape[-1] or not t.is_floating_point():
            continue
        b = f64(t).expand_as(d)
        if close(b, torch.zeros_like(b), rtol, atol):
            continue
        if close(d, b, rtol, atol):
            return f"{where} lacks {said}: it was never added (or added where it was then lost)."
        if close(-d, b, rtol, atol):
            return f"{where} has {said} added twice."
        if world > 1 and close(-d, (world - 1) * b, rtol, atol):
            return (f"{where} has {said} added N times (N = {world}): each rank added it before the sum over the "
                    "ranks; add it once, after the sum.")
    return None
