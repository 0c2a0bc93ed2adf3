"""Notebook 10's memory per rank against the learner's own plan_memory (notebook 06), on what the two share.

plan_memory counts a first-stage GPU of a mixed-precision plan: 2 B weights, 2 B gradients and 12 B of Adam (fp32
master weights, momentum, variance) a parameter, sharded by the ZeRO stage, plus Korthikanti's bf16 activations times
the micro-batches in flight. The composed trainer trains in float64, its TP leaves the embeddings whole, and it holds
what no plan counts (the batch, the adapters' working copy, backward's working memory). So two things are compared,
each on the first stage's ranks, each in a unit both share:

- what the learner's ZeRO keeps between steps (ZeRO-1, 2, 3), read from the memory timeline at each step's start
  against the trainer's own start, against the plan's bytes a parameter of the states ZeRO shards (gradients,
  optimizer; weights at stage 3) times this rank's parameters, each state at float64's size (8 B where the plan
  counts 2, 24 B for Adam's three fp32 states);
- the activations the learner's schedule holds at once, read at each forward's return, in micro-batches (one
  micro-batch's being what the rank held after its step's first forward), against the micro-batches the plan keeps
  in flight.

The tolerance is notebook 01's between Korthikanti's formula and a measured block (puzzles.memory.ACTIVATION_RTOL).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Optional

from lib.planner import Model, Plan, memory_breakdown
from lib.planner.estimate import BYTES, OPTIMIZER_BYTES
from lib.units import fmt_bytes
from puzzles import composed as C
from puzzles.memory import ACTIVATION_RTOL as PLAN_RTOL

FLOAT64 = 8
# Bytes in this float64 trainer per byte the plan counts, state by state: 16-bit weights and gradients are 8 B here,
# and Adam's three fp32 states (master weights, the shard a ZeRO rank updates; momentum; variance) 8 B each.
WIDER = {"weights": FLOAT64 / BYTES, "gradients": FLOAT64 / BYTES, "optimizer": 3 * FLOAT64 / OPTIMIZER_BYTES}


# A loop over the parameters leaves its last parameter's temporaries alive until the next step begins (a padded
# gradient, a gathered buffer): so many full-size copies of that parameter are allowed beside the plan's states. The
# parameter a loop ends on is the learner's choice (backward's hooks fire last layer first): it is read from the run,
# the whole buffer of the rank's last all-gather or reduce-scatter over DP before the step, or the stage's last one.
LEFTOVER = 2


def plan_model() -> Model:
    """The trainer's GPT as lib.planner describes a model."""
    cfg = C.config()
    return Model(layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads, seq=cfg.seq, vocab=cfg.vocab, tied=False)


def plan_for(parts: C.Parts, *, m: Optional[int] = None, micro_batch: Optional[int] = None,
             zero: Optional[int] = None) -> Plan:
    """The plan `parts` trains, or the same with m micro-batches, micro-batches of another size, or another ZeRO
    stage (the probes that take the learner's plan_memory apart)."""
    m = parts.micro_batches if m is None else m
    b = parts.micro_batch if micro_batch is None else micro_batch
    return Plan(tp=parts.tp, pp=parts.pp, dp=parts.dp, global_batch=parts.dp * b * m, micro_batch=b,
                zero=parts.zero if zero is None else zero)


def planned_in_flight(plan_memory: Callable, parts: C.Parts) -> float:
    """The micro-batches of activations the learner's plan_memory holds on the first stage for this plan: its
    answer is states + k·A, with A one micro-batch's activations (found as the change from m = 1 to m = 2, where
    min(p, m) = m as p >= 2) and the states what is left at m = 1."""
    model = plan_model()
    one, two = plan_memory(model, plan_for(parts, m=1)), plan_memory(model, plan_for(parts, m=2))
    activations = two - one
    return (plan_memory(model, plan_for(parts)) - (one - activations)) / activations


def planned_states(plan_memory: Callable, parts: C.Parts) -> float:
    """The model states in the learner's plan_memory for this plan: its answer less its activations, which grow with
    the micro-batch's size b where the states do not (P(b) = states + b·X, so states = 2·P(1) − P(2))."""
    model = plan_model()
    return 2 * plan_memory(model, plan_for(parts, micro_batch=1)) - plan_memory(model, plan_for(parts, micro_batch=2))


def kept_budget(plan_memory: Callable, parts: C.Parts, params: int) -> tuple[float, dict[str, float]]:
    """(bytes, by state) the learner's ZeRO may keep between steps on a rank of `params` parameters: the plan's
    states a parameter (split into weights, gradients and optimizer as lib.planner splits them, scaled to the
    learner's total), each at float64's size; the weights only at ZeRO-3 (below it, the trainer's own, whole)."""
    model, plan = plan_model(), plan_for(parts)
    course = {k: v for k, v in memory_breakdown(model, plan).items() if k != "activations"}
    counted = memory_breakdown(model, replace(plan, zero=0))["optimizer"] / OPTIMIZER_BYTES    # the plan's Ψ a GPU
    scale = planned_states(plan_memory, parts) / sum(course.values()) * params / counted
    kept = {k: v * scale * WIDER[k] for k, v in course.items() if k != "weights" or parts.zero == 3}
    return sum(kept.values()), kept


