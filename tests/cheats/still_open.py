"""Cheats on notebooks 03, 06 and 09 that still pass, kept runnable for whoever closes them (the red team's
report says what each needs). None is in CHEATS yet: move an entry there, with the words its rejection must contain,
once the engine or its puzzle rejects it.

    OPEN: (puzzle name, cheat, what would close it)
"""

import torch

from tests.cheats.beyond import replaying_from_the_first_files

CHEATS: list = []


def survive_checkpointing_but_replaying_the_first_files(dist, files, grads, every, lr):
    """Real checkpoints, never reloaded: after the failure the survivors replay every step from the first files
    (every rank holds every gradient), skipping the all-gathers of checkpoints already taken. Its bytes meet the
    checkpoints' floor and its FLOPs are below the reference's (it builds no files)."""
    size = sum(f["param"].numel() for f in files)

    def checkpoint(dist, state, n, group):
        mine = torch.zeros(3, -(-size // n), dtype=state[0].dtype)
        for row, t in zip(mine, state):
            row[:t.numel()] = t
        dist.all_gather([torch.empty_like(mine) for _ in range(n)], mine, group=group)
    return replaying_from_the_first_files(dist, files, grads, every, lr, checkpoint)


def coordinates_by_unravel_index(dist, shape):
    """torch's unravel_index does the puzzle's arithmetic (numpy's too)."""
    return tuple(int(c) for c in torch.unravel_index(torch.tensor(dist.get_rank()), tuple(shape)))


OPEN = [
    ("survive_failure", survive_checkpointing_but_replaying_the_first_files,
     "a statement that does not hand every rank every gradient up front (e.g. grads(step) given once per step)"),
    ("mesh_coordinates", coordinates_by_unravel_index,
     "ArithmeticPuzzle honouring off_limits (lib.mesh_check), with torch.unravel_index and numpy put there"),
]
