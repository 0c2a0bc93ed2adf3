"""How fast a parallel plan trains a model on a cluster, and whether it fits: an estimator that explains real runs.

    from lib.planner import Model, Cluster, Plan, estimate, A100_80GB
    model = Model(layers=128, hidden=25600, heads=160, seq=2048, vocab=51200)
    cluster = Cluster(gpu=A100_80GB, gpus=3072, gpus_per_node=8)
    plan = Plan(tp=8, pp=64, dp=6, global_batch=3072, micro_batch=1, recompute="full")
    e = estimate(model, cluster, plan)   # e.step_time (s), e.memory (bytes per GPU), e.mfu, e.hfu, e.breakdown
    best_plan(model, cluster, global_batch=3072)   # the fastest plan that fits, by brute force

One fitted constant per GPU type (its efficiency, see lib.planner.hardware); everything else follows from
published formulas and datasheet bandwidths. `comparison()` lists the published runs it explains (lib.planner.runs)
next to its estimates. Units: bytes, seconds, FLOPs, FLOP/s; GB are decimal.
"""

from lib.planner.errors import PlanError
from lib.planner.estimate import Breakdown, Estimate, estimate, memory_breakdown, step_time_breakdown
from lib.planner.hardware import A100_80GB, GPU, H100_80GB, Cluster
from lib.planner.model import Model
from lib.planner.plan import Plan, check
from lib.planner.runs import PUBLISHED_RUNS, PublishedRun, comparison
from lib.planner.search import best_plan, plans

__all__ = ["Model", "Cluster", "Plan", "estimate", "A100_80GB", "H100_80GB", "GPU", "Estimate", "Breakdown",
           "PlanError", "check", "plans", "best_plan", "memory_breakdown", "step_time_breakdown", "PublishedRun",
           "PUBLISHED_RUNS", "comparison"]
