"""Checks of how an answer works, beyond its numbers: who it sends to, how evenly the ranks share the work,
which of torch's kernels it may call.

A puzzle module lists rules per case (`ContractCase.rules`); `ContractPuzzle` applies them after the usual
comparison and budgets, so a right answer that breaks the lesson's contract still fails, with a reason.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from torch.utils._python_dispatch import TorchDispatchMode

from lib.check import Case, Puzzle
from lib.errors import PuzzleError
from lib.sim import SimResult
from lib.units import fmt_bytes, fmt_time

Rule = Callable[[SimResult], Optional[str]]     # what is wrong with a run, in words, or None; its .hint says what to do


def _with_hint(rule: Rule, hint: str) -> Rule:
    rule.hint = hint
    return rule


@dataclass
class ContractCase(Case):
    """A case with rules on the run itself (the trace, the per-rank counts), checked after the budgets."""

    rules: list[Rule] = field(default_factory=list)


class ContractPuzzle(Puzzle):
    """A puzzle whose cases may carry rules (ContractCase); each rule's complaint fails the check. With
    `refuse=(prefixes, why)`, the answer may not call torch's ops named so (kernels that do the lesson's work)."""

    def __init__(self, *args, refuse: tuple[Iterable[str], str] = ((), ""), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.refused, self.refused_why = tuple(refuse[0]), refuse[1]

    def wrap(self, fn: Callable) -> Callable:
        wrapped = super().wrap(fn)
        if self.refused and callable(wrapped):
            return refusing_kernels(wrapped, self.refused, self.refused_why)
        return wrapped

    def _judge(self, case: Case, result: SimResult) -> Optional[str]:
        problem = super()._judge(case, result)
        for rule in getattr(case, "rules", ()) if problem is None else ():
            problem = rule(result)
            if problem:
                break
        return problem


def sends_only_to(neighbour: Callable[[int, int], int], what: str, hint: str = "") -> Rule:
    """Every point-to-point message of rank r goes to neighbour(r, N): a ring talks to one neighbour only."""

    def rule(result: SimResult) -> Optional[str]:
        n = result.world_size
        for e in result.trace:
            if e.op == "send" and e.peer != neighbour(e.rank, n):
                return (f"the answer is right, but rank {e.rank} sent {fmt_bytes(e.bytes)} to rank {e.peer}; "
                        f"{what}, rank {neighbour(e.rank, n)} here." + (f"\nHint: {hint}" if hint else ""))
        return None
    return _with_hint(rule, hint)


def flops_balanced(tolerance: float, why: str, hint: str = "") -> Rule:
    """The busiest rank computes at most (1 + tolerance) times the FLOPs of the least busy one."""

    def rule(result: SimResult) -> Optional[str]:
        most = max(result.stats, key=lambda s: s.flops)
        least = min(result.stats, key=lambda s: s.flops)
        if most.flops <= (1 + tolerance) * least.flops:
            return None
        return (f"the answer is right, but the work is unbalanced: rank {most.rank} computed {most.flops:,.0f} FLOPs "
                f"and rank {least.rank} {least.flops:,.0f}, {most.flops / max(least.flops, 1):.2f} times as many; "
                f"the check allows {1 + tolerance:g} ({why})." + (f"\nHint: {hint}" if hint else ""))
    return _with_hint(rule, hint)


def flops_at_most(limit: float, why: str, hint: str = "") -> Rule:
    """No rank computes more than `limit` FLOPs (as the simulator counts them)."""

    def rule(result: SimResult) -> Optional[str]:
        for s in result.stats:
            if s.flops > limit * (1 + 1e-9):
                return (f"the answer is right, but rank {s.rank} computed {s.flops:,.0f} FLOPs, over the budget of "
                        f"{limit:,.0f} ({why})." + (f"\nHint: {hint}" if hint else ""))
        return None
    return _with_hint(rule, hint)


def exposed_communication(result: SimResult) -> list[float]:
    """Per rank, the simulated time not spent computing: its clock minus its compute (what overlap hides)."""
    busy = [0.0] * result.world_size
    for e in result.trace:
        if e.lane == "compute":
            busy[e.rank] += e.end - e.start
    return [s.clock - busy[s.rank] for s in result.stats]


def communication_hidden(limit: float, what: str, why: str, hint: str = "") -> Rule:
    """No rank spends more than `limit` seconds of simulated time outside its compute, waiting on `what`."""

    def rule(result: SimResult) -> Optional[str]:
        exposed = exposed_communication(result)
        rank = max(range(len(exposed)), key=exposed.__getitem__)
        if exposed[rank] <= limit * (1 + 1e-9):
            return None
        return (f"the answer is right, but rank {rank} spent {fmt_time(exposed[rank])} waiting on {what} instead of "
                f"computing, over the budget of {fmt_time(limit)} ({why})." + (f"\nHint: {hint}" if hint else ""))
    return _with_hint(rule, hint)


class KernelRefused(PuzzleError):
    """The answer called a kernel that does the puzzle's work for it."""


class _Refusing(TorchDispatchMode):
    """Stops at the first op whose name starts with one of `prefixes`."""

    def __init__(self, prefixes: tuple[str, ...], why: str) -> None:
        super().__init__()
        self.prefixes, self.why = prefixes, why

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False          # as lib.sim.tracker: no torch.compile here, and no torch._dynamo import per op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        if name.startswith(self.prefixes):
            raise KernelRefused(f"the answer called torch's {name}: {self.why}")
        return func(*args, **(kwargs or {}))


def refusing_kernels(fn: Callable, prefixes: Iterable[str], why: str) -> Callable:
    """`fn` run so that any op named with one of `prefixes` raises KernelRefused (in simulation and on real ranks)."""

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        with _Refusing(tuple(prefixes), why):
            return fn(*args, **kwargs)
    return guarded
