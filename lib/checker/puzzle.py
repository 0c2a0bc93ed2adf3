"""The checker framework: run a learner's function on simulated ranks, compare, enforce budgets.

A puzzle module binds a `Puzzle` to its inputs, reference and budgets; this module knows
nothing of any particular puzzle. A check runs several randomised cases (world sizes,
shapes, values) so that only the algorithm can pass, and explains the first failure.

A check is a pipeline of stages, each in its own module, followed from `Puzzle.check` down:
`run` (lib.checker.run: the answer on a case's ranks, meters checked, results plain), `compare`
(lib.checker.compare), `diagnose` (lib.diagnose.diagnosis), `contracts` (lib.checker.contract),
`budgets` (lib.checker.budgets), then the `verdict` (lib.checker.verdict: one message, in a fixed order).

The answer key stays out of the learner's reach: every check draws a fresh seed (printed with a failure, so
that `check(fn, seed=...)` replays it), a `Case` cannot be built while the learner's code runs, and no rank
may read the originals of the case's arguments or its expected results (lib.sim's ownership rules).
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import random
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import torch

import lib.checker.case as case_module
from lib.checker.budgets import METRICS, Budget, Floor, budget_lines, flops_budgets, judge_budgets, \
    nothing_on_the_host
from lib.checker.case import Case, guarded_builder
from lib.checker.compare import first_difference, first_wrong_rank
from lib.checker.plain import as_plain
from lib.checker.contract import Contract, judge_contracts, ops_outside
from lib.checker.run import Answer, answer_on_rank, fresh_seed, one_thread, run_case
from lib.checker.spec import SpecError
from lib.checker.terms import amount
from lib.checker.verdict import FAILING, NOT_SOLVED, PASSED, UNATTEMPTED, CheckFailed, NotSolved, Outcome, failing, \
    not_refused, refused_as_asked, strict_default
from lib.device import device
from lib.diagnose import Mistake, diagnosis
from lib.diagnose.torch_errors import explain as explain_error
from lib.errors import PuzzleError, RankFailed, is_the_stub, raised_the_stub
from lib.guard import handed_to_learners
from lib.notebook import warm_up
from lib.real.backends import to_device, where_it_runs
from lib.sim import CostModel, PerRank, SimResult, run

__all__ = ["METRICS", "Budget", "Floor", "flops_budgets", "nothing_on_the_host", "Case", "Contract", "SpecError",
           "Outcome", "PASSED", "FAILING", "UNATTEMPTED", "CheckFailed", "NotSolved", "strict_default", "fresh_seed",
           "one_thread", "Puzzle", "GPU_TOLERANCE"]

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
        self.make_case = guarded_builder(make_case)
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
        # How each rank runs the answer (lib.checker.run.Answer), validated here: the one wrapping of Puzzle.wrap.
        try:
            self.how = Answer(takes_dist=takes_dist, harness=harness, refused=self.refused,
                              refused_why=self.refused_why, off_limits=self.off_limits,
                              off_limits_advice=self.off_limits_advice)
        except SpecError as e:
            raise SpecError(f"Puzzle {name!r}: {e}") from None

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
        for keyword in ("oracle", "real_scale"):
            if getattr(self, keyword) is not None and not callable(getattr(self, keyword)):
                raise SpecError(f"{where}: {keyword}={getattr(self, keyword)!r}: a function, or None.")
        strays = [m for m in self.mistakes if not isinstance(m, Mistake)]
        if strays:
            raise SpecError(f"{where}: mistakes {strays!r}: each a lib.diagnose.Mistake(fn, message).")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.outputs.items()):
            raise SpecError(f"{where}: outputs={self.outputs!r}: maps a result's leaf ('[2]', \"['w']\") to words.")

    def __repr__(self) -> str:
        return f"<puzzle {self.notebook}/{self.name}>"

    def wrap(self, fn: Callable) -> Callable:
        """The function each rank runs, made from the learner's in one wrapping (lib.checker.run.Answer): it takes
        `dist` first (a plain puzzle function is run without it). Subclasses may wrap otherwise, e.g. to run
        backward after the learner's forward; the simulated and the real checks both run what this returns."""
        if not callable(fn):
            return fn
        return functools.partial(answer_on_rank, self.how, fn)

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
            return Outcome(UNATTEMPTED, NOT_SOLVED.format(self.name))
        warm_up.ready()
        with one_thread():
            return self._evaluate(fn, fresh_seed() if seed is None else seed)

    def _evaluate(self, fn: Callable, seed: int) -> Outcome:
        """The check's pipeline, case by case: run, then judge (ops, results and their diagnosis, contracts,
        budgets); the first failure is the verdict, said once (lib.checker.verdict.failing)."""
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
                result = run_case(fn, case, cost)
            except RankFailed as e:
                if raised_the_stub(e):
                    return Outcome(UNATTEMPTED, NOT_SOLVED.format(self.name))
                if refused_as_asked(case, e):
                    continue
                return failing(case, f"{e}", explain_error(fn, case, e, names), replay)
            except PuzzleError as e:
                return failing(case, f"{type(e).__name__}: {e}", explain_error(fn, case, e, names), replay)
            problem = not_refused(case) or self._judge(case, result, fn, [c for c in cases if c is not case], names)
            if problem:
                return failing(case, problem, None, replay, result)
            last = result
        return Outcome(PASSED, self._success(last, case), last, case, seed=seed, scale=scale)

    def _timed_at_scale(self, case: Case) -> bool:
        """Whether the check may run `case` under the display's cost model, so that its success picture needs no
        second run: only where nothing judged reads the clocks (no cost model of its own, no time budget)."""
        return (self.real_scale is not None and case.cost is None and not any(b.metric == "time" for b in case.budgets)
                and not any(c.timed for c in case.contracts))

    def _judge(self, case: Case, result: SimResult, fn: Optional[Callable] = None, others: Sequence[Case] = (),
               names: Sequence[str] = (), diagnosing: bool = True) -> Optional[str]:
        """What is wrong with a run, or None: the stages after the run, in order. `fn` and the check's `others` cases
        let the diagnosis replay the answer; without `diagnosing`, a wrong result is said without its cause."""
        return (ops_outside(case, result)
                or self._compare(case, result, fn, others, names, diagnosing)
                or judge_contracts(case, result)
                or judge_budgets(case, result))

    def _compare(self, case: Case, result: SimResult, fn: Optional[Callable], others: Sequence[Case],
                 names: Sequence[str], diagnosing: bool) -> Optional[str]:
        """The first rank whose result differs from the reference, and why (lib.diagnose.diagnosis), or None."""
        wrong = first_wrong_rank(case.expected, result.results, self.rtol, self.atol)
        if wrong is None:
            return None
        rank, diff = wrong
        found = diagnosis(case, result.results, mistakes=self.mistakes, wrap=self.wrap, rtol=self.rtol, atol=self.atol,
                          outputs=self.outputs, fn=fn, others=others, names=names, run=result) if diagnosing else ""
        return f"rank {rank}: {diff}." + (f"\n{found}" if found else "")

    def _success(self, result: SimResult, case: Case, heading: str = "") -> str:
        sizes = ", ".join(str(n) for n in self.world_sizes)
        where = f" (world sizes {sizes})" if self.takes_dist else ""
        text = heading or f"✓ {self.name} is correct on {amount(len(self.world_sizes), 'cases')}{where}."
        return text + budget_lines(case, result, self.takes_dist)

    def at_scale(self, fn: Callable, world_size: int, show: bool = True, strict: Optional[bool] = None,
                 **variant) -> Optional[SimResult]:
        """`fn` on one case of `world_size` simulated ranks (`variant`: the case builder's arguments, a mesh's shape),
        judged as the check judges it (results, contracts, budgets) and pictured as its success is: the pattern at
        a real cluster's proportions, for after the check has passed. Its run (None if there is none to show).
        A wrong answer is said without the check's diagnosis, which replays the run (seconds each at this size).
        `strict` (COURSE_STRICT, as for check): raise rather than print what is wrong."""
        strict = strict_default() if strict is None else strict

        def unsolved() -> None:
            print(f"○ {NOT_SOLVED.format(self.name)}")
            if strict:
                raise NotSolved(NOT_SOLVED.format(self.name))
        if not callable(fn) or is_the_stub(fn):
            return unsolved()
        warm_up.ready()
        case = self.make_case(random.Random(f"{self.name}:at scale"), world_size, **variant)
        where = f"at N={world_size} ({case.label})"
        with one_thread():
            try:
                result = run_case(self.wrap(fn), case, case.cost)
                problem = not_refused(case) or self._judge(case, result, diagnosing=False)
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
        mine = as_plain(mine)                   # compared as its plain values, as the simulated check does
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


def _judge_rank(dist, puzzle: Puzzle, fn: Callable, seed: int) -> tuple[Optional[str], str, str]:
    """What each process of a real cell runs: Puzzle._judge_in_group on this rank."""
    return puzzle._judge_in_group(fn, dist, seed)


def _real_rank(dist, fn: Callable, oracle: Optional[Callable], args: tuple):
    """What each real process runs: the learner's function, then the PyTorch oracle on fresh inputs, each
    given its own copy of every argument on the rank's device (dataclasses and containers included)."""
    rank, where = dist.get_rank(), device()

    def mine_of(a):
        return to_device(copy.deepcopy(a.values[rank] if isinstance(a, PerRank) else a), where)

    inputs = list(map(mine_of, args))
    case_module._learner_running = True
    try:
        mine = fn(dist, *inputs)
    finally:
        case_module._learner_running = False
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
