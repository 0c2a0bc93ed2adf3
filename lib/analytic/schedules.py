"""Pipeline schedules as a model, without running one: which stage does which micro-batch, in which order,
and when, given each stage's times.

`schedule_orders` lists each rank's steps in order (GPipe, 1F1B, interleaved 1F1B, ZB-H1); `play` times them:
a step starts once its rank is free and the steps it depends on are done. Communication is free here, as in
the bubble formula; the simulator (lib.sim) charges for it. The pictures (lib.viz.pipeline) and the budgets
of the pipeline puzzles both stand on this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
LABELS = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B", "zb-h1": "ZB-H1 (zero bubble)"}


class ScheduleError(ValueError):
    """A schedule that cannot run with these settings (too few micro-batches, an order that waits forever)."""


@dataclass(frozen=True)
class Step:
    """One step of a schedule: kind F (forward), B (backward, or input gradient only when W is separate),
    W (weight gradient), on the rank's `chunk` (its virtual stage) for micro-batch `mb`."""

    kind: str
    chunk: int
    mb: int


@dataclass(frozen=True)
class Slot:
    rank: int
    step: Step
    start: float
    end: float


def _stage(rank: int, chunk: int, p: int) -> int:
    """Virtual stages go round the ranks: chunk c of rank r is stage c·p + r (Megatron's layout)."""
    return chunk * p + rank


