"""Keep a puzzle's answer key out of the learner's reach: while their function runs, calling one of the library's
functions that computes the answer (imported from anywhere, under any name) stops the check with a message.

    with refusing({estimate: "it computes the memory you are asked for"}, puzzle="plan_memory"):
        answer = fn(...)
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping

from lib.errors import PuzzleError


class Refused(PuzzleError):
    """The learner's function called a library function that computes the answer of the puzzle."""


@contextmanager
def refusing(functions: Mapping[Callable, str], puzzle: str) -> Iterator[None]:
    """Refuse calls to `functions` (each with why) in this thread while the block runs. A refusal is reported even
    if the learner's code catches it."""
    codes = {f.__code__: (f.__name__, why) for f, why in functions.items()}
    caught: list[str] = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            name, why = codes[frame.f_code]
            caught.append(f"{puzzle} called {name}, which {why}: this puzzle asks you to compute it yourself.")
            raise Refused(caught[-1])

    before = sys.getprofile()
    sys.setprofile(watch)
    try:
        yield
    finally:
        sys.setprofile(before)
    if caught:
        raise Refused(caught[0])
