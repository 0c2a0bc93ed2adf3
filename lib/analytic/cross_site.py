"""Training across datacenters: the time of one inner step of data parallelism, of DiLoCo and of int8-compressed
data parallelism over a wide-area link, from lib.sim.cost's alpha-beta model (no overlap of compute and
communication). The notebook's figures, its widget and its budget puzzle all read these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lib.sim.cost import CostModel

INT8_RATIO = 4             # float32 gradients sent as int8 (per-chunk scales aside)


@dataclass(frozen=True)
class Workload:
    """One model trained on two datacenters: `params` parameters whose gradients travel in `grad_bytes` bytes
    each, `tokens` tokens per GPU and step, `world` GPUs (half in each datacenter)."""

    params: float
    tokens: int = 4096
    world: int = 2
    grad_bytes: int = 4

    def compute_time(self, cost: CostModel) -> float:
        """One step's forward and backward at the device's peak: 6 · params · tokens FLOPs (PaLM, 2022)."""
        return 6 * self.params * self.tokens / cost.flops_per_s

    def all_reduce_time(self, cost: CostModel, ratio: float = 1.0) -> float:
        """One all-reduce of every gradient (shrunk `ratio` times) across the wide-area link."""
        ranks = range(self.world)
        return cost.with_(ranks_per_site=max(1, self.world // 2)).collective_time(
            "all_reduce", self.params * self.grad_bytes / ratio, ranks)


def step_times(work: Workload, cost: CostModel, inner_steps: int) -> dict[str, float]:
    """Seconds per inner step: data parallelism all-reduces every step, int8 compression a quarter of the bytes
    every step, DiLoCo the whole model once every `inner_steps` steps."""
    compute = work.compute_time(cost)
    return {"data parallel": compute + work.all_reduce_time(cost),
            "int8 data parallel": compute + work.all_reduce_time(cost, INT8_RATIO),
            f"DiLoCo, H={inner_steps}": compute + work.all_reduce_time(cost) / inner_steps}


def inner_steps_to_hide(work: Workload, cost: CostModel, share: float = 0.1) -> int:
    """The fewest inner steps H for which DiLoCo's all-reduce, spread over H steps, costs at most `share` of the
    compute time."""
    return max(1, math.ceil(work.all_reduce_time(cost) / (share * work.compute_time(cost)) - 1e-9))


def powersgd_values(rows: int, cols: int, rank: int) -> int:
    """Values PowerSGD all-reduces for one rows × cols gradient at `rank`: P (rows × rank) and Q (cols × rank)
    (Vogels et al., 2019), against rows · cols for the gradient itself."""
    return (rows + cols) * rank


def shard_bounds(total: int, world: int, rank: int) -> tuple[int, int]:
    """ZeRO-3's flat layout (and DTensor's Shard(0)): rank r of `world` holds elements [r·s, (r+1)·s) of `total`,
    s = ceil(total / world), the last shard shorter (or empty)."""
    size = -(-total // world)
    return min(rank * size, total), min((rank + 1) * size, total)


def young_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """The checkpoint interval that wastes the least time (Young, 1974): saving costs save/τ of the run, a failure
    loses τ/2 on average, once every MTBF; their sum is least at τ = sqrt(2 · save · MTBF)."""
    return math.sqrt(2 * save_seconds * mtbf_seconds)
