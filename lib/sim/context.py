"""Which simulated rank the current thread is, and the engine's handles to it: shared by the runtime and its patches.

A rank is known by the thread the runtime started for it, which its code cannot change: the scheduler admits each
rank's thread before the rank's code runs and dismisses it once the thread has ended, and admitting or dismissing
from a rank's own thread is refused, so a rank cannot leave its rank and switch off the guards that ask
`current_rank()`. The engine's handles (the runtime, the rank's tracker: every meter, every rank's inputs) go to the
engine's code only; a rank may read its own clock and FLOPs as numbers.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, NamedTuple, Optional

from lib.sim.errors import OutOfView
from lib.sim.ownership import learner_line
from lib.whose_code import ENGINE

if TYPE_CHECKING:
    from lib.sim.tracker import RankTracker

_getframe = sys._getframe           # the original, before lib.guard.boundary guards it
_get_ident = threading.get_ident


class _Rank(NamedTuple):
    rank: int
    runtime: object
    tracker: "RankTracker"


_ranks: dict[int, _Rank] = {}       # thread id -> the rank it runs


def admit(thread: threading.Thread, rank: int, runtime, tracker: "RankTracker") -> None:
    """From the scheduler: `thread` (started, not yet running the rank's code) is rank `rank` of `runtime`."""
    _refuse_on_a_rank("admit a thread as a rank")
    _ranks[thread.ident] = _Rank(rank, runtime, tracker)


def dismiss(thread: threading.Thread) -> None:
    """From the scheduler, once `thread` has ended: it is no rank any more."""
    _refuse_on_a_rank("dismiss a rank's thread")
    _ranks.pop(thread.ident, None)


def current_rank() -> Optional[int]:
    """The simulated rank running in this thread, or None outside a simulation."""
    here = _ranks.get(_get_ident())
    return None if here is None else here.rank


def current_runtime():
    """The runtime of this thread's rank, for the engine's code only (None outside a simulation)."""
    here = _ranks.get(_get_ident())
    if here is None:
        return None
    _refuse_to_the_rank(here, "lib.sim.context.current_runtime()")
    return here.runtime


def current_tracker() -> Optional["RankTracker"]:
    """The tracker (memory, FLOPs, reads) of this thread's rank, for the engine's code only."""
    here = _ranks.get(_get_ident())
    if here is None:
        return None
    _refuse_to_the_rank(here, "lib.sim.context.current_tracker()")
    return here.tracker


def fail_run(error: Exception) -> None:
    """Stop the simulated run of this thread's rank with `error` (the rank's code cannot catch it); outside a run,
    raise it."""
    runtime = current_runtime()
    if runtime is None:
        raise error
    runtime.fail(error)


def clock() -> float:
    """This rank's simulated clock, in seconds: a number to read, not the meter."""
    here = _here()
    return here.runtime.ranks[here.rank].clock


def flops() -> float:
    """The FLOPs this rank has counted so far: a number to read, not the meter."""
    return _here().tracker.flops


def memory_mark() -> int:
    """Where this rank's memory timeline is now: the index its next sample takes in RankStats.memory, for code that
    measures a phase of a run between two marks. A number to read, not the meter."""
    return len(_here().tracker.samples)


def _here() -> _Rank:
    here = _ranks.get(_get_ident())
    if here is None:
        raise LookupError("this thread runs no simulated rank: ask inside a function that lib.sim.run runs.")
    return here


_HANDLES = ("the simulator's runtime and the rank's tracker hold every rank's inputs and the rank's meters (memory, "
            "FLOPs, bytes sent, clock), which the check reads: not the rank's to read or change.\nHint: compute with "
            "torch's ordinary ops and dist's calls; the check measures them.")


def _refuse_to_the_rank(here: _Rank, what: str) -> None:
    """Stop the rank when the code asking for `what` (two frames up) is not the engine's."""
    if not _getframe(2).f_code.co_filename.startswith(ENGINE):
        here.runtime.fail(OutOfView(f"rank {here.rank} called {what}{learner_line()}: {_HANDLES}"))


def _refuse_on_a_rank(what: str) -> None:
    here = _ranks.get(_get_ident())
    if here is not None:
        here.runtime.fail(OutOfView(
            f"rank {here.rank} tried to {what}{learner_line()}: which rank a thread runs is the simulator's to say, "
            "and a rank that left its rank would switch off the rules every rank runs under.\nHint: use only the "
            "arguments your function receives and dist's calls."))
