"""The reference solutions over many seeds: each must pass every case of every seed, and how close it comes to each
budget tells how much room a right answer unlike it has.

    python -m bench.seed_sweep [puzzle ...] [--seeds K] [--margins]

For each puzzle (all of them when none is named): how many of seeds 0..K-1 its reference solution passes, the first
failures' messages, and with --margins, per budget, the largest share of its limit the reference used over every case
of every seed (for a floor, the limit's share of what it measured: 1.0 is on the line either way). Run by hand after
changing a puzzle's cases or budgets; it takes minutes, not seconds.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Optional, Sequence

import puzzles
from lib.checker.puzzle import Budget, Puzzle, one_thread
from lib.sim import run


def _used(budget: Budget, result, rank: Optional[int]) -> float:
    """The share of `budget`'s limit a run used (a floor: the limit's share of the measure)."""
    if budget.metric == "time":
        value, limit = result.time, budget.limit_for(0)
    else:
        stats = result.stats[rank]
        value, limit = budget.value(stats), budget.limit_for(rank)
    if budget.least:
        return limit / max(value, 1e-30)
    return value / max(limit, 1e-30)


def margins(puzzle: Puzzle, solution, seed: int, worst: dict[str, float]) -> None:
    """Run every case of `seed` and keep, per budget (by its name and floor or ceiling), the largest share used."""
    for case in puzzle.cases(seed):
        if case.raises is not None:
            continue
        with one_thread():
            result = run(puzzle.wrap(solution), case.world_size, *case.args, cost=case.cost, protect=case.expected,
                         faults=case.faults, read_arguments=any(b.metric == "argument_reads" for b in case.budgets))
        for b in case.budgets:
            key = f"{b.name} {'floor' if b.least else 'ceiling'}"
            ranks = [None] if b.metric == "time" else range(result.world_size)
            worst[key] = max([worst.get(key, 0.0)] + [_used(b, result, r) for r in ranks])


def sweep(puzzle: Puzzle, seeds: int, with_margins: bool) -> None:
    solution = getattr(importlib.import_module(f"solutions.{puzzle.module}"), puzzle.name)
    failures, worst = [], {}
    for seed in range(seeds):
        outcome = puzzle.evaluate(solution, seed=seed)
        if not outcome.ok:
            failures.append((seed, outcome.message.splitlines()[0]))
        if with_margins:
            margins(puzzle, solution, seed, worst)
    print(f"{puzzle.name}: the reference passes {seeds - len(failures)} of {seeds} seeds")
    for seed, message in failures[:3]:
        print(f"    seed {seed}: {message[:300]}")
    for key, share in sorted(worst.items()):
        print(f"    {key}: at most {share:.3f} of its limit")


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("puzzles", nargs="*", help="puzzle names (default: every puzzle)")
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--margins", action="store_true", help="also each budget's largest share used")
    args = parser.parse_args(argv)
    by_name = {p.name: p for p in puzzles.ALL}
    unknown = [n for n in args.puzzles if n not in by_name]
    if unknown:
        parser.error(f"unknown puzzle(s): {', '.join(unknown)}")
    for name in args.puzzles or list(by_name):
        sweep(by_name[name], args.seeds, args.margins)


if __name__ == "__main__":
    main()
