"""Realistic first attempts at notebook 10's seam puzzles, none of them in tests/wrong."""

import torch.nn.functional as F

from lib.real.backends import device_mesh
from tests.mistakes import Attempt
from tests.wrong.trainer import _hsdp


def hsdp_keeps_the_padding(dist, grads, nodes):
    """Returns each shard as the reduce-scatter left it, padding rows included: the last shards are too long."""
    return _hsdp(dist, grads, nodes, keep_padding=True)


def hsdp_node_number_as_shard_index(dist, grads, nodes):
    """Cuts out shard rank // s (the rank's node) instead of its place inside the node."""
    return _hsdp(dist, grads, nodes, index=lambda rank, n, s: rank // s)


def _shard_mesh(dist, nodes):
    s = dist.get_world_size() // nodes
    mesh = device_mesh(dist, (nodes, s), ("replicate", "shard"))
    return s, mesh, mesh.get_local_rank("shard")


def hsdp_gradients_laid_end_to_end(dist, grads, nodes):
    """Pads each gradient's rows, then lays the gradients one after the other in the flat buffer: the reduce-scatter's
    slice i is then not row block i of every gradient."""
    return _hsdp(dist, grads, nodes, end_to_end=True)


def hsdp_shards_the_flattened_elements(dist, grads, nodes):
    """Flattens each gradient and shards its elements: 1-D shards where rows with their columns belong."""
    s, mesh, i = _shard_mesh(dist, nodes)
    out = []
    for g in grads:
        c = -(-g.numel() // s)
        flat = F.pad(g.reshape(-1), (0, c * s - g.numel()))
        piece = flat.new_empty(c)
        dist.reduce_scatter_single(piece, flat, op=dist.ReduceOp.AVG, group=mesh["shard"].get_group())
        dist.all_reduce(piece, op=dist.ReduceOp.AVG, group=mesh["replicate"].get_group())
        out.append(piece[:max(0, min(c, g.numel() - i * c))])
    return out


def hsdp_never_all_reduces_across_nodes(dist, grads, nodes):
    """Reduce-scatters inside the node and stops there: each shard is its node's mean, not every rank's."""
    return _hsdp(dist, grads, nodes, reduce_across=False)


MISTAKES = [
    Attempt("hsdp_gradients", hsdp_keeps_the_padding, named="padding"),
    # Its rows are often those of padding kept (shard indices below n are full ones): not named apart yet.
    Attempt("hsdp_gradients", hsdp_node_number_as_shard_index, named="shard index", named_yet=False),
    Attempt("hsdp_gradients", hsdp_gradients_laid_end_to_end, named="laid end to end"),
    Attempt("hsdp_gradients", hsdp_shards_the_flattened_elements, named="not its flattened elements"),
    Attempt("hsdp_gradients", hsdp_never_all_reduces_across_nodes, named="own node's"),
]
