"""Brute force over a space of plans: every plan that divides, and the fastest one that fits in memory."""

from __future__ import annotations

import itertools
import math
from typing import Iterator, Optional, Sequence

from lib.analytic.formulas import RECOMPUTE, ZERO_STAGES
from lib.planner.errors import PlanError, divisors
from lib.planner.estimate import Estimate, estimate
from lib.planner.hardware import Cluster
from lib.planner.model import Model
from lib.planner.plan import Plan, check, layer_slots

TIE = 1e-9     # relative difference in throughput below which two plans are equally fast


def _not_inside_a_check(name: str) -> None:
    """The search is a puzzle's answer key: a function under check (a simulated rank, or a real rank running the
    learner's code) must do its own. OutOfView, as for a Case built there: a PlanError would be swallowed by the
    `except PlanError` that skips plans which do not split (the course's own case builder's, or a learner's)."""
    from lib.checker import case
    from lib.sim import OutOfView, current_rank

    if current_rank() is not None or case._learner_running:
        raise OutOfView(f"{name} searches the plans for you, and this check asks you to write that search: loop over "
                        "the plans yourself and ask estimate() about each.")


def plans(model: Model, cluster: Cluster, global_batch: int, *, tp: Optional[Sequence[int]] = None,
          pp: Optional[Sequence[int]] = None, virtual_stages: Optional[Sequence[int]] = None,
          zero: Sequence[int] = ZERO_STAGES, micro_batch: Optional[Sequence[int]] = None,
          recompute: Sequence[str] = RECOMPUTE, **fixed) -> Iterator[Plan]:
    """Every plan of a space that passes `check`, dp filling the cluster. By default tp, pp, virtual_stages and
    micro_batch take every value that divides; pass a sequence to narrow a dimension, and other Plan fields
    (cp=2, sequence_parallel=True) to fix them. Order: tp, pp, virtual_stages, zero, micro_batch, recompute."""
    _not_inside_a_check("plans")
    cp, slots = fixed.get("cp", 1), layer_slots(model, fixed.get("embedding_as_layer", False))
    for t, p in itertools.product(tp or divisors(cluster.gpus_per_node, cluster.gpus_per_node),
                                  pp or divisors(slots, cluster.gpus)):
        dp, rest = divmod(cluster.gpus, t * cp * p)
        if rest or dp == 0 or global_batch % dp:
            continue
        vs = virtual_stages or (divisors(slots // p, slots) if p > 1 and slots % p == 0 else [1])
        for v, z, b, r in itertools.product(vs, zero, micro_batch or divisors(global_batch // dp, global_batch),
                                            recompute):
            plan = Plan(tp=t, pp=p, dp=dp, global_batch=global_batch, micro_batch=b, recompute=r,
                        virtual_stages=v, zero=z, **fixed)
            try:
                check(model, cluster, plan)
            except PlanError:
                continue
            yield plan


RANKINGS = ("tokens_per_second", "mfu", "hfu")


def best_plan(model: Model, cluster: Cluster, global_batch: int, *, by: str = "tokens_per_second",
              **space) -> Estimate:
    """The estimate of the fastest plan (tokens per second) that fits in memory. Plans within a relative 1e-9 of
    the fastest tie, and the first of them in the order of `plans` wins: the simplest. `space` narrows the search
    as `plans` takes it; PlanError if nothing fits. by="hfu" ranks by hardware FLOPs utilisation instead: the
    plan a search misled by recomputation's FLOPs picks (by="mfu" ranks as tokens per second do)."""
    return top(fitting_plans(model, cluster, global_batch, **space), by)


def fitting_plans(model: Model, cluster: Cluster, global_batch: int, **space) -> list[Estimate]:
    """The estimates of the plans of a space (as `plans` takes it) that fit in memory, in the order of `plans`;
    PlanError if none does."""
    _not_inside_a_check("fitting_plans")
    fitting = [e for e in (estimate(model, cluster, plan) for plan in plans(model, cluster, global_batch, **space))
               if e.fits]
    if not fitting:
        raise PlanError(f"no plan of this space fits in the {cluster.gpu.memory / 1e9:g} GB of an {cluster.gpu.name}: "
                        f"allow recomputation, a higher ZeRO stage, smaller micro-batches or more GPUs")
    return fitting


def top(estimates: Sequence[Estimate], by: str = "tokens_per_second") -> Estimate:
    """The first of `estimates` within a relative 1e-9 of the highest `by` (a field of Estimate, one of RANKINGS)."""
    if by not in RANKINGS:
        raise PlanError(f"by must be one of {', '.join(RANKINGS)}, got {by!r}")
    highest = max(getattr(e, by) for e in estimates)
    return next(e for e in estimates if math.isclose(getattr(e, by), highest, rel_tol=TIE))
