"""Notebook 09, beyond one cluster: the puzzles, their inputs, references and budgets.

DiLoCo (Douillard et al. 2023), compressed all-reduce with error feedback, a sharded checkpoint loaded on another
number of ranks, surviving a failed rank (the simulator's injected faults), and DiLoCo's inner steps for a given
wide-area link. Each check compares with a single-process reference of the algorithm on the same data, and bounds
the bytes (and, across two datacenters, the simulated time) by the algorithm's formula for the case at hand.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import random
import re
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from lib.checker.puzzle import Budget, Case, Contract, Floor, Puzzle, flops_budgets, one_thread
from lib.checker.contract import op_sends_at_most
from lib.analytic.cross_site import shard_bounds
from lib.diagnose import Mistake
from lib.errors import PuzzleError
from lib.checker.feed import StepFeed
from lib.notebook.warm_up import import_ahead
from lib.checker.measure import Work, counted_flops, counted_work
from lib.models import mlp, param_bytes, sharded_batches
from lib.sim import CostModel, RankDied, per_rank
from lib.sim.cost import bus_factor
from lib.checker.terms import Formula, Q, ceil, formula, matches, maximum, term
from lib.units import fmt_bytes, fmt_rate, fmt_time
from lib.viz.timeline import training_scale

import_ahead("optimizer")

NOTEBOOK = "09_beyond_one_cluster"
SIZES = (8, 16, 4)
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9          # DiLoCo's outer Nesterov SGD (Douillard et al. 2023, section 3)
# Two datacenters joined by a wide-area link: 100 Gb/s per GPU and 10 ms per message (CostModel's defaults).
WAN = CostModel()
DILOCO_RTOL, DILOCO_ATOL = 1e-9, 1e-11
TIME_SLACK = 1.5             # over compute + one WAN all-reduce per round: room for copies and the outer step


def two_datacenters(world: int, cost: CostModel = WAN) -> CostModel:
    """`cost` with the ranks split into two datacenters (the first ceil(N/2) ranks in one, the rest in the other)."""
    return cost.with_(ranks_per_site=math.ceil(world / 2))


# ---- 1. DiLoCo --------------------------------------------------------------------------------------------
def diloco_reference(model, shards, inner_steps: int, inner_lr: float, outer_lr: float, momentum: float,
                     sign: float = 1.0, outer_steps_per_round: int = 1, nesterov: bool = True,
                     zero_grad: bool = True):
    """The shared model after DiLoCo (diloco_run)."""
    return diloco_run(model, shards, inner_steps, inner_lr, outer_lr, momentum, sign, outer_steps_per_round,
                      nesterov, zero_grad)[0]


def diloco_run(model, shards, inner_steps: int, inner_lr: float, outer_lr: float, momentum: float,
               sign: float = 1.0, outer_steps_per_round: int = 1, nesterov: bool = True,
               zero_grad: bool = True, reset: bool = True):
    """DiLoCo in one process, worker after worker in rank order: H AdamW steps each (every worker keeps its
    AdamW state), the pseudo-gradient (start - local) averaged, one Nesterov SGD step. (A known mistake passes
    `sign` = -1, or takes the outer step `outer_steps_per_round` times; another outer optimizer, nesterov=False;
    zero_grad=False: the inner gradients never zeroed, each adding onto the ones before and onto the pseudo-gradient
    the outer step left in p.grad, as in a worker whose two optimizers share one model; reset=False: the outer step
    never copied into the workers.) (the shared model, the workers)"""
    start = copy.deepcopy(model)
    workers = [copy.deepcopy(model) for _ in shards]
    inner = [torch.optim.AdamW(w.parameters(), lr=inner_lr) for w in workers]
    outer = torch.optim.SGD(start.parameters(), lr=outer_lr, momentum=momentum, nesterov=nesterov and momentum > 0)
    for round_ in range(len(shards[0]) // inner_steps):
        for worker, opt, batches in zip(workers, inner, shards):
            for x, y in batches[round_ * inner_steps:(round_ + 1) * inner_steps]:
                if zero_grad:
                    opt.zero_grad()
                F.mse_loss(worker(x), y).backward()
                opt.step()
        with torch.no_grad():
            for p, *local in zip(start.parameters(), *(w.parameters() for w in workers)):
                p.grad = sign * sum(p - q for q in local) / len(workers)
        for _ in range(outer_steps_per_round):
            outer.step()
        with torch.no_grad():
            for w in workers:
                for p, q in zip(start.parameters(), w.parameters()):
                    if reset:
                        q.copy_(p)
                    if not zero_grad:
                        q.grad = p.grad.clone()
    return start, workers


def _diloco_mistake(message: str, sign: float = 1.0, per_inner_step: bool = False) -> Mistake:
    def mistaken(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
        return _gathered_reference(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, sign=sign,
                                   outer_steps_per_round=inner_steps if per_inner_step else 1)
    return Mistake(mistaken, message)


def _gathered_reference(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, **how):
    """The reference on every rank, on every rank's batches (gathered): a mistake's result, for the diagnosis."""
    world = dist.get_world_size()
    flat = [torch.stack([torch.cat([x.reshape(-1), y.reshape(-1)]) for x, y in batches])]
    everyone = [torch.empty_like(flat[0]) for _ in range(world)]
    dist.all_gather(everyone, flat[0])
    (x0, y0) = batches[0]
    cut = x0.numel()
    shards = [[(row[:cut].view_as(x0), row[cut:].view_as(y0)) for row in rows] for rows in everyone]
    return diloco_reference(model, shards, inner_steps, inner_lr, outer_lr, momentum, **how)


DILOCO_MISTAKES = [
    _diloco_mistake("a pseudo-gradient of the wrong sign gives: start - local (the way the inner steps went, "
                    "backwards, like a gradient) where local - start belongs.", sign=-1.0),
    _diloco_mistake("an outer step taken once per inner step (H times per round) with the same pseudo-gradient "
                    "gives: the outer momentum must advance once per round.", per_inner_step=True),
]


def _diloco_budgets(model, world: int, rounds: int, inner_steps: int, cost: CostModel, compute: float) -> list:
    size = param_bytes(model)
    per_round = bus_factor("all_reduce", world) * size
    ddp = rounds * inner_steps * per_round
    why = (f"{rounds} rounds × one all-reduce of the {fmt_bytes(size)} pseudo-gradient (2(N-1)/N of it): 1/H = "
           f"1/{inner_steps} of data parallelism's {fmt_bytes(ddp)} for {rounds * inner_steps} steps")
    wan = cost.collective_time("all_reduce", size, range(world))
    ddp_time = rounds * inner_steps * wan + compute
    return [Budget("bytes_sent", rounds * per_round, why,
                   hint="all-reduce the pseudo-gradients once per round, after the H inner steps: never the "
                        "gradients of an inner step."),
            Floor("bytes_sent", rounds * per_round, why,
                  hint="each worker trains on its own batches; what travels is the pseudo-gradient, once per "
                       "round."),
            Budget("time", TIME_SLACK * (compute + rounds * wan),
                   f"{TIME_SLACK} × ({fmt_time(compute)} of compute + {rounds} all-reduces across the datacenters' "
                   f"{fmt_rate(cost.inter_site_bandwidth)}, {fmt_time(cost.inter_site_latency)} link, "
                   f"{fmt_time(wan)} each); data parallelism would take {fmt_time(ddp_time)}",
                   hint="every message across the wide-area link pays its latency: all-reduce the pseudo-gradients "
                        "of all parameters as one flat tensor (torch.cat), once per round.")]


@functools.lru_cache(maxsize=8)
def _worker_work(local: int) -> tuple[Work, Work, Work]:
    """One worker's DiLoCo of `local` samples per batch, counted as a rank counts it, for (H, rounds) = (1, 1),
    (2, 1) and (1, 2). What a rank counts depends on the shapes alone, not on the values: counted once per `local`."""
    model = mlp(SIZES)
    (batches,), _ = sharded_batches(0, SIZES, 1, local, 2)

    def counted(h: int, rounds: int) -> Work:
        return counted_work(lambda: diloco_reference(model, [batches[:h * rounds]], h, 1e-2, OUTER_LR,
                                                     OUTER_MOMENTUM))[1]
    return counted(1, 1), counted(2, 1), counted(1, 2)


def worker_compute(local: int, inner_steps: int, rounds: int, cost: CostModel) -> float:
    """The seconds a worker's clock counts for its own H inner steps and outer step per round, alone (diloco_reference
    on one worker's batches): the first step and round set up the optimizers' state, every later inner step and every
    later round's outer step repeat the same ops, so three short counted runs price any H and number of rounds."""
    return _extrapolated([work.seconds(cost) for work in _worker_work(local)], inner_steps, rounds)


def worker_flops(local: int, inner_steps: int, rounds: int) -> float:
    """A worker's FLOPs for its own H inner steps and outer step per round, alone (as worker_compute)."""
    return _extrapolated([work.flops for work in _worker_work(local)], inner_steps, rounds)


def _extrapolated(measured: list[float], inner_steps: int, rounds: int) -> float:
    """From (H, rounds) = (1, 1), (2, 1) and (1, 2) measured, any H and number of rounds."""
    once, two_steps, two_rounds = measured
    step = two_steps - once                               # a later inner step
    round_end = two_rounds - once - step                  # a later round's pseudo-gradient and outer step
    return once + (rounds * inner_steps - 1) * step + (rounds - 1) * round_end


