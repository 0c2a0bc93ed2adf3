"""The simulator's injected fault (`lib.sim.run(..., faults={rank: k})`) emulated on real processes, so that a
puzzle about surviving a failure has a real cell too.

Real torch.distributed cannot lose a process and go on: the group is broken, gloo raises "Connection closed by
peer" and NCCL hangs until its timeout, and torchrun (TorchElastic) restarts the whole job. Here the failed rank
stays alive as a bystander instead: its function stops at its k-th communication call, and it only joins the
survivors' `new_group` call, which torch requires of every process. The other ranks' calls on the default group
from their own k-th on raise RankDied, as the simulator's do. This holds for SPMD code whose ranks make the same
communication calls in the same order, so that the failed rank's k-th call is everyone's.
"""

from __future__ import annotations

from typing import Any, Callable

from lib.sim.errors import RankDied

COMMUNICATION = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
                 "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single", "broadcast",
                 "reduce", "gather", "scatter", "barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv")


_TOLD = [False]          # this real process: whether an emulated failure has been raised to its rank


def failure_known() -> bool:
    """Whether this rank has been told that a peer failed (a RankDied raised to it), in a simulated rank or on a
    real process: what it learns then, and not before, may depend on it (a feed's survivors' layout)."""
    from lib.sim.context import current_rank, current_runtime

    runtime = current_runtime()
    if runtime is not None and current_rank() is not None:
        return runtime.ranks[current_rank()].told_of_failure
    return _TOLD[0]


class Died(BaseException):
    """Unwinds the failed rank's function at its k-th call (BaseException: the function cannot catch it)."""


def faulty_dist(dist: Any, dead: int, k: int) -> Any:
    """`dist` (torch.distributed) for one real rank of a run where rank `dead` fails at its k-th communication
    call; every other attribute is torch.distributed's own. As the simulator's dist keeps its engine out of reach,
    the real module and the count live in this closure only: the object has no attribute holding them, no __dict__,
    and names starting with _ are refused."""
    calls = 0

    def watched(name: str, target: Callable) -> Callable:
        def call(*args, **kwargs):
            nonlocal calls
            calls += 1
            rank = dist.get_rank()
            if rank == dead and calls == k:
                raise Died()
            group = kwargs.get("group", next((a for a in args if isinstance(a, dist.ProcessGroup)), None))
            if rank != dead and calls >= k and group is None:
                _TOLD[0] = True
                raise RankDied(dead, f"rank {rank}'s {name} needs rank {dead}, which died at its communication "
                                     f"call #{k} (an emulated fault).")
            return target(*args, **kwargs)
        call.__name__ = call.__qualname__ = name
        return call

    class FaultyDist:
        __slots__ = ()

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_"):
                raise AttributeError(f"dist has no attribute {name!r}: behind it is the real torch.distributed, "
                                     "with a failure emulated for this run, not the function's to reach.\nHint: use "
                                     "dist's public calls, as torch.distributed has them.")
            target = getattr(dist, name)
            return watched(name, target) if name in COMMUNICATION else target

        def __repr__(self) -> str:
            return f"<torch.distributed, rank {dead} failing at its communication call #{k}>"

    return FaultyDist()


def run_with_fault(dist: Any, fn: Callable, dead: int, k: int, *args) -> Any:
    """`fn(dist, *args)` on this real rank with the fault emulated; the failed rank returns None after joining
    the survivors' group, as the simulator's does."""
    _TOLD[0] = False
    try:
        return fn(faulty_dist(dist, dead, k), *args)
    except Died:
        dist.new_group([r for r in range(dist.get_world_size()) if r != dead])
        return None
