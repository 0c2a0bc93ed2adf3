"""Realistic first attempts at notebook 10's seam puzzles, none of them in tests/wrong."""

from tests.mistakes import Attempt
from tests.wrong.trainer import _hsdp


def hsdp_keeps_the_padding(dist, grads, nodes):
    """Returns each shard as the reduce-scatter left it, padding rows included: the last shards are too long."""
    return _hsdp(dist, grads, nodes, keep_padding=True)


def hsdp_node_number_as_shard_index(dist, grads, nodes):
    """Cuts out shard rank // s (the rank's node) instead of its place inside the node."""
    return _hsdp(dist, grads, nodes, index=lambda rank, n, s: rank // s)


MISTAKES = [
    Attempt("hsdp_gradients", hsdp_keeps_the_padding, named="padding"),
    # Its rows are often those of padding kept (shard indices below n are full ones): not named apart yet.
    Attempt("hsdp_gradients", hsdp_node_number_as_shard_index, named="shard index", named_yet=False),
]
