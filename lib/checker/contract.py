"""Stage 3 of a check, the contracts: rules on how an answer runs, beyond its numbers (which ops it may call, who it
sends to, how evenly the ranks share the work, how much it computes and waits).

Each rule is a Contract, judged by every Puzzle after the comparison (`Case.contracts`, `judge_contracts`). The
kernels an answer may not call are a ban, not a rule on the run: Puzzle(refuse=...), lib.checker.kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence, Union

from lib.sim import SimResult
from lib.units import fmt_bytes, fmt_time


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



def ops_outside(case, result: SimResult) -> Optional[str]:
    """The communication a rank used that the case does not allow (`Case.allowed_ops`), said, or None: judged before
    the results, since an answer built from other calls is not the lesson's whatever it returns."""
    if case.allowed_ops is not None:
        for s in result.stats:
            extra = sorted(set(s.calls) - case.allowed_ops)
            if extra:
                return (f"rank {s.rank} used {', '.join(extra)}; this puzzle is to be built from "
                        f"{', '.join(sorted(case.allowed_ops))} only.")
    return None


def judge_contracts(case, result: SimResult) -> Optional[str]:
    """The first of the case's contracts the run broke, said, or None (judged once its results are right)."""
    for contract in case.contracts:
        problem = contract.judge(result)
        if problem:
            return problem
    return None


Peers = Callable[[int, int, int], "int | Iterable[int]"]


def sends_to(peers: Peers, what: str, hint: str = "", one_way: bool = False) -> Contract:
    """Every point-to-point message of rank r, at its k-th send, goes to peers(r, N, k) (one rank, or the ranks it
    may choose from): a ring's neighbour, recursive doubling's partner r ^ 2^k. With one_way, at each step every
    rank sends the same way round ((peer - rank) mod N equal on all ranks): a ring, not a pair of half-rings."""

    def broken(result: SimResult) -> Optional[str]:
        n = result.world_size
        sends = {r: [e for e in sorted(result.trace, key=lambda e: e.start) if e.rank == r and e.op == "send"]
                 for r in range(n)}
        for rank, events in sends.items():
            for step, e in enumerate(events):
                allowed = peers(rank, n, step)
                allowed = {allowed} if isinstance(allowed, int) else set(allowed)
                if e.peer not in allowed:
                    said = " or ".join(f"rank {p}" for p in sorted(allowed))
                    return (f"rank {rank}'s send {step + 1} ({fmt_bytes(e.bytes)}) went to rank {e.peer}, where "
                            f"{said} belongs")
        if one_way:
            for step in range(max(map(len, sends.values()), default=0)):
                way = {rank: (events[step].peer - rank) % n for rank, events in sends.items() if step < len(events)}
                if len(set(way.values())) > 1:
                    a, b = sorted(set(way.values()))[:2]
                    first, second = (min(r for r, w in way.items() if w == d) for d in (a, b))
                    return (f"at step {step + 1} rank {first} sent to rank {(first + a) % n} and rank {second} to "
                            f"rank {(second + b) % n}: not the same way around the ring")
        return None
    return Contract(what, broken, hint)


def neighbours(rank: int, n: int, step: int) -> set[int]:
    """A ring's peers: the next rank either way round (sends_to(..., one_way=True) keeps the way the same)."""
    return {(rank + 1) % n, (rank - 1) % n}


def right(rank: int, n: int, step: int) -> int:
    return (rank + 1) % n


def sends_less_than(limit: float, what: str, rule: str, hint: str = "") -> Contract:
    """No rank sends `limit` bytes or more: as much as `what`, which the algorithm never needs to send (a case sized
    so that its whole traffic weighs less) and a way around it does."""

    def broken(result: SimResult) -> Optional[str]:
        for s in result.stats:
            if s.bytes_sent >= limit:
                return f"rank {s.rank} sent {fmt_bytes(s.bytes_sent)}, at least {what} ({fmt_bytes(limit)})"
        return None
    return Contract(rule, broken, hint)


def op_sends_at_most(op: str, limit: float, what: str, rule: str, hint: str = "") -> Contract:
    """No rank sends more than `limit` bytes through collectives named `op` (all_gather, all_to_all...): where two
    algorithms send the same bytes in all (a reduce-scatter and an all-gather against one all-gather of everything,
    at N = 2), what each op carries tells them apart. `what` names the limit in messages."""

    def broken(result: SimResult) -> Optional[str]:
        sent = [0.0] * result.world_size
        for e in result.trace:
            if e.op == op:
                sent[e.rank] += e.bytes
        rank = max(range(result.world_size), key=sent.__getitem__)
        if sent[rank] <= limit * (1 + 1e-9):
            return None
        return f"rank {rank} sent {fmt_bytes(sent[rank])} through {op}, more than {what} ({fmt_bytes(limit)})"
    return Contract(rule, broken, hint)


def flops_balanced(tolerance: float, why: str, hint: str = "") -> Contract:
    """The busiest rank computes at most (1 + tolerance) times the FLOPs of the least busy one."""

    def broken(result: SimResult) -> Optional[str]:
        most = max(result.stats, key=lambda s: s.flops)
        least = min(result.stats, key=lambda s: s.flops)
        if most.flops <= (1 + tolerance) * least.flops:
            return None
        return (f"the work is unbalanced: rank {most.rank} computed {most.flops:,.0f} FLOPs and rank {least.rank} "
                f"{least.flops:,.0f}, {most.flops / max(least.flops, 1):.2f} times as many, where the check allows "
                f"{1 + tolerance:g}")
    return Contract(why, broken, hint)


