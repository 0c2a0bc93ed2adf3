"""Which keys each query attended: a wrong attention output read against the case's own q, k and v (notebook 08).

The keys are cut into units (a rank's chunk, a zigzag chunk, a key block), and each unit is attended under one of a
few options: not at all, whole, twice, under a triangular mask (as a tile on the diagonal is), under one that hides
the diagonal too, with its K and V swapped, or with the querying rank's own V. For each block of queries the combination
whose attention equals the learner's output (and log-sum-exp, where the answer returns it) says which keys it attended;
where that differs from the combination the lesson asks for, the difference is the mistake ("never attended its own
block", "masked a tile off the diagonal as if it were on it"). Combinations nearest the lesson's are tried first.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

NONE, FULL, CAUSAL, STRICT, SWAPPED, OWN_V, TWICE = "none", "full", "causal", "strict", "swapped", "own V", "twice"
RING = (NONE, FULL, TWICE, SWAPPED, OWN_V)   # the options of a ring's blocks, which no mask touches
MASKED = (NONE, FULL, CAUSAL, STRICT)        # the options of a causal lesson's units, or of a mask added by mistake
SAID = {NONE: "not at all", FULL: "whole", CAUSAL: "under a causal (triangular) mask",
        STRICT: "under a mask that hides the diagonal too (triu(0): each query's own key masked)",
        SWAPPED: "with its K and V swapped", OWN_V: "with its keys but this rank's own V",
        TWICE: "twice (merged into the running output two times)"}
MOST = 4096                                  # combinations tried per block of queries, at the most


@dataclass(frozen=True)
class Unit:
    """A run of keys: their rows in the gathered K and V, and what a message calls them."""

    name: str
    start: int
    stop: int


@dataclass(frozen=True)
class Queries:
    """A block of queries: their rows in the rank's q, and what a message calls them."""

    name: str
    start: int
    stop: int
    expected: tuple[str, ...]             # the option the lesson asks for on each unit


