"""The exceptions a learner can meet. Each carries a message written for a person."""

from __future__ import annotations

import builtins
import types
from typing import Callable, Optional


class PuzzleError(Exception):
    """Base of every error the course raises on purpose: catch this to catch them all."""


class RankFailed(PuzzleError):
    """A rank raised: names the rank and what it raised, then the traceback of the learner's code, its frames only
    (the exception's own line, which a formatted traceback ends with, is the message already: said once).

    `kind` is the name of what it raised (message's prefix, "NotImplementedError: ..."), in both worlds;
    `exception` the exception itself, in simulation only (it does not cross from a real process); `posted`, in
    simulation only, the point-to-point calls each rank had posted when it raised ({(rank, peer, "send" or "recv"):
    how many}): how far each rank went in its schedule."""

    def __init__(self, rank: int, message: str, traceback: str = "",
                 exception: Optional[BaseException] = None) -> None:
        self.rank = rank
        self.traceback = traceback = _without_repeat(traceback, message)
        self.exception = exception
        self.posted: dict = {}
        name = message.split(":", 1)[0].rsplit(".", 1)[-1]         # "module.Error: ..." from a real process
        self.kind = type(exception).__name__ if exception is not None else name if name.isidentifier() else ""
        text = f"rank {rank} raised {message}"
        if traceback:
            text += "\n\n" + traceback.rstrip()
        super().__init__(text)


def _without_repeat(traceback: str, message: str) -> str:
    """`traceback` without its closing exception text when `message` says it already (a chained exception's cause,
    above, stays); "" when no frame is left (every one was the engine's)."""
    lines = traceback.rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    if not frames:
        return "" if "\n".join(lines[1:]).strip() in message else traceback
    end = next((i for i in range(frames[-1] + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
    closing = "\n".join(lines[end:]).strip()
    return "\n".join(lines[:end]) + "\n" if closing in message else traceback


class LaunchError(PuzzleError):
    """Real processes could not be started or ran out of time (the message says which and what to do)."""


def raised_the_stub(error: BaseException) -> bool:
    """A rank raised NotImplementedError: the learner's function is still the stub the notebook ships."""
    return isinstance(error, RankFailed) and error.kind == "NotImplementedError"


def _stub():
    raise NotImplementedError


def is_the_stub(fn: Callable) -> bool:
    """`fn` is a plain function whose whole body, its docstring aside, is `raise NotImplementedError`: the stub
    the notebook ships, which can only raise what `raised_the_stub` recognises (known without running it)."""
    code = getattr(fn, "__code__", None)
    return (isinstance(fn, types.FunctionType) and code.co_code == _stub.__code__.co_code
            and code.co_names == _stub.__code__.co_names and not code.co_freevars
            and fn.__globals__.get("NotImplementedError", builtins.NotImplementedError) is NotImplementedError)
