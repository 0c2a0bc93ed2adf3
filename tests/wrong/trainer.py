"""Wrong answers to notebook 10's seam puzzles, each with the words its failure message must contain."""

import torch
import torch.nn.functional as F

from lib.real.backends import device_mesh
from puzzles.trainer import _clip_counting_every_copy, _mean_of_means


def _scaled(grads, norm, max_norm):
    coef = max_norm / (norm + 1e-6)
    return [g * coef for g in grads]


def clip_without_all_reduce(dist, grads, replicated, max_norm, tp):
    """Each rank clips by the norm of its own shards: the ranks scale by different factors."""
    norm = torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()
    return _scaled(grads, norm, max_norm) if norm > max_norm else grads


def clip_always_scales(dist, grads, replicated, max_norm, tp):
    """Scales by max_norm / norm even when the norm is below max_norm: small gradients are blown up."""
    rank = dist.get_rank()
    squares = sum((g.pow(2).sum() for g, r in zip(grads, replicated) if not r or rank % tp == 0),
                  torch.zeros((), dtype=grads[0].dtype)).reshape(1)
    dist.all_reduce(squares)
    return _scaled(grads, squares.sqrt(), max_norm)


def clip_replicated_on_rank_0_only(dist, grads, replicated, max_norm, tp):
    """Counts the replicated gradients on rank 0 alone: right with one TP group (tp = world), but the other
    stages' TP groups never count theirs."""
    rank = dist.get_rank()
    squares = sum(g.pow(2).sum() for g, r in zip(grads, replicated) if not r or rank == 0).reshape(1)
    dist.all_reduce(squares)
    return _scaled(grads, squares.sqrt(), max_norm) if squares.sqrt() > max_norm else grads


def mean_loss_one_all_reduce_per_micro_batch(dist, losses, tokens):
    """Right value, m all-reduces of one number each where one of two numbers does."""
    total, count = torch.zeros(1, dtype=losses[0].dtype), torch.zeros(1, dtype=losses[0].dtype)
    for loss, n in zip(losses, tokens):
        part = torch.stack([loss * n, torch.tensor(float(n), dtype=loss.dtype)])
        dist.all_reduce(part)
        total += part[0]
        count += part[1]
    return (total / count)[0]


def mean_loss_never_divides_by_the_ranks(dist, losses, tokens):
    """The token-weighted mean of this rank's micro-batches, summed over the ranks: N times too large."""
    mine = (torch.stack(losses) * torch.tensor(tokens, dtype=losses[0].dtype)).sum() / sum(tokens)
    dist.all_reduce(mine)
    return mine


def _hsdp(dist, grads, nodes, *, shard="shard", replicate="replicate", op="AVG", across_op="AVG",
          whole_across_first=False, keep_padding=False, index=None, reduce_across=True, end_to_end=False):
    """HSDP as the hints lay it out, over the groups and with the ops named: padding for the group it
    reduce-scatters over, an all-reduce of the shard over the other (none where not `reduce_across`), and
    (whole_across_first) the whole gradient all-reduced across nodes before anything is sharded; keep_padding returns
    the padded shards, `index` takes the shard index from the rank and the sizes (a function) instead of the mesh,
    end_to_end lays the padded gradients one after the other in the flat buffer instead of shard by shard."""
    s = dist.get_world_size() // nodes
    mesh = device_mesh(dist, (nodes, s), ("replicate", "shard"))
    inside, across = mesh[shard].get_group(), mesh[replicate].get_group()
    k, i = dist.get_world_size(inside), mesh.get_local_rank(shard)
    i = i if index is None else index(dist.get_rank(), nodes, s)
    if whole_across_first:
        grads = [g.clone() for g in grads]
        for g in grads:
            dist.all_reduce(g, op=dist.ReduceOp.AVG, group=across)
    rows = [-(-g.shape[0] // k) for g in grads]
    blocks = [F.pad(g.reshape(g.shape[0], -1), (0, 0, 0, c * k - g.shape[0])).reshape(k, -1)
              for g, c in zip(grads, rows)]
    flat = torch.cat([b.reshape(-1) for b in blocks] if end_to_end else blocks, dim=int(not end_to_end)).reshape(-1)
    out = flat.new_empty(flat.numel() // k)
    dist.reduce_scatter_single(out, flat, op=getattr(dist.ReduceOp, op), group=inside)
    if reduce_across and not whole_across_first:
        dist.all_reduce(out, op=getattr(dist.ReduceOp, across_op), group=across)
    parts = out.split([b.shape[1] for b in blocks])
    return [part.reshape(c, *g.shape[1:])[:c if keep_padding else max(0, min(c, g.shape[0] - i * c))]
            for g, c, part in zip(grads, rows, parts)]


def hsdp_all_reduce_over_the_world(dist, grads, nodes):
    """No sharding on the wire: every gradient averaged over every rank, then this rank's shard cut out."""
    s, i = dist.get_world_size() // nodes, dist.get_rank() % (dist.get_world_size() // nodes)
    out = []
    for g in grads:
        g = g.clone()
        dist.all_reduce(g, op=dist.ReduceOp.AVG)
        chunks = list(torch.chunk(g, s))
        out.append(chunks[i] if i < len(chunks) else g[:0])
    return out


def hsdp_whole_gradient_across_nodes_first(dist, grads, nodes):
    """Right values, but the whole gradient crosses the nodes (s times the shard's bytes) before being sharded."""
    return _hsdp(dist, grads, nodes, whole_across_first=True)


def hsdp_averages_over_the_node_only(dist, grads, nodes):
    """Averages inside the node and sums across nodes: divided by s where N = n·s is due, n times too large."""
    return _hsdp(dist, grads, nodes, across_op="SUM")


def hsdp_groups_swapped(dist, grads, nodes):
    """Reduce-scatters over the replicate group and all-reduces over the node: shards of the wrong size and place."""
    return _hsdp(dist, grads, nodes, shard="replicate", replicate="shard")


def hsdp_sums_without_the_mean(dist, grads, nodes):
    """The sum over every rank, never divided: N times the mean."""
    return _hsdp(dist, grads, nodes, op="SUM", across_op="SUM")


WRONG = [
    ("clip_grad_norm", _clip_counting_every_copy, "expected", "TP-replicated"),
    ("clip_grad_norm", clip_without_all_reduce, "expected", "a norm of its own"),
    ("clip_grad_norm", clip_replicated_on_rank_0_only, "expected", "0 times in the TP group"),
    ("clip_grad_norm", clip_always_scales, "expected", "not below 1"),
    ("mean_loss", _mean_of_means, "expected", "micro-batches' means"),
    ("mean_loss", mean_loss_one_all_reduce_per_micro_batch, "sent"),
    ("mean_loss", mean_loss_never_divides_by_the_ranks, "expected", "each rank's own token-weighted mean"),
    ("hsdp_gradients", hsdp_all_reduce_over_the_world, "none of its mesh groups"),
    ("hsdp_gradients", hsdp_whole_gradient_across_nodes_first, "REPLICATE axis, over the budget"),
    ("hsdp_gradients", hsdp_averages_over_the_node_only, "expected", "n, the nodes"),
    ("hsdp_gradients", hsdp_groups_swapped, "expected"),
    ("hsdp_gradients", hsdp_sums_without_the_mean, "expected", "N"),
]