def _live(memory: list, index: int) -> int:
    """Live bytes on the rank at a mark: the last sample before it."""
    return memory[index - 1][1]


def _runs(marks: list) -> list[list]:
    """The marks of each pipelined run, from its "step" (or "recompute") on."""
    runs: list[list] = []
    for m in marks:
        if m.what in ("step", "recompute"):
            runs.append([m])
        elif runs:
            runs[-1].append(m)
    return runs


def held_activations(memory: list, marks: list) -> list[tuple[int, int, int, int]]:
    """Per pipelined run: (the run's number, the forward after which the rank held the most, those bytes, one
    micro-batch's bytes); the bytes held at a forward's return being what the rank gained since the schedule was
    called, less the stage's gradients then."""
    out = []
    for n, run_ in enumerate(_runs(marks)):
        base = next((m for m in run_ if m.what == "schedule"), None)
        forwards = [m for m in run_ if m.what == "forward"]
        if base is None or not forwards:
            continue
        held = [_live(memory, f.index) - _live(memory, base.index) - f.grads for f in forwards]
        if held[0] <= 0:                # nothing kept by the first forward: no micro-batch to count in
            continue
        top = max(range(len(held)), key=held.__getitem__)
        out.append((n, top, held[top], held[0]))
    return out


def leftover_room(padded: list[float], last: float) -> float:
    """The room for a loop's leftovers: LEFTOVER copies of the parameter the loop ended on, `last` (the buffer read
    from the run) or else the stage's last parameter, of `padded` bytes each. One parameter: never more than the
    stage's largest, so a flat buffer of every parameter gathered last does not widen the room to the whole stage."""
    return LEFTOVER * max(padded[-1], min(max(padded), last))


def _last_buffer(trace: list, rank: int, time: float, parts: C.Parts) -> float:
    """The whole (padded) buffer of `rank`'s last all-gather or reduce-scatter over DP that ended by `time`, in
    bytes (each sends (dp-1)/dp of it); 0 where none did."""
    mesh, last = C.mesh_of(parts), None
    for e in trace:
        if e.rank == rank and e.end <= time and e.op in ("all_gather", "reduce_scatter") and mesh.axis_of(e) == "dp":
            last = e if last is None or e.end >= last.end else last
    return 0.0 if last is None else last.bytes * parts.dp / (parts.dp - 1)


def _stage_zero(parts: C.Parts) -> list[int]:
    return [r for r in range(parts.world) if C.coordinates(r, parts)[1] == 0]


def _said_kept(extra: float, leftover: float, parts: C.Parts, params: int) -> str:
    """What a ZeRO rank keeps beyond its sharded states (`extra`, the bytes over the states ZeRO shards, the plan's
    ZeRO-3 gathered blocks left out) is worth in the states' own sizes: the stage's gradients whole (or all but this
    rank's shard of them), or Adam's three states whole (or all but the shard); a loop's leftovers may come on top."""
    grads, states, share = FLOAT64 * params, 3 * FLOAT64 * params, 1 - 1 / parts.dp
    piece = C.ZERO_PIECES[parts.zero]
    for size, kind, least in ((grads, "gradients", 2), (grads * share, "gradients", 2),
                              (states, "Adam states (master weights, momentum, variance)", 1),
                              (states * share, "Adam states (master weights, momentum, variance)", 1)):
        if parts.zero >= least and size * (1 - PLAN_RTOL) <= extra <= size * (1 + PLAN_RTOL) + leftover:
            return (f"Beyond its shards it keeps {fmt_bytes(extra)}, {extra / grads:.3g} × the stage's float64 "
                    f"gradients ({fmt_bytes(grads)}): the stage's {kind} whole. Between steps your {piece} (notebook "
                    f"03) keeps full-size {kind} alive, where ZeRO-{parts.zero} keeps only this rank's 1/dp shard of "
                    "them" + (" (free each p.grad once its shard is reduce-scattered: p.grad = None, and keep no "
                              "other reference to it), or a whole copy of the weights, the same bytes (the gathered "
                              "buffers kept in a list until the next step)" if kind == "gradients" else ""))
    return (f"Beyond its shards it keeps {fmt_bytes(extra)}, {extra / grads:.3g} × the stage's float64 gradients "
            f"({fmt_bytes(grads)}): your {piece} (notebook 03) keeps more between steps than ZeRO-{parts.zero} leaves "
            "a rank")


