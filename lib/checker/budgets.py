"""Stage 4 of a check, the budgets: a ceiling (or a floor) on one measurement of a run, with the formula it comes
from, and the run's first broken budget said in those terms (`judge_budgets`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from lib.checker.spec import SpecError
from lib.sim import SimResult
from lib.units import fmt_bytes, fmt_time

METRICS = {"bytes_sent": "sent", "bytes_received": "received", "peak_memory": "peak memory",
           "host_peak_memory": "peak host memory", "host_flops": "FLOPs computed in host memory",
           "flops": "FLOPs counted", "time": "simulated time", "largest_tensor": "largest tensor",
           "argument_reads": "bytes read of its arguments"}



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


def judge_budgets(case, result: SimResult) -> Optional[str]:
    """The first budget (time, memory, FLOPs, ...) the run breaks, said with its formula, or None."""
    for b in case.budgets:
        if b.metric == "time":
            if b.broken(result.time, b.limit_for(0)):
                return over(b, "the run", result.time, b.limit_for(0))
            continue
        for s in result.stats:
            value = b.value(s)
            if b.broken(value, b.limit_for(s.rank)):
                outside = s.outside_bytes if b.metric == "peak_memory" else 0
                return over(b, f"rank {s.rank}", value, b.limit_for(s.rank), outside)
    return None


def over(b: Budget, who: str, value: float, limit: float, outside: float = 0) -> str:
    """A broken budget in words: whose measurement, how far past its limit, and the formula the limit comes from."""
    side = "under the floor" if b.least else "over the budget"
    shown, bound = b.fmt(value), b.fmt(limit)
    by = f" by {b.fmt(abs(value - limit))}" if shown == bound else ""   # "504.33 KiB over 504.33 KiB": by what?
    text = f"the answer is right, but {who}'s {b.name} is {shown}, {side} of {bound}{by} ({b.why})."
    if outside:
        text += (f" Of that, {b.fmt(outside)} are Python numbers taken out of tensors (.tolist(), .item()), which "
                 "count until the run ends: the simulator cannot see when Python frees them.")
    return text + (f"\nHint: {b.hint}" if b.hint else "")


def budget_lines(case, result: SimResult, takes_dist: bool) -> str:
    """A passed check's account of each budget: the measurement nearest its limit, on which rank."""
    text = ""
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
        at = f" at N={case.world_size}{who}" if takes_dist else ""
        kind = "floor" if b.least else "budget"
        text += f"\n  {b.name}{at}: {b.fmt(value)} of a {b.fmt(limit)} {kind} ({b.why})."
    return text
