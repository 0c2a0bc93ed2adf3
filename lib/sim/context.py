"""Which simulated rank the current thread is, and its tracker: shared by the runtime and its patches."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from lib.sim.tracker import RankTracker

_local = threading.local()


def enter(rank: int, runtime, tracker: "RankTracker") -> None:
    _local.rank, _local.runtime, _local.tracker = rank, runtime, tracker


def leave() -> None:
    _local.rank = _local.runtime = _local.tracker = None


def current_rank() -> Optional[int]:
    """The simulated rank running in this thread, or None outside a simulation."""
    return getattr(_local, "rank", None)


def current_runtime():
    return getattr(_local, "runtime", None)


def current_tracker() -> Optional["RankTracker"]:
    return getattr(_local, "tracker", None)