def flops_at_most(limit: float, why: str, hint: str = "") -> Contract:
    """No rank computes more than `limit` FLOPs (as the simulator counts them)."""

    def broken(result: SimResult) -> Optional[str]:
        for s in result.stats:
            if s.flops > limit * (1 + 1e-9):
                return f"rank {s.rank} computed {s.flops:,.0f} FLOPs, over the budget of {limit:,.0f}"
        return None
    return Contract(why, broken, hint)


def peak_memory_between(first: Union[str, tuple], last: Union[str, tuple], limit: float,
                        phase: str, rule: str, hint: str = "",
                        excess: Optional[Callable[[float], str]] = None) -> Contract:
    """No rank holds more than `limit` bytes of device memory from the end of its first `first` op to the end of its
    last `last` op (say, from the first all-gather of training to its last reduce-scatter): that phase judged on its
    own, where a peak over the whole run may be set by what comes before or after it (the full parameters handed in,
    the final gather of every parameter to return them). From the first op's end, not its start: ops that take no
    simulated time (freeing what came before) share its start's timestamp. `first` and `last` may each name several
    ops in order of preference: the first of them a rank calls at all opens (closes) its phase (parameters gathered
    by broadcasts where a rank never all-gathers; a DDP-style broadcast of the weights before training opens nothing
    for a rank that all-gathers); a tuple among them is one choice, opened by whichever of its ops comes first (the
    parameters gathered by all-to-alls while training, the final gather an all-gather). `phase` names it in messages;
    `excess`, if given, says what the bytes over the limit are worth in the puzzle's terms (", 2.1 layers' worth")."""
    openers, closers = ((ops,) if isinstance(ops, str) else tuple(ops) for ops in (first, last))

    def first_called(ops: tuple, rank: int, trace) -> tuple[str, list[float]]:
        """The first kind among `ops` that the rank calls at all (a tuple of kinds counts as one: whichever of them
        comes first), and the ends of its calls of that kind."""
        for op in ops:
            kinds = (op,) if isinstance(op, str) else op
            calls = sorted((e.end, e.op) for e in trace if e.rank == rank and e.op in kinds)
            if calls:
                return calls[0][1], [end for end, _ in calls]
        return "", []

    def broken(result: SimResult) -> Optional[str]:
        for s in result.stats:
            (opened, starts), (closed, ends) = (first_called(ops, s.rank, result.trace) for ops in (openers, closers))
            if not starts or not ends:
                continue
            peak = max((held for t, held in s.memory if min(starts) <= t <= max(ends)), default=0)
            if peak > limit * (1 + 1e-9):
                return (f"rank {s.rank} held {fmt_bytes(peak)} of tensors {phase} (from its first {opened} to its "
                        f"last {closed}), over the budget of {fmt_bytes(limit)}"
                        f"{excess(peak - limit) if excess else ''}")
        return None
    # Not timed: the clocks only order a rank's own samples against its ops, and any cost model orders them alike.
    # A rank's clock never goes back; the phase's ends are the ends of collectives, which take time under every cost
    # model, so a sample lies inside the phase under one model exactly when it does under another (what waiting on a
    # peer adds moves a sample's time, not its side of an op's end). The check may so judge it on the run drawn at a
    # real run's scale (Puzzle.real_scale), and the success's timeline needs no second run.
    return Contract(rule, broken, hint)


def in_flight_at_most(limits: Sequence[Optional[int]], next_stage: Sequence[Optional[int]], rule: str,
                      hint: str = "") -> Contract:
    """No pipeline rank r holds more than limits[r] micro-batches in flight: activations sent on to the next stage
    (the global rank next_stage[r]) whose gradients have not come back, counted in the rank's own order of calls
    (RankStats.p2p_log) at each send. A gradient is back when the wait on its receive returned, not when the receive
    was posted: a schedule posting every receive up front holds what it waits for. Its schedule, not its memory: a
    stage's peak may come from the update, after the stash is freed. None skips a rank (the last stage)."""

    def broken(result: SimResult) -> Optional[str]:
        for s in result.stats:
            ahead, limit = next_stage[s.rank], limits[s.rank]
            if ahead is None or limit is None:
                continue
            sent = back = 0
            for kind, peer in s.p2p_log:
                if peer != ahead:
                    continue
                back += kind == "waited"
                if kind != "send":
                    continue
                sent += 1
                if sent - back > limit:
                    return (f"rank {s.rank} sent rank {ahead} an activation with {sent - back} micro-batches in "
                            f"flight (activations sent on whose gradients have not come back), {sent - back - limit} "
                            f"more than the schedule keeps on its stage ({limit})")
        return None
    return Contract(rule, broken, hint)


def exposed_communication(result: SimResult) -> list[float]:
    """Per rank, the simulated time not spent computing: its clock minus its compute (what overlap hides)."""
    busy = [0.0] * result.world_size
    for e in result.trace:
        if e.lane == "compute":
            busy[e.rank] += e.end - e.start
    return [s.clock - busy[s.rank] for s in result.stats]


def communication_hidden(limit: float, what: str, why: str, hint: str = "") -> Contract:
    """No rank spends more than `limit` seconds of simulated time outside its compute, waiting on `what`."""

    def broken(result: SimResult) -> Optional[str]:
        exposed = exposed_communication(result)
        rank = max(range(len(exposed)), key=exposed.__getitem__)
        if exposed[rank] <= limit * (1 + 1e-9):
            return None
        return (f"rank {rank} spent {fmt_time(exposed[rank])} waiting on {what} instead of computing, over the "
                f"budget of {fmt_time(limit)}")
    return Contract(why, broken, hint, timed=True)
