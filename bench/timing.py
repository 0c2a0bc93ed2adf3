"""Per-step wall times on real ranks, read from the batches a training function iterates over.

A benchmarked function gets its batches as `Steps`: the moment it takes each batch is recorded, so a
step's time is the gap between two takes. Set-up before the loop and clean-up after it (building
buckets, sharding, the final gather) fall outside every step, for our side and PyTorch's alike.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch


def now() -> float:
    """The time once the GPU (if this process uses one) has finished the work queued so far."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


class Steps:
    """The items a benchmarked function loops over, one per step, noting when each is taken."""

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = list(items)
        self.marks: list[float] = []

    def __iter__(self) -> Iterator[Any]:
        for item in self.items:
            self.marks.append(now())
            yield item
        self.marks.append(now())

    def __len__(self) -> int:
        return len(self.items)

    def durations(self) -> list[float]:
        """Seconds from taking each item to taking the next (or to the end of the loop)."""
        return [b - a for a, b in zip(self.marks, self.marks[1:])]

    def __deepcopy__(self, memo: dict) -> "Steps":
        """The simulator gives each rank a deep copy of its arguments: a fresh, unmarked one."""
        from copy import deepcopy
        return Steps(deepcopy(self.items, memo))


def steps_of(args: Sequence[Any]) -> Steps:
    found = [a for a in args if isinstance(a, Steps)]
    if len(found) != 1:
        raise ValueError(f"a benchmark's inputs hold exactly one Steps, found {len(found)}")
    return found[0]


def time_on_rank(dist, sides: Sequence[tuple[Callable, Callable]], steps: int, warmup: int) -> list[list[float]]:
    """On one rank, for each side `(fn, inputs)` in turn: one run of `fn(dist, *inputs(world, rank, n))` on fresh
    inputs; its step times after the first `warmup` steps (those pay lazy set-up: DDP's bucket rebuild, FSDP's
    first all-gather plan, a pipeline's shape inference)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    times = []
    for fn, inputs in sides:
        args = inputs(world, rank, warmup + steps)
        dist.barrier()
        fn(dist, *args)
        times.append(steps_of(args).durations()[warmup:])
    return times


@dataclass(frozen=True)
class Timing:
    """A step's time on the slowest rank: median, min and max over every measured step."""

    median: float
    min: float
    max: float
    samples: int

    @classmethod
    def slowest_rank(cls, runs: Sequence[Sequence[list[float]]]) -> "Timing":
        """From runs of (each rank's step times): the slowest rank's time of each step, summarised."""
        worst = [max(steps) for run in runs for steps in zip(*run)]
        return cls(statistics.median(worst), min(worst), max(worst), len(worst))

    def as_dict(self) -> dict:
        return {"median_s": self.median, "min_s": self.min, "max_s": self.max, "samples": self.samples}
