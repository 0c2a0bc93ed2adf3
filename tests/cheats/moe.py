"""Cheats on notebook 07's puzzles, each with the words its rejection must contain."""

import torch

import puzzles.moe as P
from solutions.moe import top_k_route
from tests.cheats.common import everywhere


def route_by_the_course_arithmetic(logits, k, capacity_factor):
    """The capacity looked up in lib.moe, which the figures use, instead of derived."""
    from lib.moe import capacity

    tokens, weights = top_k_route(logits, k, capacity_factor)
    capacity(logits.shape[0], logits.shape[1], k, capacity_factor)
    return tokens, weights


def moe_by_moving_the_experts(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    """All-to-all only, but of the experts' weights: every rank receives every expert and keeps its tokens home."""
    n = dist.get_world_size()
    rows = experts.repeat(n, 1, 1)                                          # (N·E/N, d, d): a copy for each rank
    everyone = torch.empty_like(rows)
    dist.all_to_all_single(everyone, rows)
    tokens, weights = top_k_route(x @ router, k, capacity_factor)
    kept = tokens >= 0
    e = torch.arange(tokens.shape[0]).unsqueeze(1).expand_as(tokens)[kept]
    out = torch.einsum("rd,rde->re", x[tokens[kept]], everyone[e]) * weights[kept].unsqueeze(-1)
    return torch.zeros_like(x).index_add(0, tokens[kept], out)


def moe_train_without_expert_parallelism(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    """No expert parallelism: every rank gathers every batch and every expert (all-reduces of zero-padded buffers,
    the ops the puzzle allows) and trains the whole layer itself, single-device style."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.stack([torch.stack([x, t]) for x, t in batches])                # (steps, 2, T, d)
    everyone = torch.zeros(world, *mine.shape, dtype=mine.dtype, device=mine.device)
    everyone[rank] = mine
    dist.all_reduce(everyone)
    shards = torch.zeros(ep_size, *experts.shape, dtype=experts.dtype, device=experts.device)
    if rank < ep_size:
        shards[rank] = experts
    dist.all_reduce(shards)
    every_batch = [[(everyone[r, s, 0], everyone[r, s, 1]) for s in range(mine.shape[0])] for r in range(world)]
    router, experts = P.train_reference(every_batch, router, shards.flatten(0, 1), k, capacity_factor, lr,
                                        mine.shape[0])
    return router, experts.chunk(ep_size)[rank % ep_size].clone()


CHEATS = everywhere(P) + [
    ("top_k_route", route_by_the_course_arithmetic, "lib.moe"),
    ("moe_layer", moe_by_moving_the_experts, ("over the budget", "under the floor")),
    ("moe_train", moe_train_without_expert_parallelism, "over the budget"),
]
