"""Label what simulated ranks print with their rank, as the real launcher does."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, TextIO


class RankLabelledStream:
    """Wraps a text stream: lines written from a simulated rank's thread start with `[rank r] `."""

    def __init__(self, target: TextIO, rank_of_thread: Callable[[], Optional[int]]) -> None:
        self._target = target
        self._rank_of_thread = rank_of_thread
        self._at_line_start: dict[int, bool] = {}

    def write(self, text: str) -> int:
        rank = self._rank_of_thread()
        if rank is None or not text:
            return self._target.write(text)
        out = []
        for piece in text.splitlines(keepends=True):
            if self._at_line_start.get(rank, True):
                out.append(f"[rank {rank}] ")
            out.append(piece)
            self._at_line_start[rank] = piece.endswith("\n")
        return self._target.write("".join(out))

    def __getattr__(self, name: str):
        return getattr(self._target, name)


@contextmanager
def labelled_output(rank_of_thread: Callable[[], Optional[int]]) -> Iterator[None]:
    """While simulated ranks run, their prints carry their rank; everything else passes through."""
    saved = sys.stdout, sys.stderr
    sys.stdout = RankLabelledStream(saved[0], rank_of_thread)
    sys.stderr = RankLabelledStream(saved[1], rank_of_thread)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
