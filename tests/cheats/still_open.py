"""Cheats on notebooks 03, 06, 08 and 09 that still pass, kept runnable for whoever closes them (the red team's
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


def _attention_in_one_tile(q, k, v):
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    lse = s.logsumexp(-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def ring_ignoring_block(dist, q, k, v, block):
    """The ring and the merge, each K/V block attended as one (s/N)² tile, `block` ignored: with s/N of 6 to 16 tokens
    and d of 8 or 16, the 10 chunks of s/N × d the budget allows hide the tile."""
    from solutions.ring_attention import merge_attention
    from tests.cheats.ring_attention import _pass_right

    out = lse = None
    for step in range(dist.get_world_size()):
        bo, bl = _attention_in_one_tile(q, k, v)
        out, lse = (bo, bl) if out is None else merge_attention(out, lse, bo, bl)
        if step < dist.get_world_size() - 1:
            k, v = _pass_right(dist, torch.stack([k, v]))
    return out, lse


def coordinates_by_unravel_index(dist, shape):
    """torch's unravel_index does the puzzle's arithmetic (numpy's too)."""
    return tuple(int(c) for c in torch.unravel_index(torch.tensor(dist.get_rank()), tuple(shape)))


OPEN = [
    ("survive_failure", survive_checkpointing_but_replaying_the_first_files,
     "a statement that does not hand every rank every gradient up front (e.g. grads(step) given once per step)"),
    ("ring_attention", ring_ignoring_block,
     "a measure of a rank's largest single tensor (lib.sim), then a budget of block-sized tiles"),
    ("mesh_coordinates", coordinates_by_unravel_index,
     "ArithmeticPuzzle honouring off_limits (lib.mesh_check), with torch.unravel_index and numpy put there"),
]