def _stats(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, option: str, own_v: Optional[torch.Tensor]):
    """(log-sum-exp, output) of queries q over one unit's k and v under an option; -inf and 0 where no key is seen."""
    if option == SWAPPED:
        k, v = v, k
    elif option == OWN_V:
        if own_v is None or own_v.shape != v.shape:
            return None
        v = own_v
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5                     # (b, h, nq, nk)
    if option in (CAUSAL, STRICT):
        nq, nk = s.shape[-2:]
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool).triu(1 if option == CAUSAL else 0), -math.inf)
    lse = s.logsumexp(-1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    return lse + (math.log(2) if option == TWICE else 0.0), p @ v


def _merged(parts: list) -> tuple[torch.Tensor, torch.Tensor]:
    lses = torch.stack([lse for lse, _ in parts])
    lse = lses.logsumexp(0)
    weights = torch.exp(lses - lse).nan_to_num(0.0).unsqueeze(-1)
    out = (weights * torch.stack([o for _, o in parts])).sum(0)
    return lse, out.masked_fill(torch.isinf(lse).unsqueeze(-1), math.nan)


def _combinations(expected: tuple[str, ...], options: Sequence[str]):
    """Combinations of options: first those that change every unit of one kind alike (the units the lesson sees
    whole, those it masks, those it skips: a mistake in a rule changes all of its units), then every combination,
    nearest the expected one first (fewest units changed), at most MOST in all."""
    n = len(expected)
    kinds = sorted(set(expected))
    yield expected
    for picks in itertools.product(options, repeat=len(kinds)):
        yield tuple(picks[kinds.index(e)] for e in expected)
    tried = 0
    for changed in range(n + 1):
        for where in itertools.combinations(range(n), changed):
            for picks in itertools.product(*[[o for o in options if o != expected[i]] for i in where]):
                combo = list(expected)
                for i, o in zip(where, picks):
                    combo[i] = o
                yield tuple(combo)
                tried += 1
                if tried >= MOST:
                    return


def attended(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: Optional[torch.Tensor],
             units: Sequence[Unit], queries: Queries, options: Sequence[str],
             own_v: Optional[torch.Tensor] = None) -> Optional[tuple[str, ...]]:
    """The options per unit under which the block of queries' attention equals the learner's `out` (and `lse`),
    nearest the expected first; None if none does. q, out, lse: the rank's; k, v: the gathered keys and values."""
    q, out = q[..., queries.start:queries.stop, :].double(), out[..., queries.start:queries.stop, :].double()
    lse = None if lse is None else lse[..., queries.start:queries.stop].double()
    stats = {}
    for i, u in enumerate(units):
        for o in options:
            if o != NONE:
                stats[i, o] = _stats(q, k[..., u.start:u.stop, :].double(), v[..., u.start:u.stop, :].double(), o,
                                     None if own_v is None else own_v[..., :u.stop - u.start, :].double()
                                     if own_v.shape[-2] == u.stop - u.start else None)
    def matches(combo: tuple[str, ...]) -> bool:
        parts = [stats.get((i, o)) for i, o in enumerate(combo) if o != NONE]
        if not parts or any(p is None for p in parts):
            return False
        got_lse, got_out = _merged(parts)
        return torch.allclose(got_out, out, rtol=1e-6, atol=1e-6, equal_nan=True) and (
            lse is None or torch.allclose(got_lse, lse, rtol=1e-9, atol=1e-6, equal_nan=True))
    found = next((c for c in _combinations(queries.expected, options) if matches(c)), None)
    if found is None:
        return None
    for i, want in enumerate(queries.expected):      # a unit the others outweigh matches any option: the lesson's
        if found[i] != want and matches(found[:i] + (want,) + found[i + 1:]):
            found = found[:i] + (want,) + found[i + 1:]
    return found


def differences(found: tuple[str, ...], queries: Queries, units: Sequence[Unit]) -> list[str]:
    """The units a block of queries attended otherwise than the lesson asks, in words."""
    said = []
    for unit, want, got in zip(units, queries.expected, found):
        if want == got:
            continue
        if got == NONE:
            said.append(f"never attended {unit.name}")
        elif want == NONE:
            said.append(f"attended {unit.name} ({SAID[got]}), which it must not see")
        else:
            said.append(f"attended {unit.name} {SAID[got]} where it belongs {SAID[want]}")
    return said


Found = list[tuple[Queries, tuple[str, ...]]]        # each block of a rank's queries, and the options it attended


def explain_attention(per_rank: Callable[[int], Optional[tuple]], world: int, got: list,
                      interpret: Callable[[int, Found, list[Unit]], Optional[str]] = lambda *a: None,
                      lse_at: Optional[int] = 1) -> Optional[str]:
    """For the first rank whose queries attended other keys than the lesson's: which, and what that means
    (interpret(rank, every block's found options, units), the puzzle's reading of the whole rank).
    per_rank(r) -> (q, k, v, units, query blocks, options, own V) for rank r; got: the learner's per-rank results,
    (out, lse) pairs (lse_at=1) or outputs alone (lse_at=None)."""
    for rank in range(world):
        setup = per_rank(rank)
        answer = got[rank]
        out = answer[0] if lse_at is not None and isinstance(answer, (tuple, list)) else answer
        lse = answer[lse_at] if lse_at is not None and isinstance(answer, (tuple, list)) and len(answer) > lse_at \
            else None
        if setup is None or not isinstance(out, torch.Tensor) or (lse_at is not None and not isinstance(
                lse, torch.Tensor)):
            return None
        q, k, v, units, blocks, options, own_v = setup
        if out.shape != q.shape or (lse is not None and lse.shape != q.shape[:-1]):
            return None
        out, lse = out.detach().cpu(), None if lse is None else lse.detach().cpu()
        found = [(queries, attended(q, k, v, out, lse, units, queries, options, own_v)) for queries in blocks]
        wrong = [(queries, f) for queries, f in found if f is not None and f != queries.expected]
        if not wrong:
            continue
        said = [f"{queries.name} {', '.join(differences(f, queries, units))}" for queries, f in wrong[:2]]
        meaning = interpret(rank, [(queries, f) for queries, f in found if f is not None], list(units))
        return f"Diagnosis: on rank {rank}, {'; '.join(said)}" + (f": {meaning}." if meaning else ".")
    return None
