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
    return (f"{where} holds {f64(g)[i].item():.5g}{at(i)} and {int(unwritten.sum()) - 1} more values, "
            f"{span(unwritten)}, that nothing wrote: that is uninitialised memory, what torch.empty returns until "
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
