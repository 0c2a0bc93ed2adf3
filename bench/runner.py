"""Run the rows and the schedule pairs: real ranks for the times, the simulator for bytes and predictions.

Every launch comes before every simulation. A simulation's rank threads are still exiting (natively) for a
moment after `lib.sim.run` returns; a rank forked then can inherit a lock one of them holds inside MKL's
allocator and spin forever on its first matmul (seen 3 times in 10 launches right after a simulation).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from bench.rows import Impl, Pair, Row
import lib
from bench.timing import Timing, now, time_on_rank
from lib import launch, sim
from lib.formulas import bus_bandwidth
from lib.sim import CostModel

Progress = Callable[[int, int], None]          # (repeats done, repeats in all)


@dataclass(frozen=True)
class Plan:
    """How much to measure: ranks, backend, and per side `repeats` launches of `warmup + steps` steps."""

    world: int
    quick: bool
    repeats: int
    steps: int
    warmup: int = 1
    backend: Optional[str] = None
    timeout: float = 600.0


def measure(impls: Sequence[Impl], plan: Plan, progress: Progress = lambda done, total: None) -> list[Timing]:
    """Each implementation's step time on real ranks (slowest rank). One launch per repeat, fresh processes
    each time; within a launch the implementations take turns, in alternating order from one repeat to the
    next, so that a change of load on a shared machine falls on all of them."""
    sides = [(i.fn, i.setup.inputs(plan.quick)) for i in impls]
    runs: list[list] = [[] for _ in impls]            # per implementation: per repeat, per rank, step times
    progress(0, plan.repeats)
    for r in range(plan.repeats):
        order = list(range(len(sides)))[::(-1 if r % 2 else 1)]
        per_rank = launch(time_on_rank, plan.world, [sides[i] for i in order], plan.steps, plan.warmup,
                          backend=plan.backend, timeout=plan.timeout)
        for j, i in enumerate(order):
            runs[i].append([rank[j] for rank in per_rank])
        progress(r + 1, plan.repeats)
    return [Timing.slowest_rank(r) for r in runs]


_simulated: dict[tuple, tuple[float, float]] = {}


def simulate(impl: Impl, plan: Plan, cost: Optional[CostModel] = None) -> tuple[float, float]:
    """(bytes sent by the busiest rank, simulated time) of one steady step: a 2-step run minus a 1-step run,
    so that set-up and clean-up (sharding, the final gather) cancel out."""
    key = (impl.name, id(impl.setup), plan.world, plan.quick, cost)
    if key not in _simulated:
        inputs = impl.setup.inputs(plan.quick)
        runs = []
        for steps in (1, 2):
            ranks = [inputs(plan.world, r, steps) for r in range(plan.world)]
            args = [sim.per_rank([ranks[r][i] for r in range(plan.world)]) for i in range(len(ranks[0]))]
            runs.append(sim.run(impl.fn, plan.world, *args, cost=cost, timeout=plan.timeout, memory_limit=2**40))
        one, two = runs
        sent = max(b.bytes_sent - a.bytes_sent for a, b in zip(one.stats, two.stats))
        _simulated[key] = (sent, two.time - one.time)
    return _simulated[key]


@dataclass
class RowResult:
    row: Row
    ours: Timing
    theirs: Timing
    world: int
    message_bytes: Optional[int]
    bytes_sent: float = float("nan")       # per rank per step, our algorithm, from the simulator

    @property
    def ratio(self) -> float:
        return self.ours.median / self.theirs.median

    @property
    def meets(self) -> Optional[bool]:
        return None if self.row.target is None else self.ratio <= self.row.target

    def busbw(self, timing: Timing) -> Optional[float]:
        """nccl-tests' bus bandwidth of an all-reduce row, bytes per second, from the median time."""
        if self.message_bytes is None:
            return None
        return bus_bandwidth(self.message_bytes / timing.median, self.world, "all_reduce")


def measure_row(row: Row, plan: Plan, progress: Progress = lambda done, total: None) -> RowResult:
    ours, theirs = measure([row.ours, row.theirs], plan, progress)
    return RowResult(row, ours, theirs, plan.world, row.message_bytes(plan.quick))


def add_bytes(result: RowResult, plan: Plan) -> None:
    """Bytes our algorithm sends per rank and step, from a simulated run of the same inputs."""
    result.bytes_sent = simulate(result.row.ours, plan)[0]


# ---- simulator fidelity ---------------------------------------------------------------------------------
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


