"""How fast the simulator answers: one check case on 8 ranks, and a ring all-reduce on 64.

    python -m bench.sim_speed
"""

from __future__ import annotations

import random
import statistics
import time

import torch

import solutions.data_parallel as S
from lib import sim
from puzzles import data_parallel as P


def _median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    sim.run(lambda dist: dist.barrier(), 2)        # pay the one-time import of torch's dispatch machinery
    rows = []
    for puzzle, n in ((P.ring_all_reduce, 8), (P.data_parallel_train, 8), (P.bucketed_data_parallel_train, 8)):
        case = puzzle.make_case(random.Random(0), n)
        fn = getattr(S, puzzle.name)
        rows.append((f"{puzzle.name}, one case", n, _median_seconds(lambda: sim.run(fn, n, *case.args, cost=case.cost), 5)))
    for n in (8, 64):
        xs = sim.per_rank([torch.randn(n * 256) for _ in range(n)])
        rows.append((f"ring_all_reduce of {n * 256} floats", n, _median_seconds(lambda: sim.run(S.ring_all_reduce, n, xs), 3)))
    puzzle = P.ring_all_reduce
    rows.append(("ring_all_reduce, whole check (5 cases)", "2-8",
                 _median_seconds(lambda: puzzle.check(S.ring_all_reduce, show=False), 3)))
    print("| what | ranks | median wall time |\n|---|---|---|")
    for what, n, seconds in rows:
        print(f"| {what} | {n} | {seconds * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
