"""Cheats on notebooks 08 and 09 that still pass, kept runnable for whoever closes them (the red team's
report says what each needs). None is in CHEATS yet: move an entry there, with the words its rejection must contain,
once the engine or its puzzle rejects it.

    OPEN: (puzzle name, cheat, what would close it)
"""

import torch

from lib.cross_site import shard_bounds
from tests.cheats.beyond import real_checkpoints, replaying_from_the_first_files

CHEATS: list = []


def reshard_reading_every_file(files, world, rank):
    """Every file concatenated whole, then this rank's slice cut out: the overlap of [lo, hi) with each file is
    never worked out. No budget reads what a rank reads of its arguments."""
    total = sum(f["param"].numel() for f in files)
    lo, hi = shard_bounds(total, world, rank)
    return (*(torch.cat([f[k] for f in files])[lo:hi].clone() for k in ("param", "exp_avg", "exp_avg_sq")),
            files[0]["step"])


def survive_keeping_every_gradient(dist, files, grads, every, lr):
    """Real checkpoints, never reloaded: every rank keeps each full gradient grads hands it, and after the failure the
    survivors replay every step from the first files on those. Its bytes meet the checkpoints' floor; what it keeps, a
    full gradient per step, is a few times the state every rank's checkpoint holds anyway (the cases run 4 to 14
    steps), which no memory budget a right answer always meets can tell apart."""
    return replaying_from_the_first_files(dist, files, grads, every, lr, real_checkpoints(files), keep=True)


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


OPEN = [
    ("reshard_checkpoint", reshard_reading_every_file,
     "a measure of the bytes a rank reads of its arguments (lib.sim), then a budget of what overlaps [lo, hi)"),
    ("survive_failure", survive_keeping_every_gradient,
     "grads handing each rank only its shard of a step's gradient, in the layout of the ranks alive (the survivors' "
     "after the failure), so that a rank cannot keep the elements its new shard will need"),
    ("ring_attention", ring_ignoring_block,
     "a measure of a rank's largest single tensor (lib.sim), then a budget of block-sized tiles"),
]
