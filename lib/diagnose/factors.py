"""A constant ratio between the learner's values and the expected ones, named after the case's quantities.

The case names its quantities ({"m, the number of micro-batches": 4, "v, the virtual stages": 2}; N is always
among them). A ratio is named after one of them, its inverse, or a product or quotient of two; where two
candidates are equal on this case (v = N = 2) the message says both, since the case cannot tell them apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

CLOSE = 1e-3        # how near a ratio must be to a quantity to be named after it


@dataclass(frozen=True)
class Candidate:
    value: float
    said: str           # "m, the number of micro-batches" or "m × v (m, the ...; v, the ...)"
    symbol: str         # "m" or "m × v"


def _symbol(name: str) -> str:
    return name.split(",")[0].strip()


def candidates(named: dict[str, float]) -> list[Candidate]:
    """Every quantity, then every product and quotient of two, simplest first; only values above 1 (a ratio below 1
    is matched by its inverse)."""
    singles = [Candidate(float(v), n, _symbol(n)) for n, v in named.items() if float(v) > 1]
    out = list(singles)
    for i, a in enumerate(singles):
        for b in singles[i:]:
            both = f"{a.said}; {b.said}" if a.said != b.said else a.said
            out.append(Candidate(a.value * b.value, f"{a.symbol} × {b.symbol} ({both})", f"{a.symbol} × {b.symbol}"))
    for a in singles:
        for b in singles:
            if a.value > b.value:
                out.append(Candidate(a.value / b.value, f"{a.symbol} / {b.symbol} ({a.said}; {b.said})",
                                     f"{a.symbol} / {b.symbol}"))
    return out


def matching(ratio: float, named: dict[str, float]) -> list[Candidate]:
    """Every candidate equal to `ratio`, simplest first (singles, then products and quotients of two)."""
    return [c for c in candidates(named) if math.isclose(ratio, c.value, rel_tol=CLOSE)]


def simplest(found: list[Candidate]) -> list[Candidate]:
    singles = [c for c in found if " × " not in c.symbol and " / " not in c.symbol]
    return singles or found


def constant_ratio(e: torch.Tensor, g: torch.Tensor, atol: float) -> Optional[float]:
    """c where g = c·e everywhere (the large values decide c; every value must agree), else None. Where no value is
    large (attention's gradients under logits far apart: a few values above the tolerance), those few decide; a
    ratio read from so few is then said only as a named quantity (`explain`'s one_value)."""
    big = e.abs() > max(100 * atol, 1e-12)
    if not bool(big.any()) and e.numel() and float(e.abs().max()) > 0:
        big = e.abs() >= float(e.abs().max()) / 4
    if not bool(big.any()):
        return None
    ratios = g[big] / e[big]
    c = float(ratios.median())
    if not math.isfinite(c) or c == 0 or abs(c - 1) < CLOSE:
        return None
    if not bool(torch.isclose(g, c * e, rtol=CLOSE, atol=max(atol, 1e-9)).all()):
        return None
    return c


Resolve = Callable[[list[Candidate], bool], list[Candidate]]     # (the candidates, whether the values are too big)


def said(c: float, named: dict[str, float], one_value: bool = False,
         resolve: Optional[Resolve] = None) -> Optional[tuple[str, str]]:
    """(the factor in words, the advice) for a ratio c; None when c proves nothing (one value, no named match).
    `resolve` narrows candidates equal on this case by other cases, where they differ."""
    if math.isclose(c, -1, rel_tol=CLOSE):
        return "the right magnitudes with the opposite sign", "a sign flipped (+= for -=?)."
    up = c > 0 and c > 1
    size = abs(c) if up else 1 / abs(c) if c else math.inf
    found = matching(size, named) if c > 0 else []
    if len(simplest(found)) > 1 or (len(found) > 1 and resolve is not None):
        found = (resolve(found, up) if resolve is not None else None) or found
    found = simplest(found)
    if not found:
        if one_value:
            return None          # any two numbers have a ratio: one value proves no factor but a named one
        return f"{c:.4g}× what it should be: a constant factor is wrong (a scale missing or applied twice).", ""
    first = found[0]
    names = " = ".join(c.said for c in found)
    if len(found) > 1:
        names += f" (equal on this case: the factor is one of {' or '.join(c.symbol for c in found)})"
    how = f"{size:g}× what it should be" if up else f"1/{size:g} of what it should be"
    if " / " in first.symbol:                   # values a/b too big: divided by b where a belongs
        a, b = first.symbol.split(" / ")
        advice = f"Divided by {b} where {a} belongs?" if up else f"Divided by {a} where {b} belongs?"
    else:
        advice = (f"A sum where a mean belongs: did you divide by {first.symbol}?" if up else
                  f"Divided by {first.symbol} once too often (or averaged what should be summed)?")
    return f"{how}: off by a factor of {size:g} = {names}", advice


def explain(where: str, e: torch.Tensor, g: torch.Tensor, named: dict[str, float], atol: float,
            what: str = "value", resolve: Optional[Resolve] = None) -> Optional[str]:
    """"every value of rank 0's result is 4× what it should be: off by a factor of 4 = m, ..." or None. A factor
    on everything but a per-feature offset (a bias added once, after the scaling) is said so."""
    c, offset = constant_ratio(e, g, atol), False
    if c is None:
        c, offset = offset_ratio(e, g, atol), True
        if c is None:
            return None
    one_value = int((e.abs() > max(100 * atol, 1e-12)).sum()) < 2
    if one_value and bool((e == e.round()).all()):
        return None                   # one whole number against another (a coordinate, a count): no scale to name
    found = said(c, named, one_value=one_value, resolve=resolve)
    if found is None or (offset and not any(n in found[0] for n in named)):
        return None
    words, advice = found
    if words.startswith("the right magnitudes"):
        return f"{where} has {words}: {advice}"
    if offset:
        words = words.replace(": off by", ", apart from a per-feature offset (a bias, added after the scaling): off by")
    return f"every {what} of {where} is {words}" + (f". {advice}" if advice else "")


def offset_ratio(e: torch.Tensor, g: torch.Tensor, atol: float) -> Optional[float]:
    """c where g = c·e + (a constant per feature, the last dimension): the factor a bias added after the scaling
    hides. Needs at least two rows."""
    if e.dim() < 2 or e.numel() // e.shape[-1] < 2:
        return None
    rows_e, rows_g = e.reshape(-1, e.shape[-1]), g.reshape(-1, g.shape[-1])
    return constant_ratio(rows_e - rows_e.mean(0), rows_g - rows_g.mean(0), atol)


def consistent(found: list[Candidate], ratio: float, named: dict[str, float], up: bool) -> list[Candidate]:
    """The candidates that the ratio of another case, with its own quantities, also matches, the same way up: where
    this case's values are m/N times too big, the other's must be m/N times too big with its own m and N, even where
    that is below 1 there (m < N, where its candidates name N / m)."""
    there = {}
    for c in candidates(named):
        there[c.symbol] = c.value
        if " / " in c.symbol:
            a, b = c.symbol.split(" / ")
            there[f"{b} / {a}"] = 1 / c.value
    return [c for c in found if c.symbol in there
            and math.isclose(ratio, there[c.symbol] if up else 1 / there[c.symbol], rel_tol=CLOSE)]
