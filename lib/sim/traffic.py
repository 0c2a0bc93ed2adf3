"""On which axis of a device mesh each communication of a simulated run travelled, and the bytes per axis.

A collective belongs to an axis when its group is exactly that axis's group through the rank (the TP group, the
DP group, ...); a point-to-point message, when its two ends differ in that coordinate alone (a pipeline stage
sending to the next). A collective over one rank moves nothing and belongs to every axis of size 1 ("self");
anything else travelled outside the mesh's groups ("outside").
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from lib.sim.mesh import coordinates
from lib.sim.result import Event

OUTSIDE = "outside"
SELF = "self"         # a group of one rank: no traffic, and no one axis to charge it to
_RANKS = re.compile(r"\(ranks ([\d, ]+)\)")     # how lib.sim.comm.Group names a group: "group 3 (ranks 0, 2)"


def event_ranks(event: Event, world_size: int) -> tuple[int, ...]:
    """The global ranks a communication involved: its group's members, or a message's two ends."""
    if event.peer is not None:
        return tuple(sorted((event.rank, event.peer)))
    if event.group == "WORLD":
        return tuple(range(world_size))
    found = _RANKS.search(event.group)
    if found is None:
        raise ValueError(f"cannot tell the ranks of {event.group!r} (a {event.op} on rank {event.rank})")
    return tuple(int(r) for r in found.group(1).split(","))


@dataclass(frozen=True)
class MeshAxes:
    """A device mesh's shape and dimension names, ranks laid out row-major (the last dimension innermost)."""

    shape: tuple[int, ...]
    names: tuple[str, ...]

    @property
    def world_size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def group(self, rank: int, axis: str) -> tuple[int, ...]:
        """The ranks of `rank`'s group along `axis`."""
        d = self.names.index(axis)
        stride = 1
        for s in self.shape[d + 1:]:
            stride *= s
        base = rank - coordinates(rank, self.shape)[d] * stride
        return tuple(base + i * stride for i in range(self.shape[d]))

    def axis_of(self, event: Event) -> str:
        """The axis `event` travelled on, SELF for a group of one rank, or OUTSIDE."""
        ranks = event_ranks(event, self.world_size)
        if len(ranks) == 1:
            return SELF
        if event.peer is not None:
            mine, theirs = coordinates(event.rank, self.shape), coordinates(event.peer, self.shape)
            differ = [n for n, a, b in zip(self.names, mine, theirs) if a != b]
            return differ[0] if len(differ) == 1 else OUTSIDE
        return next((n for n in self.names if self.group(event.rank, n) == ranks), OUTSIDE)


@dataclass
class AxisTraffic:
    """What one rank moved on one axis: bytes sent (a collective counts its ring share, lib.sim.cost), bytes
    received by its recvs, and how many calls of each op."""

    sent: float = 0.0
    received: float = 0.0
    ops: Counter = field(default_factory=Counter)


def traffic_by_axis(trace: Iterable[Event], axes: MeshAxes) -> list[dict[str, AxisTraffic]]:
    """Per rank, the traffic on each axis of `axes` (and SELF and OUTSIDE), from a simulated run's trace."""
    out = [{n: AxisTraffic() for n in (*axes.names, SELF, OUTSIDE)} for _ in range(axes.world_size)]
    axis: dict[tuple, str] = {}        # (rank, peer, group) -> its axis: a run repeats a few groups many times
    for e in trace:
        if e.lane != "comm" or e.op in ("to_host", "to_device"):
            continue
        key = (e.rank, e.peer, e.group)
        if key not in axis:
            axis[key] = axes.axis_of(e)
        t = out[e.rank][axis[key]]
        t.ops[e.op] += 1
        if e.op == "recv":
            t.received += e.bytes
        else:
            t.sent += e.bytes
    return out


def axis_labeller(axes: MeshAxes, labels: Optional[Sequence[str]] = None):
    """A function naming each communication event by its axis (upper case, or `labels` in the axes' order), for
    lib.viz.timeline.draw_timeline's kind_of."""
    names = dict(zip(axes.names, labels or [n.upper() for n in axes.names]))

    def kind_of(event: Event) -> str:
        axis = axes.axis_of(event)
        return names.get(axis, "a group of one" if axis == SELF else "outside the mesh")
    return kind_of
