"""Notebook 09, beyond one cluster: the puzzles, their inputs, references and budgets.

DiLoCo (Douillard et al. 2023) and compressed all-reduce with error feedback. Each check compares with a
single-process reference of the algorithm on the same data, and bounds the bytes (and, across two datacenters, the
simulated time) by the algorithm's formula for the case at hand.
"""

from __future__ import annotations

import copy
import math
import random

import torch
import torch.nn.functional as F

from lib.check import Budget, Case, Puzzle
from lib.diagnose import Mistake
from lib.first_use import import_ahead
from lib.measure import counted_time
from lib.models import mlp, param_bytes, sharded_batches
from lib.sim import CostModel, per_rank
from lib.sim.cost import bus_factor
from lib.units import fmt_bytes, fmt_rate, fmt_time
from lib.viz.timeline import training_display

import_ahead("optimizer")

NOTEBOOK = "09_beyond_one_cluster"
SIZES = (8, 16, 16, 4)
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9          # DiLoCo's outer Nesterov SGD (Douillard et al. 2023, section 3)
# Two datacenters joined by a wide-area link: 100 Gb/s per GPU and 10 ms per message (CostModel's defaults).
WAN = CostModel()
TIME_SLACK = 1.5             # over compute + one WAN all-reduce per round: room for copies and the outer step


def two_datacenters(world: int, cost: CostModel = WAN) -> CostModel:
    """`cost` with the ranks split into two datacenters (the first ceil(N/2) ranks in one, the rest in the other)."""
    return cost.with_(ranks_per_site=math.ceil(world / 2))


# ---- 1. DiLoCo --------------------------------------------------------------------------------------------
def diloco_reference(model, shards, inner_steps: int, inner_lr: float, outer_lr: float, momentum: float,
                     sign: float = 1.0, outer_steps_per_round: int = 1):
    """DiLoCo in one process, worker after worker in rank order: H AdamW steps each (every worker keeps its
    AdamW state), the pseudo-gradient (start - local) averaged, one Nesterov SGD step. (A known mistake passes
    `sign` = -1, or takes the outer step `outer_steps_per_round` times.)"""
    start = copy.deepcopy(model)
    workers = [copy.deepcopy(model) for _ in shards]
    inner = [torch.optim.AdamW(w.parameters(), lr=inner_lr) for w in workers]
    outer = torch.optim.SGD(start.parameters(), lr=outer_lr, momentum=momentum, nesterov=True)
    for round_ in range(len(shards[0]) // inner_steps):
        for worker, opt, batches in zip(workers, inner, shards):
            for x, y in batches[round_ * inner_steps:(round_ + 1) * inner_steps]:
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
                    q.copy_(p)
    return start


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
    _diloco_mistake("the pseudo-gradient has the wrong sign: it is start - local (the way the inner steps went, "
                    "backwards, like a gradient), not local - start.", sign=-1.0),
    _diloco_mistake("the outer step was taken once per inner step (H times per round) with the same "
                    "pseudo-gradient: the outer momentum must advance once per round.", per_inner_step=True),
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
            Budget("bytes_sent", rounds * per_round, why, least=True,
                   hint="each worker trains on its own batches; what travels is the pseudo-gradient, once per "
                        "round."),
            Budget("time", TIME_SLACK * (compute + rounds * wan),
                   f"{TIME_SLACK} × ({fmt_time(compute)} of compute + {rounds} all-reduces across the datacenters' "
                   f"{fmt_rate(cost.inter_site_bandwidth)}, {fmt_time(cost.inter_site_latency)} link, "
                   f"{fmt_time(wan)} each); data parallelism would take {fmt_time(ddp_time)}",
                   hint="every message across the wide-area link pays its latency: all-reduce the pseudo-gradients "
                        "of all parameters as one flat tensor (torch.cat), once per round.")]


def _diloco_case(rng: random.Random, world: int) -> Case:
    model = mlp(SIZES, seed=rng.randrange(2**31))
    inner_steps, rounds, local = rng.randint(2, 4), rng.randint(2, 3), rng.randint(2, 5)
    inner_lr = rng.choice([1e-2, 3e-2])
    outer_lr, momentum = (OUTER_LR, OUTER_MOMENTUM) if rng.random() < 0.5 else (rng.uniform(0.3, 1.0), 0.8)
    shards, _ = sharded_batches(rng.randrange(2**31), SIZES, world, local, rounds * inner_steps)
    cost = two_datacenters(world)
    expected, compute = counted_time(
        lambda: diloco_reference(model, shards, inner_steps, inner_lr, outer_lr, momentum), cost)
    return Case(world, (model, per_rank(shards), inner_steps, inner_lr, outer_lr, momentum), [expected] * world,
                f"N={world} workers in 2 datacenters, H={inner_steps} inner steps × {rounds} rounds of {local} "
                f"samples, inner lr {inner_lr:g}, outer lr {outer_lr:.3g}, momentum {momentum:g}",
                budgets=_diloco_budgets(model, world, rounds, inner_steps, cost, compute / world), cost=cost,
                allowed_ops=frozenset({"all_reduce"}))


def _diloco_display(case: Case) -> tuple[CostModel, str]:
    cost, note = training_display(case, cost=case.cost)
    return cost, (f"{note}; two datacenters joined by {fmt_rate(case.cost.inter_site_bandwidth)} per GPU, "
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
    mistakes=DILOCO_MISTAKES, rtol=1e-9, atol=1e-11, display=_diloco_display,
    describe="Train with DiLoCo: H inner AdamW steps per worker, then one outer Nesterov step on the averaged "
             "pseudo-gradient.")


PUZZLES = [diloco_train]
