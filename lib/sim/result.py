"""What a simulated run leaves behind: per-rank results, statistics and the event trace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from lib.sim.cost import CostModel


@dataclass(frozen=True)
class Event:
    """One stretch of work on one rank: op is "compute" or the communication's name."""

    rank: int
    op: str
    group: str
    peer: Optional[int]
    bytes: float
    start: float
    end: float

    @property
    def lane(self) -> str:
        return "compute" if self.op == "compute" else "comm"


_new = object.__new__


def event(rank: int, op: str, group: str, peer: Optional[int], nbytes: float, start: float, end: float) -> Event:
    """Event(...) as the simulator records it, two per message: the same frozen Event, its fields written at once
    rather than by the frozen class's setattr per field (2 µs less each)."""
    made = _new(Event)
    made.__dict__.update(rank=rank, op=op, group=group, peer=peer, bytes=nbytes, start=start, end=end)
    return made


@dataclass
class RankStats:
    """Per-rank totals: bytes moved, peak bytes of live tensors (device, and host), simulated clock at return."""

    rank: int
    bytes_sent: float
    bytes_received: float
    peak_memory: int
    clock: float
    flops: float = 0.0
    host_peak_memory: int = 0                                         # offloaded to lib.host()
    host_flops: float = 0.0                                           # of `flops`, computed in host memory
    calls: dict[str, int] = field(default_factory=dict)
    memory: list[tuple[float, int]] = field(default_factory=list)   # (simulated time, live bytes)
    outside_bytes: int = 0          # of peak_memory's bytes, Python values taken out of tensors (.tolist, .item)
    largest_tensor: int = 0         # bytes of the largest storage its ops allocated (its arguments' copies aside)
    # bytes its ops read of each positional argument of the run (its own copy): views free, an op reading a view
    # reads the view's bytes (lib.sim.reads)
    argument_reads: tuple[int, ...] = ()
    # The rank's point-to-point calls in its own order (a schedule's order, which the messages' times do not keep: a
    # send's time is when both ends were ready): ("send" or "recv", peer) as each was posted, and ("waited", sender)
    # when a receive's wait returned, its data in hand
    p2p_log: tuple[tuple[str, Optional[int]], ...] = ()


@dataclass
class SimResult:
    results: list[Any]
    stats: list[RankStats]
    trace: list[Event]
    cost: CostModel

    @property
    def world_size(self) -> int:
        return len(self.results)

    @property
    def time(self) -> float:
        """Simulated wall time of the run: the latest rank's clock."""
        return max(s.clock for s in self.stats)

    def timeline(self, title: str = ""):
        """A matplotlib figure: one row per rank, compute and communication in separate lanes."""
        from lib.viz.timeline import draw_timeline
        return draw_timeline(self.trace, self.world_size, title=title)

    def save_trace(self, path) -> None:
        """Write a Chrome / Perfetto trace (open it at ui.perfetto.dev or chrome://tracing)."""
        from lib.viz.timeline import save_chrome_trace
        save_chrome_trace(self.trace, path)
