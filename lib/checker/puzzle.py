"""The checker framework: run a learner's function on simulated ranks, compare, enforce budgets.

A puzzle module binds a `Puzzle` to its inputs, reference and budgets; this module knows
nothing of any particular puzzle. A check runs several randomised cases (world sizes,
shapes, values) so that only the algorithm can pass, and explains the first failure.

The answer key stays out of the learner's reach: every check draws a fresh seed (printed with a failure, so
that `check(fn, seed=...)` replays it), a `Case` cannot be built while the learner's code runs, and no rank
may read the originals of the case's arguments or its expected results (lib.sim's ownership rules).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
import os
import random
import secrets
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import torch

from lib.checker.compare import first_difference
from lib.device import device
from lib.diagnose import Mistake, case_reading, diagnose, unwritten_memory
from lib.diagnose.origins import remembering
from lib.diagnose.torch_errors import explain as explain_error
from lib.real.backends import to_device, where_it_runs
from lib.notebook import warm_up
from lib.errors import PuzzleError, RankFailed, is_the_stub, raised_the_stub
from lib.checker.kernels import refusing_kernels
from lib.guard import call_watched, guard_answer_keys, handed_to_learners
from lib.sim import CostModel, OutOfView, PerRank, SimResult, current_rank, run
from lib.units import fmt_bytes, fmt_time

# Which tolerance a comparison uses, and why.
# - A simulated check, and a real run on the CPU (gloo): the puzzle's own rtol and atol, as strict as the puzzle
#   allows. The expected values are computed on the CPU by the same kernels, in the same order.
# - A real run on a GPU (NCCL): at least GPU_TOLERANCE for the least precise floating dtype in the expected
#   result. A GPU's kernels add in another order than the CPU's (0.0677730285 on the CPU, 0.0677730295 on an
#   H100), so an exact comparison with CPU-computed expectations rejects right answers. These are
#   torch.testing.assert_close's defaults, the tolerances PyTorch's own tests use between devices; every wrong
#   answer catalogued in tests/wrong is off by far more (a factor N or k, a wrong shard), and
#   tests/test_devices.py checks that each still fails under them. Integers are always compared exactly.
GPU_TOLERANCE = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
                 torch.float64: (1e-7, 1e-7)}

METRICS = {"bytes_sent": "sent", "bytes_received": "received", "peak_memory": "peak memory",
           "host_peak_memory": "peak host memory", "host_flops": "FLOPs computed in host memory",
           "flops": "FLOPs counted", "time": "simulated time", "largest_tensor": "largest tensor",
           "argument_reads": "bytes read of its arguments"}


class SpecError(ValueError):
    """A puzzle's spec is wrong (a misspelt metric, a variant no world size runs): raised when it is written, at
    import, with the offending values, never in the middle of a learner's check."""


class CheckFailed(PuzzleError):
    """Strict mode: the learner's function gave a wrong answer or broke a budget."""


class NotSolved(PuzzleError):
    """Strict mode: the function is still the stub (it raises NotImplementedError)."""


@dataclass(frozen=True)
class Budget:
    """A ceiling on one measurement (or a floor: made by Floor), with the formula it comes from (said to
    the learner). A floor on FLOPs is the conservation check: the work a rank's share of the algorithm needs
    cannot vanish, whatever hides it from the simulator."""

    metric: str                          # bytes_sent, bytes_received, peak_memory, flops... (per rank), time (the run)
    limit: float | Sequence[float]       # one value for every rank, or one per rank
    why: str                             # e.g. "2(N-1)/N × 4.00 KiB, what a ring all-reduce sends"
    hint: str = ""
    least: bool = False                  # a floor: the measurement may not fall below the limit
    argument: Optional[int] = None       # argument_reads: the bytes read of this positional argument only
    label: str = ""                      # what the measurement is called in messages, if not METRICS's name

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise SpecError(f"Budget(metric={self.metric!r}): not a measurement the simulator takes; one of "
                            f"{', '.join(sorted(METRICS))}.")
        limits = self.limit if isinstance(self.limit, (list, tuple)) else [self.limit]
        if not limits or not all(isinstance(x, (int, float)) and x == x for x in limits):
            raise SpecError(f"Budget({self.metric!r}, limit={self.limit!r}): a number, or one number per rank.")
        if self.metric == "time" and isinstance(self.limit, (list, tuple)):
            raise SpecError("Budget('time', ...) bounds the run, not a rank: give one number.")
        if (self.metric == "argument_reads") != (self.argument is not None):
            raise SpecError(f"Budget({self.metric!r}, argument={self.argument!r}): argument= names the positional "
                            "argument whose reads are bounded, for argument_reads only (and always there).")

    def value(self, stats) -> float:
        """This budget's measurement of one rank (RankStats)."""
        found = getattr(stats, self.metric)
        return found if self.argument is None else found[self.argument]

    @property
    def name(self) -> str:
        return self.label or METRICS[self.metric]

    def broken(self, value: float, limit: float) -> bool:
        if self.least:
            return value < limit * (1 - 1e-9)
        return value > limit * (1 + 1e-9) + 1e-12

    def limit_for(self, rank: int) -> float:
        return self.limit[rank] if isinstance(self.limit, (list, tuple)) else self.limit

    def fmt(self, value: float) -> str:
        if self.metric == "time":
            return fmt_time(value)
        return f"{value:,.0f}" if self.metric in ("host_flops", "flops") else fmt_bytes(value)


