"""A rank's outgoing and incoming links as busy intervals on the simulated clock.

A transfer takes the earliest stretch at or after the moment both sides have posted in which every link it
uses is free. The simulator matches messages in the order its ranks happen to run, not in simulated time;
booking gaps rather than "free after the last one booked" keeps that order from delaying a message behind
one that was matched earlier but starts later.
"""

from __future__ import annotations

import bisect
from typing import Iterable


class Link:
    """Busy intervals [start, end) of one direction of one rank's link, sorted and disjoint."""

    def __init__(self) -> None:
        self._starts: list[float] = []
        self._ends: list[float] = []

    def fit(self, ready: float, duration: float) -> float:
        """The earliest start >= ready of a free stretch of `duration` on this link."""
        t = ready
        i = bisect.bisect_right(self._ends, t)            # the first interval that ends after t
        while i < len(self._starts) and self._starts[i] < t + duration:
            t = max(t, self._ends[i])
            i += 1
        return t

    def book(self, start: float, end: float) -> None:
        if end <= start:
            return
        i = bisect.bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._ends.insert(i, end)


def earliest(links: Iterable[Link], ready: float, duration: float) -> float:
    """The earliest start >= ready at which every link in `links` is free for `duration`."""
    links = list(links)
    t = ready
    while True:
        moved = t
        for link in links:
            moved = link.fit(moved, duration)
        if moved == t:
            return t
        t = moved
