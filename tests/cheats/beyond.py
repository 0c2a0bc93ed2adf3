"""Cheats on notebook 09's puzzles, each with the words its rejection must contain."""

import puzzles.beyond as P
import solutions.beyond as S
from tests.cheats.common import everywhere


def survive_checkpointing_every_step(dist, files, grads, every, lr):
    """Right after any failure, since it never loses a step: it checkpoints at every step, whatever `every` says,
    moving the whole training state each time."""
    return S.survive_failure(dist, files, grads, 1, lr)


CHEATS = everywhere(P) + [
    ("survive_failure", survive_checkpointing_every_step, "not more often"),
]