def Floor(metric: str, limit: float | Sequence[float], why: str, hint: str = "") -> Budget:
    """A floor: the least a right answer measures (what the algorithm must send, compute or keep), so that work
    hidden from the meters, or an answer that skips the lesson's step, cannot pass. A Budget that says it is one."""
    return Budget(metric, limit, why, hint=hint, least=True)


def flops_budgets(share: float, why: str, over: float = 0.15, under: float = 0.5) -> list[Budget]:
    """A rank's share of the reference's FLOPs, as a ceiling (work done twice: recomputation, every rank
    computing everything) and as a floor (conservation: work the simulator did not see cannot count)."""
    return [Budget("flops", share * (1 + over), f"{why}, + {over:.0%}",
                   hint="compute each piece once, on the rank that owns it: no recomputation, no replicated work."),
            Floor("flops", share * under, f"{under:.0%} of {why}",
                  hint="the work must run on the rank, in torch ops the simulator sees.")]


def nothing_on_the_host(lesson: str) -> Budget:
    """No host memory at all, for a lesson about where state lives on the device: moving the model to
    lib.host() would meet a device budget without the lesson's algorithm."""
    return Budget("host_peak_memory", 0, f"{lesson}: none of it belongs in host memory",
                  hint="keep the model, its gradients and the optimizer state on the device (the arguments are "
                       "there already); lib.host() hides memory from the device's budget, not from the check.")


@dataclass(frozen=True)
class Contract:
    """A rule of the algorithm the statement asks for, checked on the run (who sent to whom, how many
    collectives of what size): a right answer reached by another algorithm breaks it."""

    rule: str                                  # what the statement asks, e.g. "a ring sends only to a neighbour"
    broken: Callable[[SimResult], Optional[str]]       # what the run did instead, or None when it kept the rule
    hint: str = ""
    timed: bool = False                        # it reads the simulated clocks (so depends on the cost model)

    def judge(self, result: SimResult) -> Optional[str]:
        found = self.broken(result)
        if not found:
            return None
        return f"the answer is right, but {found}: {self.rule}." + (f"\nHint: {self.hint}" if self.hint else "")


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


def _guarded_builder(make_case: Callable[..., Case]) -> Callable[..., Case]:
    """`make_case`, refused at its first line inside the learner's function: before the builder's own reference
    runs (which a puzzle may forbid the learner, e.g. a refused kernel) and says something else."""
    @functools.wraps(make_case)
    def build(*args, **kwargs) -> Case:
        _refuse_inside_learner()
        guard_answer_keys(make_case)        # what computes its answers, off limits to a rank from the first case on
        return make_case(*args, **kwargs)
    return build


PASSED, FAILING, UNATTEMPTED = "passed", "failing", "unattempted"
_NOT_SOLVED = "{} is not solved yet: write its body, then run this cell again."


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


