"""The meters' own invariants, checked on every run before it is judged: memory and work never below zero, a rank's
clock never going back, and every message's bytes the same at both ends. A run that breaks one was not measured by
the simulator alone (or the simulator is wrong): it is refused, naming the meter and the rank."""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

from lib.errors import PuzzleError
from lib.sim import SimResult
from lib.units import fmt_bytes

# The totals that count something, by the words a message uses for them: none of them can be negative.
COUNTS = {"peak_memory": "peak memory", "host_peak_memory": "peak host memory", "bytes_sent": "bytes sent",
          "bytes_received": "bytes received", "flops": "FLOPs", "host_flops": "FLOPs in host memory",
          "largest_tensor": "largest tensor", "outside_bytes": "bytes taken out of tensors", "clock": "clock"}


class MeterBroken(PuzzleError):
    """A run's measurements break an invariant no run of the simulator can break: the run is not judged."""


def meter_problem(result: SimResult) -> Optional[str]:
    """What the first broken invariant of `result`'s meters is, naming the meter and the rank, or None."""
    for s in result.stats:
        for field, words in COUNTS.items():
            value = getattr(s, field)
            if not value >= 0:                          # NaN too
                return f"rank {s.rank}'s {words} reads {_shown(field, value)}, below zero"
        if any(not b >= 0 for b in s.argument_reads):
            return f"rank {s.rank}'s bytes read of its arguments read {list(s.argument_reads)}, below zero"
        last = float("-inf")
        for time, live in s.memory:
            if not live >= 0:
                return f"rank {s.rank}'s memory reads {fmt_bytes(live)} live at {time:.3g} s, below zero"
            if time < last:
                return f"rank {s.rank}'s memory timeline goes back in time, from {last:.6g} s to {time:.6g} s"
            last = time
    for e in result.trace:
        if not e.end >= e.start or not e.bytes >= 0:
            return (f"rank {e.rank}'s clock went back in its {e.op} (from {e.start:.6g} s to {e.end:.6g} s)"
                    if not e.end >= e.start else f"rank {e.rank}'s {e.op} moved {e.bytes} bytes, below zero")
        if e.end > result.stats[e.rank].clock * (1 + 1e-9) + 1e-15:
            return (f"rank {e.rank}'s clock reads {result.stats[e.rank].clock:.6g} s at its return, before the end of "
                    f"its {e.op} at {e.end:.6g} s")
    return _unmatched_message(result) or _bytes_lost(result)


def _unmatched_message(result: SimResult) -> Optional[str]:
    """Every point-to-point message's bytes, sent by one rank and received by its peer, equal at both ends."""
    sent, received = defaultdict(float), defaultdict(float)
    for e in result.trace:
        if e.group == "p2p" and e.op == "send":
            sent[e.rank, e.peer, e.start, e.end] += e.bytes
        elif e.group == "p2p" and e.op == "recv":
            received[e.peer, e.rank, e.start, e.end] += e.bytes
    for key in sorted(set(sent) | set(received), key=lambda k: (k[2], k[0], k[1])):
        if sent[key] != received[key]:
            src, dst, start, _ = key
            return (f"rank {src} sent {fmt_bytes(sent[key])} to rank {dst} at {start:.6g} s, and rank {dst} received "
                    f"{fmt_bytes(received[key])} of that message")
    return None


def _bytes_lost(result: SimResult) -> Optional[str]:
    """Every byte a rank sends, in a message or a collective, some rank receives: the totals over ranks are equal."""
    sent = sum(s.bytes_sent for s in result.stats)
    received = sum(s.bytes_received for s in result.stats)
    if abs(sent - received) > 1e-9 * max(sent, received, 1.0):
        by_rank = ", ".join(f"rank {s.rank} {fmt_bytes(s.bytes_sent)} / {fmt_bytes(s.bytes_received)}"
                            for s in result.stats)
        return (f"the ranks sent {fmt_bytes(sent)} in all and received {fmt_bytes(received)}, where every byte sent is "
                f"received (sent / received: {by_rank})")
    return None


def check_meters(result: SimResult) -> None:
    """Refuse `result` (MeterBroken) when a meter broke its invariants."""
    problem = meter_problem(result)
    if problem:
        raise MeterBroken(f"the simulator's meters broke their own rules: {problem}. A run measured this way cannot "
                          "be judged: something other than the simulator changed what it measures.\n"
                          "Hint: let the simulator alone measure the run: no code that writes to its meters.")


def _shown(field: str, value: float) -> str:
    if field in ("peak_memory", "host_peak_memory", "bytes_sent", "bytes_received", "largest_tensor", "outside_bytes"):
        return fmt_bytes(value)
    return f"{value:,.6g}"
