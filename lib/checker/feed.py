"""Inputs that come as training goes: step t's value is handed out when training reaches step t, as a data loader
hands out batches.

A list of every step's gradient, given up front, lets an answer that should reload a checkpoint replay every step
from the first files instead. A StepFeed hands its values out in order and, like a data loader whose position is
saved with each checkpoint, goes back only as far as the step after the last checkpoint that may have completed.
A feed may hand each rank only its part of a value (`cut`): one part until the rank has been told of a failure,
another after (in the survivors' layout), so that a rank cannot keep, before the failure, what it will need after.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional, Sequence

from lib.errors import PuzzleError
from lib.real.faults import failure_known
from lib.sim.context import current_rank, current_runtime


class FeedRefused(PuzzleError):
    """A step asked of a StepFeed that training has not reached, or one behind the last checkpoint."""


Cut = Callable[[Any, bool], Any]    # (a step's value, whether the rank knows of a failure) -> what the rank gets


class StepFeed:
    """feed(t) for t from `first` to len(feed) - 1: values[t], or cut(values[t], lib.real.faults.failure_known()), in
    order. Going back (after a failure) is allowed to any step after the checkpoint before the last one reached: with
    a checkpoint every `every` steps (after the steps whose number, counted from 1, is a multiple of `every`), the
    last may have been cut short."""

    __slots__ = ("_values", "_first", "_every", "_position", "_cut")

    def __init__(self, values: Sequence[Any], first: int, every: int, position: Optional[list] = None,
                 cut: Optional[Cut] = None) -> None:
        self._values, self._first, self._every, self._cut = list(values), first, every, cut
        # [the last step handed out, the furthest, the simulated rank whose feed it is]: shared by the copies a
        # rank makes of its feed (deep, shallow, moved to the device), so that no copy starts again from the top
        self._position = [first - 1, first - 1, None] if position is None else position

    @property
    def _last(self) -> int:
        return self._position[0]

    @property
    def _furthest(self) -> int:
        return self._position[1]

    def __len__(self) -> int:
        return len(self._values)

    def __call__(self, step: int) -> Any:
        step = int(step)
        if not self._first <= step < len(self._values):
            self._refuse(f"asked for step {step}'s value; there are steps {self._first} to {len(self._values) - 1}")
        if step > self._last + 1:
            self._refuse(f"asked for step {step} after step {self._last}: a step's value comes when training "
                         f"reaches it; the next is step {self._last + 1}")
        if step <= self._last and step < self.earliest():
            self._refuse(f"asked for step {step} again, having reached step {self._furthest}: a step comes again only "
                         "after a failure, and only from the step of the last checkpoint that may have completed "
                         f"(step {self.earliest()}) on: what came before is in that checkpoint",
                         "reload the last complete checkpoint and train on from its step; do not replay from the "
                         "first files.")
        self._position[:2] = step, max(self._furthest, step)
        value = self._values[step]
        return value if self._cut is None else self._cut(value, failure_known())

    def earliest(self) -> int:
        """The earliest step that may be asked again: the one after the checkpoint before the last one reached."""
        reached = self._furthest + 1                      # steps done, counted from 1
        last_checkpoint = reached - reached % self._every
        return max(self._first, last_checkpoint - self._every)

    def _refuse(self, what: str, hint: str = "ask for step t's value at step t, in order.") -> None:
        rank = current_rank()
        error = FeedRefused(f"{'' if rank is None else f'rank {rank} '}{what}.\nHint: {hint}")
        runtime = current_runtime()
        if runtime is None:
            raise error
        runtime.fail(error)           # not the learner's to catch

    def __deepcopy__(self, memo: dict) -> StepFeed:
        """Each simulated rank's own copy of the run's feed (its own position), its values copied through `memo` as
        the run's are; a copy the rank makes of its own feed goes on from where that feed is."""
        rank = current_rank()
        mine = self._position[2] is not None and self._position[2] == rank
        return StepFeed(copy.deepcopy(self._values, memo), self._first, self._every,
                        self._position if mine else [self._first - 1, self._first - 1, rank], self._cut)

    def __copy__(self) -> StepFeed:
        return StepFeed(self._values, self._first, self._every, self._position, self._cut)

    def _moved_to(self, where) -> StepFeed:
        """The same feed (same position) with its values on `where` (lib.real.backends.to_device)."""
        from lib.real.backends import to_device
        return StepFeed(to_device(self._values, where), self._first, self._every, self._position, self._cut)

    def __reduce__(self):
        """For a real run's processes."""
        return StepFeed, (self._values, self._first, self._every, self._position, self._cut)

    def __repr__(self) -> str:
        return f"<gradients of steps {self._first} to {len(self._values) - 1}, handed out one step at a time>"