def schedule_orders(name: str, p: int, m: int, v: int = 1) -> list[list[Step]]:
    """Each rank's work in the order it runs it."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; one of {', '.join(SCHEDULES)}")
    if p < 1 or m < 1 or v < 1:
        raise ScheduleError(f"p, m and v must be at least 1, got p={p}, m={m}, v={v}")
    if name != "interleaved" and v != 1:
        raise ScheduleError(f"{LABELS[name]} has one stage per rank: v must be 1, got {v}")
    if name in ("1f1b", "zb-h1") and m < p:
        raise ScheduleError(f"{LABELS[name]} needs at least as many micro-batches as stages: m={m} < p={p}")
    if name == "interleaved" and m % p:
        raise ScheduleError(f"interleaved 1F1B sends micro-batches round the ranks in groups of p: "
                            f"m={m} must be a multiple of p={p}")
    orders = []
    for r in range(p):
        if name == "gpipe":
            order = [Step("F", 0, j) for j in range(m)] + [Step("B", 0, j) for j in range(m)]
        elif name == "interleaved":
            order = _interleaved(r, p, m, v)
        elif name == "zb-h1":
            order = _zero_bubble_h1(r, p, m)
        else:
            warm = p - r - 1                     # warm-up: forwards before the first backward
            order = [Step("F", 0, j) for j in range(warm)]
            for i in range(m - warm):             # steady state: one forward, one backward
                order += [Step("F", 0, warm + i), Step("B", 0, i)]
            order += [Step("B", 0, j) for j in range(m - warm, m)]   # cool-down
        orders.append(order)
    return orders


def _interleaved(r: int, p: int, m: int, v: int) -> list[Step]:
    """Megatron-LM's interleaved order: micro-batches in groups of p, each group through every chunk."""
    total = m * v

    def unit(k: int, forward: bool) -> Step:
        group = k // (p * v)
        mb = group * p + k % p
        chunk = (k // p) % v
        return Step("F", chunk, mb) if forward else Step("B", v - 1 - chunk, mb)

    warm = min((p - r - 1) * 2 + (v - 1) * p, total)
    order = [unit(k, True) for k in range(warm)]
    for i in range(total - warm):
        order += [unit(warm + i, True), unit(i, False)]
    order += [unit(k, False) for k in range(total - warm, total)]
    return order


def _zero_bubble_h1(r: int, p: int, m: int) -> list[Step]:
    """ZB-H1 (Qi et al. 2024, section 2.1): 1F1B's order of forwards and input gradients B, each rank keeping
    at most r weight gradients W waiting; the waiting W fill the cool-down, where 1F1B's ranks sit idle.

    Every rank then holds at most p micro-batches between F and W, 1F1B's peak (on its first stage); it is
    the order of torch.distributed.pipelining.ScheduleInterleavedZeroBubble with one stage per rank."""
    warm = p - r - 1
    forwards = iter(range(m))
    order = [Step("F", 0, next(forwards)) for _ in range(warm)]
    waiting: list[int] = []
    for j in range(m):
        if j + warm < m:
            order.append(Step("F", 0, next(forwards)))
        order.append(Step("B", 0, j))
        waiting.append(j)
        if len(waiting) > r:
            order.append(Step("W", 0, waiting.pop(0)))
    return order + [Step("W", 0, j) for j in waiting]


Times = Union[float, Sequence[float]]


def play(orders: list[list[Step]], v: int = 1, t_f: Times = 1.0, t_b: Times = 2.0,
         t_w: Optional[Times] = None) -> list[Slot]:
    """Time the orders. Each of t_f, t_b, t_w is one number, a whole rank's time (a chunk takes 1/v of it), or
    one number per virtual stage (stage c·p + r is rank r's chunk c). In an order with W steps the backward is
    split: W (the weight gradient) takes t_w, half the backward when t_w is None, and B the rest."""
    p = len(orders)
    stages = p * v
    split = any(w.kind == "W" for order in orders for w in order)

    def per_stage(t: Times) -> list[float]:
        return [t / v] * stages if isinstance(t, (int, float)) else [float(x) for x in t]
    f, b = per_stage(t_f), per_stage(t_b)
    w = per_stage(t_w) if t_w is not None else [x / 2 for x in b]
    if not split:
        w = [0.0] * stages
    cost = {"F": f, "B": [bb - ww for bb, ww in zip(b, w)], "W": w}
    done: dict[tuple[str, int, int], float] = {}
    free, nxt, slots = [0.0] * p, [0] * p, []

    def needs(r: int, step: Step) -> list[tuple[str, int, int]]:
        s = _stage(r, step.chunk, p)
        if step.kind == "F":
            return [("F", s - 1, step.mb)] if s > 0 else []
        if step.kind == "B":
            return [("F", s, step.mb)] + ([("B", s + 1, step.mb)] if s < stages - 1 else [])
        return [("B", s, step.mb)]

    while any(nxt[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while nxt[r] < len(orders[r]):
                step = orders[r][nxt[r]]
                deps = needs(r, step)
                if any(d not in done for d in deps):
                    break
                s = _stage(r, step.chunk, p)
                start = max([free[r]] + [done[d] for d in deps])
                end = start + cost[step.kind][s]
                done[(step.kind, s, step.mb)] = free[r] = end
                slots.append(Slot(r, step, start, end))
                nxt[r] += 1
                moved = True
        if not moved:
            stuck = ", ".join(f"rank {r} waits to run {orders[r][nxt[r]]}" for r in range(p) if nxt[r] < len(orders[r]))
            raise ScheduleError(f"the order waits forever: {stuck}")
    return slots


def makespan(slots: list[Slot]) -> float:
    """When the last step of the schedule ends."""
    return max(s.end for s in slots)


def bubble_of(slots: list[Slot]) -> float:
    """Bubble time over ideal time: (step time - busiest rank's work) / that work."""
    end = max(s.end for s in slots)
    busy = max(sum(s.end - s.start for s in slots if s.rank == r) for r in {s.rank for s in slots})
    return (end - busy) / busy


def peak_in_flight(orders: list[list[Step]]) -> list[int]:
    """Per rank, the most micro-batches whose forward has run and whose backward has not (with a split
    backward: whose W has not): the activations the rank must keep, in units of one chunk's activations."""
    peaks = []
    for order in orders:
        last = "W" if any(step.kind == "W" for step in order) else "B"
        live = peak = 0
        for step in order:
            live += (step.kind == "F") - (step.kind == last)
            peak = max(peak, live)
        peaks.append(peak)
    return peaks
