"""Notebook 10, your own trainer: the reference solutions of its seams."""

import torch
import torch.nn.functional as F

from lib.real.backends import device_mesh


def clip_grad_norm(dist, grads, replicated, max_norm, tp):
    rank = dist.get_rank()
    # A TP-replicated gradient is the same on every TP rank: count it on TP rank 0 only.
    squares = sum((g.double().pow(2).sum() for g, r in zip(grads, replicated) if not r or rank % tp == 0),
                  torch.zeros((), dtype=torch.float64, device=grads[0].device))
    dist.all_reduce(squares)
    coef = max_norm / (squares.sqrt() + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef)
    return grads


def mean_loss(dist, losses, tokens):
    # Weight each micro-batch's mean by its tokens; one all-reduce of (loss sum, token count).
    total = torch.stack([torch.stack([loss * n for loss, n in zip(losses, tokens)]).sum(),
                         torch.tensor(float(sum(tokens)), dtype=losses[0].dtype, device=losses[0].device)])
    dist.all_reduce(total)
    return total[0] / total[1]


def hsdp_gradients(dist, grads, nodes):
    s = dist.get_world_size() // nodes
    mesh = device_mesh(dist, (nodes, s), ("replicate", "shard"))
    i = mesh.get_local_rank("shard")
    # Each gradient padded to s blocks of c rows (torch.chunk's size); block k of every gradient lies in the k-th
    # slice of one flat buffer, as FSDP2's foreach_reduce_scatter_copy_in lays them out.
    rows = [-(-g.shape[0] // s) for g in grads]
    blocks = [F.pad(g.reshape(g.shape[0], -1), (0, 0, 0, c * s - g.shape[0])).reshape(s, -1)
              for g, c in zip(grads, rows)]                                  # (s, c · the rest) each
    flat = torch.cat(blocks, dim=1).reshape(-1)
    shard = flat.new_empty(flat.numel() // s)
    dist.reduce_scatter_single(shard, flat, op=dist.ReduceOp.AVG, group=mesh["shard"].get_group())
    dist.all_reduce(shard, op=dist.ReduceOp.AVG, group=mesh["replicate"].get_group())
    parts = shard.split([b.shape[1] for b in blocks])
    # Shard i holds rows i·c up to the gradient's end: fewer than c in the last, none past it (padding only).
    return [part.reshape(c, *g.shape[1:])[:max(0, min(c, g.shape[0] - i * c))]
            for g, c, part in zip(grads, rows, parts)]
