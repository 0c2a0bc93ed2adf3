"""Python's audit hook: the doors to the simulator's objects that no patched function can guard.

A patched function can be walked around (its original is a closure cell or a module attribute away), but CPython
fires an audit event from its own C code whichever way that code is reached: the garbage collector's lists
(`gc.get_objects`, referrers, referents), other threads' frames, a traceback's, generator's or coroutine's frame
(`tb_frame`, `gi_frame`, `cr_frame`, `ag_frame`), tracing (`sys.settrace`, `sys.setprofile`), new processes and
code run by `exec`, a frame handed out by `sys._getframe` and a file opened (`open`, `io.open`, `os.open` and their
C originals alike). Inside a simulated rank the frames and the collector's lists are refused when the learner's code
asked for them, directly or through Python's library handing frames back to it (`inspect.currentframe`,
`inspect.stack`, `inspect.trace`, `traceback.walk_stack`, `traceback.walk_tb`): a frame leads through `f_back` to the
simulator's own frames, which hold every rank's inputs and the rank's meters, and the collector's lists hold every
object of the process. Python's library reading frames for itself (logging, typing, `traceback.format_exc()`) still
may. A file only the engine, the import system and the library reading source lines (linecache) may open: what goes
through a file is neither counted nor sent. A tracer or profiler only the engine may set, whoever asks (its watch,
lib.guard.offlimits), and no process may start; code a rank runs by `exec` is shown to the watchers that ask
(lib.guard.offlimits:
a copy of an answer key). Anywhere, the learner's code may not compile code under the file name of the engine's, the
problem set's or a library's: that code would pass for theirs, in a run to come too.

The hook is the process's for good (Python cannot remove one): the first run adds it (lib.guard.around_run), not the
import of the course, so that a kernel that never checks pays nothing (code compiled under the engine's name before the
first run is not seen). While no rank runs it looks only at code compiled under the engine's or a library's name;
every other event returns at once (about 0.25 µs added to a `sys._getframe()`, bench/guard_cost.py).
"""

from __future__ import annotations

import asyncio.base_tasks
import inspect
import linecache
import sys
import threading
import tokenize
import traceback
from types import CodeType, FrameType, MappingProxyType   # the rules read-only: a notebook cannot clear them
from typing import Callable, Optional

from lib.whose_code import COURSE, ENGINE, LIBRARIES
from lib.sim import context
from lib.sim.context import current_rank, current_runtime, fail_run
from lib.sim.errors import OutOfView
from lib.sim.ownership import learner_line

_getframe = sys._getframe
_get_ident = threading.get_ident

_PEEKING = ("other threads, the garbage collector and the frames below your function hold the check's own cases, "
            "every rank's inputs and the rank's meters.\n"
            "Hint: use only the arguments your function receives; get other ranks' data through dist.")
_TRACING = ("a profiler or tracer is handed every frame, the simulator's own too (every rank's inputs, the rank's "
            "meters), and takes the place of the check's own watch on what your function calls.\n"
            "Hint: time or debug your function outside the check, by calling it on your own inputs.")
_PROCESSES = ("work in another process runs outside the simulator's view, so its time, FLOPs and memory would not "
              "count.\nHint: compute in your function itself, with torch's ordinary ops.")
# event -> (code that may raise it for a rank: the engine's only, Python's library's too, or nobody's; why not the
# learner's). Only the engine may set a tracer or profiler (its watch, lib.guard.offlimits), whoever asks: Python's
# library
# would hand the learner's own (contextlib's callbacks, pdb) every frame just the same.
_EVENTS = MappingProxyType({"gc.get_objects": (ENGINE, _PEEKING), "gc.get_referrers": (ENGINE, _PEEKING),
           "gc.get_referents": (ENGINE, _PEEKING), "sys._current_frames": (ENGINE, _PEEKING),
           "sys.settrace": (ENGINE, _TRACING), "sys.setprofile": (ENGINE, _TRACING),
           **{event: ((), _PROCESSES) for event in ("os.fork", "os.forkpty", "os.system", "os.posix_spawn",
                                                    "os.spawn", "os.exec", "subprocess.Popen")}})
_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# Python's library functions that hand the frames they read to their caller: their caller is the one asking.
_FRAME_GIVERS = {inspect.trace.__code__, inspect.getinnerframes.__code__, traceback.walk_tb.__code__,
                 asyncio.base_tasks._task_get_stack.__code__, inspect.currentframe.__code__, inspect.stack.__code__,
                 traceback.walk_stack.__code__}
_FILES = ("the simulator does not see what goes through a file, and ranks on different machines share none.\n"
          "Hint: pass data between ranks with dist, and keep what a rank needs in tensors of its own.")
_FRAMES = ("the frames below your function are the simulator's own: they hold every rank's inputs and the rank's "
           "meters.\nHint: use only the arguments your function receives; get other ranks' data through dist.")
# Who may open a file inside a rank: the engine (torch included), the import system, and the library reading source
# lines for a traceback or a warning (linecache, through tokenize).
_OPENERS = ENGINE + ("<frozen ", linecache.__file__, tokenize.__file__)


def _asker(depth: int) -> Optional[FrameType]:
    """The frame whose code raised the event (`depth` frames up from the caller); for the library functions
    handing frames back, their caller."""
    frame = _getframe(depth + 1)
    while frame is not None and frame.f_code in _FRAME_GIVERS:
        frame = frame.f_back
    return frame


_DISGUISE = ("code compiled under the file name of the course's or a library's own code would pass for it: the checks "
             "tell whose code asks by its file.\nHint: compile your own code under a name of your own.")


