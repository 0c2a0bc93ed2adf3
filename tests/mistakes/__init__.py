"""The second catalogue: realistic first attempts, one module per notebook, kept apart from tests/wrong.

tests/wrong holds the mistakes the checkers were built against; this catalogue holds mistakes written the way
learners really make them (forum questions, issue trackers, first attempts), to measure how well the checks
*teach* on mistakes they were not tuned to. Each module has

    MISTAKES = [Attempt("puzzle_name", fn, named=("words", "or alternatives")), ...]

`named` is what a good teacher would say the mistake is, in words the failure message must contain to count as
naming it (any one of the alternatives). Every attempt must fail (tests/test_mistakes.py); the share whose
message names the mistake is measured per notebook by `python -m bench.mistakes`, and an attempt whose message
does not name it yet is marked `named_yet=False`, so the record is honest and the test still holds the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# Words of lib.diagnose's sentences that several catalogues name their mistakes by.
NO_GRADIENT = ("gradients are None", "backward never reached", "is None where a tensor belongs")
FIRST_STEP = "leaves the reference at its first step"
A_SHARD_FOR_THE_WHOLE = ("a shard where the whole", "1/N of", "a rank's part where the whole tensor belongs")


@dataclass(frozen=True)
class Attempt:
    """A learner's realistic wrong answer to one puzzle, and the words that name its mistake."""

    puzzle: str
    fn: Callable
    named: str | tuple[str, ...]
    named_yet: bool = True        # False: the message does not name it yet (counted against the share)

    @property
    def words(self) -> tuple[str, ...]:
        return self.named if isinstance(self.named, tuple) else (self.named,)

    def names_it(self, message: str) -> bool:
        return any(w in message for w in self.words)
