"""Honest shortcuts on notebook 10's seams, each with the words its rejection must contain, and the cheats every
puzzle must reject."""

import torch
import torch.nn.functional as F

import puzzles.trainer as P
from lib.real.backends import device_mesh
from tests.cheats.common import everywhere
from tests.wrong.trainer import _scaled


def clip_on_the_gathered_gradients(dist, grads, replicated, max_norm, tp):
    """The norm from every rank's whole gradients, gathered: right values, but the model's gradients cross the
    link where one number (the sum of squares) does."""
    world = dist.get_world_size()
    squares = torch.zeros((), dtype=torch.float64)
    for g, r in zip(grads, replicated):
        gathered = [torch.empty_like(g) for _ in range(world)]
        dist.all_gather(gathered, g.contiguous())
        squares += sum(x.double().pow(2).sum() for k, x in enumerate(gathered) if not r or k % tp == 0)
    norm = squares.sqrt()
    return _scaled(grads, norm, max_norm) if norm + 1e-6 > max_norm else grads


def mean_loss_all_gathering_each_micro_batch(dist, losses, tokens):
    """Every micro-batch's loss and token count gathered from every rank, one all_gather each, then summed
    locally: the right mean, a collective per micro-batch where one all-reduce of two numbers does."""
    world = dist.get_world_size()
    total, count = torch.zeros((), dtype=losses[0].dtype), 0.0
    for loss, n in zip(losses, tokens):
        pair = torch.stack([loss * n, torch.tensor(float(n), dtype=loss.dtype)])
        gathered = [torch.empty_like(pair) for _ in range(world)]
        dist.all_gather(gathered, pair)
        total = total + sum(p[0] for p in gathered)
        count += float(sum(p[1] for p in gathered))
    return total / count


def hsdp_all_reducing_inside_the_node(dist, grads, nodes):
    """Inside the node an all-reduce of the whole gradient, then this rank's slice kept: the right shard, but twice
    a reduce-scatter's bytes on the node's links (HSDP's point is that each rank reduces only its shard)."""
    s = dist.get_world_size() // nodes
    mesh = device_mesh(dist, (nodes, s), ("replicate", "shard"))
    i = mesh.get_local_rank("shard")
    out = []
    for g in grads:
        c = -(-g.shape[0] // s)
        whole = g.clone()
        dist.all_reduce(whole, op=dist.ReduceOp.AVG, group=mesh["shard"].get_group())
        piece = F.pad(whole, (*(0, 0) * (g.dim() - 1), 0, c * s - g.shape[0]))[i * c:(i + 1) * c].contiguous()
        dist.all_reduce(piece, op=dist.ReduceOp.AVG, group=mesh["replicate"].get_group())
        out.append(piece[:max(0, min(c, g.shape[0] - i * c))])
    return out


CHEATS = everywhere(P) + [
    ("clip_grad_norm", clip_on_the_gathered_gradients, "sent"),
    ("mean_loss", mean_loss_all_gathering_each_micro_batch, "sent"),
    ("hsdp_gradients", hsdp_all_reducing_inside_the_node, "SHARD axis, over the budget"),
]
