"""Calls a puzzle puts out of reach while the learner's function runs: a prediction is derived, not looked up.

A puzzle names what its answer must not come from (building the model, the formula library, the measuring
tools); while the learner's function runs, a profile hook on that thread stops the first call into any of them.
A C function (numpy's) is seen when Python calls it; numpy's public ones run a Python dispatcher first (which
arguments may override them), and that call is the one seen.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import inspect
from contextlib import contextmanager
from types import CodeType, FrameType, ModuleType
from typing import Any, Callable, Iterator, Mapping

import torch

from lib.errors import PuzzleError

# What a prediction puzzle may not call: building any module (nn.Module.__init__, also on the meta device) and
# the library's own formulas, measurements and planner, which hold the answers.
MODULE_INIT = torch.nn.Module.__init__
_SETPROFILE, _GETPROFILE = sys.setprofile, sys.getprofile       # the originals, before a watch refuses them


class OffLimits(PuzzleError):
    """The learner's function called something its puzzle puts out of reach (e.g. a formula that is the answer)."""


class _Watch:
    """The code objects and source files that are off limits, each with the words that name it."""

    def __init__(self, targets: Mapping[str, Any]) -> None:
        self.codes: dict[CodeType, str] = {}
        self.files: dict[str, str] = {}
        self.builtins: dict[int, str] = {}           # C functions by id, seen at their c_call event
        for label, target in targets.items():
            if isinstance(target, str):          # a module by name, not imported until it is called
                spec = importlib.util.find_spec(target)
                path = spec.submodule_search_locations
                self.files[os.path.join(list(path)[0], "") if path else spec.origin] = label
            elif isinstance(target, ModuleType):
                path = getattr(target, "__path__", None)
                self.files[os.path.join(list(path)[0], "") if path else target.__file__] = label
            elif _is_c_function(target):
                self.builtins[id(target)] = label
            elif hasattr(target, "_implementation"):     # numpy's dispatcher over a C function
                self.builtins[id(target._implementation)] = label
                self.codes[_dispatcher_code(target)] = label
            else:
                code = getattr(getattr(target, "__func__", target), "__code__", None)
                if code is None:
                    raise TypeError(f"{label}: only functions (Python's or C's) and modules can be put off limits, "
                                    f"not {type(target).__name__}")
                self.codes[code] = label

    def label_of(self, code: CodeType) -> str | None:
        if code in self.codes:
            return self.codes[code]
        for where, label in self.files.items():
            if code.co_filename == where or (where.endswith(os.sep) and code.co_filename.startswith(where)):
                return label
        return None


def _is_c_function(target: Any) -> bool:
    return type(target).__name__ == "builtin_function_or_method"


_DISPATCHERS: dict[int, CodeType] = {}


def _dispatcher_code(target: Any) -> CodeType:
    """The code of the Python dispatcher numpy runs before `target`'s C function: called once with placeholder
    arguments under a profile hook that notes the first Python call (the C function then refuses the arguments)."""
    if id(target) not in _DISPATCHERS:
        seen: list[CodeType] = []

        def note(frame: FrameType, event: str, _arg: Any) -> None:
            if event == "call" and not seen:
                seen.append(frame.f_code)
        required = [p for p in inspect.signature(target).parameters.values() if p.default is p.empty]
        before = _GETPROFILE()
        _SETPROFILE(note)
        try:
            target(*[None] * len(required))
        except Exception:
            pass
        finally:
            _SETPROFILE(before)
        if not seen:
            raise TypeError(f"{target!r}: no Python dispatcher runs before it, so it cannot be put off limits")
        _DISPATCHERS[id(target)] = seen[0]
    return _DISPATCHERS[id(target)]


def _named(label: str, frame: FrameType) -> str:
    """How the message names the call: the module's class being built, or the function called."""
    if frame.f_code is MODULE_INIT.__code__:
        built = type(frame.f_locals.get("self")).__name__
        return f"{label} ({built}(...))"
    name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    return label if name == "<module>" else f"{label} ({name})"


@contextmanager
def watching(targets: Mapping[str, Any], advice: str) -> Iterator[None]:
    """Within the block, on this thread, the first call into any of `targets` (label -> a function, a module or
    a module's dotted name; a package counts with all its modules) raises OffLimits with `advice`; so does
    switching the watch off."""
    if not targets:
        yield
        return
    watch = _Watch(targets)

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            label = watch.label_of(frame.f_code)
            if label is not None:
                raise OffLimits(f"this puzzle puts {_named(label, frame)} out of reach: {advice}.")
        elif event == "c_call" and id(arg) in watch.builtins:
            raise OffLimits(f"this puzzle puts {watch.builtins[id(arg)]} ({arg.__name__}) out of reach: {advice}.")

    def refusing(*_a: Any, **_k: Any) -> None:
        raise OffLimits(f"this puzzle's check watches which library calls your function makes; touching its "
                        f"watch (sys.setprofile, sys.getprofile, sys.settrace) is not allowed: {advice}.")

    # The hooks' setters and sys.getprofile are refused meanwhile: without the watch's own function, a setter
    # saved earlier can switch it off but not back on, which the end of the block notices.
    get = sys.getprofile
    saved = get(), sys.setprofile, sys.settrace, threading.setprofile, threading.settrace
    sys.setprofile(profile)
    sys.setprofile = sys.settrace = threading.setprofile = threading.settrace = sys.getprofile = refusing
    try:
        yield
        if get() is not profile:
            raise OffLimits(f"this puzzle's watch on library calls was switched off while your function ran: {advice}.")
    finally:
        sys.setprofile, sys.settrace, threading.setprofile, threading.settrace = saved[1:]
        sys.getprofile = get
        sys.setprofile(saved[0])


def call_watched(targets: Mapping[str, Any], advice: str, fn: Callable, *args: Any) -> Any:
    """fn(*args) under `watching(targets, advice)`."""
    with watching(targets, advice):
        return fn(*args)
