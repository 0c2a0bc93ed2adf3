"""Simulated ranks: run SPMD code written against torch.distributed inside one process.

    result = lib.sim.run(ring_all_reduce, 4, lib.sim.per_rank(xs))
    result.results[r], result.stats[r].bytes_sent, result.timeline()
"""

from lib.sim.cost import CostModel
from lib.sim.context import current_rank
from lib.sim.errors import (CollectiveMismatch, Deadlock, InvalidCall, OutOfView, RankDied, SharedMemory,
                            SimTimeout)
from lib.sim.result import Event, RankStats, SimResult
from lib.sim.runtime import PerRank, per_rank, run

__all__ = ["run", "per_rank", "PerRank", "CostModel", "SimResult", "RankStats", "Event", "Deadlock",
           "CollectiveMismatch", "InvalidCall", "SimTimeout", "SharedMemory", "OutOfView", "RankDied", "current_rank"]
