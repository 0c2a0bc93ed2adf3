"""What a simulated rank holds of the engine: a guarded stand-in for each engine handle (its dist, a work handle, a
feed of inputs), so that the engine's own classes stay plain.

A stand-in answers the handle's public calls and hands on what they return (a work handle, a copy of a feed) as
stand-ins too; the handle itself stays behind a slot whose name, like every private name of the stand-in or its
class, is refused to the rank's own code (lib.guard.boundary.EngineHandle). The engine's code may read past it.
"""

from __future__ import annotations

from types import FunctionType
from typing import Any

from lib.checker.feed import StepFeed
from lib.guard.boundary import EngineHandle
from lib.sim.comm import Work
from lib.sim.dist import SimDist

HANDLES = (SimDist, Work, StepFeed)       # the engine's objects whose private state is every rank's or the meters'
_NOT_FORWARDED = frozenset({"__init__", "__new__", "__getattribute__", "__getattr__", "__setattr__", "__delattr__",
                            "__init_subclass__", "__subclasshook__", "__class_getitem__"})


class _StandIn(EngineHandle):
    """The base of every stand-in: the handle in a slot, private names (its own and the handle's) read past it by the
    engine's code only."""

    __slots__ = ("_handle",)

    def __getattr__(self, name: str) -> Any:           # a private name the engine asks of the handle (feed._moved_to)
        return getattr(_HANDLE.__get__(self), name)


_HANDLE = _StandIn._handle          # the slot's descriptor: the stand-ins' own reads skip the guard


def _forwarding(name: str) -> FunctionType:
    def forward(self, *args, **kwargs):
        return handed(getattr(_HANDLE.__get__(self), name)(*args, **kwargs))
    forward.__name__ = forward.__qualname__ = name
    return forward


def _stand_in_class(cls: type) -> type:
    """A class whose instances stand in for `cls`'s: its public methods and dunders forwarded, its other public class
    attributes (dist.ReduceOp, dist.group) the same objects, under `cls`'s name (which refusals quote)."""
    body: dict[str, Any] = {"__slots__": (), "__doc__": cls.__doc__}
    for klass in reversed(cls.__mro__[:-1]):
        for name, value in vars(klass).items():
            if name in _NOT_FORWARDED or name.startswith("_") and not name.startswith("__"):
                continue
            if isinstance(value, FunctionType):
                body[name] = _forwarding(name)
            elif not name.startswith("__"):
                body[name] = value
    return type(cls.__name__, (_StandIn,), body)


_STAND_INS = {cls: _stand_in_class(cls) for cls in HANDLES}


def handed(value: Any) -> Any:
    """`value` as a rank's code may hold it: an engine handle, or a list of them, behind stand-ins; else `value`."""
    stand_in = _STAND_INS.get(type(value))
    if stand_in is not None:
        guarded = object.__new__(stand_in)
        _HANDLE.__set__(guarded, value)
        return guarded
    if type(value) is list and value and type(value[0]) in _STAND_INS:
        return [handed(v) for v in value]
    return value
