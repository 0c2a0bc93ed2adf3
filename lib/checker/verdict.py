"""Stage 5 of a check, the verdict: passed, failing or unattempted, and a failure's one message in the order a
learner reads it (what differs, the diagnosis, the seed that replays it, one hint)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from lib.checker.case import Case
from lib.errors import PuzzleError, RankFailed
from lib.sim import SimResult


class CheckFailed(PuzzleError):
    """Strict mode: the learner's function gave a wrong answer or broke a budget."""


class NotSolved(PuzzleError):
    """Strict mode: the function is still the stub (it raises NotImplementedError)."""


PASSED, FAILING, UNATTEMPTED = "passed", "failing", "unattempted"
NOT_SOLVED = "{} is not solved yet: write its body, then run this cell again."


@dataclass
class Outcome:
    """What one check found: passed, failing (with why), or unattempted (the stub is still there); the last run."""

    status: str                        # PASSED, FAILING or UNATTEMPTED
    message: str
    result: Optional[SimResult] = None
    case: Optional[Case] = None
    hinted: bool = False               # the message already ends with this puzzle's hint (a budget's)
    seed: Optional[int] = None
    scale: Optional[str] = None        # the real run the result's clocks stand for (Puzzle.real_scale), if any

    @property
    def ok(self) -> bool:
        return self.status == PASSED


def strict_default() -> bool:
    """Strict (a failing check raises) where grades are made: with COURSE_STRICT=1 (tests, grading), and
    always while nbgrader autogrades or validates (it sets NBGRADER_EXECUTION), whatever COURSE_STRICT says."""
    if os.environ.get("NBGRADER_EXECUTION"):
        return True
    return os.environ.get("COURSE_STRICT", "") not in ("", "0")



def failing(case: Case, problem: str, meaning: Optional[str], replay: str,
             result: Optional[SimResult] = None) -> Outcome:
    """The one place a failure's message is made, in the order a learner reads it: the case and what differs, the
    diagnosis (or what an error means), the seed that replays it, then one hint: the most specific the run gave
    (a budget's, the simulator's), else the puzzle's own (added by Puzzle.check, which knows the tiers)."""
    text, hints, in_hint = [], [], False
    for line in f"on {case.label}: {problem}".split("\n"):
        starts = line.startswith("Hint: ")
        in_hint = starts or (in_hint and line.strip() != "")
        if starts:
            hints.append([])
        (hints[-1] if in_hint else text).append(line)
    if meaning:
        text.append(meaning)
    hint = "".join("\n" + line for line in hints[0]) if hints else ""
    message = "\n".join(text).rstrip("\n") + replay + hint
    return Outcome(FAILING, message, result, case, hinted=bool(hints))


def refused_as_asked(case: Case, e: RankFailed) -> bool:
    """The learner's function raised the exception the statement asks for on this case's arguments."""
    return case.raises is not None and isinstance(getattr(e, "exception", None), case.raises)


def not_refused(case: Case) -> Optional[str]:
    """What is wrong when a case whose arguments the statement says to refuse ran to the end."""
    if case.raises is None:
        return None
    name = case.raises.__name__
    return (f"the statement asks for a {name} on these arguments, and your function returned without raising "
            f"one: check the arguments first, and raise {name}(\"...\") saying what is wrong, so that a run that "
            "cannot work stops before it starts.")