_RANKS = context._ranks                 # every simulated rank's thread: empty while no run is under way
_COMPILING = frozenset({"compile", "code.__new__"})
# Every event the hook looks at. Python raises many more (`builtins.id` on every id(), which the tracker calls once per
# op): one set lookup turns those away.
_WATCHED = frozenset({*_COMPILING, "object.__getattr__", "sys._getframe", "open", "exec", *_EVENTS})


def _hook(event: str, args: tuple) -> None:
    if event not in _WATCHED or not _RANKS and event not in _COMPILING:   # no rank anywhere: only compiling matters
        return
    if event in _COMPILING:      # whatever the thread: such code could run in a rank later
        filename = args[1]
        if isinstance(filename, str) and filename.startswith(LIBRARIES + COURSE):
            _checked(_disguised, filename)
        return
    if event == "object.__getattr__":
        if args[1] in _FRAME_ATTRIBUTES:
            _checked(_rule, f"{args[1]} (the frame of a {type(args[0]).__name__})", LIBRARIES, _PEEKING, "reached")
        return
    if event == "sys._getframe":
        _checked(_frame_asked)
        return
    if event == "open":
        _checked(_rule, "open (a file)", _OPENERS, _FILES, "called")
        return
    if event == "exec":
        if current_rank() is not None:
            for watcher in _exec_watchers:
                watcher(args[0])
        return
    rule = _EVENTS.get(event)
    if rule is not None:
        _checked(_rule, event, *rule, "reached")


_busy: set[int] = set()            # threads whose event the hook is looking at: the events its own look raises pass


def _checked(check: Callable, *args) -> None:
    """check(*args), unless this thread is in the hook already (reading a frame raises sys._getframe, a message's
    source line open). Outside a rank nothing is looked at but code compiled under another's name."""
    me = _get_ident()
    if me in _busy or (check is not _disguised and current_rank() is None):
        return
    _busy.add(me)
    try:
        check(*args)
    finally:
        _busy.discard(me)


_DEPTH = 3              # from a check: _checked, _hook, then the frame whose code raised the event


def caller_file(depth: int, through: tuple[str, ...] = (), unless: tuple[str, ...] = ()) -> Optional[str]:
    """The file of the code `depth` frames above the caller (None past the stack's bottom); with `through`, of the
    first frame from there whose file is not under `through`, or is under `unless`. For the engine's own guards,
    which ask on every dist call whose code called them: the frames are read without the hook looking at them (the
    hook's look at a frame event costs several times the read), and only a file name, which hands a rank's code
    nothing, comes back. Its arguments must be a plain int and tuples of plain strings: the hook is blind while it
    reads, so nothing of a caller's (an int subclass's __add__) may run then."""
    if type(depth) is not int or any(type(t) is not tuple or any(type(s) is not str for s in t)
                                     for t in (through, unless)):
        raise TypeError("caller_file(depth: int, through: tuple[str, ...], unless: tuple[str, ...])")
    me = _get_ident()
    mine = me not in _busy
    if mine:
        _busy.add(me)
    try:
        frame = _getframe(depth + 1)
        while frame is not None:
            file = frame.f_code.co_filename
            if not file.startswith(through) or file.startswith(unless):
                return file
            frame = frame.f_back
        return None
    finally:
        if mine:
            _busy.discard(me)


def _rule(what: str, may: tuple, why: str, verb: str) -> None:
    if why is _TRACING and _ending():
        return
    asker = _asker(_DEPTH)
    if asker is not None and not asker.f_code.co_filename.startswith(may):
        _refuse(f"{verb} {what}", why)


def _frame_asked() -> None:
    """sys._getframe, refused where it would hand the learner's code a frame: called by that code itself, or by
    inspect.currentframe/inspect.stack/traceback.walk_stack called by it. Python's library reading frames for its own
    bookkeeping (logging, namedtuple, typing) still may."""
    caller = _getframe(_DEPTH)
    asker = _asker(_DEPTH)
    if asker is not None and not asker.f_code.co_filename.startswith(LIBRARIES):
        name = caller.f_code.co_name if asker is not caller else "_getframe"
        _refuse(f"called {'sys' if name == '_getframe' else caller.f_globals.get('__name__', '')}.{name}", _FRAMES)


def _disguised(filename: str) -> None:
    asker = _asker(_DEPTH)
    if asker is not None and not asker.f_code.co_filename.startswith(LIBRARIES):
        rank = current_rank()
        _refuse(f"compiled code as {filename}", _DISGUISE, "" if rank is None else f"rank {rank} ")


def _refuse(what: str, why: str, who: Optional[str] = None) -> None:
    fail_run(OutOfView(f"{f'rank {current_rank()} ' if who is None else who}{what}{learner_line()}: {why}"))


def _ending() -> bool:
    """Whether the rank's run is ending: CPython unsets a profiler that raised (the engine's watch, stopping the run)
    at the learner's line."""
    return current_runtime().ending


_exec_watchers: list[Callable[[CodeType], None]] = []


def watch_exec(watcher: Callable[[CodeType], None]) -> None:
    """Have `watcher(code)` see the code a simulated rank is about to run by exec (lib.guard.offlimits: a copy of an
    answer
    key, run under another name, stops the run)."""
    if watcher not in _exec_watchers:
        _exec_watchers.append(watcher)


def install() -> None:
    """Add the hook once per process (lib.guard.around_run, at the first run: see the module's docstring)."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


_installed = False
