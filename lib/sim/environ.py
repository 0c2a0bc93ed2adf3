"""Each simulated rank's own environment variables, as each process has its own.

Threads share `os.environ`; processes do not: a variable one rank sets is not there for the others. During a run,
`os.environ` is a view that gives each rank its own copy, made at its first use from the environment the run started
with (as a forked process inherits it) and the variables torchrun sets for each rank (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: one node, torchrun --standalone's defaults), so that a program passing
data between ranks through environment variables fails here as it would on real processes; where it reads one that
only another rank set, the KeyError says so. Outside the ranks (the scheduler, the kernel's own threads) `os.environ`
is the real one, and after the run it is the real object again, untouched by the ranks.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from contextlib import contextmanager
from typing import Iterator

from lib.sim.context import current_rank
from lib.sim.ownership import SHARE_NOTHING


class NotInThisRanksEnvironment(KeyError):
    """A rank read a variable that only another rank set: processes do not share their environment."""

    def __str__(self) -> str:
        return str(self.args[0])


class RankEnvironments(MutableMapping):
    """`os.environ` while ranks run: the real mapping for other threads, a copy-on-write one for each rank."""

    def __init__(self, real: MutableMapping, world_size: int = 1) -> None:
        self.real = real
        self.world_size = world_size
        self.own: dict[int, dict[str, str]] = {}        # rank -> its environment, made at its first use
        self.set_by: dict[str, int] = {}                # variable -> the first rank that set it

    def _mine(self) -> MutableMapping:
        rank = current_rank()
        if rank is None:
            return self.real
        mine = self.own.get(rank)
        if mine is None:
            mine = self.own[rank] = {**self.real, **torchrun_variables(rank, self.world_size)}
        return mine

    def _writable(self) -> MutableMapping:
        return self._mine()

    def __getitem__(self, key: str) -> str:
        try:
            return self._mine()[key]
        except KeyError:
            other = self.set_by.get(key)
            if other is None or other == current_rank():
                raise
            raise NotInThisRanksEnvironment(
                f"{key!r}: rank {current_rank()} read the environment variable {key!r}, which rank {other} set "
                f"during the run. Each process has its own environment: what one rank puts there is not there for "
                f"the others. {SHARE_NOTHING} Send the value with dist (a tensor), or compute it on every "
                "rank.") from None

    def __setitem__(self, key: str, value: str) -> None:
        if not (isinstance(key, str) and isinstance(value, str)):
            raise TypeError(f"str expected, not {type(key if not isinstance(key, str) else value).__name__}")
        if current_rank() is not None:
            self.set_by.setdefault(key, current_rank())
        self._writable()[key] = value

    def __delitem__(self, key: str) -> None:
        del self._writable()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._mine()))

    def __len__(self) -> int:
        return len(self._mine())

    def copy(self) -> dict:
        return dict(self._mine())

    def __repr__(self) -> str:
        return f"environ({dict(self._mine())!r})"


def torchrun_variables(rank: int, world_size: int) -> dict[str, str]:
    """What torchrun puts in the environment of rank `rank` of a one-node job."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500"}


@contextmanager
def own_environments(world_size: int = 1) -> Iterator[RankEnvironments]:
    """`os.environ` per rank for the duration of a run; the real one again afterwards, untouched by the ranks."""
    real = os.environ
    view = RankEnvironments(real, world_size)
    os.environ = view      # noqa: B003  (a view in front of the real mapping, not a new environment)
    try:
        yield view
    finally:
        os.environ = real  # noqa: B003