class Puzzle:
    """One puzzle: the function `name` a learner writes in notebook `notebook`."""

    def __init__(self, name: str, notebook: str, make_case: Callable[[random.Random, int], Case], *,
                 world_sizes: Sequence[int] = (2, 3, 4, 5, 8), hints: Sequence[str] = (),
                 oracle: Optional[Callable] = None, oracle_name: str = "", rtol: float = 1e-5,
                 atol: float = 1e-6, describe: str = "", takes_dist: bool = True, min_world_size: int = 1,
                 min_world_size_reason: str = "", variants: Sequence[dict] = (),
                 mistakes: Sequence[Mistake] = (),
                 off_limits: Mapping[str, Any] = MappingProxyType({}), off_limits_advice: str = "",
                 real_cell: bool = True,
                 real_scale: Optional[Callable[[Case], tuple[CostModel, str]]] = None,
                 refuse: tuple[Iterable[str], str] = ((), ""),
                 harness: Optional[Callable] = None,
                 outputs: Mapping[str, str] = MappingProxyType({}), tools: Sequence[Callable] = ()) -> None:
        self.name = name
        self.tools = tuple(tools)       # helpers its notebook hands the learner: never taken for answer keys
        handed_to_learners(self.tools)
        self.notebook = notebook
        # The problem-set module that builds the cases; solutions/ has a module of the same name.
        self.module = make_case.__module__.rsplit(".", 1)[-1]
        self.make_case = _guarded_builder(make_case)
        self.world_sizes = tuple(world_sizes)
        # Keyword arguments of make_case for the first cases, so that every seed covers what the statement does
        # (tied and untied embeddings, an m that must be refused): the rest of each case stays random.
        self.variants = tuple(variants)
        self.hints = list(hints)
        self.mistakes = tuple(mistakes)    # known wrong answers, named when a learner's result equals theirs
        # What the learner's function may not call while it runs (label -> function or module, lib.guard.offlimits):
        # a prediction is derived, not looked up in the library that measures or models it.
        self.off_limits = dict(off_limits)
        self.off_limits_advice = off_limits_advice or "derive the answer yourself"
        # False for a prediction: the notebook shows a measurement on the device instead of a real cell, since a
        # real process would only repeat the prediction's arithmetic (Puzzle.real still runs it).
        self.real_cell = real_cell
        # The timeline after a success is drawn under real_scale(case)'s cost model, scaled so that the toy case
        # shows a real run's proportions of compute, bandwidth and latency (lib.viz.timeline.at_scale), with the
        # scale it stands for in its title: the check runs its last case so where no judgement reads the clocks,
        # else one more run of it draws the picture. None: the check's own run.
        self.real_scale = real_scale
        # torch's ops the answer may not call, with why (prefixes of op names, lib.checker.kernels): kernels that
        # would do
        # the lesson's work for it.
        self.refused, self.refused_why = tuple(refuse[0]), refuse[1]
        # How each rank runs the answer, where the check judges what the answer does rather than what it returns:
        # harness(answer, dist, *case.args) -> the result compared (the answer as the learner gave it, watched).
        self.harness = harness
        self.oracle = oracle
        self.oracle_name = oracle_name
        self.rtol, self.atol = rtol, atol
        self.describe = describe
        # What each part of the result is, by its leaf ("[2]": "the router's gradient"), for messages that name
        # outputs as the statement does rather than as result[2].
        self.outputs = dict(outputs)
        self.takes_dist = takes_dist       # False: a plain function of the inputs (a prediction, a count)
        self.min_world_size = min_world_size   # the fewest ranks its algorithm can run on (a pipeline: 2 stages)
        self.min_world_size_reason = min_world_size_reason or f"its algorithm runs on {min_world_size} ranks or more"
        # A real cell's default: one process for single-device lessons, four otherwise.
        self.real_world_size = 1 if max(self.world_sizes) == 1 else 4
        self._hints_shown = 0
        self._validate(make_case)

    def _validate(self, make_case: Callable) -> None:
        """A spec that is wrong fails here, at import, with the offending values (as torchtitan's
        ParallelDims._validate does), not in a learner's check."""
        where = f"Puzzle {self.name!r}"
        if not self.name.isidentifier():
            raise SpecError(f"{where}: the name must be the function's name, a Python identifier.")
        if not self.world_sizes or not all(isinstance(n, int) and n >= 1 for n in self.world_sizes):
            raise SpecError(f"{where}: world_sizes={self.world_sizes!r}: positive integers, one case each.")
        if len(self.variants) > len(self.world_sizes):
            raise SpecError(f"{where}: {len(self.variants)} variants for {len(self.world_sizes)} world sizes "
                            f"{self.world_sizes}: variant {len(self.world_sizes) + 1} on would never run.")
        params = inspect.signature(make_case).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        for i, variant in enumerate(self.variants):
            unknown = sorted(set(variant) - set(params)) if not takes_any else []
            if unknown:
                raise SpecError(f"{where}: variant {i + 1} {variant!r} sets {unknown}, which "
                                f"{make_case.__name__} does not take.")
        small = [n for n in self.world_sizes if n < self.min_world_size]
        if small:
            raise SpecError(f"{where}: world sizes {small} are below its min_world_size={self.min_world_size}.")
        if not all(isinstance(h, str) and h for h in self.hints):
            raise SpecError(f"{where}: hints must be non-empty strings.")
        if self.rtol < 0 or self.atol < 0:
            raise SpecError(f"{where}: rtol={self.rtol}, atol={self.atol}: tolerances are not negative.")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.outputs.items()):
            raise SpecError(f"{where}: outputs={self.outputs!r}: maps a result's leaf ('[2]', \"['w']\") to words.")

    def __repr__(self) -> str:
        return f"<puzzle {self.notebook}/{self.name}>"

    def wrap(self, fn: Callable) -> Callable:
        """The function each rank runs, made from the learner's: it takes `dist` first (a plain puzzle
        function is wrapped to ignore it). Subclasses may wrap further, e.g. to run backward after the
        learner's forward; the simulated and the real checks both run what this returns."""
        if not callable(fn):
            return fn
        inner = self._runnable(fn)
        return refusing_kernels(inner, self.refused, self.refused_why) if self.refused else inner

    def _runnable(self, fn: Callable) -> Callable:
        if self.harness is not None:
            watched = functools.partial(call_watched, self.off_limits, self.off_limits_advice, fn) if self.off_limits \
                else fn
            return functools.partial(self.harness, watched)
        inner = fn if self.takes_dist else functools.partial(_without_dist, fn)
        if self.off_limits:
            return functools.partial(call_watched, self.off_limits, self.off_limits_advice, inner)
        return inner

    def cases(self, seed: int = 0) -> list[Case]:
        rng = random.Random(f"{self.name}:{seed}")
        variants = list(self.variants) + [{}] * (len(self.world_sizes) - len(self.variants))
        out = []
        for n, variant in zip(self.world_sizes, variants):
            state = rng.getstate()
            case = self.make_case(rng, n, **variant)
            case.rebuild = functools.partial(self._rebuild, state, n, variant)
            out.append(case)
        return out

    def _rebuild(self, state: object, world: int, variant: dict, **changes) -> Case:
        """The same case drawn again from the same random state, with `changes` to its builder (steps=1)."""
        rng = random.Random()
        rng.setstate(state)
        return self.make_case(rng, world, **variant, **changes)

    # ---- simulated check -------------------------------------------------------------
    def evaluate(self, fn: Callable, seed: Optional[int] = None) -> Outcome:
        """Run every case; stop at the first failure. Never raises for a learner's mistake.

        Without a seed, the cases come from a fresh one; a failure says which, to replay it."""
        if not callable(fn):
            return Outcome(FAILING, f"{self.name} should be a function, got {type(fn).__name__}.")
        if is_the_stub(fn):              # what running it on the cases would say, without building them
            return Outcome(UNATTEMPTED, _NOT_SOLVED.format(self.name))
        warm_up.ready()
        with one_thread():
            return self._evaluate(fn, fresh_seed() if seed is None else seed)

    def _evaluate(self, fn: Callable, seed: int) -> Outcome:
        call = f"P.{self.name}.check({getattr(fn, '__name__', 'fn')}, seed={seed})"
        names = _parameter_names(fn, self.takes_dist)
        replay = f"\n(Cases from seed {seed}: {call} replays them.)"
        last: Optional[SimResult] = None
        fn = self.wrap(fn)
        cases = self.cases(seed)
        scale = None
        for case in cases:
            cost = case.cost
            if case is cases[-1] and self._timed_at_scale(case):
                cost, scale = self.real_scale(case)
            try:
                result = _run_case(fn, case, cost)
            except RankFailed as e:
                if raised_the_stub(e):
                    return Outcome(UNATTEMPTED, _NOT_SOLVED.format(self.name))
                if _refused_as_asked(case, e):
                    continue
                return _failing(case, f"{e}", explain_error(fn, case, e, names), replay)
            except PuzzleError as e:
                return _failing(case, f"{type(e).__name__}: {e}", explain_error(fn, case, e, names), replay)
            problem = _not_refused(case) or self._judge(case, result, fn, [c for c in cases if c is not case], names)
            if problem:
                return _failing(case, problem, None, replay, result)
            last = result
        return Outcome(PASSED, self._success(last, case), last, case, seed=seed, scale=scale)

    def _timed_at_scale(self, case: Case) -> bool:
        """Whether the check may run `case` under the display's cost model, so that its success picture needs no
        second run: only where nothing judged reads the clocks (no cost model of its own, no time budget)."""
        return (self.real_scale is not None and case.cost is None and not any(b.metric == "time" for b in case.budgets)
                and not any(c.timed for c in case.contracts))

    def _judge(self, case: Case, result: SimResult, fn: Optional[Callable] = None, others: Sequence[Case] = (),
               names: Sequence[str] = (), diagnosing: bool = True) -> Optional[str]:
        return self._judge_answer(case, result, fn, others, names, diagnosing) or self._judge_budgets(case, result)

    def _judge_answer(self, case: Case, result: SimResult, fn: Optional[Callable] = None,
                      others: Sequence[Case] = (), names: Sequence[str] = (), diagnosing: bool = True,
                      ) -> Optional[str]:
        """What is wrong with the ops used, the results or the case's contracts, or None. `fn` and the check's
        `others` cases let the diagnosis replay the answer (a NaN's origin, a factor the case cannot pin down);
        without `diagnosing`, a wrong result is said without looking for its cause."""
        if case.allowed_ops is not None:
            for s in result.stats:
                extra = sorted(set(s.calls) - case.allowed_ops)
                if extra:
                    return (f"rank {s.rank} used {', '.join(extra)}; this puzzle is to be built from "
                            f"{', '.join(sorted(case.allowed_ops))} only.")
        for rank, (want, got) in enumerate(zip(case.expected, result.results)):
            diff = first_difference(want, got, self.rtol, self.atol, where="the result")
            if diff and not diagnosing:
                return f"rank {rank}: {diff}."
            if diff:
                with remembering():           # the replays asked for below run once
                    explained = case_reading(case, result.results)
                    # A reading of values that torch.empty's leftovers made (a stale block, NaN) would name a cause
                    # that changes from run to run: memory read before anything wrote it is said instead.
                    found = explained and unwritten_memory(case.expected, result.results, case, fn, self.rtol,
                                                           self.atol, self.outputs)
                    if not found:
                        found = diagnose(case.expected, result.results, case.args,
                                         mistakes=self.mistakes + case.mistakes, wrap=self.wrap, factors=case.factors,
                                         rtol=self.rtol, atol=self.atol, case=case, fn=fn, outputs=self.outputs,
                                         others=others, names=names, explained=bool(explained))
                        found = "\n".join(filter(None, (explained, found)))
                return f"rank {rank}: {diff}." + (f"\n{found}" if found else "")
        for contract in case.contracts:
            problem = contract.judge(result)
            if problem:
                return problem
        return None

    def _judge_budgets(self, case: Case, result: SimResult) -> Optional[str]:
        """The first budget (time, memory, FLOPs, ...) the run breaks, said with its formula, or None."""
        for b in case.budgets:
            if b.metric == "time":
                if b.broken(result.time, b.limit_for(0)):
                    return self._over(b, "the run", result.time, b.limit_for(0))
                continue
            for s in result.stats:
                value = b.value(s)
                if b.broken(value, b.limit_for(s.rank)):
                    outside = s.outside_bytes if b.metric == "peak_memory" else 0
                    return self._over(b, f"rank {s.rank}", value, b.limit_for(s.rank), outside)
        return None

    @staticmethod
    def _over(b: Budget, who: str, value: float, limit: float, outside: float = 0) -> str:
        side = "under the floor" if b.least else "over the budget"
        shown, bound = b.fmt(value), b.fmt(limit)
        by = f" by {b.fmt(abs(value - limit))}" if shown == bound else ""   # "504.33 KiB over 504.33 KiB": by what?
        text = f"the answer is right, but {who}'s {b.name} is {shown}, {side} of {bound}{by} ({b.why})."
        if outside:
            text += (f" Of that, {b.fmt(outside)} are Python numbers taken out of tensors (.tolist(), .item()), which "
                     "count until the run ends: the simulator cannot see when Python frees them.")
        return text + (f"\nHint: {b.hint}" if b.hint else "")

    def _success(self, result: SimResult, case: Case, heading: str = "") -> str:
        sizes = ", ".join(str(n) for n in self.world_sizes)
        where = f" (world sizes {sizes})" if self.takes_dist else ""
        text = heading or f"✓ {self.name} is correct on {len(self.world_sizes)} cases{where}."
        for b in case.budgets:
            who = ""
            if b.metric == "time":
                value, limit = result.time, b.limit_for(0)
            else:
                ratio = lambda s, b=b: b.value(s) / max(b.limit_for(s.rank), 1e-30)     # noqa: E731
                worst = (min if b.least else max)(result.stats, key=ratio)
                value, limit = b.value(worst), b.limit_for(worst.rank)
                nearest = "floor" if b.least else "budget"
                who = f" (rank {worst.rank}, nearest its {nearest})" if case.world_size > 1 else ""
            at = f" at N={case.world_size}{who}" if self.takes_dist else ""
            kind = "floor" if b.least else "budget"
            text += f"\n  {b.name}{at}: {b.fmt(value)} of a {b.fmt(limit)} {kind} ({b.why})."
        return text

    def at_scale(self, fn: Callable, world_size: int, show: bool = True, strict: Optional[bool] = None,
                 **variant) -> Optional[SimResult]:
        """`fn` on one case of `world_size` simulated ranks (`variant`: the case builder's arguments, a mesh's shape),
        judged as the check judges it (results, contracts, budgets) and pictured as its success is: the pattern at
        a real cluster's proportions, for after the check has passed. Its run (None if there is none to show).
        A wrong answer is said without the check's diagnosis, which replays the run (seconds each at this size).
        `strict` (COURSE_STRICT, as for check): raise rather than print what is wrong."""
        strict = strict_default() if strict is None else strict

        def unsolved() -> None:
            print(f"○ {_NOT_SOLVED.format(self.name)}")
            if strict:
                raise NotSolved(_NOT_SOLVED.format(self.name))
        if not callable(fn) or is_the_stub(fn):
            return unsolved()
        warm_up.ready()
        case = self.make_case(random.Random(f"{self.name}:at scale"), world_size, **variant)
        where = f"at N={world_size} ({case.label})"
        with one_thread():
            try:
                result = _run_case(self.wrap(fn), case, case.cost)
                problem = _not_refused(case) or self._judge(case, result, diagnosing=False)
            except PuzzleError as e:
                if isinstance(e, RankFailed) and raised_the_stub(e):        # a helper of theirs still the stub
                    return unsolved()
                problem = str(e).strip()
        if problem:
            text = (f"✗ {self.name} failed {where}:\n{_abridged(problem)}\n"
                    f"Hint: run P.{self.name}.check({fn.__name__}) first: on its small cases it names the mistake. "
                    "What only a larger mesh shows is a size written as a number (a 2 where a degree belongs) or a "
                    "rank's place worked out for the small mesh alone.")
            print(text)
            if strict:
                raise CheckFailed(text)
            return None
        print(self._success(result, case, heading=f"✓ {self.name} is right {where}: every rank's result matches the "
                                                 "single-device reference, within every budget."))
        if show and _in_notebook():
            from IPython.display import display

            from lib.viz.png import Picture
            for figure in self.picture(Outcome(PASSED, "", result, case), fn):
                display(Picture(figure))
        return result

    def check(self, fn: Callable, strict: Optional[bool] = None, seed: Optional[int] = None, show: bool = True) -> bool:
        """The check cell: True when `fn` is right and within budget. Prints why not, with a hint."""
        strict = strict_default() if strict is None else strict
        outcome = self.evaluate(fn, seed)
        warm_up.answered()
        if outcome.ok:
            print(outcome.message)
            if show and _in_notebook():
                from IPython.display import display

                from lib.viz.png import Picture
                for figure in self.picture(outcome, fn):
                    display(Picture(figure))
            return True
        if outcome.status == UNATTEMPTED:
            print(f"○ {outcome.message}")
            if strict:
                raise NotSolved(outcome.message)
            return False
        text = f"✗ {self.name} failed {outcome.message}"
        if self.hints and not outcome.hinted:
            text += "\n" + self._failure_hint()
        print(text)
        if strict:
            raise CheckFailed(text)
        return False

    def picture(self, outcome: Outcome, fn: Optional[Callable] = None) -> list:
        """The figures that show what the lesson is about: the per-rank timeline when ranks talk (or
        copy to the host), at a real run's scale where the puzzle has a display cost model and `fn` is given;
        memory over time when memory is a budget; none for a plain prediction."""
        result, case = outcome.result, outcome.case
        if result is None:
            return []
        title = f"{self.name}, {case.label}"
        figures = []
        if any(e.lane == "comm" or e.op in ("to_host", "to_device") for e in result.trace):
            shown, scale = result, outcome.scale or ""
            if self.real_scale is not None and outcome.scale is None and fn is not None:
                cost, scale = self.real_scale(case)
                with one_thread():         # as the check's own runs: intra-op threads only spin on tiny tensors
                    shown = run(self.wrap(fn), case.world_size, *case.args, cost=cost, protect=case.expected,
                                faults=case.faults)
            figures.append(shown.timeline(title=f"{title}\n{scale}" if scale else title))
        if any(b.metric == "peak_memory" for b in case.budgets):
            from lib.viz.plots import memory_over_time_figure
            figures.append(memory_over_time_figure({f"{self.name}, rank 0": result}, title=title))
        return figures

    def hint(self) -> str:
        """Show the next hint, in tiers from a nudge to nearly the answer."""
        if not self.hints:
            text = "No hints for this one."
        else:
            i = min(self._hints_shown, len(self.hints) - 1)
            self._hints_shown = i + 1
            text = f"Hint {i + 1} of {len(self.hints)}: {self.hints[i]}"
        print(text)
        return text

    def _failure_hint(self) -> str:
        """A failed check repeats the furthest hint the learner has seen (the first, at first); puzzle.hint()
        then gives the one after it."""
        i = max(self._hints_shown, 1) - 1
        self._hints_shown = i + 1
        more = i + 1 < len(self.hints)
        return f"Hint: {self.hints[i]}" + (f"  (P.{self.name}.hint() gives the next, {i + 2} of {len(self.hints)})"
                                           if more else "")

    def solution(self, confirm: bool = False) -> Optional[str]:
        """The reference solution, on explicit request only: `puzzle.solution(confirm=True)`.

        Looked up by name in the solutions package (`solutions.<module>.<name>`), which a student
        release does not ship."""
        if not confirm:
            print(f"This would show the reference solution of {self.name}. To see it, ask on purpose: "
                  f"P.{self.name}.solution(confirm=True)")
            return None
        try:
            module = importlib.import_module(f"solutions.{self.module}")
        except ModuleNotFoundError:
            print("The reference solutions are not part of this release of the course.")
            return None
        source = inspect.getsource(getattr(module, self.name))
        print(source)
        return source

    def run(self, fn: Callable, world_size: Optional[int] = None, seed: int = 0) -> SimResult:
        """Run one case on simulated ranks, for exploring: look at .stats and .timeline()."""
        n = world_size or self.world_sizes[-1]
        with one_thread():
            case = self.make_case(random.Random(f"{self.name}:{seed}"), n)
            return run(self.wrap(fn), n, *case.args, cost=case.cost)

    def explore(self, fn: Callable, world_size: Optional[int] = None) -> Optional[SimResult]:
        """Like run, for figures in a notebook: None (with a note) while the puzzle is unsolved or failing."""
        try:
            return self.run(fn, world_size)
        except PuzzleError as e:
            stub = raised_the_stub(e)
            print(f"○ solve {self.name} first to see this." if stub else f"✗ {self.name} does not run yet: "
                  f"{str(e).splitlines()[0]}")
            return None

    # ---- real processes --------------------------------------------------------------
    def real(self, fn: Callable, world_size: Optional[int] = None, backend: Optional[str] = None,
             seed: Optional[int] = None, strict: Optional[bool] = None, timeout: float = 60.0) -> bool:
        """The real cell: the same function on `world_size` real processes (gloo, or NCCL on GPUs).

        Each rank builds the same case from the seed and judges its own result where it was computed
        (results need not survive a trip between processes: a pickled Parameter loses its .grad)."""
        from lib.real.launch import launch

        strict = strict_default() if strict is None else strict
        world_size = world_size or self.real_world_size
        refusal = self.refusal(world_size)
        if refusal:
            return self._real_failed(refusal, strict)
        seed = fresh_seed() if seed is None else seed
        try:
            verdicts = launch(_judge_rank, world_size, self, fn, seed, backend=backend, timeout=timeout)
        except RankFailed as e:
            if raised_the_stub(e):
                print(f"○ {self.name} is not solved yet: the real run waits for your answer.")
                if strict:
                    raise NotSolved(str(e)) from None
                return False
            return self._real_failed(f"{e}", strict)
        except PuzzleError as e:
            return self._real_failed(f"{type(e).__name__}: {e}", strict)
        for problem, *_ in verdicts:
            if problem:
                return self._real_failed(problem + self._simulated_view(fn, seed), strict)
        _, label, how = verdicts[0]
        against = f" and agrees with {self.oracle_name}" if self.oracle is not None else ""
        processes = "1 process" if world_size == 1 else f"{world_size} processes"
        print(f"✓ real run on {processes}, {how} ({label}): {self.name} matches the reference{against} "
              "on every rank.")
        return True

    def _simulated_view(self, fn: Callable, seed: int) -> str:
        """After a real run's wrong result, which a rank judges alone: the simulated check of the same answer,
        which sees every rank and names the mistake where it knows it, or says that only processes show it."""
        outcome = self.evaluate(fn, seed)
        if outcome.ok:
            return (f"\nThe simulated check passes this answer (seed {seed}): what differs is what only separate "
                    "processes show: state the ranks share in Python (a global, a closure, a class attribute) or keep "
                    "from an earlier call, or code that tells the simulator from torch.distributed.")
        return f"\nThe simulated check of the same answer says: {outcome.message}" if outcome.status == FAILING else ""

    def refusal(self, world_size: int) -> Optional[str]:
        """Why this puzzle cannot run on `world_size` ranks, with the fix; None when it can."""
        if max(self.world_sizes) == 1 and world_size != 1:
            return f"{self.name} is a single-device lesson: run it with world_size=1."
        if isinstance(world_size, int) and world_size < self.min_world_size:
            n = self.min_world_size
            return (f"{self.name} needs at least {n} ranks ({self.min_world_size_reason}): run it with "
                    f"world_size={n} or more; {where_it_runs(n)}.")
        return None

    def real_tolerance(self, expected: Any, where: torch.device) -> tuple[float, float]:
        """(rtol, atol) for comparing a real run on `where` with `expected`: see GPU_TOLERANCE above."""
        dtype = _least_precise(expected)
        if where.type == "cpu" or dtype is None:
            return self.rtol, self.atol
        rtol, atol = GPU_TOLERANCE.get(dtype, GPU_TOLERANCE[torch.float16])
        return max(self.rtol, rtol), max(self.atol, atol)

    def check_in_group(self, fn: Callable, dist, seed: int = 0) -> Optional[str]:
        """This rank's part of the real check inside a process group someone else started (torchrun).

        Every rank builds the same case from the seed; returns None when this rank's result is right.
        """
        return self._judge_in_group(fn, dist, seed)[0]

    def _judge_in_group(self, fn: Callable, dist, seed: int) -> tuple[Optional[str], str, str]:
        """(what is wrong on this rank or None, the case's label, where it ran and how it was compared)."""
        refusal = self.refusal(dist.get_world_size())
        if refusal:
            return refusal, "", ""
        args = self.make_case(random.Random(f"{self.name}:{seed}"), dist.get_world_size()).args
        mine, theirs = _real_rank(dist, self.wrap(fn), self.oracle, args)
        # Rebuilt from the seed only now: while the learner's function ran, no case (expected results included)
        # was in this process to be found.
        case = self.make_case(random.Random(f"{self.name}:{seed}"), dist.get_world_size())
        rank, where = dist.get_rank(), device()
        rtol, atol = self.real_tolerance(case.expected[rank], where)
        how = f"{dist.get_backend()} on {where}"
        if (rtol, atol) != (self.rtol, self.atol):
            how += f", compared within a GPU's rounding (rtol {rtol:g}, atol {atol:g})"
        diff = first_difference(case.expected[rank], mine, rtol, atol, where="the result")
        if diff:
            return f"on {case.label}, rank {rank}: {diff}.", case.label, how
        if self.oracle is not None:
            diff = first_difference(theirs, mine, rtol, atol, where="the result")
            if diff:
                return f"rank {rank} differs from {self.oracle_name}: {diff}.", case.label, how
        return None, case.label, how

    def _real_failed(self, message: str, strict: bool) -> bool:
        text = f"✗ real run of {self.name} failed: {message}"
        print(text)
        if strict:
            raise CheckFailed(text)
        return False


