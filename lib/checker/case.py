"""A check's case: one configuration to run (world size, arguments, expected results, budgets, contracts), validated
when written, and never built while a learner's function runs (its expected results are the answer key)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Optional

from lib.checker.budgets import Budget
from lib.checker.contract import Contract
from lib.checker.spec import SpecError
from lib.guard import guard_answer_keys
from lib.sim import CostModel, OutOfView, current_rank

_learner_running = False      # a real rank is running the learner's function: no Case may be built meanwhile


@dataclass
class Case:
    """One configuration to run: arguments (wrap per-rank ones in lib.sim.per_rank), expected results."""

    world_size: int
    args: tuple
    expected: list                       # rank r's expected return value
    label: str                           # how the case reads in messages
    budgets: list[Budget] = field(default_factory=list)
    cost: Optional[CostModel] = None
    allowed_ops: Optional[frozenset] = None   # the communication this puzzle is about, if restricted
    factors: dict = field(default_factory=dict)   # numbers a wrong factor may equal: {"k, the micro-batches": 4}
    contracts: list[Contract] = field(default_factory=list)
    raises: Optional[type] = None        # the exception the statement asks for on these arguments (then no expected)
    faults: dict = field(default_factory=dict)   # {rank: k}: rank dies at its k-th communication call (lib.sim.run)
    mistakes: tuple = ()                 # known wrong answers of this case alone (their answer drawn with it), named
                                         # as the puzzle's are
    # where the wrong values are, said as a reason: explain(expected, results) -> a sentence or None, for a pattern
    # no run of a known mistake can match (one that holds for any values the mistaken answer made up)
    explain: Optional[Callable[[list, list], Optional[str]]] = None
    # explain takes the run as well, explain(expected, results, run): the SimResult whose results they are (its trace,
    # who sent what), or None where the results come from a replay
    explain_reads_run: bool = False
    # explain reads the answer on the check's other cases too, for a mistake this case alone cannot tell from another
    # (a strict < and a capacity one too large agree where the smallest capacity drops exactly the budget): it is then
    # called explain(expected, results, others): others(wanted) runs the answer on each other case wanted(case)
    # keeps, as the reading asks, and yields (that case, the answer's results there or None)
    reads_others: bool = False
    # what an error raised on this case means for it, from the case's structure: explain_error(error) -> a sentence
    # or None (then the engine's reading of the error)
    explain_error: Optional[Callable[[BaseException], Optional[str]]] = field(default=None, repr=False)
    # A prediction's reference as named terms (lib.checker.terms), by the result's leaf ("" for a plain number,
    # "['peak']"
    # for a dict's entry): a wrong prediction is named by the term, or the multiple of one, it is off by.
    formulas: dict = field(default_factory=dict)
    # Named parts of a result tensor, {"expert": (dim, count)}: right values in the wrong places are said part by
    # part ("expert 1 holds what expert 2 should"). N chunks along each dimension are always tried.
    parts: dict = field(default_factory=dict)
    # A training run's number of steps, where its builder takes steps= (the same draws otherwise): a wrong run is
    # replayed on fewer steps to find the first step that leaves the reference.
    steps: Optional[int] = None
    # What the nth point-to-point message from rank src to rank dst carries (src, dst, nth) -> words in the lesson's
    # terms ("2nd activation"; "activation of virtual stage 3 ..." where the schedule tells which): a deadlock is read
    # as which message each rank waited for, and which one its peer still needed.
    messages: Optional[Callable[[int, int, int], str]] = field(default=None, repr=False)
    rebuild: Optional[Callable[..., "Case"]] = field(default=None, repr=False)   # set by Puzzle.cases

    def __post_init__(self) -> None:
        _refuse_inside_learner()
        _validate_case(self)


def _validate_case(case: "Case") -> None:
    """The checks a case's fields allow at construction (the offending values in the message)."""
    n = case.world_size
    if not isinstance(n, int) or n < 1:
        raise SpecError(f"Case(world_size={n!r}): a positive integer.")
    if case.raises is None and len(case.expected) != n:
        raise SpecError(f"Case {case.label!r}: {len(case.expected)} expected results for world_size={n}.")
    for b in case.budgets:
        if isinstance(b.limit, (list, tuple)) and len(b.limit) != n:
            raise SpecError(f"Case {case.label!r}: Budget({b.metric!r}) has {len(b.limit)} per-rank limits for "
                            f"world_size={n}.")
    bad = {k: v for k, v in case.factors.items() if not isinstance(v, (int, float)) or not k.split(",")[0].strip()}
    if bad:
        raise SpecError(f"Case {case.label!r}: factors={bad!r}: each maps 'symbol, what it is' to a number.")
    for part, spec in case.parts.items():
        if not (isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(x, int) for x in spec)
                and spec[1] >= 2):
            raise SpecError(f"Case {case.label!r}: parts[{part!r}]={spec!r}: (dimension, number of parts >= 2).")
    if case.messages is not None and not callable(case.messages):
        raise SpecError(f"Case {case.label!r}: messages={case.messages!r}: a function (src, dst, nth) -> what the "
                        "nth message from src to dst carries.")
    if case.steps is not None and (not isinstance(case.steps, int) or case.steps < 1):
        raise SpecError(f"Case {case.label!r}: steps={case.steps!r}: a positive integer.")
    if case.explain_reads_run and case.reads_others:
        raise SpecError(f"Case {case.label!r}: explain_reads_run=True and reads_others=True: each gives explain its "
                        "third argument (the run, or the answer on the other cases), so a case sets one of them.")
    from lib.checker.terms import Formula
    for key, formula in case.formulas.items():
        if not isinstance(formula, Formula):
            raise SpecError(f"Case {case.label!r}: formulas[{key!r}] is a {type(formula).__name__}: build it with "
                            "lib.checker.terms.formula(expression, unit).")


def _refuse_inside_learner() -> None:
    """Stop a learner's function that builds a case (its expected results are the answer key)."""
    if current_rank() is not None or _learner_running:
        raise OutOfView("a check's case was being built inside the function under check. The cases are the "
                        "check's own: a fresh seed each time, and the answer is not yours to build.\n"
                        "Hint: compute your answer from the arguments your function receives.")


def guarded_builder(make_case: Callable[..., Case]) -> Callable[..., Case]:
    """`make_case`, refused at its first line inside the learner's function: before the builder's own reference
    runs (which a puzzle may forbid the learner, e.g. a refused kernel) and says something else."""
    @functools.wraps(make_case)
    def build(*args, **kwargs) -> Case:
        _refuse_inside_learner()
        guard_answer_keys(make_case)        # what computes its answers, off limits to a rank from the first case on
        return make_case(*args, **kwargs)
    return build

