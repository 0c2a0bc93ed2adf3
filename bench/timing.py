"""Per-step wall times on real ranks, read from the batches a training function iterates over.

A benchmarked function gets its batches as `Steps`: the moment it takes each batch is recorded, so a
step's time is the gap between two takes. Set-up before the loop and clean-up after it (building
buckets, sharding, the final gather) fall outside every step, for our side and PyTorch's alike.

A solution that runs every step inside one call (its steps a number, or a list it slices) takes no batch
from `Steps`: `one_call` times its steps from the collectives it issues instead (a step ends with its last).
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


COMMUNICATION = frozenset({"all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                           "all_gather_single", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
                           "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv", "batch_isend_irecv",
                           "barrier"})


class _Paced:
    """`dist` as the solution sees it, noting when each of its communication calls returns (an asynchronous one:
    when it is posted)."""

    def __init__(self, dist) -> None:
        self._dist, self.times = dist, []

    def __getattr__(self, name: str):
        attr = getattr(self._dist, name)
        if name not in COMMUNICATION:
            return attr

        def noted(*args, **kwargs):
            out = attr(*args, **kwargs)
            self.times.append(now())
            return out
        return noted


def one_call(dist, steps: Steps, run: Callable[[Any], Any]) -> Any:
    """`run(dist)` runs all `len(steps)` steps inside one call of a solution; mark `steps` as if it had taken them
    one by one. With c communication calls per step, a step ends when its last returns (the set-up before the
    first step counts in the first step, which the benchmark drops as its warm-up); with one every g steps (a
    round: DiLoCo's outer all-reduce), each round's time is spread evenly over its g steps."""
    paced, start = _Paced(dist), now()
    out = run(paced)
    steps.marks = _marks(start, paced.times, len(steps))
    return out


def _marks(start: float, times: list[float], n: int) -> list[float]:
    c = len(times)
    if c and c % n == 0:
        return [start] + times[c // n - 1::c // n]
    if c and n % c == 0:
        g, ends = n // c, [start] + times
        return [start] + [a + (b - a) * (j + 1) / g for a, b in zip(ends, ends[1:]) for j in range(g)]
    raise ValueError(f"{n} steps made {c} communication calls: neither a whole number per step nor one per round "
                     "of a whole number of steps, so one_call cannot tell where a step ends")


def per_round(durations: Sequence[float], size: int) -> list[float]:
    """Mean time per step over each round of `size` consecutive steps (a last partial round dropped)."""
    return [sum(durations[i:i + size]) / size for i in range(0, len(durations) - size + 1, size)]


def time_on_rank(dist, sides: Sequence[tuple[Callable, Callable]], steps: int, warmup: int,
                 round_size: int = 1) -> list[list[float]]:
    """On one rank, for each side `(fn, inputs)` in turn: one run of `fn(dist, *inputs(world, rank, n))` on fresh
    inputs; its step times after the first `warmup` steps (those pay lazy set-up: DDP's bucket rebuild, FSDP's
    first all-gather plan, a pipeline's shape inference). With `round_size` > 1, `steps` and `warmup` count rounds
    of that many steps, and a round's time per step (its mean) is one sample."""
    world, rank = dist.get_world_size(), dist.get_rank()
    times = []
    for fn, inputs in sides:
        args = inputs(world, rank, (warmup + steps) * round_size)
        dist.barrier()
        fn(dist, *args)
        times.append(per_round(steps_of(args).durations(), round_size)[warmup:])
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
