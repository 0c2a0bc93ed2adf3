"""Realistic first attempts at notebook 10's seam puzzles, none of them in tests/wrong."""

import torch
import torch.nn.functional as F

from lib.real.backends import device_mesh
from tests.mistakes import Attempt
from tests.wrong.trainer import _hsdp


def clip_tp_rank_taken_as_outermost(dist, grads, replicated, max_norm, tp):
    """Counts the replicated gradients on the ranks whose index over (N / tp) is 0, as if TP were the outer axis:
    some TP groups count their copy twice or more, others not at all."""
    rank = dist.get_rank()
    squares = sum(g.pow(2).sum() for g, r in zip(grads, replicated)
                  if not r or rank // (dist.get_world_size() // tp) == 0).reshape(1)
    dist.all_reduce(squares)
    coef = max_norm / (squares.sqrt() + 1e-6)
    return [g * coef if coef < 1 else g for g in grads]


def clip_by_the_sum_of_squares(dist, grads, replicated, max_norm, tp):
    """Forgets the square root: divides max_norm by the norm's square."""
    rank = dist.get_rank()
    squares = sum(g.pow(2).sum() for g, r in zip(grads, replicated) if not r or rank % tp == 0).reshape(1)
    dist.all_reduce(squares)
    coef = max_norm / (squares + 1e-6)
    return [g * coef if coef < 1 else g for g in grads]


def clip_by_the_sum_of_the_ranks_norms(dist, grads, replicated, max_norm, tp):
    """Takes each rank's own norm (its replicas counted on TP rank 0), then all-reduces the norms: a sum of norms,
    not the norm of the whole."""
    rank = dist.get_rank()
    norm = sum(g.pow(2).sum() for g, r in zip(grads, replicated) if not r or rank % tp == 0).sqrt().reshape(1)
    dist.all_reduce(norm)
    coef = max_norm / (norm + 1e-6)
    return [g * coef if coef < 1 else g for g in grads]


def clip_by_the_mean_of_the_squares(dist, grads, replicated, max_norm, tp):
    """Averages the squares over the ranks, as a data-parallel gradient is averaged, before the square root."""
    rank = dist.get_rank()
    squares = sum(g.pow(2).sum() for g, r in zip(grads, replicated) if not r or rank % tp == 0).reshape(1)
    dist.all_reduce(squares)
    coef = max_norm / ((squares / dist.get_world_size()).sqrt() + 1e-6)
    return [g * coef if coef < 1 else g for g in grads]


def mean_loss_never_divides_by_the_tokens(dist, losses, tokens):
    """All-reduces the token-weighted sum and the count, then divides by the ranks instead of the count."""
    total = torch.stack([sum(loss * n for loss, n in zip(losses, tokens)),
                         torch.tensor(float(sum(tokens)), dtype=losses[0].dtype)])
    dist.all_reduce(total)
    return total[0] / dist.get_world_size()


def mean_loss_divides_by_its_own_tokens(dist, losses, tokens):
    """All-reduces the token-weighted sum alone, then divides by N times this rank's own tokens, as if every rank
    held as many."""
    total = sum(loss * n for loss, n in zip(losses, tokens)).reshape(1)
    dist.all_reduce(total)
    return total[0] / (sum(tokens) * dist.get_world_size())


def mean_loss_without_the_token_weights(dist, losses, tokens):
    """All-reduces the micro-batches' mean losses, unweighted, and the token count, then divides one by the other."""
    total = torch.stack([sum(losses), torch.tensor(float(sum(tokens)), dtype=losses[0].dtype)])
    dist.all_reduce(total)
    return total[0] / total[1]


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


def hsdp_cut_by_tensor_split(dist, grads, nodes):
    """Reduce-scatters the padded blocks right, then cuts each shard to torch.tensor_split's size for its index
    (rows spread as evenly as they go) instead of torch.chunk's."""
    s, _, i = _shard_mesh(dist, nodes)
    return [t[:len(g.tensor_split(s)[i])] for t, g in zip(_hsdp(dist, grads, nodes, keep_padding=True), grads)]


MISTAKES = [
    Attempt("clip_grad_norm", clip_tp_rank_taken_as_outermost, named="rank % tp == 0"),
    Attempt("clip_grad_norm", clip_by_the_sum_of_squares, named="square root"),
    Attempt("clip_grad_norm", clip_by_the_sum_of_the_ranks_norms, named="norms do not add"),
    Attempt("clip_grad_norm", clip_by_the_mean_of_the_squares, named="averaged the squares"),
    Attempt("mean_loss", mean_loss_never_divides_by_the_tokens, named="T, the step's tokens"),
    Attempt("mean_loss", mean_loss_divides_by_its_own_tokens, named="own"),
    Attempt("mean_loss", mean_loss_without_the_token_weights, named="weigh it by its token count"),
    Attempt("hsdp_gradients", hsdp_keeps_the_padding, named="padding"),
    # Its rows are often those of padding kept (shard indices below n are full ones): not named apart yet.
    Attempt("hsdp_gradients", hsdp_node_number_as_shard_index, named="shard index", named_yet=False),
    Attempt("hsdp_gradients", hsdp_gradients_laid_end_to_end, named="laid end to end"),
    Attempt("hsdp_gradients", hsdp_shards_the_flattened_elements, named="not its flattened elements"),
    Attempt("hsdp_gradients", hsdp_never_all_reduces_across_nodes, named="own node's"),
    Attempt("hsdp_gradients", hsdp_cut_by_tensor_split, named="tensor_split's sizes"),
]
