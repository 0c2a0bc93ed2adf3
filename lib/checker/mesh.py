"""Checks for puzzles on a device mesh: the bytes each rank may send along each axis (TP, PP, DP, ...), the ops
each axis may carry, no traffic outside the mesh's groups, and a timeline coloured by axis; and puzzles of
arithmetic on the rank, whose `dist` answers who am I and how many are we, nothing else.

A MeshCase's rules on its traffic per axis (lib.sim.traffic) are lib.checker.puzzle.Contracts, judged as every Puzzle
judges
its cases' contracts; a MeshPuzzle adds the per-axis figures to a success and colours the timeline by axis.
"""

from __future__ import annotations

import functools
import importlib
import random
import textwrap
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from lib.checker.puzzle import Case, Contract, Outcome, Puzzle, fresh_seed
from lib.guard import call_watched
from lib.sim import SimResult
from lib.sim.errors import InvalidCall
from lib.sim.mesh import answer_key_refused
from lib.sim.traffic import OUTSIDE, AxisTraffic, MeshAxes, axis_labeller, traffic_by_axis
from lib.units import fmt_bytes

SLACK = 1e-9          # budgets are exact formulas; this only absorbs rounding


@dataclass(frozen=True)
class AxisBudget:
    """A ceiling on the bytes each rank sends along one axis, with the formula it comes from, and the ops the axis
    may carry (empty: any)."""

    axis: str
    limit: float | Sequence[float]       # one value for every rank, or one per rank
    why: str
    ops: frozenset = frozenset()
    hint: str = ""
    # (k, calls, what it means): sending exactly k times the budget in `calls` calls (None: any number) is a known
    # mistake's trace, e.g. as many collectives as the budget's, each k times too large
    multiples: tuple = ()

    def limit_for(self, rank: int) -> float:
        return self.limit[rank] if isinstance(self.limit, (list, tuple)) else self.limit

    def contract(self, axes: MeshAxes) -> Contract:
        """This budget as a rule on the run: its axis carries its ops only, and no rank sends more than its limit."""
        return Contract(self.why, functools.partial(_over_axis_budget, self, axes), self.hint)


@dataclass
class MeshCase(Case):
    """A case whose ranks form a device mesh: `axes` names its dimensions, `axis_budgets` bound each one; both
    join the case's contracts (no traffic outside the mesh's groups, then each axis budget)."""

    axes: Optional[MeshAxes] = None
    axis_budgets: list[AxisBudget] = field(default_factory=list)
    scale: str = ""                       # what the timeline's proportions stand for, said in its title
    within: str = ""                      # who may talk to whom on this mesh, in its axes' words (default: 3D's)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.axes is not None:
            self.contracts = [*self.contracts, within_mesh(self.axes, self.within),
                              *(b.contract(self.axes) for b in self.axis_budgets)]


def _traffic(result: SimResult, axes: MeshAxes) -> list[dict[str, AxisTraffic]]:
    """traffic_by_axis of a run, read from its trace once however many rules ask (kept on the result itself)."""
    cache = result.__dict__.setdefault("_traffic_by_axis", {})
    if axes not in cache:
        cache[axes] = traffic_by_axis(result.trace, axes)
    return cache[axes]


def _label(axis: str) -> str:
    return "outside the mesh's groups" if axis == OUTSIDE else f"the {axis.upper()} axis"


def within_mesh(axes: MeshAxes, rule: str = "") -> Contract:
    """No communication outside the mesh's groups: each travels along one axis (`rule` says so in the mesh's
    words)."""

    def broken(result: SimResult) -> Optional[str]:
        for rank, per_axis in enumerate(_traffic(result, axes)):
            if per_axis[OUTSIDE].ops:
                event = next(e for e in result.trace if e.rank == rank and e.lane == "comm"
                             and axes.axis_of(e) == OUTSIDE)
                where = f"to rank {event.peer}" if event.peer is not None else f"on {event.group}"
                return (f"rank {rank} called {event.op} {where}, which is none of its mesh groups "
                        f"({', '.join(f'{a.upper()} {list(axes.group(rank, a))}' for a in axes.names)})")
        return None
    return Contract(rule or "every communication of a composed step travels along one axis: the TP group, the PP "
                    "neighbours or the DP group", broken,
                    hint="pass group= to collectives" + ("." if rule else ", and send to a rank of your PP group."))


def _over_axis_budget(b: AxisBudget, axes: MeshAxes, result: SimResult) -> Optional[str]:
    """Which rank used an op `b`'s axis does not carry, or sent more than `b` allows on it, or None."""
    for rank, per_axis in enumerate(_traffic(result, axes)):
        t: AxisTraffic = per_axis[b.axis]
        extra = sorted(set(t.ops) - b.ops) if b.ops else []
        if extra:
            return (f"rank {rank} used {', '.join(extra)} on {_label(b.axis)}, which carries "
                    f"{', '.join(sorted(b.ops))} only here")
        limit = b.limit_for(rank)
        if t.sent > limit * (1 + SLACK) + 1e-9:
            said = f"rank {rank} sent {fmt_bytes(t.sent)} on {_label(b.axis)}, over the budget of {fmt_bytes(limit)}"
            meaning = next((m for k, calls, m in b.multiples if limit and abs(t.sent / limit - k) < 1e-6
                            and calls in (None, sum(t.ops.values()))), None)
            return f"{said}: exactly {t.sent / limit:g} times it, {meaning}" if meaning else said
    return None


