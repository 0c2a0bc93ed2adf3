"""Stage 1 of a check, the run: the learner's function wrapped once (`Answer`: dist or not, a harness, the kernels
refused, the library put off limits) and run on a case's simulated ranks, its meters checked and its results copied
into plain types before anything judges them (`run_case`)."""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

import torch

from lib.checker.case import Case
from lib.checker.kernels import kernels_refused
from lib.checker.meters import check_meters
from lib.checker.plain import as_plain
from lib.checker.spec import SpecError
from lib.guard import call_watched
from lib.sim import CostModel, SimResult, run


@dataclass(frozen=True)
class Answer:
    """How each rank runs the learner's function: with `dist` first or without it, inside `harness` where the check
    judges what the answer does rather than what it returns, with the kernels in `refused` refused around it all and
    the library in `off_limits` out of the answer's reach."""

    takes_dist: bool = True
    harness: Optional[Callable] = None      # harness(answer, dist, *args) -> the result compared
    refused: tuple = ()                     # prefixes of torch op names (lib.checker.kernels)
    refused_why: str = ""
    off_limits: Optional[Mapping[str, Any]] = None    # label -> function or module (lib.guard.offlimits)
    off_limits_advice: str = ""

    def __post_init__(self) -> None:
        if self.harness is not None and not callable(self.harness):
            raise SpecError(f"harness={self.harness!r}: a function (answer, dist, *args) -> the result compared.")
        if not all(isinstance(p, str) and p for p in self.refused) or (self.refused and not self.refused_why):
            raise SpecError(f"refuse=({list(self.refused)!r}, {self.refused_why!r}): prefixes of torch op names, and "
                            "why the answer may not call them.")
        if not all(isinstance(k, str) for k in (self.off_limits or {})):
            raise SpecError(f"off_limits keys {sorted(map(repr, self.off_limits))}: labels (str) for what is kept "
                            "from the answer.")


def answer_on_rank(how: Answer, fn: Callable, dist, *args) -> Any:
    """What one rank runs: the learner's `fn` on `args`, as `how` says (Puzzle.wrap binds the two)."""
    with kernels_refused(how.refused, how.refused_why) if how.refused else contextlib.nullcontext():
        if how.harness is not None:
            answer = fn if not how.off_limits else \
                (lambda *a: call_watched(how.off_limits, how.off_limits_advice, fn, *a))
            return how.harness(answer, dist, *args)
        given = (dist, *args) if how.takes_dist else args
        return call_watched(how.off_limits, how.off_limits_advice, fn, *given) if how.off_limits else fn(*given)


def run_case(answer: Callable, case: Case, cost: Optional[CostModel]) -> SimResult:
    """`answer` (wrapped already) on `case`'s simulated ranks, under `cost`: a check's run of one case, its meters
    checked (lib.checker.meters) and its results plain (lib.checker.plain)."""
    result = run(answer, case.world_size, *case.args, cost=cost, protect=case.expected, faults=case.faults,
                 read_arguments=any(b.metric == "argument_reads" for b in case.budgets))
    check_meters(result)
    result.results = [as_plain(r) for r in result.results]
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
