"""Notebook 05, pipeline parallelism: the puzzles, their inputs, references and budgets.

The model is an MLP of constant width cut into p stages of LAYERS linear layers, one stage per rank.
Time budgets come from FLOPs counted on one stage and one micro-batch; memory budgets from the
activations one micro-batch leaves on a stage, measured with lib.checker.measure. Nothing is copied from a run.
"""

from __future__ import annotations

import copy
import functools
import random
import re
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from lib.checker.puzzle import Budget, Case, Contract, Floor, Puzzle, nothing_on_the_host
from lib.notebook.warm_up import import_ahead
from lib.analytic.formulas import bubble_fraction, zero_bubble_h1_bubble
from lib.checker.measure import allocated, counted_time, once_per_shape, saved_activation_bytes
from lib.models import mlp, param_bytes
from lib.sim import CostModel, SimResult, per_rank
from lib.units import fmt_bytes, fmt_time, ordinal
from lib.analytic.schedules import makespan, peak_in_flight, play, schedule_orders
from puzzles._sample_weights import fit, module_grads, said, vjp

import_ahead("explicit_gradient")          # a stage back-propagates the gradient it receives

NOTEBOOK = "05_pipeline"
WIDTH = 16           # every layer is WIDTH -> WIDTH, so every message between stages has a known shape
LAYERS = 2           # linear layers per stage
MICRO = 8            # rows per micro-batch
# A device of 1 GFLOP/s and links so fast that only compute counts: what the bubble formula assumes.
COST = CostModel(flops_per_s=1e9, latency=1e-9, intra_node_bandwidth=1e15, inter_node_bandwidth=1e15)
SLACK = 1e-3         # the latencies of the messages on the critical path, and no more


def stage_slices(p: int) -> list[slice]:
    """Stage r holds linear layers r·LAYERS .. (r+1)·LAYERS - 1 (and the ReLUs after them)."""
    return [slice(2 * LAYERS * r, 2 * LAYERS * (r + 1)) for r in range(p)]


def _model_and_data(rng: random.Random, p: int, m: int):
    model = mlp([WIDTH] * (LAYERS * p + 1), seed=rng.randrange(2**31))
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    batch = torch.randn(m * MICRO, WIDTH, generator=gen, dtype=torch.float64)
    targets = torch.randn(m * MICRO, WIDTH, generator=gen, dtype=torch.float64)
    return model, batch, targets


def reference(model, batch, targets, p: int) -> list[torch.nn.Module]:
    """The single-device reference: the whole model on the whole batch, cut into p stages afterwards."""
    model = copy.deepcopy(model)
    F.mse_loss(model(batch), targets).backward()
    return [model[s] for s in stage_slices(p)]


@once_per_shape
def stage_times(stage, micro: torch.Tensor, cost: CostModel = COST,
                targets: Optional[torch.Tensor] = None, m: int = 1) -> tuple[float, float]:
    """(t_f, t_b): one micro-batch's forward and backward through `stage` on the simulated clock (every op on the
    roofline). With `targets`, the stage is the last: its forward includes the loss, F.mse_loss(out, y) / m.

    The input requires a gradient, as on every stage but the first: the first stage may skip that
    matmul, which only makes it faster."""
    stage = copy.deepcopy(stage)
    x = micro.clone().requires_grad_()
    grad = torch.ones_like(micro) if targets is None else None
    out, t_f = counted_time(lambda: stage(x) if targets is None else F.mse_loss(stage(x), targets) / m, cost)
    _, t_b = counted_time(lambda: out.backward(grad), cost)
    return t_f, t_b


@once_per_shape
def split_stage_times(stage, micro: torch.Tensor, cost: CostModel = COST,
                      targets: Optional[torch.Tensor] = None, m: int = 1) -> tuple[float, float, float]:
    """(t_F, t_B, t_W): one micro-batch's forward, input gradient (B) and weight gradient (W) through `stage`.

    B is what autograd runs for the input's gradient alone (every Linear's input-gradient matmul, and the ReLUs');
    W is the rest of the full backward (every Linear's weight-gradient matmul and bias sum), so t_B + t_W is
    stage_times' t_b."""
    t_f, t_b = stage_times(stage, micro, cost, targets, m)
    stage = copy.deepcopy(stage)
    x = micro.clone().requires_grad_()
    out = stage(x) if targets is None else F.mse_loss(stage(x), targets) / m
    grad = torch.ones_like(out) if targets is None else None
    _, t_input = counted_time(lambda: torch.autograd.grad(out, x, grad), cost)
    return t_f, t_input, t_b - t_input


