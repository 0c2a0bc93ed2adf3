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
from lib.analytic.formulas import bus_bandwidth
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
    (round_size,) = {i.setup.round_size(plan.quick) for i in impls}
    runs: list[list] = [[] for _ in impls]            # per implementation: per repeat, per rank, step times
    progress(0, plan.repeats)
    for r in range(plan.repeats):
        order = list(range(len(sides)))[::(-1 if r % 2 else 1)]
        per_rank = launch(time_on_rank, plan.world, [sides[i] for i in order], plan.steps, plan.warmup, round_size,
                          backend=plan.backend, timeout=plan.timeout)
        for j, i in enumerate(order):
            runs[i].append([rank[j] for rank in per_rank])
        progress(r + 1, plan.repeats)
    return [Timing.slowest_rank(r) for r in runs]


_simulated: dict[tuple, tuple[float, float]] = {}


def simulate(impl: Impl, plan: Plan, cost: Optional[CostModel] = None) -> tuple[float, float]:
    """(bytes sent by the busiest rank, simulated time) of one steady step: a 2-step run minus a 1-step run,
    so that set-up and clean-up (sharding, the final gather) cancel out; where steps come in rounds (DiLoCo's),
    2 rounds minus 1, over the steps of a round."""
    key = (impl.name, id(impl.setup), plan.world, plan.quick, cost)
    if key not in _simulated:
        inputs, size = impl.setup.inputs(plan.quick), impl.setup.round_size(plan.quick)
        runs = []
        for steps in (size, 2 * size):
            ranks = [inputs(plan.world, r, steps) for r in range(plan.world)]
            args = [sim.per_rank([ranks[r][i] for r in range(plan.world)]) for i in range(len(ranks[0]))]
            runs.append(sim.run(impl.fn, plan.world, *args, cost=cost, timeout=plan.timeout, memory_limit=2**40))
        one, two = runs
        sent = max(b.bytes_sent - a.bytes_sent for a, b in zip(one.stats, two.stats))
        _simulated[key] = (sent / size, (two.time - one.time) / size)
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


def _calibration_rank(dist, small: int, big: int, shape: tuple[int, int, int], elements: int, seconds: float):
    """On every rank at once (the ranks share the machine, as in the benchmarks): matmul FLOP/s, memory
    bandwidth as the simulator's roofline counts it (an elementwise add reads two tensors, writes a third),
    then the median time of each collective on a big message, and of an all-reduce on a small one."""
    m, k, n = shape
    a, b = torch.randn(m, k, device=lib.device()), torch.randn(k, n, device=lib.device())
    x, y = torch.randn(elements, device=lib.device()), torch.randn(elements, device=lib.device())
    dist.barrier()
    flops = 2 * m * k * n / _per_call(lambda: a @ b, seconds)
    bandwidth = 3 * x.nbytes / _per_call(lambda: x + y, seconds)
    times = {op: _median_time(dist, _collective(dist, op, big)) for op in COLLECTIVES}
    times["all_reduce_small"] = _median_time(dist, _collective(dist, "all_reduce", small))
    return flops, bandwidth, times


def _per_call(fn: Callable[[], object], seconds: float) -> float:
    """Seconds per call of `fn`, called repeatedly for about `seconds`."""
    count, start = 0, now()
    while now() - start < seconds:
        fn()
        count += 1
    return (now() - start) / count


@dataclass(frozen=True)
class Calibration:
    """This machine as the simulator's cost model sees it: per-rank compute speed and memory bandwidth, link
    latency and bandwidth; and the time of each collective on the big message (slowest rank's median)."""

    flops_per_s: float
    memory_bandwidth: float
    latency: float
    bandwidth: float
    matmul: tuple[int, int, int]
    messages: tuple[int, int]
    collectives: dict

    def cost(self, world: int) -> CostModel:
        return CostModel(flops_per_s=self.flops_per_s, memory_bandwidth=self.memory_bandwidth,
                         intra_node_bandwidth=self.bandwidth, inter_node_bandwidth=self.bandwidth,
                         latency=self.latency, ranks_per_node=world)


def alpha_beta(world: int, small: int, t_small: float, big: int, t_big: float) -> tuple[float, float]:
    """(latency, bandwidth) of lib.sim.cost's ring all-reduce, t(S) = 2(N-1)·latency + 2(N-1)/N·S/bandwidth,
    through the times of a small and a big message; each kept positive on a noisy machine."""
    if world < 2:
        return 1e-6, 1e12
    steps, share = 2 * (world - 1), 2 * (world - 1) / world
    bandwidth = share * (big - small) / max(t_big - t_small, t_big * 1e-3)
    latency = max(t_small - share * small / bandwidth, t_small * 1e-3) / steps
    return latency, bandwidth


def calibrate(plan: Plan) -> Calibration:
    """Measured on the benchmark's ranks: the cost model's latency and bandwidth from a small and a big
    all-reduce (`alpha_beta`), compute and memory speed from a matmul and an elementwise add."""
    small, big = (2**10, 2**20) if plan.quick else (2**10, 2**22)
    shape = (64, 128, 128) if plan.quick else (256, 512, 512)
    elements = 2**18 if plan.quick else 2**22
    per_rank = launch(_calibration_rank, plan.world, small, big, shape, elements, 0.3 if plan.quick else 1.0,
                      backend=plan.backend, timeout=plan.timeout)
    flops = statistics.median(f for f, _, _ in per_rank)
    memory = statistics.median(b for _, b, _ in per_rank)
    times = {op: max(t[op] for _, _, t in per_rank) for op in per_rank[0][2]}
    latency, bandwidth = alpha_beta(plan.world, small, times["all_reduce_small"], big, times["all_reduce"])
    return Calibration(flops, memory, latency, bandwidth, shape, (small, big), {op: times[op] for op in COLLECTIVES})


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
