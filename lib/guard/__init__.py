"""What keeps a ✓ honest inside the notebook: entered at one seam, `around_run`, the context the runtime opens around
a run; nothing of it is installed before the first run. See docs/TRUST.md for what it promises and what it does not."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator


@contextlib.contextmanager
def around_run(runtime) -> Iterator[Callable[[Any], Any]]:
    """The guard in place while `runtime` runs its ranks: Python's audit hook added (once per process, at the first
    run: Python cannot remove one) and every patch of lib.guard.boundary in place; each patch put back on exit, unless
    a rank's thread that could not be stopped still runs the rank's code (its guards stay on until it ends). Yields
    what hands a value to a rank's code: an engine handle (its dist, a work handle, a feed of inputs) behind a guarded
    stand-in whose private state the rank's code may not read (lib.guard.handles), anything else as it is."""
    from lib.guard import audit, boundary, handles      # the wing loads with the first run, not with the simulator

    audit.install()
    with boundary.guarding() as guard, _no_hooks_for_new_threads():
        try:
            yield handles.handed
        finally:
            guard.left_running.extend(state.thread for state in runtime.ranks
                                      if state.thread is not None and state.thread.is_alive())


@contextlib.contextmanager
def _no_hooks_for_new_threads() -> Iterator[None]:
    """threading.settrace's and setprofile's hooks, which every new thread is born with, off while a run lasts (a hook
    set before the run would be handed every frame of every rank, the engine's included)."""
    trace, profile = threading.gettrace(), threading.getprofile()
    threading.settrace(None)
    threading.setprofile(None)
    try:
        yield
    finally:
        threading.settrace(trace)
        threading.setprofile(profile)


def handed_to_learners(tools) -> None:
    """The helpers a notebook hands its learners (a Puzzle's `tools`): never answer keys, whichever puzzle's cases
    call them. Said when the Puzzle is made, before any of its module's cases is built."""
    from lib.guard.offlimits import tool

    for fn in tools:
        tool(fn)


def guard_answer_keys(builder) -> None:
    """The answer keys of the puzzle whose cases `builder` makes (what it calls of its package and the formulas),
    refused to a rank's own code from its first case on (lib.guard.offlimits)."""
    from lib.guard.offlimits import guard_answer_keys as guard_them

    guard_them(builder)


def call_watched(targets, advice: str, fn, *args):
    """fn(*args), with every call into `targets` (a puzzle's `off_limits`) stopping the run (lib.guard.offlimits)."""
    from lib.guard.offlimits import call_watched as watched

    return watched(targets, advice, fn, *args)
