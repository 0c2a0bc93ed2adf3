"""Stage 1 of a check, the run: the learner's function wrapped once (`Answer`: dist or not, a harness, the kernels
refused, the library put off limits) and run on a case's simulated ranks, its meters checked and its results copied
into plain types before anything judges them (`run_case`)."""

from __future__ import annotations

import contextlib
import secrets
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

import torch

from lib.checker.case import Case
from lib.checker.compare import kind_of
from lib.checker.kernels import kernels_refused
from lib.checker.meters import check_meters
from lib.checker.plain import plain
from lib.guard.offlimits import call_watched, watching
from lib.errors import PuzzleError
from lib.sim import CostModel, SimResult, run
from lib.whose_code import COURSE, LIBRARIES


class ResultUnusable(PuzzleError):
    """The answer returned a value the check cannot use as the statement's result (the wrong kind of value)."""


@dataclass(frozen=True, eq=True)
class Answer:
    """How each rank runs the learner's function: with `dist` first or without it, inside `harness` where the check
    judges what the answer does rather than what it returns, with the kernels in `refused` refused around it all and
    the library in `off_limits` out of the answer's reach."""

    takes_dist: bool = True
    harness: Optional[Callable] = None      # harness(answer, dist, *args) -> the result compared
    refused: tuple = ()                     # prefixes of torch op names (lib.checker.kernels)
    refused_why: str = ""
    off_limits: Mapping[str, Any] = None    # label -> function or module (lib.guard.offlimits)
    off_limits_advice: str = ""

    def __hash__(self) -> int:
        return id(self)


def answer_on_rank(how: Answer, fn: Callable, dist, *args) -> Any:
    """What one rank runs: the learner's `fn` on `args`, as `how` says (Puzzle.wrap binds the two)."""
    with kernels_refused(how.refused, how.refused_why) if how.refused else contextlib.nullcontext():
        if how.harness is not None:
            return _harnessed(how, fn, dist, args)
        with watching(how.off_limits or {}, how.off_limits_advice):
            return fn(dist, *args) if how.takes_dist else fn(*args)


def _harnessed(how: Answer, fn: Callable, dist, args: tuple) -> Any:
    """The harness around the answer. Where the harness's own code fails on what the answer returned (a None where it
    unpacks two losses, a float where it calls backward), the learner is told what they returned, not shown the
    harness's traceback (ResultUnusable); an error raised in the learner's code stays theirs."""
    returned: list = []

    def answer(*a: Any) -> Any:
        out = call_watched(how.off_limits, how.off_limits_advice, fn, *a) if how.off_limits else fn(*a)
        returned.append(out)
        return out
    try:
        return how.harness(answer, dist, *args)
    except Exception as e:
        if not returned or isinstance(e, PuzzleError) or _learners_code_in(e):
            raise
        raise ResultUnusable(f"your function returned {_returned(returned[-1])}, which the check cannot use as the "
                             f"statement's result ({type(e).__name__}: {e}).\nHint: return exactly what the statement "
                             "asks for: its types, shapes and order.") from None


def _returned(x: Any) -> str:
    """What an answer returned, in a few words: a container by its items' kinds, not its values."""
    if isinstance(x, (list, tuple)) and 0 < len(x) <= 4:
        return f"a {type(x).__name__} of {len(x)}: " + ", ".join(kind_of(v) for v in x)
    if isinstance(x, (list, tuple, dict)):
        return f"a {type(x).__name__} of {len(x)} items"
    return kind_of(x)


def _learners_code_in(e: BaseException) -> bool:
    """Whether any frame of `e`'s traceback runs the learner's code (neither the course's, nor a library's)."""
    frames = traceback.extract_tb(e.__traceback__)
    return any(not f.filename.startswith(COURSE + LIBRARIES) for f in frames)


def run_case(answer: Callable, case: Case, cost: Optional[CostModel]) -> SimResult:
    """`answer` (wrapped already) on `case`'s simulated ranks, under `cost`: a check's run of one case, its meters
    checked (lib.checker.meters) and its results plain (lib.checker.plain)."""
    result = run(answer, case.world_size, *case.args, cost=cost, protect=case.expected, faults=case.faults,
                 read_arguments=any(b.metric == "argument_reads" for b in case.budgets))
    check_meters(result)
    result.results = [plain(r) for r in result.results]
    return result


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch's intra-op parallelism off while a check runs: on the course's tiny tensors a second thread only
    adds hand-offs, and on a busy 2-core machine its spinning costs 10-30× the work itself."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def fresh_seed() -> int:
    """A seed no learner's function can predict."""
    return secrets.randbelow(2**31)
