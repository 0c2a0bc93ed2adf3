"""How fast the simulator answers: one check case on 8 ranks, a whole check, a ring all-reduce on 8 to 256 ranks.

    python -m bench.sim_speed

(The time of each puzzle's check cell in a notebook, first and warm, is bench.check_times.)
"""

from __future__ import annotations

import contextlib
import io
import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

import solutions.data_parallel as S
from lib import sim
from puzzles import data_parallel as P


@dataclass(frozen=True)
class SimSpeed:
    what: str
    ranks: str
    seconds: float          # median wall time
    repeats: int

    def as_dict(self) -> dict:
        return {"what": self.what, "ranks": self.ranks, "median_s": self.seconds, "repeats": self.repeats}


def _median_seconds(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(quick: bool = False) -> list[SimSpeed]:
    sim.run(lambda dist: dist.barrier(), 2)        # pay the one-time import of torch's dispatch machinery
    rows = []
    for puzzle in (P.ring_all_reduce, P.data_parallel_train, P.bucketed_data_parallel_train):
        n = max(puzzle.world_sizes)
        case = puzzle.make_case(random.Random(0), n)
        fn = getattr(S, puzzle.name)
        seconds = _median_seconds(lambda: sim.run(fn, n, *case.args, cost=case.cost), 5)
        rows.append(SimSpeed(f"{puzzle.name}, one check case", str(n), seconds, 5))
    for n, repeat in ((8, 3),) if quick else ((8, 3), (64, 3), (256, 1)):
        xs = sim.per_rank([torch.randn(n * 256) for _ in range(n)])
        seconds = _median_seconds(lambda: sim.run(S.ring_all_reduce, n, xs, timeout=600), repeat)
        rows.append(SimSpeed(f"ring_all_reduce of {n * 256:,} floats", str(n), seconds, repeat))
    puzzle = P.ring_all_reduce
    sizes = f"{min(puzzle.world_sizes)}-{max(puzzle.world_sizes)}"
    with contextlib.redirect_stdout(io.StringIO()):             # its ✓ line
        seconds = _median_seconds(lambda: puzzle.check(S.ring_all_reduce, show=False), 3)
    rows.append(SimSpeed(f"ring_all_reduce, whole check ({len(puzzle.world_sizes)} cases, in-process)", sizes,
                         seconds, 3))
    return rows


def main() -> None:
    print("| what | ranks | median wall time |\n|---|---|---|")
    for r in run():
        print(f"| {r.what} | {r.ranks} | {r.seconds * 1e3:,.0f} ms |")


if __name__ == "__main__":
    main()