class MeshPuzzle(Puzzle):
    """A puzzle on a device mesh: its success says each axis's traffic, and its timeline is coloured by axis.

    preload: modules its oracle needs, imported once before the real ranks fork instead of in each of them
    (FSDP2 and DTensor pull in torch._dynamo: seconds per rank)."""

    def __init__(self, *args, preload: Sequence[str] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.preload = tuple(preload)

    def real(self, fn: Callable, world_size: Optional[int] = None, backend: Optional[str] = None,
             seed: Optional[int] = None, strict: Optional[bool] = None, timeout: float = 60.0) -> bool:
        """As Puzzle.real, with the case built once here first: what its builder caches (measured budgets) the
        forked ranks inherit instead of measuring it N times at once."""
        for module in self.preload:
            importlib.import_module(module)
        seed = fresh_seed() if seed is None else seed
        n = world_size or self.real_world_size
        if self.refusal(n) is None:
            self.make_case(random.Random(f"{self.name}:{seed}"), n)
        return super().real(fn, world_size, backend, seed, strict, timeout)

    def _success(self, result: SimResult, case: Case, heading: str = "") -> str:
        text = super()._success(result, case, heading)
        if not isinstance(case, MeshCase) or case.axes is None:
            return text
        traffic = _traffic(result, case.axes)
        for b in case.axis_budgets:
            worst = max(range(len(traffic)), key=lambda r: traffic[r][b.axis].sent / max(b.limit_for(r), 1e-30))
            text += (f"\n  sent on {_label(b.axis)} at N={case.world_size}: {fmt_bytes(traffic[worst][b.axis].sent)} "
                     f"of a {fmt_bytes(b.limit_for(worst))} budget ({b.why}).")
        return text

    def picture(self, outcome: Outcome, fn: Optional[Callable] = None) -> list:
        case, result = outcome.case, outcome.result
        if result is None or not isinstance(case, MeshCase) or case.axes is None:
            return super().picture(outcome, fn)
        from lib.viz.plots import memory_over_time_figure
        from lib.viz.timeline import draw_timeline

        shown = None if result.world_size <= TIMELINE_ROWS else rows_to_show(case.axes)
        label = case.label if shown is None else \
            f"{case.label}; ranks {', '.join(map(str, shown))} of {case.world_size}"
        title = "\n".join(textwrap.wrap(f"{self.name}, {label}" + (f"; {case.scale}" if case.scale else ""), 100))
        figures = []
        if any(e.lane == "comm" for e in result.trace):
            figures.append(draw_timeline(result.trace, result.world_size, title=title,
                                         kind_of=axis_labeller(case.axes), ranks=shown))
        if shown is not None:
            from lib.viz.mesh import axis_traffic_figure
            figures.append(axis_traffic_figure(axis_rows(_traffic(result, case.axes), case.axes, result.cost),
                                               title=f"{self.name}: bytes sent along each axis, {case.label}"))
        if any(b.metric == "peak_memory" for b in case.budgets):
            figures.append(memory_over_time_figure({f"{self.name}, rank 0": result},
                                                   title=f"{self.name}, {case.label}"))
        return figures


TIMELINE_ROWS = 16        # a timeline of more ranks draws a few of them (rows_to_show)


def rows_to_show(axes: MeshAxes, per_axis: int = 4) -> list[int]:
    """The ranks a timeline of a large mesh draws, in rank order: rank 0 and the first `per_axis` of its group along
    each axis (its DP peers, its pipeline, its TP peers: every kind of wait rank 0 has)."""
    shown: list[int] = []
    for axis in axes.names:
        for r in axes.group(0, axis)[:per_axis]:
            if r not in shown:
                shown.append(r)
    return sorted(shown)


def axis_rows(traffic: list[dict[str, AxisTraffic]], axes: MeshAxes,
              cost) -> list[tuple[str, float, float, str, float]]:
    """Per axis: (its name, the busiest rank's bytes sent, the mean over ranks, the link its groups use, the busiest
    rank's bytes at that link's bandwidth), for lib.viz.mesh.axis_traffic_figure."""
    rows = []
    for axis in axes.names:
        sent = [per_axis[axis].sent for per_axis in traffic]
        busiest = max(range(len(sent)), key=sent.__getitem__)
        group = axes.group(busiest, axis)
        bandwidth = cost.bandwidth(group)
        nodes = len({cost.node_of(r) for r in group})
        link = (f"inside one node ({bandwidth / 1e9:g} GB/s)" if nodes == 1 else
                f"across {nodes} nodes ({bandwidth / 1e9:g} GB/s)")
        rows.append((axis.upper(), sent[busiest], sum(sent) / len(sent), link, sent[busiest] / bandwidth))
    return rows


class RankOnly:
    """The `dist` of a puzzle of arithmetic on the rank: who am I, how many are we; no groups, no communication."""

    def __init__(self, dist, puzzle: str) -> None:
        self._dist, self._puzzle = dist, puzzle

    def get_rank(self) -> int:
        return self._dist.get_rank()

    def get_world_size(self) -> int:
        return self._dist.get_world_size()

    def __getattr__(self, name: str):
        raise InvalidCall(f"{self._puzzle} is arithmetic on dist.get_rank(): it needs no dist.{name} (no groups, "
                          "no mesh, no communication).")


def _rank_only(fn: Callable, puzzle: str, dist, *args):
    with answer_key_refused(f"{puzzle} is that arithmetic on dist.get_rank(), yours to write"):
        return fn(RankOnly(dist, puzzle), *args)


class ArithmeticPuzzle(Puzzle):
    """A puzzle whose function may ask `dist` its rank and world size, and nothing else (lib.sim.mesh's arithmetic,
    its answer key, neither), nor call what the puzzle puts off limits (lib.guard.offlimits)."""

    def wrap(self, fn: Callable) -> Callable:
        if not callable(fn):
            return fn
        ranked = functools.partial(_rank_only, fn, self.name)
        return functools.partial(call_watched, self.off_limits, self.off_limits_advice, ranked) if self.off_limits \
            else ranked