def _run_case(fn: Callable, case: Case, cost: Optional[CostModel]) -> SimResult:
    """`fn` (wrapped already) on `case`'s simulated ranks, under `cost`: a check's run of one case."""
    return run(fn, case.world_size, *case.args, cost=cost, protect=case.expected, faults=case.faults,
               read_arguments=any(b.metric == "argument_reads" for b in case.budgets))


def _abridged(text: str, head: int = 20, tail: int = 4) -> str:
    """`text` with its middle lines left out when it has too many to read: a report of every rank's wait has a line per
    rank, hundreds at a cluster's size (Puzzle.at_scale); its first lines and its last (the hints) are kept."""
    lines = text.splitlines()
    if len(lines) <= head + tail + 1:
        return text
    return "\n".join([*lines[:head], f"  ... ({len(lines) - head - tail} more lines like these)", *lines[-tail:]])


def _parameter_names(fn: Callable, takes_dist: bool) -> tuple[str, ...]:
    """The learner's names for the arguments after dist, for messages that name an input as the learner does."""
    try:
        names = [p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return ()
    return tuple(names[1:] if takes_dist else names)


def _failing(case: Case, problem: str, meaning: Optional[str], replay: str,
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


def _refused_as_asked(case: Case, e: RankFailed) -> bool:
    """The learner's function raised the exception the statement asks for on this case's arguments."""
    return case.raises is not None and isinstance(getattr(e, "exception", None), case.raises)


def _not_refused(case: Case) -> Optional[str]:
    """What is wrong when a case whose arguments the statement says to refuse ran to the end."""
    if case.raises is None:
        return None
    name = case.raises.__name__
    return (f"the statement asks for a {name} on these arguments, and your function returned without raising "
            f"one: check the arguments first, and raise {name}(\"...\") saying what is wrong, so that a run that "
            "cannot work stops before it starts.")


def _judge_rank(dist, puzzle: Puzzle, fn: Callable, seed: int) -> tuple[Optional[str], str, str]:
    """What each process of a real cell runs: Puzzle._judge_in_group on this rank."""
    return puzzle._judge_in_group(fn, dist, seed)


_learner_running = False      # a real rank is running the learner's function: no Case may be built meanwhile


@contextlib.contextmanager
def one_thread():
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


def _without_dist(fn: Callable, dist, *args):
    return fn(*args)


def _real_rank(dist, fn: Callable, oracle: Optional[Callable], args: tuple):
    """What each real process runs: the learner's function, then the PyTorch oracle on fresh inputs, each
    given its own copy of every argument on the rank's device (dataclasses and containers included)."""
    rank, where = dist.get_rank(), device()

    def mine_of(a):
        return to_device(copy.deepcopy(a.values[rank] if isinstance(a, PerRank) else a), where)

    global _learner_running
    inputs = list(map(mine_of, args))
    _learner_running = True
    try:
        mine = fn(dist, *inputs)
    finally:
        _learner_running = False
    theirs = oracle(dist, *map(mine_of, args)) if oracle is not None else None
    return mine, theirs


def _least_precise(value: Any) -> Optional[torch.dtype]:
    """The floating dtype with the largest rounding in `value` (tensors, modules, containers; a Python float
    is a float64), or None when it holds no floating-point number."""
    if isinstance(value, torch.Tensor):
        found = [value.dtype] if value.is_floating_point() else []
    elif isinstance(value, torch.nn.Module):
        found = [p.dtype for p in value.parameters() if p.is_floating_point()]
    elif isinstance(value, float):
        found = [torch.float64]
    elif isinstance(value, (list, tuple)):
        found = [_least_precise(v) for v in value]
    elif isinstance(value, dict):
        found = [_least_precise(v) for v in value.values()]
    else:
        found = []
    found = [d for d in found if d is not None]
    return max(found, key=lambda d: torch.finfo(d).eps) if found else None


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


if _in_notebook():          # the one-time costs are paid after the notebook's first answer (lib.notebook.warm_up)
    warm_up.in_kernel()
