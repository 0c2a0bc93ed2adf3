"""Cheats on notebook 09 that still pass, kept runnable for whoever closes them (the red team's report says what
each needs). None is in CHEATS yet: move an entry there, with the words its rejection must contain, once the engine
or its puzzle rejects it.

    OPEN: (puzzle name, cheat, what would close it)
"""

from tests.cheats.beyond import real_checkpoints, replaying_from_the_first_files

CHEATS: list = []


def survive_keeping_every_gradient(dist, files, grads, every, lr):
    """Real checkpoints, never reloaded: every rank keeps each full gradient grads hands it, and after the failure the
    survivors replay every step from the first files on those. Its bytes meet the checkpoints' floor; what it keeps, a
    full gradient per step, is a few times the state every rank's checkpoint holds anyway (the cases run 4 to 14
    steps), which no memory budget a right answer always meets can tell apart."""
    return replaying_from_the_first_files(dist, files, grads, every, lr, real_checkpoints(files), keep=True)


OPEN = [
    ("survive_failure", survive_keeping_every_gradient,
     "grads handing each rank only its shard of a step's gradient, in the layout of the ranks alive (the survivors' "
     "after the failure), so that a rank cannot keep the elements its new shard will need"),
]
