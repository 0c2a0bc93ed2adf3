"""Each simulated rank's own environment variables, as each process has its own.

Threads share `os.environ`; processes do not: a variable one rank sets is not there for the others. During a run,
`os.environ` is a view that gives each rank its own copy, made at its first change from the environment the run
started with (as a forked process inherits it), so that a program passing data between ranks through environment
variables fails here as it would on real processes; where it reads one that only another rank set, the KeyError
says so. Outside the ranks (the scheduler, the kernel's own threads) `os.environ` is the real one, and after the
run it is the real object again, untouched by the ranks.
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

    def __init__(self, real: MutableMapping) -> None:
        self.real = real
        self.own: dict[int, dict[str, str]] = {}        # rank -> its environment, once it changed it
        self.set_by: dict[str, int] = {}                # variable -> the first rank that set it

    def _mine(self) -> MutableMapping:
        rank = current_rank()
        return self.real if rank is None else self.own.get(rank, self.real)

    def _writable(self) -> MutableMapping:
        rank = current_rank()
        return self.real if rank is None else self.own.setdefault(rank, dict(self.real))

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


@contextmanager
def own_environments() -> Iterator[RankEnvironments]:
    """`os.environ` per rank for the duration of a run; the real one again afterwards, untouched by the ranks."""
    real = os.environ
    view = RankEnvironments(real)
    os.environ = view      # noqa: B003  (a view in front of the real mapping, not a new environment)
    try:
        yield view
    finally:
        os.environ = real  # noqa: B003
