"""The exceptions a learner can meet. Each carries a message written for a person."""

from __future__ import annotations


class PuzzleError(Exception):
    """Base of every error the course raises on purpose: catch this to catch them all."""


class RankFailed(PuzzleError):
    """A rank raised: names the rank and shows the traceback of the learner's code."""

    def __init__(self, rank: int, message: str, traceback: str = "") -> None:
        self.rank = rank
        self.traceback = traceback
        text = f"rank {rank} raised {message}"
        if traceback:
            text += "\n\n" + traceback.rstrip()
        super().__init__(text)


class LaunchError(PuzzleError):
    """Real processes could not be started or ran out of time (the message says which and what to do)."""