# (H, rounds) a case draws: H from 2 to 4 and 2 or 3 rounds, at most 8 inner steps in all (every rank and the
# reference run them all: 12 cost half as much again and test nothing 8 do not).
STEPS_AND_ROUNDS = tuple((h, r) for h in (2, 3, 4) for r in (2, 3) if h * r <= 8)


def _diloco_case(rng: random.Random, world: int, steps: Optional[int] = None) -> Case:
    model = mlp(SIZES, seed=rng.randrange(2**31))
    inner_steps, rounds = rng.choice(STEPS_AND_ROUNDS)
    local = rng.randint(2, 5)
    inner_lr = rng.choice([1e-2, 3e-2])
    outer_lr, momentum = (OUTER_LR, OUTER_MOMENTUM) if rng.random() < 0.5 else (rng.uniform(0.3, 1.0), 0.8)
    shards, _ = sharded_batches(rng.randrange(2**31), SIZES, world, local, rounds * inner_steps)
    if steps is not None:        # the same draws, fewer rounds (DiLoCo's outer steps): where a wrong run first leaves
        rounds = steps
        shards = [rank[:rounds * inner_steps] for rank in shards]
    cost = two_datacenters(world)
    expected = diloco_reference(model, shards, inner_steps, inner_lr, outer_lr, momentum)
    # Judged by its parameters: what .grad holds after the outer step is the optimizer's business (on a GPU, torch's
    # foreach SGD adds the momentum into it in place; on the CPU it does not: seen on an H200 with torch 2.11).
    for p in expected.parameters():
        p.grad = None
    compute = worker_compute(local, inner_steps, rounds, cost)
    flops = worker_flops(local, inner_steps, rounds)
    # Each worker trains on its own batches: compute is nothing next to the wide-area link, so the time budget cannot
    # see a rank that trains every worker itself (on batches it has no way to get but outside dist); FLOPs can.
    work = flops_budgets(flops, f"one worker's {rounds * inner_steps} AdamW steps and {rounds} outer steps on its own "
                                f"{local} samples a step, {flops:,.0f} FLOPs")
    return Case(world, (model, per_rank(shards), inner_steps, inner_lr, outer_lr, momentum), [expected] * world,
                f"N={world} workers in 2 datacenters, H={inner_steps} inner steps × {rounds} rounds of {local} "
                f"samples, inner lr {inner_lr:g}, outer lr {outer_lr:.3g}, momentum {momentum:g}",
                budgets=_diloco_budgets(model, world, rounds, inner_steps, cost, compute) + work, cost=cost,
                allowed_ops=frozenset({"all_reduce"}), steps=rounds,
                explain=_diloco_explained(model, shards, inner_steps, inner_lr, outer_lr, momentum, DILOCO_RTOL,
                                          DILOCO_ATOL))


# DiLoCo runs a wrong answer may equal, as diloco_reference's settings: another outer optimizer than Nesterov's SGD,
# or inner gradients never zeroed.
DILOCO_VARIANTS = {"heavy-ball momentum (torch.optim.SGD without nesterov=True), where DiLoCo's outer optimizer is "
               "Nesterov's": {"nesterov": False},
               "plain SGD, no momentum, where DiLoCo's outer optimizer is Nesterov's SGD with momentum": {
                   "momentum": 0.0},
               "the inner gradients not zeroed between inner steps, each adding onto the ones before (call "
               "inner.zero_grad() before each backward)": {"zero_grad": False},
               "the workers' parameters averaged (local SGD: an outer step of learning rate 1 without momentum), "
               "where DiLoCo averages the pseudo-gradients and takes Nesterov's SGD step with outer_lr and momentum "
               "on them": {"outer_lr": 1.0, "momentum": 0.0}}
REPLICAS_WHY = {"": "DiLoCo's outer step gives every worker the same parameters: from the round's start "
                    "(p.copy_(start) before it), with the pseudo-gradient averaged over all workers. Something of a "
                    "worker's own inner steps survived it: the outer step taken from the worker's own weights, or "
                    "its own pseudo-gradient where the average belongs."}


def _diloco_explained(model, shards, inner_steps: int, inner_lr: float, outer_lr: float, momentum: float,
                      rtol: float, atol: float) -> Callable[[list, list], Optional[str]]:
    """A DiLoCo case's explain (lib.checker.puzzle.Case): workers that never received the outer step, workers whose
    parameters differ from each other (replicas drifting apart), or a run that equals one of DILOCO_VARIANTS."""
    from lib.diagnose.leaves import close, leaves
    from puzzles.replicas import drifted

    def explain(expected: list, got: list) -> Optional[str]:
        mine = [dict(leaves(g)) for g in got]
        _, workers = diloco_run(model, shards, inner_steps, inner_lr, outer_lr, momentum, reset=False)
        if all(key in m and close(t, m[key], max(rtol, 1e-6), max(atol, 1e-9)) for m, w in zip(mine, workers)
               for key, t in dict(leaves(w)).items() if not key.endswith(".grad")):
            return ("Diagnosis: every worker's parameters are what DiLoCo gives with the outer step never copied "
                    "into the workers' models: it updated the shared copy, and each worker went on from its own "
                    "inner steps. After the outer step, copy the shared parameters into the model "
                    "(p.copy_(shared)), so that every worker starts the next round from them.")
        apart = drifted(expected, got, {}, REPLICAS_WHY, rtol, atol)
        if apart:
            return apart
        for what, how in DILOCO_VARIANTS.items():
            other = dict(leaves(diloco_reference(model, shards, inner_steps, inner_lr,
                                                 **{"outer_lr": outer_lr, "momentum": momentum, **how})))
            if all(key in m and close(t, m[key], max(rtol, 1e-6), max(atol, 1e-9)) for m in mine
                   for key, t in other.items() if not key.endswith(".grad")):
                return f"Diagnosis: every worker's parameters are what DiLoCo gives with {what}."
        return None
    return explain


def _diloco_scale(case: Case) -> tuple[CostModel, str]:
    cost, note = training_scale(case, cost=case.cost)
    return cost, (f"{note}\nbetween the 2 datacenters: {fmt_rate(case.cost.inter_site_bandwidth)} per GPU, "
                  f"{fmt_time(case.cost.inter_site_latency)} per message")


diloco_train = Puzzle(
    "diloco_train", NOTEBOOK, _diloco_case, world_sizes=(2, 3, 4),
    hints=["Make the inner optimizer once, torch.optim.AdamW(model.parameters(), lr=inner_lr), and the outer one "
           "once, torch.optim.SGD(model.parameters(), lr=outer_lr, momentum=momentum, nesterov=True): both keep "
           "their state from round to round. Each round: keep a copy of the parameters, take H inner steps.",
           "After the H steps the pseudo-gradient of a parameter is start - p (it points the way a gradient "
           "does). Average it over the workers with one all-reduce of all of them flattened (torch.cat), then "
           "divide by N.",
           "Then, under torch.no_grad(): p.copy_(start); p.grad = its averaged pseudo-gradient; after the loop "
           "over parameters, outer.step() once. The next round starts from the new p on every worker."],
    mistakes=DILOCO_MISTAKES, rtol=DILOCO_RTOL, atol=DILOCO_ATOL, real_scale=_diloco_scale,
    describe="Train with DiLoCo: H inner AdamW steps per worker, then one outer Nesterov step on the averaged "
             "pseudo-gradient.")