def _collective(dist, op: str, nbytes: int) -> Callable[[], None]:
    """One call of `op` on a message of `nbytes` (the full tensor; broadcast: every rank's 1/N share in turn, as
    ZeroRedundancyOptimizer sends the updated shards)."""
    world, where = dist.get_world_size(), lib.device()
    full, part = torch.ones(nbytes // 4, device=where), torch.ones(nbytes // 4 // world, device=where)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "reduce_scatter":      # torch 2.13's names, and the older ones (the GPU machine runs 2.11)
        return lambda: getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(part, full)
    if op == "all_gather":
        return lambda: getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(full, part)
    return lambda: [dist.broadcast(part, r) for r in range(world)]


def _median_time(dist, fn: Callable[[], object], repeat: int = 7) -> float:
    fn()
    samples = []
    for _ in range(repeat):
        dist.barrier()
        start = now()
        fn()
        samples.append(now() - start)
    return statistics.median(samples)


def _calibration_rank(dist, small: int, big: int, shape: tuple[int, int, int], seconds: float):
    """On every rank at once: matmul FLOP/s (the ranks share the machine, as in the benchmarks), then the median
    time of each collective on a big message, and of an all-reduce on a small one."""
    m, k, n = shape
    a, b = torch.randn(m, k, device=lib.device()), torch.randn(k, n, device=lib.device())
    dist.barrier()
    count, start = 0, now()
    while now() - start < seconds:
        a @ b
        count += 1
    flops = 2 * m * k * n * count / (now() - start)
    times = {op: _median_time(dist, _collective(dist, op, big)) for op in COLLECTIVES}
    times["all_reduce_small"] = _median_time(dist, _collective(dist, "all_reduce", small))
    return flops, times


@dataclass(frozen=True)
class Calibration:
    """This machine as the simulator's cost model sees it: per-rank compute speed, link latency and bandwidth;
    and the time of each collective on the big message (slowest rank's median)."""

    flops_per_s: float
    latency: float
    bandwidth: float
    matmul: tuple[int, int, int]
    messages: tuple[int, int]
    collectives: dict

    def cost(self, world: int) -> CostModel:
        return CostModel(flops_per_s=self.flops_per_s, intra_node_bandwidth=self.bandwidth,
                         inter_node_bandwidth=self.bandwidth, latency=self.latency, ranks_per_node=world)


def calibrate(plan: Plan) -> Calibration:
    """Measured on the benchmark's ranks: latency = a small all-reduce's time over its 2(N-1) steps; bandwidth
    from a big one, 2(N-1)/N · S / (t - 2(N-1) · latency), the ring all-reduce of lib.sim.cost's model."""
    small, big = (2**10, 2**20) if plan.quick else (2**10, 2**22)
    shape = (64, 128, 128) if plan.quick else (256, 512, 512)
    per_rank = launch(_calibration_rank, plan.world, small, big, shape, 0.3 if plan.quick else 1.0,
                      backend=plan.backend, timeout=plan.timeout)
    n = plan.world
    flops = statistics.median(f for f, _ in per_rank)
    times = {op: max(t[op] for _, t in per_rank) for op in per_rank[0][1]}
    steps = 2 * (n - 1)
    latency = times["all_reduce_small"] / steps if n > 1 else 1e-6
    bandwidth = 2 * (n - 1) / n * big / max(times["all_reduce"] - steps * latency, 1e-9) if n > 1 else 1e12
    return Calibration(flops, latency, bandwidth, shape, (small, big), {op: times[op] for op in COLLECTIVES})


@dataclass
class PairResult:
    pair: Pair
    a: Timing
    b: Timing
    predicted: float = float("nan")        # by the simulator with the cost model calibrated on this machine
    predicted_h100: float = float("nan")   # by the simulator with its default cost model (an H100 node)

    @property
    def measured(self) -> float:
        return self.a.median / self.b.median


def measure_pair(pair: Pair, plan: Plan, progress: Progress = lambda done, total: None) -> PairResult:
    return PairResult(pair, *measure([pair.a, pair.b], plan, progress))


def add_predictions(result: PairResult, plan: Plan, calibration: Calibration) -> None:
    def ratio(cost: Optional[CostModel]) -> float:
        return simulate(result.pair.a, plan, cost)[1] / simulate(result.pair.b, plan, cost)[1]

    result.predicted = ratio(calibration.cost(plan.world))
    result.predicted_h100 = ratio(None)