def sharded_states(parts: C.Parts, params: int) -> float:
    """What a ZeRO-k rank of `params` parameters keeps between steps at least, in float64: Adam's three states
    over dp (the master weights' shard being, at ZeRO-3, the weights' shard too) and the gradients (whole below
    ZeRO-2)."""
    return FLOAT64 * params * (3 / parts.dp + (1 / parts.dp if parts.zero >= 2 else 1))


def memory_problem(result, parts: C.Parts, shards: list, plan_memory: Optional[Callable]) -> tuple[Optional[str], str]:
    """(the first rank over what the learner's plan_memory counts, said as the piece that holds it, or None; a line
    saying what held)."""
    if plan_memory is None:
        return None, ""
    try:
        states = planned_states(plan_memory, parts)
        in_flight = planned_in_flight(plan_memory, parts) if parts.pp > 1 else None
    except Exception as e:          # the learner's function: its error is theirs, said as such
        return (f"your plan_memory (notebook 06) raised {type(e).__name__}: {e} for this trainer's plan "
                f"({plan_for(parts)}), so its memory cannot be compared.", "")
    if not states > 0:
        return (f"your plan_memory (notebook 06) counts {states:.4g} B of model states for this trainer's plan "
                f"({plan_for(parts)}): it cannot be the budget of a rank.", "")
    lines, worst_kept, worst_held = [], None, None
    for rank in _stage_zero(parts):
        memory, marks = result.stats[rank].memory, result.results[rank]["marks"]
        params = sum(p.numel() for p in shards[rank].parameters())
        where = C.where(rank, parts)
        if parts.zero:
            start = next(m for m in marks if m.what == "start")
            budget, by_state = kept_budget(plan_memory, parts, params)
            padded = [FLOAT64 * math.ceil(p.numel() / parts.dp) * parts.dp for p in shards[rank].parameters()]
            over = [(_live(memory, m.index) - _live(memory, start.index),
                     leftover_room(padded, _last_buffer(result.trace, rank, memory[m.index - 1][0], parts)))
                    for m in marks if m.what == "step"]
            kept, leftover = max(over, key=lambda kl: kl[0] - kl[1])
            if kept > budget * (1 + PLAN_RTOL) + leftover:
                return (f"between steps, {where} kept {fmt_bytes(kept)} beyond the trainer's own tensors, where your "
                        f"plan_memory (notebook 06) counts {fmt_bytes(budget)} for its ZeRO-{parts.zero} states "
                        f"({_said_states(by_state, params)}), and a loop's last temporaries {fmt_bytes(leftover)} "
                        f"({LEFTOVER} padded copies of the parameter your loop ended on). "
                        f"{_said_kept(kept - sharded_states(parts, params), leftover, parts, params)}.", "")
            kept = max(k for k, _ in over)
            worst_kept = max(worst_kept or (kept, budget), (kept, budget), key=lambda kb: kb[0] / kb[1])
        if in_flight is not None:
            for run_, top, held, one in held_activations(memory, marks):
                if held > in_flight * one * (1 + PLAN_RTOL):
                    return (f"{where} held {fmt_bytes(held)} of activations after its forward of micro-batch "
                            f"{top} (pipelined run {run_ + 1}): {held / one:.3g} micro-batches' worth, one being "
                            f"the {fmt_bytes(one)} it held after its first forward; your plan_memory (notebook 06) "
                            f"keeps {in_flight:.3g} in flight on the first stage for this plan. "
                            + _said_held(held / one, in_flight), "")
                worst_held = max(worst_held or 0, held / one)
    if worst_kept:
        lines.append(f"between steps your {C.ZERO_PIECES[parts.zero]} kept at most {fmt_bytes(worst_kept[0])} on a "
                     f"first-stage rank, your plan_memory counting {fmt_bytes(worst_kept[1])} for its states (within "
                     f"{PLAN_RTOL:.0%}, with a loop's last temporaries)")
    if worst_held is not None:
        lines.append(f"the first stage held at most {worst_held:.3g} micro-batches' activations of the "
                     f"{in_flight:.3g} your plan_memory keeps in flight")
    return None, ("  memory against your plan_memory: " + "; ".join(lines)) if lines else ""


def _said_states(by_state: dict[str, float], params: int) -> str:
    return ", ".join(f"{name} {fmt_bytes(b)}" for name, b in by_state.items()) + \
        f", in float64 for its {params:,} parameters"


def _said_held(times: float, in_flight: float) -> str:
    """Whose activations those are: the order already passed 1F1B's (the pipeline's budgets come first), so what
    is over is kept, not scheduled."""
    return (f"Your one_f_one_b (notebook 05) runs 1F1B's order (its bubble and warm-up passed), so the "
            f"{times - in_flight:.2g} micro-batches' worth more are tensors it keeps after their backward: a stash "
            "or list never emptied, outputs or inputs held to the end, or backward(retain_graph=True). Drop each "
            "micro-batch's tensors once its backward is done.")
