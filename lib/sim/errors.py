"""Errors of simulated runs: each names the ranks involved and says how to fix it."""

from __future__ import annotations

from typing import Optional

from lib.errors import PuzzleError


class Deadlock(PuzzleError):
    """Every live rank is blocked and none can proceed; the message lists who waits on whom. `waits` holds, for each
    rank blocked in a receive from a named peer, (rank, peer, which message from that peer it waits for (1 = the
    first), how many the peer has sent it, how many it has sent the peer): what a case's names for its messages
    read a schedule's mistake from. `unreceived` holds (src, dst) for each send posted and not yet received.
    `posted` counts the point-to-point calls each rank posted, {(rank, peer, "send" or "recv"): how many}: how far
    each rank went in its schedule before it stopped."""

    def __init__(self, message: str, waits: tuple = (), unreceived: frozenset = frozenset(),
                 posted: Optional[dict] = None) -> None:
        super().__init__(message)
        self.waits = waits
        self.unreceived = unreceived
        self.posted = dict(posted or {})


class CollectiveMismatch(PuzzleError):
    """Ranks disagree: different collectives, shapes or dtypes, or a message never received."""


class InvalidCall(PuzzleError):
    """One rank called a `dist` function with arguments torch.distributed would reject."""


class SimTimeout(PuzzleError):
    """A rank ran past the time limit without communicating or returning (an endless loop?)."""


class SharedMemory(PuzzleError):
    """A rank touched memory another rank made, or wrote into memory made before the run: in real
    processes ranks share nothing, so the program would behave differently there."""


class OutOfView(PuzzleError):
    """A rank moved memory or work where the simulator cannot measure it (numpy, pickled bytes, a thread
    of its own, dispatch switched off): its budgets would be meaningless."""


class RankDied(RuntimeError):
    """A peer of this call died (a fault injected with `run(..., faults=...)`): what NCCL and gloo report as a
    broken connection. A RuntimeError, as torch.distributed's own errors are, so a rank can catch it."""

    def __init__(self, dead: int, message: str) -> None:
        super().__init__(message)
        self.rank = dead
