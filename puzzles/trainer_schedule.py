"""The composed trainer's pipeline budgets, read from the order each stage ran its micro-batches in: the bubble that
order leaves (against 1F1B's), and the micro-batches whose activations the first stage holds at once (against the
learner's own plan_memory from notebook 06, which counts them for the same plan).

The order comes from the simulator's log of each rank's point-to-point calls on the pipeline axis: a stage's forward
of a micro-batch is its send to the next stage (the last stage's, the wait for its input), its backward the send to
the previous stage (the first stage's, the wait for its output gradient). Played with equal stages
(lib.analytic.schedules.play, t_f = 1, t_b = 2), an order's bubble is the schedule's, free of the toy's latencies.
"""

from __future__ import annotations

from typing import Callable, Optional

from lib.analytic.formulas import bubble_fraction
from lib.analytic.schedules import Step, bubble_of, peak_in_flight, play, schedule_orders
from puzzles import composed as C
from puzzles.trainer_memory import planned_in_flight


def _marks(stage: int, rank: int, parts: C.Parts) -> dict[tuple[str, int], str]:
    """The log entries that stand for a forward (F) and a backward (B) on this rank's stage."""
    prev, nxt = rank - parts.tp, rank + parts.tp
    forward = ("send", nxt) if stage < parts.pp - 1 else ("waited", prev)
    backward = ("send", prev) if stage > 0 else ("waited", nxt)
    return {forward: "F", backward: "B"}


def orders(p2p_logs: list[tuple], parts: C.Parts) -> dict[int, list[list[list[Step]]]]:
    """Per pipeline (its first rank), per step, each stage's F and B in the order it ran them; micro-batches
    numbered in the order each kind ran (as the messages between two stages arrive)."""
    out: dict[int, list[list[list[Step]]]] = {}
    for rank, log in enumerate(p2p_logs):
        _, stage, _ = C.coordinates(rank, parts)
        marks = _marks(stage, rank, parts)
        kinds = [marks[entry] for entry in log if entry in marks]
        steps, m = [], parts.micro_batches
        for k in range(0, len(kinds), 2 * m):
            seen = {"F": 0, "B": 0}
            order = []
            for kind in kinds[k:k + 2 * m]:
                order.append(Step(kind, 0, seen[kind]))
                seen[kind] += 1
            steps.append(order)
        first = rank - stage * parts.tp
        pipeline = out.setdefault(first, [[[] for _ in range(parts.pp)] for _ in steps])
        for s, order in enumerate(steps):
            pipeline[s][stage] = order
    return out


def _written(order: list[Step]) -> str:
    return " ".join(f"{s.kind}{s.mb}" for s in order)


def _warm_up(order: list[Step]) -> int:
    """Forwards a stage runs before its first backward."""
    return next((i for i, step in enumerate(order) if step.kind == "B"), len(order))


def _cause(stages: list[list[Step]], p: int, m: int) -> str:
    """Where the learner's order first leaves 1F1B's, and what that stage did instead, in the lesson's terms."""
    ideal = schedule_orders("1f1b", p, m)
    s = next(s for s in range(p) if stages[s] != ideal[s])
    mine, want = _warm_up(stages[s]), _warm_up(ideal[s])
    did = (f"runs {mine} forward(s) before its first backward, where 1F1B's stage r runs p - r = {want} (its p-r-1 "
           "warm-up forwards and the first of its steady state): "
           + ("too few, so it waits for a gradient that has the rest of the pipeline to cross while the stages "
              "after it sit idle" if mine < want else
              "too many, so it holds more activations, and the stages before it wait longer for its backward")
           if mine != want else "warms up as 1F1B does but then leaves its alternation of one forward and one "
                                "backward")
    return (f"Stage {s} ran {_written(stages[s])}, 1F1B's order is {_written(ideal[s])}. Your one_f_one_b "
            f"(notebook 05) {did}.")


def schedule_problem(p2p_logs: list[tuple], parts: C.Parts, plan_memory: Optional[Callable]) -> tuple[Optional[str],
                                                                                                    str]:
    """(the first broken pipeline budget, or None; a line saying what held)."""
    p, m = parts.pp, parts.micro_batches
    if p == 1:
        return None, ""
    best = bubble_of(play(schedule_orders("1f1b", p, m)))
    kept = peak_in_flight(schedule_orders("1f1b", p, m))
    planned = planned_in_flight(plan_memory, parts) if plan_memory else None
    allowed = [planned if planned is not None and s == 0 else k for s, k in enumerate(kept)]
    for first, steps in sorted(orders(p2p_logs, parts).items()):
        for step, stages in enumerate(steps, start=1):
            if any(len(order) != 2 * m for order in stages):
                continue                                # a schedule the losses already failed
            where = f"the pipeline of ranks {first}, {first + parts.tp}{', ...' if p > 2 else ''}, step {step}"
            held = peak_in_flight(stages)
            over = next((s for s in range(p) if held[s] > allowed[s] + 1e-9), None)
            if over is not None:
                counted = (f"your plan_memory (notebook 06) counts {planned:.3g} for this plan" if over == 0 and
                           planned is not None else f"1F1B holds p - r = {kept[over]}")
                return (f"{where}: stage {over} holds {held[over]} micro-batches' activations at once, where "
                        f"{counted}. {_cause(stages, p, m)}", "")
            bubble = bubble_of(play(stages))
            if bubble > best + 1e-9:
                return (f"{where}: played with equal stages, your schedule leaves a bubble of {bubble:.3g} of the "
                        f"ideal time, where 1F1B's is {best:.3g} ((p-1)/m with p={p}, m={m}). "
                        f"{_cause(stages, p, m)}", "")
    line = (f"  the pipeline: a bubble of {best:.3g} of the ideal time with equal stages, 1F1B's (p-1)/m = "
            f"{bubble_fraction(p, m):.3g}")
    if planned is not None:
        line += (f"; at most {', '.join(map(str, kept))} micro-batches in flight on stages 0..{p - 1}, the first "
                 "stage's as your plan_memory counts")
    return None, line
