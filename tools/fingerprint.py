"""The checker's fingerprint: what a check relies on inside the answers' process, taken before any of the
learner's code runs, and what differs from it later.

The simulator meters a run where it runs, in the answers' process (bytes sent, FLOPs, memory, who sent to
whom), and runs the learner's function through the puzzle's wrapping (its harness, the functions it may not
call): code there can patch them. A patch the fingerprint sees (a replaced, removed or added attribute of the
course's modules, classes and puzzles, of Python's builtins, of torch's functions and Tensor methods) grades the
notebook `tampered`; one it does not see is left to the review of the notebook's text (tools.traces).
"""

from __future__ import annotations

import builtins
import hmac
import importlib
import inspect
import io
import json
import os
import pkgutil
import sys
import types
from typing import Any, Callable, Iterator, Optional

CACHES = {"__slotnames__"}          # attributes Python itself adds to a class (copy and pickle cache them)


def _attr(obj: Any, name: str) -> Any:
    try:                                             # some objects (torch.classes) raise on any lookup
        return getattr(obj, name, None)
    except Exception:
        return None


def _identity(attr: str, value: Any, state: bool = False) -> tuple:
    """What must stay the same for `value` to behave the same: the object, and a function's code and defaults. The
    engine's run state (what a module names in `__run_state__`: lib.guard.boundary's table of patches built on first
    use, the modules it saw, the record of the patches in place) and a private number (a counter) are state, not
    code: they count as present only. Any other value, private or not, counts by identity."""
    if state:
        return ("state",)
    if attr.startswith("_") and type(value) in (int, float, bool):
        return ("a number",)
    fn = _attr(value, "__func__") or value           # staticmethod, classmethod, bound method
    return (id(value), id(_attr(fn, "__code__")), id(_attr(fn, "__defaults__")), id(_attr(fn, "__kwdefaults__")))


def _watched() -> Iterator[tuple[str, Any, bool]]:
    """(name, object, whether attributes added to it count) for everything a check relies on, each once."""
    import torch
    import torch.nn.functional
    ours = ("lib", "puzzles", "tools")
    seen: set[int] = set()

    def once(name: str, obj: Any, additions: bool) -> Iterator[tuple[str, Any, bool]]:
        if id(obj) not in seen:
            seen.add(id(obj))
            yield name, obj, additions

    for name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType) or name.split(".")[0] not in ours:
            continue
        yield from once(name, module, True)
        for attr, value in list(vars(module).items()):
            owner = _attr(value, "__module__") if isinstance(value, type) else type(value).__module__
            if isinstance(owner, str) and owner.split(".")[0] in ours and _attr(value, "__dict__") is not None \
                    and not isinstance(value, types.ModuleType):
                yield from once(f"{name}.{attr}", value, True)   # the course's classes, and objects such as a Puzzle
    for module in (builtins, torch, torch.nn.functional, json, hmac, os, io):
        yield from once(module.__name__, module, False)
    for cls in (torch.Tensor, torch.nn.Module, torch.nn.Parameter, hmac.HMAC):
        yield from once(f"{cls.__module__}.{cls.__qualname__}", cls, True)


def _run_state(name: str) -> Callable[[str], bool]:
    """Which attributes of the watched object `name` are its run state: those its module names in `__run_state__`,
    and every attribute of an object named there (lib.guard.boundary._INSTALLED)."""
    module, _, attr = name.rpartition(".")
    if attr in getattr(sys.modules.get(module), "__run_state__", ()):
        return lambda _attr_name: True
    declared = getattr(sys.modules.get(name), "__run_state__", ())
    return lambda attr_name: attr_name in declared


def fingerprint() -> dict[str, tuple[dict[str, tuple], bool]]:
    return {name: ({attr: _identity(attr, v, _run_state(name)(attr)) for attr, v in list(vars(obj).items())},
                   additions)
            for name, obj, additions in _watched()}


def changes(before: dict[str, tuple[dict[str, tuple], bool]]) -> list[str]:
    """What differs from the fingerprint `before`: replaced or removed attributes, and attributes added to
    the course's objects and to classes (a submodule imported meanwhile is not a change)."""
    found = []
    for name, obj, _ in _watched():
        if name not in before:
            continue
        then, additions = before[name]
        now = vars(obj)
        state = _run_state(name)
        for attr, was in then.items():
            if attr not in now:
                found.append(f"{name}.{attr} removed")
            elif _identity(attr, now[attr], state(attr)) != was:
                found.append(f"{name}.{attr} replaced")
        if additions:
            found += [f"{name}.{attr} added" for attr, value in list(now.items())
                      if attr not in then and attr not in CACHES and not isinstance(value, types.ModuleType)]
    return found


def load_checker(notebook: Optional[str] = None) -> None:
    """Import all that a check uses, so that the fingerprint taken next covers it; guard the answer keys of the
    puzzles of `notebook` (a name such as 02_data_parallel), as its first case built would (lib.guard.offlimits: the
    answers' process builds none, and they are guarded there too); and meet once what torch sets up
    on first use (an optimizer's step and zero_grad, which enter a profiler's record_function: typing machinery that
    calls sys._getframe). A check in one process met it building its cases; in the answers' process, which builds
    none, it would otherwise first happen inside a simulated rank, where the simulator refuses frames."""
    import torch._dynamo                   # noqa: F401  (imported by the first check anyway; it rewraps torch.manual_seed)

    import lib.notebook.cells                     # noqa: F401  (what runs the notebook's cells)
    import lib.sim
    import puzzles
    for found in pkgutil.iter_modules(lib.sim.__path__):
        importlib.import_module(f"lib.sim.{found.name}")
    import torch
    weight = torch.nn.Parameter(torch.zeros(1))
    for optimizer in (torch.optim.SGD([weight], lr=0.1, momentum=0.9), torch.optim.Adam([weight])):
        weight.grad = torch.zeros(1)
        optimizer.step()
        optimizer.zero_grad()
    from lib.guard.offlimits import guard_answer_keys
    for module in puzzles.MODULES:
        for puzzle in module.PUZZLES if module.NOTEBOOK == notebook else ():
            guard_answer_keys(inspect.unwrap(puzzle.make_case))
