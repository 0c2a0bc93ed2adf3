"""Python's audit hook: the doors to the simulator's objects that no patched function can guard.

A patched function can be walked around (its original is a closure cell or a module attribute away), but CPython
fires an audit event from its own C code whichever way that code is reached: the garbage collector's lists
(`gc.get_objects`, referrers, referents), other threads' frames, a traceback's, generator's or coroutine's frame
(`tb_frame`, `gi_frame`, `cr_frame`, `ag_frame`), tracing (`sys.settrace`, `sys.setprofile`), new processes and
code run by `exec`. Inside a simulated rank the frames and the collector's lists are refused when the learner's code
asked for them, directly or through Python's library handing frames back to it (`inspect.trace`,
`traceback.walk_tb`): a frame leads through `f_back` to the simulator's own frames, which hold every rank's inputs
and the rank's meters, and the collector's lists hold every object of the process. Python's library reading a
traceback for itself (`traceback.format_exc()`) still may. A tracer or profiler only the engine may set, whoever
asks (its watch, lib.offlimits), and no process may start; code a rank runs by `exec` is shown to the watchers that ask
(lib.offlimits: a copy of an answer key). Anywhere, the learner's code may not compile code under the file name of the
engine's, the problem set's or a library's: that code would pass for theirs.

The hook is the process's for good (Python cannot remove one), so outside a rank it returns at once.
"""

from __future__ import annotations

import asyncio.base_tasks
import inspect
import sys
import traceback
from types import CodeType
from typing import Callable

from lib.places import COURSE, ENGINE, LIBRARIES
from lib.sim.context import current_rank
from lib.sim.errors import OutOfView

_getframe = sys._getframe            # before lib.sim.boundary guards it

_PEEKING = ("other threads, the garbage collector and the frames below your function hold the check's own cases, "
            "every rank's inputs and the rank's meters.\n"
            "Hint: use only the arguments your function receives; get other ranks' data through dist.")
_TRACING = ("a profiler or tracer is handed every frame, the simulator's own too (every rank's inputs, the rank's "
            "meters), and takes the place of the check's own watch on what your function calls.\n"
            "Hint: time or debug your function outside the check, by calling it on your own inputs.")
_PROCESSES = ("work in another process runs outside the simulator's view, so its time, FLOPs and memory would not "
              "count.\nHint: compute in your function itself, with torch's ordinary ops.")
# event -> (code that may raise it for a rank: the engine's only, Python's library's too, or nobody's; why not the
# learner's). Only the engine may set a tracer or profiler (its watch, lib.offlimits), whoever asks: Python's library
# would hand the learner's own (contextlib's callbacks, pdb) every frame just the same.
_EVENTS = {"gc.get_objects": (ENGINE, _PEEKING), "gc.get_referrers": (ENGINE, _PEEKING),
           "gc.get_referents": (ENGINE, _PEEKING), "sys._current_frames": (ENGINE, _PEEKING),
           "sys.settrace": (ENGINE, _TRACING), "sys.setprofile": (ENGINE, _TRACING),
           **{event: ((), _PROCESSES) for event in ("os.fork", "os.forkpty", "os.system", "os.posix_spawn",
                                                    "os.spawn", "os.exec", "subprocess.Popen")}}
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


_DISGUISE = ("code compiled under the file name of the course's or a library's own code would pass for it: the checks "
             "tell whose code asks by its file.\nHint: compile your own code under a name of your own.")


def _hook(event: str, args: tuple) -> None:
    if event in ("compile", "code.__new__"):      # whatever the thread: such code could run in a rank later
        filename = args[1]
        if isinstance(filename, str) and filename.startswith(LIBRARIES + COURSE) and _asked_by_learner(LIBRARIES):
            from lib.sim.boundary import fail_run
            from lib.sim.ownership import learner_line
            rank = current_rank()
            fail_run(OutOfView(f"{'' if rank is None else f'rank {rank} '}compiled code as {filename}{learner_line()}: "
                               f"{_DISGUISE}"))
        return
    if event == "object.__getattr__":
        if args[1] not in _FRAME_ATTRIBUTES:
            return
        what, (may, why) = f"{args[1]} (the frame of a {type(args[0]).__name__})", (LIBRARIES, _PEEKING)
    elif event == "exec":
        if current_rank() is not None:
            for watcher in _exec_watchers:
                watcher(args[0])
        return
    else:
        rule = _EVENTS.get(event)
        if rule is None:
            return
        what, (may, why) = event, rule
    rank = current_rank()
    if rank is None or (why is _TRACING and _ending()):
        return
    if _asked_by_learner(may):
        from lib.sim.boundary import fail_run
        from lib.sim.ownership import learner_line
        fail_run(OutOfView(f"rank {rank} reached {what}{learner_line()}: {why}"))


def _ending() -> bool:
    """Whether the rank's run is ending: CPython unsets a profiler that raised (the engine's watch, stopping the run)
    at the learner's line."""
    from lib.sim.context import current_runtime
    return current_runtime().ending


_exec_watchers: list[Callable[[CodeType], None]] = []


def watch_exec(watcher: Callable[[CodeType], None]) -> None:
    """Have `watcher(code)` see the code a simulated rank is about to run by exec (lib.offlimits: a copy of an answer
    key, run under another name, stops the run)."""
    if watcher not in _exec_watchers:
        _exec_watchers.append(watcher)


def install() -> None:
    """Add the hook once per process."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


_installed = False