# ---- 2. compressed all-reduce with error feedback ----------------------------------------------------------
def quantize(x: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """x (1-D, any float dtype) as integers of `bits` bits held in int8, and one float32 scale of shape (1,):
    x ≈ q · scale, rounded to nearest, |q| <= 2**(bits-1) - 1 (127 for int8)."""
    x = x.float()
    scale = (x.abs().max() / (2 ** (bits - 1) - 1)).clamp_min(torch.finfo(torch.float32).tiny).reshape(1)
    return torch.round(x / scale).to(torch.int8), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """What `quantize` sent, back in float32."""
    return q.float() * scale


def compressed_reference(grads: list, residuals: list, bits: int, feedback: bool = True,
                         subtract: bool = True, residual_in: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every rank's (mean, new residual), in one process: each rank's grad + residual quantized chunk by chunk
    (chunk j for rank j), the owners' float64 sums of what arrived divided by N and quantized again, gathered.
    (Known mistakes: feedback=False ignores the residual, subtract=False keeps grad + residual as the residual,
    residual_in=False quantises the gradient alone and keeps what that lost.)"""
    n = len(grads)
    corrected = [g + r if feedback and residual_in else g.clone() for g, r in zip(grads, residuals)]
    sent = [torch.cat([dequantize(*quantize(c, bits)) for c in x.chunk(n)]) for x in corrected]
    total = torch.stack([s.double() for s in sent]).sum(0) / n
    mean = torch.cat([dequantize(*quantize(c, bits)) for c in total.chunk(n)])
    if not feedback:
        return [(mean, torch.zeros_like(c)) for c in corrected]
    return [(mean, c - s if subtract else c) for c, s in zip(corrected, sent)]


def _gather(dist, t: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return parts


def _compressed_mistake(message: str, **how) -> Mistake:
    def mistaken(dist, grad, residual, bits):
        return compressed_reference(_gather(dist, grad), _gather(dist, residual), bits, **how)[dist.get_rank()]
    return Mistake(mistaken, message)


COMPRESSED_MISTAKES = [
    _compressed_mistake("error feedback forgot to subtract what was sent: the new residual is grad + residual "
                        "minus dequantize(what you sent), the part the quantisation lost.", subtract=False),
    _compressed_mistake("there is no error feedback: the residual from the last call must be added to the "
                        "gradient before quantising, and the new one kept.", feedback=False),
    _compressed_mistake("quantising the gradient alone gives: the residual the last call kept was never added "
                        "back, so what it lost is lost for good. Quantise c = grad + residual, and keep c minus what "
                        "you sent.", residual_in=False),
]
SCALE_BYTES = 8              # per chunk: a float32 scale, or room for a float64 one
# A rank's FLOPs may exceed its share by this much (bookkeeping: copies, casts); one that computes every rank's share
# (with the others' gradients got outside dist) counts N times it.
COMPRESSED_OVER = 0.5
PASSES = 7


def _rank_flops(chunk: int, world: int, bits: int) -> float:
    """One rank's FLOPs in the algorithm, from quantize's and dequantize's on a chunk (counted as a rank counts them):
    N + 1 chunks quantised (its own N, its mean), 2N dequantised (what it sent, every owner's mean), and PASSES
    elementwise passes over its N·c values (adding the residual, subtracting what was sent, stacking, casting and
    summing what arrived, concatenating the result)."""
    x = torch.zeros(chunk)
    (q, scale), quantising = counted_flops(lambda: quantize(x, bits))
    dequantising = counted_flops(lambda: dequantize(q, scale))[1]
    return (world + 1) * quantising + 2 * world * dequantising + PASSES * world * chunk


def _compressed_explained(grads: list, residuals: list, bits: int) -> Callable[[list, list], Optional[str]]:
    """A compressed case's explain (lib.checker.puzzle.Case): a wrong mean read chunk by chunk against what its owner
    received (the mean unquantised, or the integers added under one sender's scale), a wrong residual against the
    inputs it is made of (one of them left out or counted twice)."""
    n = len(grads)
    sent = [[quantize(c, bits) for c in (g + r).chunk(n)] for g, r in zip(grads, residuals)]   # [rank][chunk]

    def back(mean: torch.Tensor) -> torch.Tensor:
        return dequantize(*quantize(mean, bits))

    def readings(j: int) -> list[tuple[str, torch.Tensor]]:
        """Owner j's chunk of the result as each slip makes it."""
        arrived = [sent[i][j] for i in range(n)]
        exact = sum(dequantize(q, s).double() for q, s in arrived) / n
        added = sum(q.long() for q, _ in arrived)
        scales = torch.stack([s for _, s in arrived])
        return [("unquantised", exact.float()),
                ("by the senders' mean scale", back((added * scales.mean(0)).double() / n)),
                ("by the senders' largest scale", back((added * scales.max(0).values).double() / n))] + \
            [(f"scale {k}", back((added * arrived[k][1]).double() / n)) for k in range(n)]

    def explain(expected: list, got: list) -> Optional[str]:
        return _compressed_mean(expected, got, n, readings) or _compressed_residual(expected, got, grads, residuals)
    return explain


def _compressed_mean(expected: list, got: list, n: int, readings: Callable) -> Optional[str]:
    """The reading that gives every chunk of the first wrong mean, said."""
    for rank, (e, g) in enumerate(zip(expected, got)):
        mean = g[0] if isinstance(g, (tuple, list)) and g and isinstance(g[0], torch.Tensor) else None
        if mean is None or mean.shape != e[0].shape or torch.equal(mean.detach().cpu(), e[0]):
            continue
        fits = [[what for what, t in readings(j) if _near(c, t)] for j, c in enumerate(mean.detach().cpu().chunk(n))]
        if all("unquantised" in f for f in fits):
            return (f"Diagnosis: rank {rank}'s mean is each owner's mean unquantised (float32, 4 B a value): the way "
                    "back is quantised too: quantize the mean of the chunk you own, all_gather its int8 values and "
                    "its scale, and dequantize each owner's into its place.")
        for one in ("by the senders' mean scale", "by the senders' largest scale"):
            if all(one in f for f in fits) and not all("unquantised" in f for f in fits):
                return (f"Diagnosis: rank {rank}'s mean is, chunk by chunk, the int8 values that arrived added as "
                        f"integers and multiplied {one}: each sender's integers have a scale of their own, so "
                        "dequantize each sender's values with its scale, then add.")
        scaled = [sorted(int(w.split()[1]) for w in f if w.startswith("scale")) for f in fits]
        if all(scaled):
            who = {k[0] for k in scaled}
            by = f"rank {who.pop()}'s scale" if len(who) == 1 else "one sender's scale"
            return (f"Diagnosis: rank {rank}'s mean is, chunk by chunk, the int8 values that arrived added as "
                    f"integers and multiplied by {by}: each sender's integers have a scale of their own, so "
                    "dequantize each sender's values with its scale, then add.")
        return None
    return None


def _compressed_residual(expected: list, got: list, grads: list, residuals: list) -> Optional[str]:
    """A wrong new residual that differs from the right one by exactly one input, left out or counted twice."""
    for rank, (e, g) in enumerate(zip(expected, got)):
        have = g[1] if isinstance(g, (tuple, list)) and len(g) > 1 and isinstance(g[1], torch.Tensor) else None
        if have is None or have.shape != e[1].shape:
            continue
        off = have.detach().cpu().double() - e[1].double()
        c = (grads[rank] + residuals[rank]).double()
        if off.abs().max() > 0 and _near(have.detach().cpu().double(), c - e[0].double()):
            return (f"Diagnosis: rank {rank}'s new residual is c minus the all-reduced mean, where c = grad + "
                    "residual: the mean holds every rank's gradients, not what you lost. The residual is what "
                    "quantising your c lost, c - dequantize(what you sent), chunk by chunk.")
        for what, x in (("the gradient", grads[rank]), ("the old residual (the input residual)", residuals[rank])):
            for sign, how in ((-1, "left out"), (1, "counted twice")):
                if off.abs().max() > 0 and _near(off, sign * x.double()):
                    return (f"Diagnosis: rank {rank}'s new residual is the right one with {what} {how}: the "
                            "residual is what quantising lost, c - dequantize(what you sent), where c = grad + "
                            "residual is what you quantised.")
    return None


def _near(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float32 rounding, relative to the larger of the two's magnitudes."""
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-30)
    return a.shape == b.shape and bool((a.double() - b.double()).abs().max() <= 1e-5 * scale)


def _compressed_case(rng: random.Random, world: int, bits=None) -> Case:
    bits = rng.choice([8, 8, 4, 2]) if bits is None else bits
    length = world * rng.randint(3, 40)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    grads = [torch.randn(length, generator=gen) * rng.choice([1e-3, 1.0, 30.0]) for _ in range(world)]
    for g in grads:                                                    # an outlier or two, as real gradients have
        g[torch.randint(length, (2,), generator=gen)] *= 50
    residuals = [torch.randn(length, generator=gen) * g.abs().max() / 2 ** bits for g in grads]
    expected = compressed_reference(grads, residuals, bits)
    flops = _rank_flops(length // world, world, bits)
    payload = 2 * (world - 1) / world * length                          # int8: one byte per value
    fp32 = bus_factor("all_reduce", world) * 4 * length
    why = (f"your int8 chunks to their owners and the owners' int8 means back, 2 × (N-1)/N × {length} values of "
           f"1 byte, and a scale per chunk: about 1/4 of a float32 ring all-reduce's {fmt_bytes(fp32)}")
    return Case(world, (per_rank(grads), per_rank(residuals), bits), expected,
                f"N={world}, {length} float32 gradients per rank, {bits}-bit values",
                budgets=[Budget("bytes_sent", payload + 2 * (world - 1) * SCALE_BYTES, why,
                                hint="send int8 values and one scale per chunk, never float32 values."),
                         Floor("bytes_sent", payload, why,
                               hint="every rank's chunk j goes to rank j (all_to_all), and each owner's quantised "
                                    "mean comes back to everyone (all_gather): both through dist."),
                         *flops_budgets(flops, f"a rank's quantising (N chunks and its mean), dequantising (what "
                                               f"it sent, every owner's mean) and {PASSES} passes over its {length} "
                                               f"values, {flops:,.0f} FLOPs", over=COMPRESSED_OVER)],
                allowed_ops=frozenset({"all_to_all", "all_gather"}),
                explain=_compressed_explained(grads, residuals, bits),
                contracts=[op_sends_at_most(
                    "all_gather", (world - 1) * (length // world + SCALE_BYTES),
                    f"N-1 = {world - 1} owners' means of {length // world} values and their scales",
                    "the all-gather carries each owner's quantised mean of its chunk, not the whole vector: every "
                    "rank's chunks reach their owners through the all-to-all first",
                    hint="all_to_all your N quantised chunks (chunk j to rank j); all_gather only the mean of the "
                         "chunk you own.")])


compressed_all_reduce = Puzzle(
    "compressed_all_reduce", NOTEBOOK, _compressed_case, tools=(quantize, dequantize), world_sizes=(2, 3, 4, 8),
    variants=[{"bits": 8}],
    hints=["c = grad + residual. Cut it into N chunks; quantize(chunk j, bits) is what rank j receives from you. "
           "Your new residual is c minus dequantize of what you sent, chunk by chunk (torch.cat them).",
           "Stack the N int8 chunks and all_to_all_single them (and the N scales likewise): slice i of what "
           "arrives is rank i's version of your chunk. Sum their dequantized values in float64, divide by N.",
           "quantize that mean chunk, all_gather the int8 values and the scale from every rank, and dequantize "
           "each into its place: the result is the mean, in float32, equal on every rank."],
    mistakes=COMPRESSED_MISTAKES, rtol=1e-6, atol=0.0, outputs={"[0]": "the mean", "[1]": "the new residual"},
    describe="All-reduce (mean) of gradients sent as int8 with a scale per chunk, with error feedback.")


RACE_SIZES = (16, 32, 4)
# What the race shows at 2 bits (tests/test_cross_site.py holds the reference solution to it): error feedback ends
# within EF_CLOSE of float32 training's loss, and leaving it out ends at least NO_EF_WORSE above error feedback's.
EF_CLOSE, NO_EF_WORSE = 0.15, 0.30


def _race_rank(dist, fn, model, target, batches, lr: float, bits: int, feedback: bool):
    """One rank of compressed SGD on a regression: its loss before each step. fn None: a float32 all-reduce."""
    params = list(model.parameters())
    residual = torch.zeros(sum(p.numel() for p in params))
    losses = []
    for x in batches:
        model.zero_grad()
        loss = F.mse_loss(model(x), target(x).detach())
        loss.backward()
        losses.append(loss.detach())
        grad = torch.cat([p.grad.reshape(-1) for p in params])
        if fn is None:
            dist.all_reduce(grad)
            mean = grad / dist.get_world_size()
        else:
            mean, residual = fn(dist, grad, residual if feedback else torch.zeros_like(grad), bits)
        with torch.no_grad():
            for p, g in zip(params, mean.split([p.numel() for p in params])):
                p -= lr * g.view_as(p)
    return torch.stack(losses)


def compression_race(fn, steps: int = 50, world: int = 2, bits: int = 2, lr: float = 0.05, seed: int = 0,
                     show: bool = True):
    """SGD on a small regression on `world` simulated ranks, the gradients averaged by a float32 all-reduce and
    by `fn` at `bits` bits with and without error feedback: the loss curves, and the final losses (a dict, or
    None while `fn` does not run)."""
    from lib.errors import PuzzleError, raised_the_stub
    from lib.sim import run

    model = mlp(RACE_SIZES, seed=seed, dtype=torch.float32)
    target = mlp(RACE_SIZES, seed=seed + 1, dtype=torch.float32)
    shards, _ = sharded_batches(seed + 2, RACE_SIZES, world, 8, steps, dtype=torch.float32)
    batches = per_rank([[x for x, _ in rank] for rank in shards])
    runs = {"float32 all-reduce": (None, True), f"{bits}-bit, error feedback": (fn, True),
            f"{bits}-bit, no error feedback": (fn, False)}
    curves = {}
    for name, (f, feedback) in runs.items():
        try:
            with one_thread():
                result = run(_race_rank, world, f, model, target, batches, lr, bits, feedback)
        except PuzzleError as e:
            print("○ solve compressed_all_reduce first, then race." if raised_the_stub(e)
                  else f"✗ compressed_all_reduce failed here: {str(e).splitlines()[0]}")
            return None
        curves[name] = torch.stack(result.results).mean(0)
    final = {name: float(c[-10:].mean()) for name, c in curves.items()}
    base = final["float32 all-reduce"]
    print(f"{steps} SGD steps on {world} ranks, mean loss of the last 10: " + ", ".join(
        f"{name} {loss:.4f}" + ("" if name == "float32 all-reduce" else f" ({loss / base:.2f}×)")
        for name, loss in final.items()))
    kept, dropped = list(final.values())[1:]
    close = "yes" if kept <= (1 + EF_CLOSE) * base else "no"
    worse = "at least" if dropped >= (1 + NO_EF_WORSE) * kept else "less than"
    print(f"error feedback within {EF_CLOSE:.0%} of float32: {close}; without it {dropped / kept:.2f}× error "
          f"feedback's loss ({worse} {1 + NO_EF_WORSE:g}×)")
    if show:
        import matplotlib.pyplot as plt
        from IPython.display import display

        fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
        for name, c in curves.items():
            ax.plot(c.numpy(), label=name)
        ax.set(yscale="log", xlabel="step", ylabel="training loss", title=f"{bits}-bit gradients, N = {world}")
        ax.legend()
        plt.close(fig)
        display(fig)
    return final


def _powersgd_rank(dist, model, target, batches, lr: float, rank: int) -> tuple[float, float]:
    """One real rank: DDP with SGD over `batches`, float32 all-reduce then PowerSGD at `rank` (error feedback on,
    from the third step): the mean loss of the last 10 steps of each, averaged over the ranks."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel

    finals = []
    for hooked in (False, True):
        net = copy.deepcopy(model)
        ddp = DistributedDataParallel(net)
        if hooked:
            ddp.register_comm_hook(psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                                      start_powerSGD_iter=2), psgd.powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=lr)
        losses = []
        for x in batches:
            opt.zero_grad()
            loss = F.mse_loss(ddp(x), target(x).detach())
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        final = torch.stack(losses[-10:]).mean()
        dist.all_reduce(final)
        finals.append(float(final) / dist.get_world_size())
    return finals[0], finals[1]


def powersgd_on_gloo(rank: int = 1, steps: int = 50, world: int = 2, lr: float = 0.05, seed: int = 0):
    """PyTorch's PowerSGD DDP hook on `world` real processes, on compression_race's problem: its loss against
    float32 DDP's, and what each sends per step (every weight matrix of this model shrinks more than the 2× below
    which the hook would send it whole)."""
    from lib.analytic.cross_site import powersgd_values
    from lib.real.launch import launch

    model = mlp(RACE_SIZES, seed=seed, dtype=torch.float32)
    target = mlp(RACE_SIZES, seed=seed + 1, dtype=torch.float32)
    shards, _ = sharded_batches(seed + 2, RACE_SIZES, world, 8, steps, dtype=torch.float32)
    exact, compressed = launch(lambda dist: _powersgd_rank(dist, model, target, [x for x, _ in shards[dist.get_rank()]],
                                                           lr, rank), world)[0]
    params = list(model.parameters())
    values = sum(p.numel() for p in params)
    sent = sum(powersgd_values(*p.shape, rank) if p.dim() == 2 else p.numel() for p in params)
    print(f"PowerSGD at rank {rank} on {world} gloo processes: loss {compressed:.4f} against float32 DDP's "
          f"{exact:.4f} ({compressed / exact:.2f}×); per step it all-reduces {sent:,} float32 values (P and Q of "
          f"each weight matrix, the biases whole) instead of {values:,}: {values / sent:.1f}× fewer; int8 sends "
          f"4× fewer bytes")
    return exact, compressed


# ---- 3. a sharded checkpoint, loaded on another number of ranks -----------------------------------------------
STATE = ("param", "exp_avg", "exp_avg_sq")      # what each file holds per element, besides its offset and step
ITEM = 8                                        # float64
ADAM_LR = 1e-2


def _adam_run(state: dict, grads: list, first_step: int) -> dict:
    """Adam (torch.optim.Adam's update, no weight decay) on flat tensors, in place: state after len(grads) steps."""
    from puzzles.zero import adam_update

    for k, g in enumerate(grads):
        adam_update(state["param"], g, state["exp_avg"], state["exp_avg_sq"], first_step + k, ADAM_LR)
    return state


class ShardMismatch(PuzzleError):
    """A loaded shard that does not fit this rank's place in the new layout."""


def _continue_training(answer, dist, files, grads):
    """How the check runs an answer: this rank's loaded shard, then the rest of training on it (Adam is
    elementwise: each rank updates its own elements with its slice of each step's gradient)."""
    loaded = answer(files, dist.get_world_size(), dist.get_rank())
    param, exp_avg, exp_avg_sq, step = loaded
    lo, hi = shard_bounds(grads[0].numel(), dist.get_world_size(), dist.get_rank())
    for name, t in zip(STATE, loaded):
        if t.shape != (hi - lo,):
            raise ShardMismatch(f"rank {dist.get_rank()} loaded {name} of shape {tuple(t.shape)}; its shard in the "
                                f"new layout is elements [{lo}, {hi}) of {grads[0].numel()}, {hi - lo} elements, "
                                "so training cannot go on from it."
                                + _loaded_where(files, STATE.index(name), lambda r: loaded if r == dist.get_rank()
                                                else answer(files, dist.get_world_size(), r), dist.get_world_size(),
                                                dist.get_rank())
                                + "\nHint: the files were saved by another number "
                                "of ranks; compute your bounds for this world size and read them from the files "
                                "that overlap them.")
    state = {"param": param.clone(), "exp_avg": exp_avg.clone(), "exp_avg_sq": exp_avg_sq.clone()}
    _adam_run(state, [g[lo:hi] for g in grads], step + 1)
    return loaded, tuple(state[k] for k in STATE)


def _loaded_where(files: list[dict], index: int, load: Callable[[int], tuple], world: int, rank: int) -> str:
    """Which elements of the saved state this rank's wrongly sized shard holds (its values are found in the files),
    and the index mistake that puts exactly the elements the answer loads (`load(r)`) on every rank."""
    whole = torch.cat([f[STATE[index]] for f in sorted(files, key=lambda f: f["offset"])])
    place = {v: i for i, v in enumerate(whole.tolist())}

    def held(r: int) -> Optional[list[int]]:
        """The saved elements rank r's answer loads; None where it raises or loads values no file holds."""
        try:
            at = [place.get(v) for v in load(r)[index].detach().cpu().tolist()]
        except Exception:
            return None
        return None if None in at else at

    loads = {r: held(r) for r in range(world)}
    at = loads[rank]
    if not at:
        return ""
    fits = [said for said, where in _index_mistakes(files, whole.numel(), world, rank)
            if all(a == where(r) for r, a in loads.items() if a is not None)]
    said = f" Its values are elements {_runs(at)} of the saved state"
    if len(fits) > 1:
        return said + ": " + "; or ".join(fits) + " (the same elements on every rank)."
    return said + (f": {fits[0]}." if fits else ".")


def _index_mistakes(files: list[dict], total: int, world: int, rank: int) -> list[tuple[str, Callable]]:
    """Slips of indexing a sharded checkpoint, each with the saved elements it loads on rank r."""
    lo, hi = shard_bounds(total, world, rank)

    def inclusive(r: int) -> list[int]:
        a, b = shard_bounds(total, world, r)
        return list(range(a, min(b + 1, total)))

    def by_global(r: int) -> list[int]:
        a, b = shard_bounds(total, world, r)
        return [f["offset"] + i for f in sorted(files, key=lambda f: f["offset"])
                for i in range(max(a, f["offset"]), min(b, f["offset"] + len(f["param"]), len(f["param"])))]

    assumed = len(files) * len(files[0]["param"])

    def assumed_equal(r: int) -> list[int]:
        return list(range(*shard_bounds(assumed, world, r)))[:max(total - shard_bounds(assumed, world, r)[0], 0)]

    return [(f"element {hi} is one too many, the first past the shard [{lo}, {hi}): an overlap's end taken "
             "inclusive (min(hi, end) + 1), where a half-open range [a, b) stops before b", inclusive),
            (f"this rank's bounds in the layout that saved the files ({len(files)} ranks, len(files)), not in the "
             f"new one ({world} ranks)", lambda r: list(range(*shard_bounds(total, len(files), r)))),
            ("each file sliced with the global bounds, its offset never subtracted (a file's element i is element "
             "offset + i of the state: slice f[key][a - offset : b - offset])", by_global),
            (f"this rank's bounds for {assumed} elements, len(files) × the first file's length: the files are not "
             f"of equal lengths (the last is shorter), and the state's length is the sum of theirs, {total}",
             assumed_equal)]


def _runs(indices: list[int]) -> str:
    """[0, 12) and [24, 30): consecutive indices as half-open ranges."""
    runs, start = [], indices[0]
    for prev, i in zip(indices, indices[1:] + [None]):
        if i != prev + 1:
            runs.append(f"[{start}, {prev + 1})")
            start = i
    return " and ".join(runs)


def _step_explained(expected: list, got: list) -> Optional[str]:
    """The loaded step one off the saved one."""
    for rank, (e, g) in enumerate(zip(expected, got)):
        try:
            want, have = e[0][3], g[0][3]
        except (TypeError, IndexError):
            return None
        if isinstance(have, int) and have != want and abs(have - want) == 1:
            return (f"Diagnosis: rank {rank}'s loaded step is {have}, the saved step {'+' if have > want else '-'} 1: "
                    f"off by one. The files' step ({want}) counts the Adam steps already taken; return it as saved "
                    "(the next update is step + 1, which training adds itself).")
    return None


def _fewer_files(saved_on: int, error: BaseException) -> Optional[str]:
    """A list indexed past its end where fewer ranks saved the files than load them: a file read by this rank's
    number."""
    if "list index out of range" not in str(error):
        return None
    return (f"What it means: a list was read past its end. {saved_on} ranks saved these files, fewer than load them, "
            f"so files[rank] does not exist on the ranks numbered {saved_on} and up: a rank's place in the new "
            "layout is not a file. Read what every file holds alike (the step) from any file, files[0]['step'], and "
            "the tensors from the files that overlap your bounds.")


def _checkpoint_case(rng: random.Random, world: int, uneven: bool = False, fewer_files: bool = False) -> Case:
    """uneven: files and shards of unequal lengths; fewer_files: saved by fewer ranks than load them."""
    saved_on = rng.choice([n for n in (2, 3, 4, 5, 8) if (n < world if fewer_files else n != world)])
    total = rng.randint(3 * max(world, saved_on), 60)
    # uneven: a shorter last shard in the new layout (its rounding matters), and a shorter last file, short enough
    # that a total taken as the first file's length times the files moves the new shards' bounds
    while uneven and (total % world == 0 or -(-total // world) == -(-(saved_on * -(-total // saved_on)) // world)):
        total += 1
    before, after = rng.randint(1, 3), rng.randint(1, 3)
    state, gen = _adam_state(rng, total, before)
    grads = [torch.randn(total, generator=gen, dtype=torch.float64) for _ in range(after)]
    files = _files(state, saved_on, before)
    at_checkpoint = {k: t.clone() for k, t in state.items()}
    _adam_run(state, grads, before + 1)
    expected = []
    for r in range(world):
        lo, hi = shard_bounds(total, world, r)
        expected.append(((*(at_checkpoint[k][lo:hi].clone() for k in STATE), before),
                         tuple(state[k][lo:hi].clone() for k in STATE)))
    unequal = " in files of unequal lengths" if total % saved_on else ""
    return Case(world, (files, grads), expected,
                f"{total} parameters saved by {saved_on} ranks{unequal} after {before} Adam steps, loaded on {world}, "
                f"{after} more steps", budgets=[_files_read(total, world)], allowed_ops=frozenset(),
                explain=_step_explained, explain_error=functools.partial(_fewer_files, saved_on))


READ_SLACK = 0.25          # over the bytes of the files that overlap a rank's shard: a piece read twice, in part


def _files_read(total: int, world: int) -> Budget:
    """What each rank may read of the files: the part of each that overlaps its shard, for the 3 tensors. A loader
    reads every byte it copies, so this is the lesson itself: read only what the new layout puts here."""
    shards = [hi - lo for lo, hi in (shard_bounds(total, world, r) for r in range(world))]
    return Budget("argument_reads", [len(STATE) * ITEM * n * (1 + READ_SLACK) for n in shards],
                  f"the part of each file that overlaps your shard [lo, hi): {len(STATE)} tensors × hi - lo "
                  f"elements × {ITEM} bytes, + {READ_SLACK:.0%}", argument=0, label="bytes read of the files",
                  hint="read only the part of each file that overlaps your shard: slice each file first (a slice "
                       "reads nothing), then copy the slices (torch.cat, clone, copy_). Reading every file whole "
                       "(torch.cat of whole files, sliced afterwards) reads the whole checkpoint on every rank.")


def _dcp_state(dist, state: dict, zeros: bool = False) -> dict:
    """`state`'s flat tensors as DTensors sharded along dim 0 over every rank (FSDP2's layout)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    from lib.real.backends import device_mesh

    mesh = device_mesh(dist)
    return {k: distribute_tensor(torch.zeros_like(v) if zeros else v, mesh, [Shard(0)]) for k, v in state.items()}


def _dcp_save(dist, path: str, state: dict) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(_dcp_state(dist, state), checkpoint_id=path)


def _dcp_load_and_compare(dist, path: str, state: dict, files: list, fn) -> Optional[str]:
    """This rank's shard loaded by torch.distributed.checkpoint and by `fn`: what differs, or None."""
    import torch.distributed.checkpoint as dcp

    from lib.checker.compare import first_difference

    theirs = _dcp_state(dist, state, zeros=True)
    dcp.load(theirs, checkpoint_id=path)
    mine = fn(files, dist.get_world_size(), dist.get_rank())
    expected = tuple(theirs[k].to_local() for k in STATE)
    return first_difference(expected, tuple(mine[:3]), 0.0, 0.0, where=f"rank {dist.get_rank()}'s shard")


def compare_with_dcp(fn, saved_on: int = 4, world: int = 2, total: int = 25, seed: int = 0) -> bool:
    """torch.distributed.checkpoint saves a flat state sharded over `saved_on` real processes and loads it on
    `world`; `fn` loads the same state from files saved in this notebook's layout: both must give every rank the
    same shard."""
    import tempfile

    from lib.errors import raised_the_stub
    from lib.real.launch import launch

    gen = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(total, generator=gen, dtype=torch.float64) for k in STATE}
    files = [{"offset": lo, "step": 1, **{k: v[lo:hi].clone() for k, v in state.items()}}
             for lo, hi in (shard_bounds(total, saved_on, r) for r in range(saved_on))]
    with tempfile.TemporaryDirectory() as path:
        launch(_dcp_save, saved_on, path, state)
        try:
            problems = [p for p in launch(_dcp_load_and_compare, world, path, state, files, fn) if p]
        except PuzzleError as e:
            print("○ solve reshard_checkpoint first, then compare." if raised_the_stub(e)
                  else f"✗ reshard_checkpoint failed here: {str(e).splitlines()[0]}")
            return False
    if problems:
        print(f"✗ torch.distributed.checkpoint and your loader disagree: {problems[0]}")
        return False
    print(f"✓ {total} elements saved by torch.distributed.checkpoint on {saved_on} processes and loaded on {world}: "
          "every rank's shard equals yours.")
    return True


# What the check compares of a loaded shard: the answer's four results, then the state after training on from them.
LOADED_AND_TRAINED = {**{f"[0][{i}]": f"the loaded {k}" for i, k in enumerate(STATE)}, "[0][3]": "the loaded step",
                      **{f"[1][{i}]": f"{k} after training on from it" for i, k in enumerate(STATE)}}


reshard_checkpoint = Puzzle(
    "reshard_checkpoint", NOTEBOOK, _checkpoint_case, world_sizes=(2, 3, 4), harness=_continue_training,
    variants=[{"uneven": True}, {"fewer_files": True}],
    takes_dist=False, outputs=LOADED_AND_TRAINED,
    hints=["Your new shard covers elements [lo, hi) of the flat state: shard_bounds(total, world, rank) with total "
           "the sum of the files' lengths. A file covers [offset, offset + len(file['param'])).",
           "For each file that overlaps [lo, hi), take the overlap: from max(lo, offset) to min(hi, offset + "
           "length), sliced relative to the file's offset; torch.cat the pieces in order.",
           "Do the same for param, exp_avg and exp_avg_sq, and return the step of any file (they all saved "
           "the same one). No communication is needed: every rank reads the files it needs."],
    rtol=0.0, atol=0.0,
    describe="Load this rank's ZeRO-3 shard (parameters and Adam moments) from a checkpoint saved by another "
             "number of ranks.")


# ---- 4. surviving a failed rank ------------------------------------------------------------------------------
def _adam_state(rng: random.Random, total: int, before: int):
    """A flat training state after `before` Adam steps from random parameters, and a generator for more."""
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    state = {"param": torch.randn(total, generator=gen, dtype=torch.float64), **{
        k: torch.zeros(total, dtype=torch.float64) for k in STATE[1:]}}
    return _adam_run(state, [torch.randn(total, generator=gen, dtype=torch.float64) for _ in range(before)], 1), gen


def _files(state: dict, world: int, step: int) -> list[dict]:
    """The checkpoint `world` ranks save of `state`: one dict per rank, its shard of each tensor."""
    return [{"offset": lo, "step": step, **{k: state[k][lo:hi].clone() for k in STATE}}
            for lo, hi in (shard_bounds(state["param"].numel(), world, r) for r in range(world))]


@dataclasses.dataclass(frozen=True)
class ShardOfTheLiving:
    """Rank `rank`'s shard of a step's flat gradient (a StepFeed's cut), as a reduce-scatter over the ranks alive
    would hand it: among all `world` ranks, then among the survivors of rank `dead` once the rank has been told of
    the failure. A rank that kept every shard it was given still lacks most of its shard in the survivors' layout."""

    world: int
    dead: int
    rank: int

    def __call__(self, grad: torch.Tensor, failed: bool) -> torch.Tensor:
        n, me = (self.world - 1, self.rank - (self.rank > self.dead)) if failed else (self.world, self.rank)
        lo, hi = shard_bounds(grad.numel(), n, me)
        return grad[lo:hi].clone()        # a copy: a view would lead back to the whole gradient (._base)


def _survive_explained(world: int, dead: int, start: dict, grads: list, before: int, reloaded: int):
    """A survive case's explain (lib.checker.puzzle.Case), from the run's structure: the state before the failure
    (`start`,
    after `before` steps), every step's whole gradient, and the step of the last complete checkpoint (`reloaded`),
    from which the survivors train on in the layout of N - 1 ranks. A wrong result is read as a shard of another
    layout, as wrong exactly where the rank held nothing before, or as a training state that lost a part."""
    survivors = [r for r in range(world) if r != dead]
    total = start["param"].numel()
    lost = _state_lost(start, grads, before, reloaded)

    def explain(expected: list, got: list) -> Optional[str]:
        have = {r: got[r] if r < len(got) else None for r in survivors}
        if not all(isinstance(h, (tuple, list)) and len(h) == len(STATE) and all(isinstance(t, torch.Tensor)
                                                                               for t in h) for h in have.values()):
            return None
        shaped = {r: all(t.shape == e.shape for t, e in zip(have[r], expected[r])) for r in survivors}
        if not all(shaped.values()):
            return _old_shard(have, expected, world, dead, total)
        wrong = {r: [not torch.equal(t.detach().cpu(), e.cpu()) for t, e in zip(have[r], expected[r])]
                 for r in survivors}
        if not any(any(w) for w in wrong.values()):
            return None
        return _held_before_only(have, expected, world, dead, total) or next(
            (f"Diagnosis: the survivors' state is {what}." for what, state in lost
             if all(_near(t.detach().cpu(), state[k][slice(*shard_bounds(total, world - 1, survivors.index(r)))])
                    for r in survivors for t, k in zip(have[r], STATE))), None)
    return explain


def _state_lost(start: dict, grads: list, before: int, reloaded: int) -> list[tuple[str, dict]]:
    """The whole final state as training makes it with one part of Adam's state lost or miscounted, each said: the
    moments restarting from zero at the reload (a checkpoint without them), and the step count one off."""
    def trained(first_step: int, zeroed: tuple = ()) -> dict:
        state = {k: t.clone() for k, t in start.items()}
        _adam_run(state, grads[before:reloaded], before + first_step)
        for k in zeroed:
            state[k].zero_()
        return _adam_run(state, grads[reloaded:], reloaded + first_step)
    moments = " and ".join(STATE[1:])
    return [(f"what training on from the last checkpoint gives with {moments} restarted from zero: the checkpoint "
             f"must carry Adam's moments ({moments}) beside the parameters, or the reload loses them",
             trained(1, STATE[1:])),
            ("what Adam gives with its step count one behind (adam_update(..., step, lr) where step + 1 belongs): "
             "Adam counts its steps from 1, and its bias correction (1 - β^t) divides by that count", trained(0)),
            ("what Adam gives with its step count one ahead (step + 2 where step + 1 belongs): its bias correction "
             "(1 - β^t) divides by that count", trained(2))]


def _old_shard(have: dict, expected: list, world: int, dead: int, total: int) -> Optional[str]:
    """A survivor whose result has the size of its shard before the failure: it went on with what it held."""
    for r, h in have.items():
        before = shard_bounds(total, world, r)
        if h[0].shape != expected[r][0].shape and h[0].shape == (before[1] - before[0],):
            return (f"Diagnosis: rank {r} returned {h[0].numel()} elements, its shard [{before[0]}, {before[1]}) in "
                    f"the layout of {world} ranks before the failure: after rank {dead} died the survivors hold "
                    f"the state in the layout of {world - 1} rank{'s' * (world > 2)} ({expected[r][0].numel()} "
                    "elements here), so "
                    "reload the last checkpoint in that layout (reshard_checkpoint(saved, len(members), "
                    "members.index(rank))) rather than going on with the shard it held.")
    return None


def _held_before_only(have: dict, expected: list, world: int, dead: int, total: int) -> Optional[str]:
    """The survivors whose result is wrong exactly where they held nothing before the failure trained those elements
    on something other than the last checkpoint (what they kept, made-up values): whatever they used, the only state
    of those elements after the failure is in that checkpoint."""
    survivors = sorted(have)
    found = []
    for r in survivors:
        wrong = torch.zeros(expected[r][0].shape, dtype=torch.bool)
        for g, e in zip(have[r], expected[r]):
            wrong |= (g.detach().cpu() != e.cpu())
        lo, hi = shard_bounds(total, world - 1, survivors.index(r))
        old_lo, old_hi = shard_bounds(total, world, r)
        held = torch.zeros_like(wrong)
        held[max(old_lo, lo) - lo:max(min(old_hi, hi) - lo, 0)] = True
        if wrong[held].any():
            return None
        if wrong.any():
            found.append(f"rank {r}")
    if not found:
        return None
    return (f"Diagnosis: on {', '.join(found)}, exactly the elements the rank did not hold before the failure are "
            "wrong (its new shard's part that was the failed rank's or a neighbour's): after the failure their "
            "state comes only from the last complete checkpoint, which holds every rank's shard. Gradients or "
            "state a rank kept for itself cannot rebuild them: reload the checkpoint in the survivors' layout "
            "and train on from its step.")


def _survive_harness(answer, dist, files, grads, every, lr, dead, k):
    """Each rank runs the answer: in simulation the case's fault is injected by the simulator; on real processes
    lib.real.faults emulates it (the failed rank is refused its k-th call and stands by)."""
    from lib.real.faults import run_with_fault
    from lib.sim import current_rank

    if current_rank() is not None:
        try:
            return answer(dist, files, grads, every, lr)
        except RankDied as e:
            raise FailureUncaught(f"rank {current_rank()} was told of the failure by the error below, a RuntimeError, "
                                  "and it left your function: nothing around that call caught it. Catch it (try/"
                                  "except RuntimeError as e; e.rank is the rank that died) around the training and "
                                  "the checkpoints: then the survivors regroup and go on from the last checkpoint."
                                  f"\n  {e}") from None
        except Exception as e:
            caught = e.__context__
            if not isinstance(caught, RuntimeError) or isinstance(caught, RankDied):
                raise
            raise FailureUncaught(f"rank {current_rank()}'s except caught a RuntimeError that no failed rank raised: "
                                  f"torch's own, from your code ({caught}); handling it as a failure then raised "
                                  f"{type(e).__name__}: {e}. Only a RankDied (e.rank) tells of a failure: the error "
                                  "before it is your code's." + _sizes_read(str(caught), files, dist, dead)) from None
    return run_with_fault(dist, answer, dead, k, files, grads, every, lr)


def _sizes_read(error: str, files: list, dist, dead: int) -> str:
    """A size mismatch between this rank's shard before the failure and its shard among the survivors, said."""
    total, world, rank = sum(f["param"].numel() for f in files), dist.get_world_size(), dist.get_rank()
    old = shard_bounds(total, world, rank)
    new = shard_bounds(total, world - 1, rank - (rank > dead))
    held, due = old[1] - old[0], new[1] - new[0]
    if held == due or f"({held})" not in error or f"({due})" not in error:
        return ""
    return (f" {held} elements are rank {rank}'s shard in the layout of all {world} ranks, {due} its shard among the "
            "survivors: it went on in the old layout (with the shard it held, or a reload in that layout), where the "
            "last checkpoint reloaded in the survivors' layout belongs.")


class FailureUncaught(PuzzleError):
    """A survivor's function ended with the error that told it of the failure."""


def _checkpoints_at_most(limit: int, every: int) -> Contract:
    """A checkpoint every `every` steps and no more often: each one all-gathers the whole state. `limit` counts the
    checkpoints due over the run, plus the one the failure interrupts (taken again after the reload)."""
    def broken(result) -> Optional[str]:
        for s in result.stats:
            made = s.calls.get("all_gather", 0)
            if made > limit:
                return (f"rank {s.rank} all-gathered {made} times, where a checkpoint every {every} steps takes "
                        f"{limit} at the most (a checkpoint taken at the top of the loop, before the step's update, "
                        "saves again what is already saved: the first files, and the checkpoint just reloaded)")
        return None
    return Contract(f"a checkpoint every {every} steps, not more often: each one moves the whole training state",
                    broken, hint="all-gather the shards only when step % every == 0.")


CHECKPOINT_SLACK = 0.25     # over the padded shards' bytes: a checkpoint may carry a little more (a step counter)


def _checkpoints_sent(total: int, world: int, dead: int, k: int, due: int, shard: Callable[[int], int]) -> list:
    """Each rank's bytes of the checkpoints' all-gathers of param, exp_avg and exp_avg_sq, shard(n) elements a rank
    on n ranks: the first k-1 complete on all N ranks; the k-th fails (rank `dead` dies in it) and is taken again,
    with every later one, by the N-1 survivors."""
    def moved(n: int) -> float:
        return bus_factor("all_gather", n) * n * len(STATE) * shard(n) * ITEM
    return [(k - 1) * moved(world) + (0 if r == dead else (due - k + 1) * moved(world - 1)) for r in range(world)]


def _checkpoint_traffic(total: int, world: int, dead: int, k: int, due: int) -> Budget:
    """What the checkpoints move, as a floor: the smallest shard's worth (total // n elements). Without it, a run
    that sends heartbeats at the checkpoints' steps and replays every step from the first files would pass: no state
    would travel."""
    return Floor("bytes_sent", _checkpoints_sent(total, world, dead, k, due, lambda n: total // n),
                 f"{k - 1} checkpoint{'s' * (k != 2)} on {world} ranks before the failure, then {due - k + 1} on the "
                 f"{world - 1} survivor{'s' * (world > 2)}, each all-gathering the whole state: {len(STATE)} float64 "
                 "tensors of at least total // n elements per rank",
                 hint="a checkpoint all-gathers the state itself (param, exp_avg and exp_avg_sq, stacked), so that "
                      "the survivors can reload it: the survivors train on from the last checkpoint, not from the "
                      "first files.")


def _checkpoint_traffic_ceiling(total: int, world: int, dead: int, k: int, due: int) -> Budget:
    """The checkpoints' bytes as a ceiling: padded shards (ceil(total / n) elements), + CHECKPOINT_SLACK. Gradient
    shards carried along with the checkpoints (so that every rank would hold whole gradients to replay from the
    first files) are 2 or more rows beside the state's 3."""
    sent = _checkpoints_sent(total, world, dead, k, due, lambda n: -(-total // n))
    return Budget("bytes_sent", [b * (1 + CHECKPOINT_SLACK) for b in sent],
                  f"the checkpoints' all-gathers of param, exp_avg and exp_avg_sq, padded to ceil(total / n) "
                  f"elements, + {CHECKPOINT_SLACK:.0%}",
                  hint="a checkpoint carries the training state only: no gradients, nothing kept to replay from "
                       "the first files.")


def _survivors(world: int) -> str:
    return f"{world - 1} survivor{'s' * (world > 2)}"


def _survive_error(world: int, dead: int, total: int, error: BaseException) -> Optional[str]:
    """An error a survivor raised, read against the case's layouts: a shard of the layout of all N ranks (or of a
    survivor indexed by its global rank) meeting the survivors' gradient, uneven shards all-gathered unpadded, or a
    checkpoint's all-gather on the whole world after regrouping."""
    text = str(error)
    survivors = [r for r in range(world) if r != dead]

    def size(n: int, index: int) -> int:
        lo, hi = shard_bounds(total, n, index)
        return hi - lo
    met = re.search(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)", text)
    said_rank = re.match(r"rank (\d+)", text)
    rank = getattr(error, "rank", None) if hasattr(error, "rank") else int(said_rank.group(1)) if said_rank else None
    if met and rank in survivors:
        due, sizes = size(world - 1, survivors.index(rank)), {int(met.group(1)), int(met.group(2))}
        if due not in sizes or len(sizes) != 2:
            return None
        held = (sizes - {due}).pop()
        readings = [what for what, n in (
            (f"its shard in the layout of all {world} ranks (the shard it held before, one reloaded in that "
             f"layout, or a new group that still counts rank {dead}): reload the last checkpoint in the layout of "
             f"the {_survivors(world)}, reshard_checkpoint(saved, len(members), members.index(rank)), with the "
             "dead rank removed from members", size(world, rank)),
            (f"the shard of survivor number {rank} among {world - 1}, its global rank taken for its index: among the "
             f"survivors {survivors} it is number {survivors.index(rank)}, members.index(rank)",
             size(world - 1, rank) if rank < world - 1 else 0)) if n == held]
        if not readings:
            return None
        return (f"What it means: after rank {dead} failed, rank {rank}'s shard has {held} elements where the "
                f"survivors' gradient brings {due}, its shard among the {_survivors(world)}. {held} elements are "
                + " Or ".join(readings) + ".")
    gathered = re.findall(r"all_gather_single\(\((?:\d+, )*(\d+)\)", text)
    if len(gathered) == 2 and gathered[0] != gathered[1]:
        a, b = sorted(int(g) for g in gathered)
        for n in (world, world - 1):
            if {a, b} <= {size(n, i) for i in range(n)}:
                return (f"What it means: the shards are uneven ({total} elements over {n} ranks: {b} on most, {a} on "
                        f"the last), and an all-gather takes the same size from every rank: pad each shard to "
                        f"ceil(total / n) = {b} elements first, and cut each rank's part back to its shard_bounds "
                        "after.")
    if "all_gather" in text and f"world_size ({world})" in text:
        return (f"What it means: after rank {dead} failed, this all-gather ran on the whole world ({world} ranks, "
                "the dead one included) with the survivors' shards: the checkpoint's all-gather takes group= (the "
                "survivors' group from dist.new_group(members)) once the survivors have regrouped.")
    return None


def _survive_case(rng: random.Random, world: int, dead_first: bool = False) -> Case:
    # The first files are a checkpoint, as a resumed run's are: their step is a multiple of `every`, and the run ends
    # between two checkpoints. An answer that checkpoints at the top of the loop, before the step's update, then
    # saves the first files again (and the checkpoint just reloaded after the failure): more all-gathers than due.
    # Where the run began off a multiple and ended on one, its count and bytes equalled the due ones.
    total, every, checkpoints = rng.randint(3 * world, 50), rng.randint(2, 3), rng.randint(2, 4)
    before = every * rng.randint(1, 2)
    steps = every * checkpoints + rng.randint(1, every - 1)
    state, gen = _adam_state(rng, total, before)
    files = _files(state, world, before)
    start = {key: t.clone() for key, t in state.items()}
    grads = [torch.randn(total, generator=gen, dtype=torch.float64) for _ in range(before + steps)]
    _adam_run(state, grads[before:], before + 1)
    # The failure cuts the second checkpoint or a later one short: one completed before it, so that replaying from
    # the first files is not what reloading the last checkpoint would do.
    # dead_first: never the last rank, so that a survivor's global rank and its index among the survivors differ.
    dead, k = rng.randrange(world - 1 if dead_first else world), rng.randint(2, checkpoints)
    due = [t for t in range(before + 1, before + steps + 1) if t % every == 0]
    survivors = [r for r in range(world) if r != dead]
    expected = []
    for r in range(world):
        if r == dead:
            expected.append(None)
            continue
        lo, hi = shard_bounds(total, world - 1, survivors.index(r))
        expected.append(tuple(state[key][lo:hi].clone() for key in STATE))
    feeds = per_rank([StepFeed(grads, before, every, cut=ShardOfTheLiving(world, dead, r)) for r in range(world)])
    return Case(world, (files, feeds, every, ADAM_LR, dead, k), expected,
                f"{total} parameters on {world} ranks from step {before}, {steps} more steps, a checkpoint every "
                f"{every}; rank {dead} fails at its communication call #{k}", faults={dead: k},
                allowed_ops=frozenset({"all_gather"}),
                explain=_survive_explained(world, dead, start, grads, before, due[k - 2]),
                explain_error=functools.partial(_survive_error, world, dead, total),
                budgets=[budget(total, world, dead, k, len(due))
                         for budget in (_checkpoint_traffic, _checkpoint_traffic_ceiling)],
                contracts=[_checkpoints_at_most(len(due) + 1, every)])


survive_failure = Puzzle(
    "survive_failure", NOTEBOOK, _survive_case, world_sizes=(2, 3, 4), harness=_survive_harness,
    variants=[{"dead_first": True}],
    min_world_size=2, min_world_size_reason="one rank fails and at least one must survive",
    hints=["Keep `members` (the global ranks still alive, all of them at first), `group` (None, the default group, at "
           "first) and `saved` (the last complete checkpoint: `files` at first). Load your shard with "
           "reshard_checkpoint(saved, len(members), members.index(rank)) and train from step = saved[0]['step'] "
           "while step < len(grads): adam_update(param, grads(step), m, v, step + 1, lr).",
           "Checkpoint: pad param, exp_avg and exp_avg_sq to ceil(total / n) elements, torch.stack them, "
           "all_gather on `group`, and cut each rank's part back to its shard_bounds: a new list of files. Replace "
           "`saved` only once the all_gather has returned.",
           "Wrap the training in try/except RuntimeError as e: then members.remove(e.rank), group = "
           "dist.new_group(members), and go back to loading from `saved`: the steps since it are trained again, on "
           "the survivors (grads hands each its shard in the survivors' layout, from that step on)."],
    rtol=0.0, atol=0.0,
    describe="Train a sharded Adam state with checkpoints; when a rank fails, regroup the survivors, reload the last "
             "checkpoint and finish.")


# ---- 5. how far apart can datacenters be? ---------------------------------------------------------------------
WAN_LINKS = {"100 Gb/s, 10 ms (across a country)": (12.5e9, 10e-3), "10 Gb/s, 40 ms (across an ocean)": (1.25e9, 40e-3),
             "400 Gb/s, 2 ms (a metro campus)": (50e9, 2e-3)}
DERIVE = {"lib.analytic.cross_site": "lib.analytic.cross_site", "lib.sim.cost": "lib.sim.cost"}


def fewest_inner_steps(comm: float, compute: float, share: float) -> int:
    """The fewest H with comm / H <= share · compute."""
    h = max(1, math.ceil(comm / (share * compute)))
    while comm / h > share * compute:
        h += 1
    while h > 1 and comm / (h - 1) <= share * compute:
        h -= 1
    return h


def _budget_case(rng: random.Random, _world: int, size: Optional[float] = None) -> Case:
    params = (size or rng.choice([0.15e9, 1e9, 7e9, 70e9])) * rng.uniform(0.8, 1.25)
    tokens, world = rng.choice([2048, 4096, 8192]), rng.choice([2, 4, 8, 16])
    name = rng.choice(sorted(WAN_LINKS))
    bandwidth, latency = (x * rng.uniform(0.7, 1.4) for x in WAN_LINKS[name])
    flops, share = CostModel().flops_per_s * rng.uniform(0.3, 0.6), rng.choice([0.05, 0.1, 0.2])
    cost = CostModel(flops_per_s=flops, inter_site_bandwidth=bandwidth, inter_site_latency=latency,
                     ranks_per_site=world // 2)
    comm = cost.collective_time("all_reduce", 4 * params, range(world))       # the simulator's price
    h = fewest_inner_steps(comm, 6 * params * tokens / flops, share)
    return Case(1, (params, tokens, world, bandwidth, latency, flops, share), [h],
                f"{params / 1e9:.3g}B parameters, {tokens} tokens per GPU and step, {world} GPUs in 2 datacenters, "
                f"{fmt_rate(bandwidth)} and {fmt_time(latency)} between them, {flops / 1e12:.0f} TFLOP/s achieved, "
                f"communication at most {share:.0%} of compute",
                formulas={"": _inner_steps_formula(params, tokens, world, bandwidth, latency, flops, share, h)},
                mistakes=(_sites_mistake((params, tokens, world, bandwidth, latency, flops, share)),))


def _inner_steps_formula(params, tokens, world, bandwidth, latency, flops, share, expected: int) -> Formula:
    """The fewest H as named terms (lib.checker.terms): a ring all-reduce's 2(N-1) latencies and 2(N-1)/N of the float32
    pseudo-gradient's bytes, over H steps' forward and backward FLOPs; checked against the simulator's answer."""
    found = _inner_steps_terms(params, tokens, world, bandwidth, latency, flops, share)
    assert found.value == expected, (found.value, expected)
    return found


def _inner_steps_terms(params, tokens, world, bandwidth, latency, flops, share) -> Formula:
    p, t = Q("P", params, "the parameters", kind="count"), Q("tokens", tokens, "the tokens per GPU and step",
                                                             kind="count")
    comm = term("the latency (2(N-1) messages × α)", Q("2(N-1)", 2 * (world - 1), "the ring's messages one after "
                                                             "another", kind="count")
                * Q("α", latency, "the link's latency", kind="s")) \
        + term("the bytes (2(N-1)/N × 4 B × P / bandwidth)",
               Q("2(N-1)/N", 2 * (world - 1) / world, "the share of the bytes a ring all-reduce sends", kind="share",
                 alternatives=(((world - 1) / world, "(N-1)/N (what a reduce-scatter or an all-gather alone "
                                                     "sends)"),))
               * Q("4 B", 4, "a float32 value's bytes", alternatives=((2, "2 B a value (bfloat16's)"),), kind="B")
               * p / Q("B", bandwidth, "the bandwidth", kind="B/s"))
    compute = (term("the forward (2 × P × tokens)", 2 * p * t) + term("the backward (4 × P × tokens)", 4 * p * t)) \
        / Q("F", flops, "the FLOP/s achieved", kind="FLOP/s")
    return formula(maximum(1, ceil(comm / (Q("share", share, "communication's share of compute", kind="share")
                                           * compute))), "steps")


def _ring_over_the_sites(params, tokens, world, bandwidth, latency, flops, share) -> int:
    """The fewest H for a ring over the 2 datacenters, where it runs over all N GPUs."""
    return int(_inner_steps_terms(params, tokens, 2, bandwidth, latency, flops, share).value)


def _sites_mistake(args: tuple) -> Mistake:
    """A ring over the 2 datacenters, said with the slip of the formula that gives the same number on this case, if
    one does (the case cannot tell them apart)."""
    same = matches(_inner_steps_terms(*args), _ring_over_the_sites(*args))
    also = f" (on this case also what the formula gives with {same[0]})" if same else ""
    return Mistake(_ring_over_the_sites, f"a ring over the 2 datacenters gives{also}: DiLoCo's all-reduce runs over "
                   "all N GPUs (a ring of N: 2(N-1) messages and 2(N-1)/N of the bytes), every message that crosses "
                   "between them paying the wide-area link, not over 2 sites.")


inner_steps_for = Puzzle(
    "inner_steps_for", NOTEBOOK, _budget_case, world_sizes=(1,) * 6, takes_dist=False, real_cell=False,
    variants=[{"size": 0.15e9}, {"size": 70e9}],         # one where latency rules, one where bandwidth does
    off_limits=DERIVE, off_limits_advice="derive it from the ring all-reduce's cost and 6 · params · tokens",
    hints=["A step computes 6 · params · tokens FLOPs (forward and backward) at `flops` FLOP/s. DiLoCo all-reduces "
           "the float32 pseudo-gradient (4 bytes per parameter) once every H steps.",
           "A ring all-reduce over N GPUs sends 2(N-1) messages one after another and moves 2(N-1)/N of the bytes "
           "per GPU; spanning two datacenters, each message pays the wide-area latency and every byte its bandwidth.",
           "H is the smallest integer with all_reduce_time / H <= share × compute_time: math.ceil of their ratio, "
           "and at least 1."],
    describe="The fewest inner steps H for which DiLoCo's all-reduce, spread over H steps, stays within a share of "
             "the compute.")


def how_far(fn, params: float = 1e9, tokens: int = 4096, world: int = 8, share: float = 0.1) -> Optional[dict]:
    """Your `inner_steps_for` on each wide-area link of WAN_LINKS, and what it buys per step (lib.analytic.cross_site's
    times, compute at an H100's peak): {link: H}, or None while the function is a stub."""
    from lib.analytic.cross_site import Workload, step_times

    found = {}
    for name, (bandwidth, latency) in WAN_LINKS.items():
        cost = CostModel(inter_site_bandwidth=bandwidth, inter_site_latency=latency)
        try:
            h = fn(params, tokens, world, bandwidth, latency, cost.flops_per_s, share)
        except NotImplementedError:
            print("○ solve inner_steps_for first.")
            return None
        times = step_times(Workload(params, tokens, world), cost, h)
        found[name] = h
        print(f"{name:>36}: H = {h:>4}: DiLoCo {fmt_time(times[f'DiLoCo, H={h}'])} per step, data parallel "
              f"{fmt_time(times['data parallel'])}")
    return found


PUZZLES = [diloco_train, compressed_all_reduce, reshard_checkpoint, survive_failure, inner_steps_for]
