"""Right values in the wrong places: which part of a result holds which, and what kind of index mistake that is.

A result tensor is cut into parts along one dimension: the case's named parts ({"expert": (0, E)}), else N or
2N chunks along any dimension. When every part the learner returned equals some expected part (of this rank or
another), the mapping is said part by part ("expert 1 holds what expert 2 should") and, where it has a shape,
named: reversed, rotated (an index off by a step), or a grid read the other way round (round-robin where
contiguous blocks belong, coordinates innermost-first).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from lib.diagnose.leaves import close, f64, listing


def cuts(shape: torch.Size, world: int, parts: dict[str, tuple[int, int]]) -> list[tuple[str, int, int]]:
    """(part name, dim, count) to try: the case's named parts first, then N and 2N chunks of each dimension."""
    out = [(n, d % len(shape), c) for n, (d, c) in parts.items()
           if len(shape) > d % max(len(shape), 1) and c > 1 and shape[d % len(shape)] % c == 0] if shape else []
    for d, size in enumerate(shape):
        for c in (world, 2 * world):
            if c > 1 and size % c == 0 and size > 1 and not any(d == d2 and c == c2 for _, d2, c2 in out):
                out.append(("chunk", d, c))
    if len(shape) == 1 and 2 <= shape[0] <= 8 and not any(c == shape[0] for _, _, c in out):
        out.append(("entry", 0, shape[0]))      # a short vector (coordinates, a few numbers): entry by entry
    return out


def explain(rank: int, key: str, where: str, expected: Sequence[dict], got: torch.Tensor, world: int,
            parts: dict[str, tuple[int, int]], rtol: float, atol: float,
            unwritten: Optional[torch.Tensor] = None) -> Optional[str]:
    """The first cut under which every part of `got` is an expected part moved (of rank `rank` or another);
    `expected` holds every rank's leaves by key. A part wholly in `unwritten` (memory no step wrote, as a replay
    saw it) holds nothing: the others may still be parts moved (a received chunk stored one place off)."""
    mine = expected[rank].get(key)
    if mine is None:
        return None
    for part, dim, count in cuts(mine.shape, world, parts):
        have = f64(got).chunk(count, dim)
        empty = [bool(u.all()) for u in unwritten.chunk(count, dim)] if unwritten is not None \
            and unwritten.shape == got.shape else [False] * len(have)
        owners = [r for r in [rank] + [s for s in range(world) if s != rank]
                  if key in expected[r] and expected[r][key].shape == mine.shape]
        pool = [(r, j, p) for r in owners for j, p in enumerate(f64(expected[r][key]).chunk(count, dim))]
        found = []
        for i, h in enumerate(have):
            if empty[i]:
                found.append(None)
                continue
            same = close(pool[i][2], h, rtol, atol)
            match = (rank, i) if same else next(((r, j) for r, j, p in pool if close(p, h, rtol, atol)), None)
            if match is None:
                break
            found.append(match)
        else:
            moved = [(i, m) for i, m in enumerate(found) if m is not None and m != (rank, i)]
            if moved:
                return _said(where, part, dim, count, found, moved, rank, world)
    return None


def _said(where: str, part: str, dim: int, count: int, found: list, moved: list, rank: int, world: int) -> str:
    def whose(m: tuple[int, int]) -> str:
        return f"{part} {m[1]}" if m[0] == rank else f"rank {m[0]}'s {part} {m[1]}"
    pairs = [f"{part} {i} holds what {whose(m)} should" for i, m in moved]
    along = f" along dimension {dim}" if part == "chunk" else ""
    text = (f"{where} has the right values in the wrong places ({listing(pairs, 3)}, of {count} {part}s{along})")
    if None in found:
        return f"{text}: a wrong {part} index where a received {part} is stored."
    kind = _pattern([m[1] for m in found], [m[0] for m in found], rank, count)
    return f"{text}: {kind}" if kind else f"{text}: a wrong {part} index or order."


def _pattern(perm: list[int], ranks: list[int], rank: int, count: int) -> str:
    """What kind of index mistake a permutation is, where it has a shape a learner would recognise."""
    if any(r != rank for r in ranks):
        if all(r == ranks[0] for r in ranks):
            return (f"the whole result is rank {ranks[0]}'s: a wrong rank index or order (which rank's part is "
                    "whose?).")
        return "parts of other ranks' results: a wrong rank index in the layout."
    if perm == list(range(count))[::-1]:
        return "the order reversed (an index counted from the wrong end, or coordinates taken innermost-first)."
    for s in range(1, count):
        if perm == [(i + s) % count for i in range(count)]:
            return f"rotated by {s}: each part is {s} place{'s' * (s > 1)} off (an index off by {s}?)."
    for a in range(2, count):
        if count % a == 0 and a < count:
            b = count // a
            if perm == [(i % a) * b + i // a for i in range(count)]:
                return (f"a {a} × {b} grid read the other way round: dealt round-robin (i % {a}) where contiguous "
                        f"blocks belong (i // {b}), or coordinates taken innermost-first.")
    moved = [i for i in range(count) if perm[i] != i]
    if len(moved) == 2:
        return f"two parts swapped ({moved[0]} and {moved[1]})."
    return ""
