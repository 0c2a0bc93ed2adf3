"""Python's audit hook: the doors to the simulator's objects that no patched function can guard.

A patched function can be walked around (its original is a closure cell or a module attribute away), but CPython
fires an audit event from its own C code whichever way that code is reached: the garbage collector's lists
(`gc.get_objects`, referrers, referents), other threads' frames, a traceback's, generator's or coroutine's frame
(`tb_frame`, `gi_frame`, `cr_frame`, `ag_frame`) and tracing (`sys.settrace`, `sys.setprofile`). Inside a
simulated rank these are refused when the learner's code asked for them, directly or through Python's library
handing frames back to it (`inspect.trace`, `traceback.walk_tb`): a frame leads through `f_back` to the
simulator's own frames, which hold every rank's inputs and the rank's meters, and the collector's lists hold every
object of the process. Python's library reading a traceback for itself (`traceback.format_exc()`) still may.

The hook is the process's for good (Python cannot remove one), so outside a rank it returns at once.
"""

from __future__ import annotations

import asyncio.base_tasks
import inspect
import sys
import traceback

from lib.places import ENGINE, LIBRARIES
from lib.sim.context import current_rank
from lib.sim.errors import OutOfView

_getframe, _getprofile, _gettrace = sys._getframe, sys.getprofile, sys.gettrace    # before anyone patches them

_PEEKING = ("other threads, the garbage collector and the frames below your function hold the check's own cases, "
            "every rank's inputs and the rank's meters.\n"
            "Hint: use only the arguments your function receives; get other ranks' data through dist.")
_TRACING = ("a profiler or tracer is handed every frame, the simulator's own too (every rank's inputs, the rank's "
            "meters), and takes the place of the check's own watch.\n"
            "Hint: time or debug your function outside the check, by calling it on your own inputs.")
# event -> (code that may raise it for a rank: the engine's only, or Python's library's too; why not the learner's)
_EVENTS = {"gc.get_objects": (ENGINE, _PEEKING), "gc.get_referrers": (ENGINE, _PEEKING),
           "gc.get_referents": (ENGINE, _PEEKING), "sys._current_frames": (ENGINE, _PEEKING),
           "sys.settrace": (LIBRARIES, _TRACING), "sys.setprofile": (LIBRARIES, _TRACING)}
_FRAME_ATTRIBUTES = {"tb_frame", "gi_frame", "cr_frame", "ag_frame"}
# Python's library functions that hand the frames they read to their caller: their caller is the one asking.
_FRAME_GIVERS = {inspect.trace.__code__, inspect.getinnerframes.__code__, traceback.walk_tb.__code__,
                 asyncio.base_tasks._task_get_stack.__code__}


def _asked_by_learner(may: tuple) -> bool:
    """Whether the code that raised the event is not among `may`; for the library functions handing frames back,
    whether their caller is not."""
    frame = _getframe(2)
    while frame is not None and frame.f_code in _FRAME_GIVERS:
        frame = frame.f_back
    return frame is not None and not frame.f_code.co_filename.startswith(may)


def _engine_is_tracing(event: str) -> bool:
    """Whether the engine's own profiler or tracer is set (lib.offlimits' watch): CPython unsets one that raised, at
    the learner's line, and the watch itself tells when the learner's code switched it off."""
    current = _getprofile() if event == "sys.setprofile" else _gettrace()
    code = getattr(current, "__code__", None)
    return code is not None and code.co_filename.startswith(ENGINE)


def _hook(event: str, args: tuple) -> None:
    if event == "object.__getattr__":
        if args[1] not in _FRAME_ATTRIBUTES:
            return
        what, (may, why) = f"{args[1]} (the frame of a {type(args[0]).__name__})", (LIBRARIES, _PEEKING)
    else:
        rule = _EVENTS.get(event)
        if rule is None:
            return
        what, (may, why) = event, rule
    rank = current_rank()
    if rank is None or (why is _TRACING and _engine_is_tracing(event)):
        return
    if _asked_by_learner(may):
        from lib.sim.boundary import _fail
        from lib.sim.ownership import learner_line
        _fail(OutOfView(f"rank {rank} reached {what}{learner_line()}: {why}"))


def install() -> None:
    """Add the hook once per process."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


_installed = False