def schedule_step_time(schedule: str, stages, micro: torch.Tensor, micro_y: torch.Tensor, m: int, v: int = 1,
                       split: bool = False) -> float:
    """The schedule's step on p ranks with each virtual stage's own measured times (lib.analytic.schedules.play): what
    the
    bubble formula predicts when stages differ, as the last one does by computing the loss."""
    last = len(stages) - 1
    times = [(split_stage_times if split else stage_times)(st, micro, COST, micro_y if s == last else None, m)
             for s, st in enumerate(stages)]
    t_f = [t[0] for t in times]
    t_b = [t[1] + t[2] for t in times] if split else [t[1] for t in times]
    t_w = [t[2] for t in times] if split else None
    return makespan(play(schedule_orders(schedule, len(stages) // v, m, v), v, t_f, t_b, t_w))


def linear_io_bytes(stage, micro: torch.Tensor) -> tuple[int, int]:
    """(inputs, outputs): bytes of every nn.Linear's input and of its output on one micro-batch (each output's
    gradient has its size): W needs each Linear's input and output gradient."""
    sizes = [0, 0]

    def hook(module, args, out):
        sizes[0] += args[0].nbytes
        sizes[1] += out.nbytes
    handles = [m.register_forward_hook(hook) for m in stage.modules() if isinstance(m, torch.nn.Linear)]
    try:
        with torch.no_grad():
            stage(micro)
    finally:
        for h in handles:
            h.remove()
    return sizes[0], sizes[1]


@once_per_shape
def stage_memory(stage, micro: torch.Tensor, targets: torch.Tensor, last: bool) -> tuple[int, int]:
    """(stash, step): the activations one micro-batch leaves on `stage` until its backward, and the peak
    of one micro-batch's forward and backward there, weights and gradients included (both measured)."""
    x, y = micro.clone().requires_grad_(), targets.clone()

    def forward(s):
        out = s(x)
        return F.mse_loss(out, y) if last else out

    stash = saved_activation_bytes(lambda: forward(stage), exclude=[*stage.parameters(), y])

    def step():
        s = copy.deepcopy(stage)
        out = forward(s)
        (out if last else out.sum()).backward()
    return stash, allocated(step)[1]


def measured_bubble(result: SimResult) -> float:
    """Bubble time over ideal time from the simulated clocks: (step time - busiest rank's compute) / compute."""
    busy = max(sum(e.end - e.start for e in result.trace if e.rank == r and e.lane == "compute")
               for r in range(result.world_size))
    return (result.time - busy) / busy


CLOSE = 0.05         # how near the paper's formula a run's bubble is said to be (the loss makes stages unequal)


def bubble_report(result: SimResult, m: int, v: int = 1, zero_bubble: bool = False) -> float:
    """Print the bubble measured on a run next to the paper's formula (lib.analytic.formulas.bubble_fraction, or
    zero_bubble_h1_bubble with equal t_F, t_B, t_W), and return the measured one."""
    p = result.world_size
    got = measured_bubble(result)
    if zero_bubble:
        formula, name = zero_bubble_h1_bubble(p, m), f"ZB-H1's (p-1)/(3m) with p={p}, m={m}"
    else:
        formula, name = bubble_fraction(p, m, v), f"(p-1)/(v·m) with p={p}, m={m}, v={v}"
    near = abs(got - formula) <= CLOSE * formula + 1e-9
    print(f"bubble from the simulated clocks: {got:.4f}; {name}: {formula:.4f}"
          + ("  (close: the formula assumes equal stages, and the last stage also computes the loss)" if near else
             "  (they differ: the formula assumes equal stages and free communication)"))
    return got


# ---- the cases -----------------------------------------------------------------------------------
COPIES = 6            # elementwise passes over a boundary tensor a stage may make per micro-batch (see _time_budget)


def _time_budget(schedule: str, stages, micro: torch.Tensor, micro_y: torch.Tensor, m: int, v: int = 1) -> Budget:
    """The schedule's step with each virtual stage's measured times (the last one computes the loss), plus the
    copies a stage makes of the tensors at its boundary (the micro-batch taken off the batch, the activation and
    gradient it sends and receives): COPIES elementwise passes per step of the critical path. For GPipe and
    1F1B with equal stages that step is (m+p-1)(t_f+t_b) (Narayanan et al. 2021); ZB-H1's is
    m(t_F+t_B+t_W) + (p-1)(t_F+t_B-t_W) (Qi et al. 2024, section 2.1), since t_W <= t_F, t_B."""
    p = len(stages) // v
    split = schedule == "zb-h1"
    step = schedule_step_time(schedule, stages, micro, micro_y, m, v, split)
    critical = m * v + p - 1
    copies = critical * COPIES * COST.compute_time(micro.numel(), nbytes=2 * micro.nbytes)
    limit = (step + copies) * (1 + SLACK)
    t_f, t_b = stage_times(stages[0], micro)
    equal = f"(m·v+p-1)(t_f+t_b) = {critical} × {fmt_time(t_f + t_b)}" if v > 1 else \
        f"(m+p-1)(t_f+t_b) = {critical} × {fmt_time(t_f + t_b)}"
    if split:
        _, t_in, t_w = split_stage_times(stages[0], micro)
        why = (f"ZB-H1's step with each stage's measured t_F, t_B (input gradient) and t_W (weight gradient), "
               f"{fmt_time(step)}: about m(t_F+t_B+t_W) + (p-1)(t_F+t_B-t_W), a bubble of "
               f"{zero_bubble_h1_bubble(p, m, t_f, t_in, t_w):.3f} of the ideal time where 1F1B's is "
               f"{bubble_fraction(p, m):.3f}")
        hint = ("B is on the critical path and W is not: send the input gradient to rank-1 as soon as B has computed "
                "it, and run W later (rank r keeps up to r of them waiting, run after a B, the rest at the end). W "
                "must not redo B's work: compute each Linear's weight gradient from the output gradient B found for "
                "it (dW = dYᵀX, db = ΣdY).")
    else:
        name = {"gpipe": "GPipe's", "1f1b": "1F1B's", "interleaved": "interleaved 1F1B's"}[schedule]
        why = (f"{name} step with each stage's measured times, {fmt_time(step)}: about {equal}, the ideal plus "
               f"the bubble, (p-1)/{'(v·m)' if v > 1 else 'm'} = {bubble_fraction(p, m, v):.3f} of it (the last "
               "stage, which also computes the loss, is a little slower than the others)")
        hint = ("a stage must start micro-batch j+1 while the next stage works on micro-batch j: do not wait "
                "for a micro-batch to go all the way through before sending the next." if v == 1 else
                "run Megatron's order (rank r: (p-r-1)·2 + (v-1)·p warm-up forwards, then one forward and one "
                "backward, then the cool-down), and send with dist.isend: a blocking send waits for its receiver.")
    why += f"; + {COPIES} copies of a boundary tensor per micro-batch and stage, {fmt_time(copies)}"
    return Budget("time", limit, why, hint=hint)


def _memory_budget(schedule: str, stages, micro, micro_y, inputs: int, m: int) -> Budget:
    """Per rank: the inputs, one micro-batch's forward and backward, and what the schedule keeps of the
    micro-batches in flight (measured per micro-batch), plus the boundary tensors in flight."""
    p, boundary = len(stages), micro.nbytes
    in_flight = peak_in_flight(schedule_orders(schedule, p, m))
    # Besides the stashes: the activation being sent, the next input received ahead, the gradient received for
    # a backward and the input gradient being sent.
    extra = 4
    limits, whys = [], []
    for r in range(p):
        stash, step = stage_memory(stages[r], micro, micro_y, last=r == p - 1)
        if schedule == "zb-h1":
            ins, outs = linear_io_bytes(stages[r], micro)
            stash = max(stash + outs, ins + outs)
        limits.append(inputs + step + in_flight[r] * stash + extra * boundary)
        whys.append((stash, step))
    stash0, step0 = whys[0]
    if schedule == "gpipe":
        who = "m micro-batches on every stage (GPipe keeps them all)"
    elif schedule == "1f1b":
        who = ("p - r micro-batches on stage r (its p - r - 1 warm-up forwards, and the one forward of each steady "
               "step before its backward)")
    else:
        who = ("p micro-batches on every stage (ZB-H1's most between a forward and its W), each the larger of "
               "what a forward keeps (the activations autograd saves and each Linear's output, for B) and what W "
               "needs (each Linear's input and output gradient)")
    return Budget(
        "peak_memory", limits,
        f"the batch and targets every rank is given ({fmt_bytes(inputs)}) + "
        f"one micro-batch's forward and backward ({fmt_bytes(step0)} on rank 0, weights and gradients included) "
        f"+ stashed activations of {who}, {fmt_bytes(stash0)} each on rank 0, + {extra} boundary tensors of "
        f"{fmt_bytes(boundary)} in flight (an activation sent, the next input received ahead, a gradient received, "
        f"an input gradient sent)",
        hint=("once B is done keep only what W needs, each Linear's input and output gradient: not the outputs "
              "themselves (to call y.backward later keeps every y alive; compute dW = dYᵀX, or keep "
              "torch.autograd.graph.get_gradient_edge(y) instead of y), and no more W waiting than ZB-H1's order."
              if schedule == "zb-h1" else
              "free a micro-batch's activations as soon as its backward is done (drop your references), and "
              "do not run more forwards ahead than the schedule needs."))


# A stage's activations and weights live on its device: host memory would hide a schedule's stash from the budget.
ON_DEVICE = nothing_on_the_host("a pipeline stage keeps its weights and its micro-batches' activations on its device")


def _all_forwards_first(pair_times: list[float]):
    """GPipe's order on every stage r > 0, judged from its own messages: between the last activation's arrival and
    the first gradient it sends back, stage r runs that micro-batch's forward and then a backward (its first
    gradient needs both), pair_times[r] = t_f + t_b of simulated compute. Interleaving sends the first gradient
    before the last activation is even in (or as it arrives): half of pair_times[r] is the line, so that neither
    a right answer's own ops (a copy more or less) nor the clocks' rounding come near it. (Stage 0 receives no
    activation: interleaving there, with the next stage in GPipe's order, deadlocks; with the next stage
    interleaving too, that stage is caught.)"""

    def broken(result: SimResult) -> Optional[str]:
        for r in range(1, result.world_size):
            arrived = [e.end for e in result.trace if e.rank == r and e.op == "recv" and e.peer == r - 1]
            back = [e.start for e in result.trace if e.rank == r and e.op == "send" and e.peer == r - 1]
            if not arrived or not back:
                continue
            gap, need = min(back) - max(arrived), pair_times[r]
            if gap < need / 2:
                where = "before" if gap < 0 else f"{fmt_time(gap)} after"
                return (f"rank {r} sent its first gradient back at {fmt_time(min(back))}, {where} the last "
                        f"micro-batch's activation reached it (at {fmt_time(max(arrived))}), where GPipe computes "
                        f"that micro-batch's forward and a backward in between ({fmt_time(need)} here): forwards "
                        "and backwards interleaved, as in 1F1B's order or one micro-batch at a time")
        return None
    return Contract("GPipe runs every micro-batch's forward before any backward, on every stage (interleaving them "
                    "is 1F1B, the next puzzle)", broken, timed=True,
                    hint="forward all m micro-batches first, keeping each (input, output) pair; only then run the "
                         "backwards.")


def _warm_ups(p: int, m: int, time: Budget, memory: Budget) -> Contract:
    """1F1B's warm-up, read from a run over its time or its memory budget: stage r < p-1 posts p-1-r forwards, then its
    steady state's first forward, before it asks for its first gradient (min(m, p-r) activations sent by then). A run
    within both budgets is never judged by it: this only says which stages' warm-ups made a slow run slow, or a
    stage's stash too large."""

    def over(result: SimResult) -> Optional[tuple[str, bool]]:
        """(the budget line the run is over, whether it is memory's), or None within both."""
        if result.time > time.limit_for(0):
            return (f"the run's simulated time is {fmt_time(result.time)}, over the budget of "
                    f"{fmt_time(time.limit_for(0))}"), False
        for r, stats in enumerate(result.stats):
            if stats.peak_memory > memory.limit_for(r):
                return (f"rank {r}'s peak memory is {fmt_bytes(stats.peak_memory)}, over the budget of "
                        f"{fmt_bytes(memory.limit_for(r))}"), True
        return None

    def broken(result: SimResult) -> Optional[str]:
        found = over(result)
        if found is None:
            return None
        slow, stash = found
        warm = {}
        for r in range(p - 1):
            asked = [e.start for e in result.trace if e.rank == r and e.op == "recv" and e.peer == r + 1]
            sent = [e.start for e in result.trace if e.rank == r and e.op == "send" and e.peer == r + 1]
            if not asked:
                return None
            warm[r] = sum(t <= min(asked) for t in sent) - 1
        off = {r: w for r, w in warm.items() if w != min(m, p - r) - 1}
        if not off:
            return None
        said = ", ".join(f"stage {r} ran {w} (1F1B: {min(m, p - r) - 1})" for r, w in off.items())
        same = ("; the same warm-up on every stage, where a stage nearer the end needs fewer (p - 1 - r)"
                if len(set(warm.values())) == 1 and p > 2 else "")
        more = all(w > min(m, p - r) - 1 for r, w in off.items())
        why = (": each forward run ahead keeps its activations until its backward" if more and stash else "")
        return (f"{slow}, and its warm-ups differ from 1F1B's (forwards before the first backward): {said}{same}"
                f"{why}")
    return Contract("1F1B's warm-up on stage r is p - 1 - r forwards: the micro-batches in flight between it and the "
                    "last stage, no more (they cost memory and delay the backwards) and no fewer (the pipeline "
                    "drains)", broken, timed=True,
                    hint="warm = min(p - 1 - rank, m) forwards first; then one forward and one backward in turn.")


def _gpipe_order(stages, micro: torch.Tensor, micro_y: torch.Tensor, m: int) -> Contract:
    """GPipe's order contract with each stage's measured t_f + t_b (the last one's forward computes the loss)."""
    last = len(stages) - 1
    return _all_forwards_first([sum(stage_times(st, micro, COST, micro_y if r == last else None, m))
                                for r, st in enumerate(stages)])


def _messages(p: int, v: int, m: int, boundary: int) -> list[Budget]:
    """What each rank sends, as a ceiling and a floor: every virtual stage (c·p + r on rank r) but the last sends each
    micro-batch's activation forward, and every one but the first its input gradient back. The floor: they travel by
    dist, not through anything threads share."""
    sent = [boundary * m * ((v - (r == p - 1)) + (v - (r == 0))) for r in range(p)]
    why = "each micro-batch's activation to the next stage and its input gradient back to the previous one, once each"
    return [Budget("bytes_sent", sent, why, hint="send each stage's output forward once and its input gradient back "
                                                 "once, per micro-batch."),
            Floor("bytes_sent", sent, why, hint="activations and gradients go from stage to stage by "
                                                            "dist.send / dist.isend: separate processes share "
                                                            "nothing else.")]


def _factors(batch: torch.Tensor) -> dict:
    """The sizes a mean over the wrong axis would be off by: a micro-batch's rows, the values of the whole batch."""
    return {"b, the rows of a micro-batch": MICRO, "the values of the batch (rows × width)": batch.numel()}


class _Reference:
    """The reference run seen stage by stage: each stage's input and the gradient of the loss at its output (the mean
    over the whole batch), row by row, for the analyses of _schedule_explain."""

    def __init__(self, model, batch: torch.Tensor, targets: torch.Tensor, p: int) -> None:
        self.stages = [copy.deepcopy(model[s]) for s in stage_slices(p)]
        acts, h = [], batch
        for stage in self.stages:
            h = stage(h)
            acts.append(h)
        grads = torch.autograd.grad(F.mse_loss(h, targets), acts)
        self.inputs = [batch] + [a.detach() for a in acts[:-1]]
        self.grads = [g.detach() for g in grads]

    def vjp(self, r: int, rows, grad: torch.Tensor) -> torch.Tensor:
        """Stage r's parameter gradients from its input `rows` with `grad` flowing into its output."""
        stage = self.stages[r]
        return vjp(lambda: stage(self.inputs[r][rows]), list(stage.parameters()), grad)

    def inner_grads(self, r: int) -> list[tuple[str, torch.Tensor]]:
        """(what, its gradient) for every tensor inside stage r the shape of its input: its layers' outputs."""
        x = self.inputs[r].clone().requires_grad_()
        outs, h = [], x
        for name, layer in self.stages[r].named_children():
            h = layer(h)
            outs.append((f"layer {name}'s output ({type(layer).__name__})", h))
        kept = [(what, t) for what, t in outs if t.shape == x.shape]
        grads = torch.autograd.grad(h, [t for _, t in kept], self.grads[r])
        return [(what, g.detach()) for (what, _), g in zip(kept, grads)]


def _schedule_explain(model, batch: torch.Tensor, targets: torch.Tensor, p: int, m: int):
    """A pipeline case's explain (lib.checker.puzzle.Case): the highest stage whose gradients are wrong, whose later
    stages
    sent it what they should, seen three ways: which micro-batches (or rows) its gradients hold
    (puzzles._sample_weights), which micro-batch's activations each micro-batch's gradient went back through, or which
    tensor of the next stage came back in place of the gradient of that stage's input."""

    def explain(expected: list, got: list) -> Optional[str]:
        by_parameter = _parameter_by_parameter(expected, got)
        if by_parameter:
            return f"Diagnosis: {by_parameter}"
        mine = [module_grads(g) for g in got]
        want = [module_grads(e) for e in expected]
        if any(g is None or g.shape != w.shape for g, w in zip(mine, want)):
            return None
        wrong = [r for r in range(p) if not torch.allclose(mine[r], want[r], rtol=1e-6, atol=1e-9)]
        if not wrong:
            return None
        r = wrong[-1]
        ref = _Reference(model, batch, targets, p)
        found = (_rows_held(ref, r, mine[r], m) or _pairs(ref, r, mine[r], m)
                 or (_targets_paired(ref, targets, mine[r], m) if r == p - 1 else None)
                 or _sent_back(ref, r, mine[r], m))
        return f"Diagnosis: on rank {r}, {found}" if found else None
    return explain


def _parameter_by_parameter(expected: list, got: list) -> Optional[str]:
    """A weight gradient written by hand (zero-bubble's W, or any manual backward), read parameter by parameter: the
    gradients missing (None) while every other one is right, or each wrong one the transpose of the right one."""
    if not all(isinstance(g, torch.nn.Module) and isinstance(e, torch.nn.Module) for g, e in zip(got, expected)):
        return None
    pairs = [(f"rank {r}'s {name}", dict(g.named_parameters()).get(name), p)
             for r, (g, e) in enumerate(zip(got, expected)) for name, p in e.named_parameters()]
    if any(mine is None for _, mine, _ in pairs):
        return None
    missing = [what for what, mine, want in pairs if mine.grad is None and want.grad is not None]
    wrong = [(what, mine.grad, want.grad) for what, mine, want in pairs if mine.grad is not None
             and want.grad is not None and not _close(mine.grad, want.grad)]
    # autograd fills a layer's weight and bias together: a bias left None beside its weight's right gradient was
    # left out by a backward written by hand, not cut off from the loss
    beside_weight = all(w.endswith(".bias") and w.removesuffix(".bias") + ".weight" not in missing for w in missing)
    if missing and not wrong and beside_weight:
        return (f"{', '.join(w + '.grad' for w in missing)} {'is' if len(missing) == 1 else 'are'} None, and every "
                "other gradient is right, each weight's beside them: the backward that fills the gradients by hand "
                "never set the biases'. A bias needs its gradient too: db = dY summed over the rows (dY.sum(0)), "
                "accumulated like dW.")
    if wrong and not missing and all(g.dim() == 2 and _close(g, w.t()) for _, g, w in wrong):
        return (f"{', '.join(w + '.grad' for w, _, _ in wrong)} {'is' if len(wrong) == 1 else 'are'} the transpose "
                "of the right gradient: for y = x Wᵀ (nn.Linear keeps W as (out, in)), dW = dYᵀ X, of shape (out, in); "
                "Xᵀ dY is its transpose (the shapes agree only because the layers are square).")
    return None


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.detach().double(), b.detach().double(), rtol=1e-6, atol=1e-9)


def _rows_held(ref: _Reference, r: int, got: torch.Tensor, m: int) -> Optional[str]:
    rows = len(ref.inputs[r])
    basis = torch.stack([ref.vjp(r, slice(i, i + 1), ref.grads[r][i:i + 1]) for i in range(rows)])
    weights = fit(basis, got)
    return said(weights, m) if weights is not None else None


def _pairs(ref: _Reference, r: int, got: torch.Tensor, m: int) -> Optional[str]:
    """Each micro-batch's output gradient back-propagated through which micro-batches' activations."""
    if m < 2:
        return None
    parts = [slice(j * MICRO, (j + 1) * MICRO) for j in range(m)]
    basis = torch.stack([ref.vjp(r, parts[j], ref.grads[r][parts[i]]) for i in range(m) for j in range(m)])
    weights = fit(basis, got)
    if weights is None:
        return None
    pairs = weights.reshape(m, m).round(decimals=6)
    moved = [(i, j) for i in range(m) for j in range(m) if i != j and pairs[i, j] != 0]
    if not moved or not bool(((pairs == 0) | (pairs == 1)).all()):
        return None
    said_pairs = ", ".join(f"{i} → {j}" for i, j in moved)
    return ("a backward pairs the gradient of one micro-batch with the activations of another (gradient of "
            f"micro-batch → activations used: {said_pairs}): each gradient must go back through the graph of its own "
            "micro-batch. The gradients arrive in micro-batch order, oldest first: keep the stash by micro-batch and "
            "take the one whose gradient came.")


def _targets_paired(ref: _Reference, targets: torch.Tensor, got: torch.Tensor, m: int) -> Optional[str]:
    """The last stage's gradients when each micro-batch's loss took another micro-batch's targets: which targets
    each micro-batch's outputs went with, read from the gradients (an m × m fit of output j against targets k)."""
    if m < 2:
        return None
    r = len(ref.stages) - 1
    with torch.no_grad():
        out = ref.stages[r](ref.inputs[r])
    parts = [slice(j * MICRO, (j + 1) * MICRO) for j in range(m)]
    basis = torch.stack([ref.vjp(r, parts[j], 2 * (out[parts[j]] - targets[parts[k]]) / out.numel())
                         for j in range(m) for k in range(m)])
    weights = fit(basis, got)
    if weights is None:
        return None
    pairs = weights.reshape(m, m).round(decimals=6)
    if not bool(((pairs == 0) | (pairs == 1)).all()) or not bool((pairs.sum(1) == 1).all()):
        return None
    moved = [(j, int(k)) for j, k in enumerate(pairs.argmax(1).tolist()) if k != j]
    if not moved:
        return None
    return ("the loss compares a micro-batch's outputs with another micro-batch's targets (micro-batch → targets "
            f"used: {', '.join(f'{j} → {k}' for j, k in moved)}): micro-batch j's outputs go with "
            "targets.chunk(m)[j], the same j as its inputs.")


def _sent_back(ref: _Reference, r: int, got: torch.Tensor, m: int) -> Optional[str]:
    """The gradients stage r gets when stage r+1 sends back, for every micro-batch, another of its tensors' gradient
    than its input's."""
    if r + 1 >= len(ref.stages):
        return None
    parts = [slice(j * MICRO, (j + 1) * MICRO) for j in range(m)]
    for what, grad in ref.inner_grads(r + 1):
        if torch.allclose(grad, ref.grads[r]):
            continue
        mixed = sum(ref.vjp(r, part, grad[part]) for part in parts)
        if torch.allclose(mixed, got, rtol=1e-6, atol=1e-9):
            return (f"the gradients are what rank {r + 1} sending back the gradient of its {what} would make, in "
                    f"place of the gradient of its input: the wrong tensor went back (send x.grad, the gradient of "
                    f"what rank {r + 1} received).")
    return None


def _stage_error(p: int, m: int, v: int, error: BaseException) -> Optional[str]:
    """A pipeline case's explain_error: a None sent back as a rank's input gradient (the activation it received never
    made to require grad), or, in Megatron's interleaved order, a backward that found no stash of its forward."""
    text = str(error)
    sent = re.match(r"rank (\d+) called i?send with tensor=None[^(]*\(`([^`]*)`\)", text)
    if sent and int(sent.group(1)) > 0 and ".grad" in sent.group(2):
        r = int(sent.group(1))
        return (f"What it means here: rank {r} sent None back to rank {r - 1} for its input's gradient. The "
                f"activation rank {r} received from rank {r - 1} came out of dist.recv, which carries values and no "
                "graph, into a buffer that does not require grad, so backward never reached it and its .grad stayed "
                "None. Call x.requires_grad_() on it right after the recv, before the stage's forward uses it; after "
                "backward, x.grad is the gradient to send back.")
    raised = getattr(error, "exception", None)
    if v > 1 and raised is None and getattr(error, "posted", None):          # a deadlock: how far each rank went
        return (_chunk_zero_ahead(p, error.posted) or _gradient_asked_first(p, m, v, error)
                or _one_tag_both_kinds(p, error))
    if v > 1 and isinstance(raised, KeyError) and raised.args and isinstance(raised.args[0], tuple):
        return _backward_before_forward(p, m, v, getattr(error, "rank", None), raised.args[0],
                                        getattr(error, "posted", {}))
    return None


def _chunk_zero_ahead(p: int, posted: dict) -> Optional[str]:
    """A deadlock in which rank 0 had sent rank 1 more than p messages and received none: each was a chunk 0
    forward's activation (any other work of rank 0 needs a message first), where Megatron's order runs p micro-batches
    through chunk 0 and then needs rank p - 1's activation for chunk 1."""
    sent = posted.get((0, 1, "send"), 0)
    if sent <= p or any(n for (rank, _, kind), n in posted.items() if rank == 0 and kind == "recv"):
        return None
    return (f"What it means: rank 0 sent rank 1 {sent} activations of chunk 0 (micro-batches 0 to {sent - 1}) before "
            f"it received anything, where Megatron's order runs p = {p} micro-batches through chunk 0 and then takes "
            f"the same {p} through chunk 1, whose input comes from rank {p - 1}: groups of p micro-batches through "
            "each chunk in turn (rank r's k-th forward is micro-batch (k // (p·v))·p + k % p on chunk (k // p) % v), "
            "not all m micro-batches through chunk 0 before chunk 1. The schedule's order is at fault here, not the "
            "way the messages are posted.")


def _one_tag_both_kinds(p: int, error: BaseException) -> Optional[str]:
    """A deadlock at p = 2 in which every message carried one tag: between two stages rank 1 sends rank 0 two kinds of
    message (activations for chunk k + 1, gradients of chunk k's input), and a recv takes whichever came first."""
    tag = re.search(r"every message here carried tag (-?\d+)", str(error))
    if p != 2 or not tag:
        return None
    return (f"What it means: at p = 2, rank 1 sends rank 0 two kinds of message: the activation that leaves its chunk "
            f"k for rank 0's chunk k + 1, and the gradient of its chunk's input going back. Every message carried tag "
            f"{tag.group(1)}, so each recv of rank 0 took whichever kind came first, not the one it was posted for, "
            "and the two ranks' schedules drifted apart until both waited on a send. Give activations and gradients "
            "tags of their own (tag= on the send and on its recv), as the notebook's Details say.")


def _gradient_asked_first(p: int, m: int, v: int, error: BaseException) -> Optional[str]:
    """A deadlock in which the last rank waits, under another tag, for the nth message of a peer that has sent it:
    where Megatron's order has that message be an activation, the last rank was receiving a gradient, for a backward
    on a chunk before its last, where Megatron's order runs the backward of its last chunk, which starts from the loss
    and needs no message."""
    found = re.search(r"rank (\d+) waits for tag \d+ from rank (\d+), which sends it another tag", str(error))
    if not found or int(found.group(1)) != p - 1:
        return None
    rank, peer = p - 1, int(found.group(2))
    nth = next((w[2] for w in getattr(error, "waits", ()) if w[0] == rank and w[1] == peer), None)
    what = _interleaved_messages(p, m, v)(peer, rank, nth) if nth else ""
    if "activation" not in what:
        return None
    nth_said, _, message = what.rstrip(",").partition(", the ")
    return (f"What it means: rank {rank} asks for the {nth_said} from rank {peer} under another tag than the one "
            f"rank {peer} sent it with. In Megatron's order that message is the {message}: rank {rank} was receiving "
            f"the other kind, a gradient for a backward, where Megatron's order runs a forward. Rank {rank} holds "
            f"the last virtual stage (its chunk v - 1 = {v - 1}), and Megatron's order runs its backwards on the "
            "chunks in reverse, the k-th on chunk v - 1 - (k // p) % v: "
            f"the first ones, on chunk {v - 1}, start from the loss and need no message. A backward that waits for "
            f"a gradient from rank {peer} first is one on an earlier chunk, as when the backwards visit the chunks in "
            "the forwards' order, (k // p) % v.")


def _backward_before_forward(p: int, m: int, v: int, rank: Optional[int], key: tuple, posted: dict) -> Optional[str]:
    """A stash looked up at (chunk, micro-batch) (either order) that no forward stored yet, where it is the first
    backward of Megatron's order for that rank (chunk v - 1, micro-batch 0): read from the activations the rank had
    sent by then (one per forward on a chunk but the last stage), either fewer forwards than Megatron's order runs
    before that backward (the warm-up too short), or as many and more, none of them that one (the forwards in
    another order)."""
    if rank is None or len(key) != 2 or not all(isinstance(k, int) for k in key):
        return None
    order = schedule_orders("interleaved", p, m, v)[rank]
    first = next(s for s in order if s.kind == "B")
    if (first.chunk, first.mb) not in (key, key[::-1]):
        return None
    at = next(i for i, s in enumerate(order) if s.kind == "F" and (s.chunk, s.mb) == (first.chunk, first.mb))
    ran = posted.get((rank, (rank + 1) % p, "send"), 0)        # forwards that sent an activation on
    needed = at + 1 if rank < p - 1 else at                      # the last rank's chunk v - 1 sends nothing
    opening = (f"What it means: rank {rank} ran its first backward, chunk {first.chunk}'s for micro-batch "
               f"{first.mb}, before the forward that stores what it needs, which Megatron's order runs as rank "
               f"{rank}'s {ordinal(at + 1)} forward")
    if ran > needed or (ran == needed and rank < p - 1):
        return (f"{opening}. Rank {rank} had run {ran} forwards by then, none of them that one: its forwards do not "
                "follow Megatron's order, which takes groups of p micro-batches through each chunk in turn (rank r's "
                "k-th forward is micro-batch (k // (p·v))·p + k % p on chunk (k // p) % v), not all m micro-batches "
                "through one chunk before the next.")
    formula = (p - rank - 1) * 2 + (v - 1) * p
    return (f"{opening}: its warm-up ran too few forwards. Megatron's order runs (p - r - 1)·2 + (v - 1)·p = {formula} "
            f"warm-up forwards on rank {rank}, then one more before each backward. Plain 1F1B's warm-up, p - r - 1 = "
            f"{p - rank - 1}, counts one chunk per rank; each of the other v - 1 chunks adds p micro-batches.")


def _one_backward(p: int, m: int, t_f: float, t_b: float, time: Budget) -> Contract:
    """GPipe's backwards, read from a run over its time budget: the last stage sends its first input gradient one
    forward and one backward (t_f + t_b of its own) after the last activation reached it. A first gradient nearer m
    backwards later came out of one backward through every micro-batch's output joined into one loss: the stage before
    waited for the whole batch. A run within the budget is never judged by it."""

    def broken(result: SimResult) -> Optional[str]:
        if result.time <= time.limit_for(0) or m < 2 or p < 2:
            return None
        arrived = [e.end for e in result.trace if e.rank == p - 1 and e.op == "recv" and e.peer == p - 2]
        back = [e.start for e in result.trace if e.rank == p - 1 and e.op == "send" and e.peer == p - 2]
        if not arrived or not back or min(back) - max(arrived) < t_f + t_b * (m + 1) / 2:
            return None
        return (f"the run's simulated time is {fmt_time(result.time)}, over the budget of "
                f"{fmt_time(time.limit_for(0))}, and the last stage sent its first input gradient back "
                f"{fmt_time(min(back) - max(arrived))} after the last activation reached it, where one micro-batch's "
                f"forward and backward take {fmt_time(t_f + t_b)} there: about a forward and m = {m} backwards, what "
                "one backward through every micro-batch's output joined into one loss takes, so that rank "
                f"{p - 2} could start no backward before the whole batch had gone through")
    return Contract("GPipe's last stage runs each micro-batch's backward on its own loss and sends that input gradient "
                    "back at once, so that the stage before starts its backwards while the later ones run", broken,
                    timed=True, hint="compute each micro-batch's loss on its own (F.mse_loss(out_j, y_j) / m), call "
                                     "backward on it, and send its input gradient before the next micro-batch's "
                                     "backward.")


def _case(rng: random.Random, p: int, m: int, schedule: str) -> Case:
    model, batch, targets = _model_and_data(rng, p, m)
    stages = [model[s] for s in stage_slices(p)]
    expected = reference(model, batch, targets, p)
    micro, micro_y = batch[:MICRO], targets[:MICRO]
    boundary = micro.nbytes
    messages = _messages(p, 1, m, boundary)
    if schedule == "one batch":
        return Case(p, (per_rank(stages), batch, targets), expected, f"p={p} stages, one batch of {len(batch)}",
                    budgets=[ON_DEVICE] + messages, cost=COST, factors=_factors(batch),
                    explain=_schedule_explain(model, batch, targets, p, 1), messages=_carried(1),
                    explain_error=functools.partial(_stage_error, p, 1, 1))
    inputs = batch.nbytes + targets.nbytes
    time = _time_budget(schedule, stages, micro, micro_y, m)
    memory = _memory_budget(schedule, stages, micro, micro_y, inputs, m)
    budgets = [ON_DEVICE, time, memory, *messages]
    last = stage_times(stages[-1], micro, COST, micro_y, m)
    contracts = {"gpipe": [_gpipe_order(stages, micro, micro_y, m), _one_backward(p, m, *last, time)],
                 "1f1b": [_warm_ups(p, m, time, memory)]}
    return Case(p, (per_rank(stages), batch, targets, m), expected, f"p={p} stages, m={m} micro-batches of {MICRO}",
                budgets=budgets, cost=COST, factors={"m, the number of micro-batches": m, **_factors(batch)},
                contracts=contracts.get(schedule, []),
                explain=_schedule_explain(model, batch, targets, p, m), messages=_carried(m),
                explain_error=functools.partial(_stage_error, p, m, 1))


def _carried(m: int) -> Callable[[int, int, int], str]:
    """What the nth message between two stages carries: forward toward the last stage, backward toward the first,
    m of each way between neighbours (`carried.count`, which tells a wait for a message never sent)."""
    def carried(src: int, dst: int, nth: int) -> str:
        return f"{ordinal(nth)} {'activation' if src < dst else 'gradient'}"
    carried.count = lambda src, dst: m if abs(src - dst) == 1 else 0
    carried.from_where = ("A stage receives its activations from the previous stage, r - 1, and its gradients from "
                          "the next, r + 1")
    return carried


def _interleaved_messages(p: int, m: int, v: int) -> Callable[[int, int, int], str]:
    """What the nth message from one rank to another carries in Megatron's interleaved order, where both directions
    join the same two ranks (p = 2) and the last rank sends its chunks' outputs on to rank 0: the schedule's own
    sequence of activations (F of a virtual stage before the last) and gradients (B of one after the first)."""
    last, sent = p * v - 1, {}
    for r, order in enumerate(schedule_orders("interleaved", p, m, v)):
        for step in order:
            stage = step.chunk * p + r
            if step.kind == "F" and stage < last:
                what, to = "activation", (r + 1) % p
            elif step.kind == "B" and stage > 0:
                what, to = "gradient", (r - 1) % p
            else:
                continue
            onward = (f" (rank {r}'s chunk {step.chunk}, not the last stage: that is p·v - 1 = {last})"
                      if what == "activation" and r == p - 1 else "")
            sent.setdefault((r, to), []).append(f"{what} of virtual stage {stage}{onward} for micro-batch {step.mb}")

    def carried(src: int, dst: int, nth: int) -> str:
        known = sent.get((src, dst), [])
        return (f"{ordinal(nth)} message, the {known[nth - 1]}," if 0 < nth <= len(known)
                else f"{ordinal(nth)} message (the schedule sends {len(known)})")
    return carried


def _stages_case(rng: random.Random, p: int) -> Case:
    return _case(rng, p, 1, "one batch")


def _gpipe_case(rng: random.Random, p: int) -> Case:
    # m ≠ p, so that a gradient off by m (1/m forgotten) is not also off by N = p, which the diagnosis would name
    return _case(rng, p, rng.choice([m for m in range(2, 2 * p + 2) if m != p]), "gpipe")


def _refused_case(rng: random.Random, p: int, m: int, v: int, why: str) -> Case:
    """Arguments the statement says to refuse with a ValueError: no expected result, no budget."""
    model, batch, targets = _model_and_data(rng, p * v, m)
    stages = [model[s] for s in stage_slices(p * v)]
    mine = [[stages[c * p + r] for c in range(v)] for r in range(p)] if v > 1 else stages
    return Case(p, (per_rank(mine), batch, targets, m), [None] * p,
                f"p={p} stages, m={m} micro-batches ({why}: the statement asks for a ValueError)", raises=ValueError)


def _one_f_one_b_case(rng: random.Random, p: int, too_few: bool = False, fewest: bool = False) -> Case:
    """too_few: m < p, to be refused; fewest: m = p, the fewest micro-batches the schedule runs (an answer that
    refuses it passed while every case drew m > p + 1). Otherwise m > p, where 1F1B holds fewer micro-batches than
    GPipe (at m = p the two hold as many), and at p = 2 m > p + 1: one micro-batch fewer on two stages is within the
    memory budget's slack (GPipe's schedule passed the p = 2, m = 3 case)."""
    if too_few:
        return _refused_case(rng, p, rng.randint(1, p - 1), 1, "m < p")
    return _case(rng, p, p if fewest else rng.randint(p + 1 if p > 2 else p + 2, 2 * p + 2), "1f1b")


def _zero_bubble_case(rng: random.Random, p: int, too_few: bool = False, fewest: bool = False) -> Case:
    """m as for 1F1B, among those ScheduleInterleavedZeroBubble (the real cell's oracle) takes: a multiple of
    its number of rounds, max(1, m // p)."""
    if too_few:
        return _refused_case(rng, p, rng.randint(1, p - 1), 1, "m < p")
    return _case(rng, p, p if fewest else rng.choice([m for m in range(p + 1, 2 * p + 3) if m % max(1, m // p) == 0]),
                 "zb-h1")


CHUNKS_AND_ROUNDS = ((2, 2), (2, 3), (3, 2))      # (v, m / p) an interleaved case draws from


def _interleaved_case(rng: random.Random, p: int, v: Optional[int] = None, m: Optional[int] = None,
                      uneven: bool = False) -> Case:
    """p ranks, v chunks of LAYERS layers each (virtual stage c·p + r on rank r), m a multiple of p."""
    if uneven:
        return _refused_case(rng, p, p * rng.randint(0, 2) + rng.randint(1, p - 1), rng.choice((2, 3)),
                             "m not a multiple of p")
    # m = p holds no more than all forwards first. Three chunks or three rounds of p micro-batches, not both: the run
    # costs p·v·m chunk passes, and every pair still has a steady state between warm-up and cool-down.
    if v is None or m is None:
        v, rounds = rng.choice([(c, k) for c, k in CHUNKS_AND_ROUNDS if (v or c) == c and (m or k * p) == k * p])
        m = rounds * p
    model, batch, targets = _model_and_data(rng, p * v, m)
    stages = [model[s] for s in stage_slices(p * v)]
    chunks = [[stages[c * p + r] for c in range(v)] for r in range(p)]
    trained = reference(model, batch, targets, p * v)
    expected = [trained[r::p] for r in range(p)]
    micro, micro_y = batch[:MICRO], targets[:MICRO]
    boundary = micro.nbytes
    budgets = [_time_budget("interleaved", stages, micro, micro_y, m, v)]
    # Memory: rank r holds v chunks' weights and gradients, one chunk's forward and backward at a time, and at its
    # peak the activations of as many (chunk, micro-batch) pairs as Megatron's order keeps between their forward
    # and backward (peak_in_flight of the schedule, e.g. (p-r-1)·2 + (v-1)·p + 1 on rank r when m > p).
    held = peak_in_flight(schedule_orders("interleaved", p, m, v))
    inputs = batch.nbytes + targets.nbytes
    limits, whys = [], []
    for r in range(p):
        mem = [stage_memory(chunks[r][c], micro, micro_y, last=c * p + r == p * v - 1) for c in range(v)]
        stash, step = max(a for a, _ in mem), max(b for _, b in mem)
        others = (v - 1) * 2 * param_bytes(chunks[r][0])
        limits.append(inputs + step + others + held[r] * stash + 5 * boundary)
        whys.append((stash, step, others))
    stash0, step0, others0 = whys[0]
    budgets.append(Budget(
        "peak_memory", limits,
        f"the batch and targets ({fmt_bytes(inputs)}) + one chunk's forward and backward "
        f"({fmt_bytes(step0)} on rank 0, "
        f"its weights and gradients included) + the other {v - 1} chunks' weights and gradients ({fmt_bytes(others0)}) "
        f"+ the chunk activations Megatron's order holds at its peak, {', '.join(map(str, held))} on ranks 0..{p - 1} "
        f"({fmt_bytes(stash0)} each on rank 0) + 4 boundary tensors of {fmt_bytes(boundary)} in flight (the next "
        f"forward's input and the next backward's gradient received ahead, the gradient in use, the input gradient "
        f"being sent) and one more for the loss and small temporaries",
        hint="free each (chunk, micro-batch) stash as soon as its backward has run, and do not run more forwards "
             "ahead than (p-r-1)·2 + (v-1)·p."))
    return Case(p, (per_rank(chunks), batch, targets, m), expected,
                f"p={p} ranks × v={v} chunks, m={m} micro-batches of {MICRO}",
                budgets=[ON_DEVICE] + budgets + _messages(p, v, m, boundary), cost=COST,
                factors={"m, the number of micro-batches": m, "v, the virtual stages": v, **_factors(batch)},
                messages=_interleaved_messages(p, m, v), explain_error=functools.partial(_stage_error, p, m, v))


def _torch_pipelining(schedule_name: str, multi: bool = False):
    """The oracle: torch.distributed.pipelining's own schedule on an identical copy of the stage (given as a
    list of one stage to the `multi` schedules, which take several stages per rank)."""

    def oracle(dist, stage, batch, targets, m: int = 1):
        from torch.distributed import pipelining

        rank, p = dist.get_rank(), dist.get_world_size()
        pipe = pipelining.PipelineStage(stage, rank, p, batch.device)
        schedule = getattr(pipelining, schedule_name)([pipe] if multi else pipe, n_microbatches=m,
                                                      loss_fn=F.mse_loss)
        if rank == 0:
            schedule.step(batch)
        elif rank == p - 1:
            schedule.step(target=targets, losses=[])
        else:
            schedule.step()
        return stage
    oracle.__name__ = f"torch_{schedule_name}"
    return oracle


def _torch_interleaved(dist, chunks, batch, targets, m: int):
    """The oracle: ScheduleInterleaved1F1B with this rank's chunks as its stages c·p + rank of p·v."""
    from torch.distributed import pipelining

    rank, p = dist.get_rank(), dist.get_world_size()
    v = len(chunks)
    stages = [pipelining.PipelineStage(chunk, c * p + rank, p * v, batch.device) for c, chunk in enumerate(chunks)]
    schedule = pipelining.ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=F.mse_loss)
    if rank == 0:
        schedule.step(batch)
    elif rank == p - 1:
        schedule.step(target=targets, losses=[])
    else:
        schedule.step()
    return chunks


# A pipeline of one stage has no one to send to (torch.distributed.pipelining fails deep inside; NCCL answers
# "Trying to send to self without a matching recv"): the real cells refuse it up front.
AT_LEAST = dict(min_world_size=2, min_world_size_reason="a pipeline has one stage per rank, and a single stage has "
                                                        "no neighbour to send activations to")

SIGNATURE_HELP = ("`stage` is this rank's nn.Module; rank 0 feeds it `batch`, the last rank compares its output "
                  "with `targets` by F.mse_loss")

pipeline_stages = Puzzle(
    "pipeline_stages", NOTEBOOK, _stages_case, world_sizes=(2, 3, 4),
    hints=["Forward: rank 0 runs stage(batch); every other rank first receives its input from rank-1 "
           "(dist.recv into torch.empty_like(batch)), then sends its output to rank+1.",
           "Backward: the last rank calls F.mse_loss(out, targets).backward(); every other rank receives the "
           "gradient of its output from rank+1 and calls out.backward(grad). Mark the received input with "
           "x.requires_grad_() so that x.grad is there to send back to rank-1.",
           "Send out.detach() (a message carries values, not the graph) and return the stage: its parameters' "
           ".grad are what the check compares."],
    oracle=_torch_pipelining("ScheduleGPipe"),
    oracle_name="torch.distributed.pipelining (ScheduleGPipe, 1 micro-batch)",
    rtol=1e-9, atol=1e-12, **AT_LEAST,
    describe="The model cut into p stages, one batch forward then backward, activations and gradients by send/recv.")

gpipe = Puzzle(
    "gpipe", NOTEBOOK, _gpipe_case, world_sizes=(2, 3, 4),
    hints=["Cut batch and targets into m micro-batches (tensor.chunk(m)). Run every micro-batch's forward, "
           "keeping each (input, output) pair, then every backward.",
           "The loss is the mean over micro-batches: divide each micro-batch's loss by m before backward "
           "(the gradients add up in .grad). A blocking send waits for the receiver: use dist.isend for sends "
           "and wait on them at the end, so that a stage can go on to the next micro-batch.",
           "Rank 0 must start micro-batch j+1 as soon as it has sent micro-batch j; each micro-batch's input "
           "gets x.requires_grad_() and its x.grad goes back to rank-1 after out.backward(grad)."],
    oracle=_torch_pipelining("ScheduleGPipe"), oracle_name="torch.distributed.pipelining.ScheduleGPipe",
    rtol=1e-9, atol=1e-12, **AT_LEAST,
    describe="GPipe: m micro-batches, all forwards then all backwards, gradients of the mean loss.")

one_f_one_b = Puzzle(
    "one_f_one_b", NOTEBOOK, _one_f_one_b_case, world_sizes=(3, 2, 3, 4),
    variants=[{"too_few": True}, {"fewest": True}],
    hints=["Rank r runs p-r-1 forwards (warm-up), then alternates one forward and one backward until every "
           "forward is done (steady state), then runs the remaining backwards (cool-down).",
           "Keep the stash in a dict by micro-batch and pop it in backward, so its activations are freed. "
           "Backwards run in micro-batch order 0, 1, 2, ...",
           "Write forward(j) and backward(j) helpers (from your gpipe) and call them in the three phases: "
           "for j < warm: forward(j); for i < m - warm: forward(warm + i), backward(i); then the last warm backwards."],
    oracle=_torch_pipelining("Schedule1F1B"), oracle_name="torch.distributed.pipelining.Schedule1F1B",
    rtol=1e-9, atol=1e-12, **AT_LEAST,
    describe="1F1B: warm-up, steady state of one forward and one backward, cool-down; at most p-r micro-batches "
             "of activations on stage r.")

interleaved_1f1b = Puzzle(
    "interleaved_1f1b", NOTEBOOK, _interleaved_case, world_sizes=(3, 2, 3, 4),
    hints=["Number this rank's work: its k-th forward is micro-batch (k // (p·v))·p + k % p on chunk (k // p) % v; "
           "its k-th backward is the same micro-batch on chunk v-1-(k // p) % v. Chunk c is stage s = c·p + rank: "
           "its input comes from rank (rank-1) % p, its output goes to rank (rank+1) % p.",
           "Warm-up: min((p-rank-1)·2 + (v-1)·p, m·v) forwards; then one forward and one backward until the forwards "
           "are done; then the remaining backwards. Stage 0 reads the batch, stage p·v-1 computes the loss / m; "
           "keep the stash in a dict by (chunk, micro-batch).",
           "With p = 2 the same pair of ranks carries activations and gradients both ways, and a receive takes the "
           "first message its peer sent with its tag. Receiving each one (blocking) when you need it gets them in "
           "the right order; if you post receives ahead (dist.irecv before you need them), give activations and "
           "gradients different tags (tag=0 and tag=1) so a receive cannot take the other kind. Raise ValueError "
           "when m % p."],
    oracle=_torch_interleaved, oracle_name="torch.distributed.pipelining.ScheduleInterleaved1F1B",
    rtol=1e-9, atol=1e-12, **AT_LEAST,
    # m % p must be refused; then p=2 with m > p: the pair of ranks carries both kinds of message both ways
    variants=[{"uneven": True}, {"m": 4}],
    describe="Interleaved 1F1B (Megatron-LM): v chunks per rank, the bubble divided by v.")

zero_bubble = Puzzle(
    "zero_bubble", NOTEBOOK, _zero_bubble_case, world_sizes=(3, 2, 3, 4),
    variants=[{"too_few": True}, {"fewest": True}],
    hints=["Start from your 1F1B and split its backward in two. B: run the stage layer by layer in forward, keeping "
           "each nn.Linear's input and output y; in B ask autograd for the gradients of the outputs and of x only, "
           "torch.autograd.grad(out, [y1, y2, ..., x], grad), and send x's gradient to rank-1 at once.",
           "W for one Linear is dW = dYᵀX and db = dY.sum(0), with X its input and dY the gradient B found for its "
           "output: add them to layer.weight.grad and layer.bias.grad (set them when they are None). Keep only "
           "(layer, X, dY) between B and W.",
           "ZB-H1's order: 1F1B's warm-up and its order of forwards and B's; after each B, if more than `rank` W are "
           "waiting, run the oldest; after the last B, run the rest. On rank 0 the batch needs no gradient, so B "
           "there asks only for the outputs' gradients."],
    oracle=_torch_pipelining("ScheduleInterleavedZeroBubble", multi=True),
    oracle_name="torch.distributed.pipelining.ScheduleInterleavedZeroBubble (one stage per rank: ZB-H1's order)",
    rtol=1e-9, atol=1e-12, **AT_LEAST,
    describe="Zero bubble (ZB-H1): backward split into the input gradient B and the weight gradient W, W moved "
             "into the bubble; 1F1B's memory with a third of its bubble.")

PUZZLES = [pipeline_stages, gpipe, one_f_one_b, interleaved_1f1b, zero_bubble]


def explore_bubble(puzzle: Puzzle, fn, p: int = 4):
    """Run `fn` on the puzzle's p-rank case, print its bubble against the formula, return the run (for
    .timeline()); None with a note while the puzzle is unsolved or failing."""
    result = puzzle.explore(fn, p)
    if result is not None:
        args = puzzle.make_case(random.Random(f"{puzzle.name}:0"), p).args
        bubble_report(result, args[3], len(args[0].values[0]) if puzzle is interleaved_1f1b else 1,
                      zero_bubble=puzzle is zero_bubble)
    return result
