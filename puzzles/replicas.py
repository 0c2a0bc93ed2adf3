"""Replicas that drift apart, for the training puzzles of notebooks 06, 07 and 09.

Ranks whose expected results are equal hold replicas (a parameter every rank keeps whole, the same shard on each
data-parallel replica): what keeps them equal is a collective over exactly those ranks. When the learner's replicas
differ, the ranks they still agree within say which collective ran over the wrong ranks ("the router agrees within
each EP group only": its gradient was all-reduced within the EP group, never across the DP replicas).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from lib.diagnose.leaves import close, leaves, listing, name

Groups = dict[str, Sequence[Sequence[int]]]     # {"EP group": [[0, 1], [2, 3]], ...}: the case's groups, by name


def _classes(ranks: Sequence[int], same: Callable[[int, int], bool]) -> list[list[int]]:
    """The ranks sorted into classes of equal values (the first member of a class stands for it)."""
    out: list[list[int]] = []
    for r in ranks:
        home = next((c for c in out if same(c[0], r)), None)
        if home is None:
            out.append([r])
        else:
            home.append(r)
    return out


def _within(agree: list[list[int]], replicas: list[int], groups: Groups) -> Optional[str]:
    """The name of the case's groups the learner's replicas agree within: each group's members among `replicas`
    are one class."""
    found = sorted(sorted(c) for c in agree)
    if all(len(c) == 1 for c in found):
        return None                   # each rank its own: every group cuts the replicas so, which says nothing
    for group, members in groups.items():
        cut = sorted(sorted(r for r in g if r in replicas) for g in members)
        if [c for c in cut if c] == found:
            return group
    return None


def drifted(expected: list, got: list, groups: Groups, why: dict[str, str], rtol: float, atol: float,
            outputs: Optional[dict] = None) -> Optional[str]:
    """A sentence when ranks that should hold equal values hold different ones, said by the groups they still agree
    within; `why` says what that means, by group name ("" when they agree within none of the case's groups)."""
    mine_e, mine_g = [dict(leaves(e)) for e in expected], [dict(leaves(g)) for g in got]
    found = []
    for key, e in mine_e[0].items():
        holders = [r for r in range(len(expected)) if key in mine_e[r]]
        for replicas in _classes(holders, lambda a, b, k=key: close(mine_e[a][k], mine_e[b][k], rtol, atol)):
            if len(replicas) < 2 or not all(key in mine_g[r] and mine_g[r][key].shape == e.shape for r in replicas):
                continue
            agree = _classes(replicas, lambda a, b, k=key: close(mine_g[a][k], mine_g[b][k], rtol, atol))
            if len(agree) > 1:
                found.append((key, replicas, agree, _within(agree, replicas, groups)))
    if not found:
        return None
    key, replicas, agree, group = next((f for f in found if f[3]), found[0])
    said = name(key, outputs)
    if group:
        where = f"it agrees within each {group} only ({listing([str(sorted(c)) for c in agree])})"
    elif all(len(c) == 1 for c in agree):
        where = "each of them holds its own"
    else:
        where = f"it agrees only among ranks {listing([str(sorted(c)) for c in agree])}"
    return (f"Diagnosis: {said} should be the same on ranks {listing([str(r) for r in replicas], 8)} (replicas of "
            f"one tensor) and is not: {where}. {why.get(group or '', why.get('', ''))}".rstrip())
