"""Notebook 07, mixture of experts and expert parallelism: the reference solutions.

Tokens are rows (T, d); expert e maps a row v to v @ W_e; rank r holds experts r·E/N ... (r+1)·E/N - 1.
"""

import math

import torch


def top_k_route(logits, k, capacity_factor):
    t_count, experts = logits.shape
    probs = torch.softmax(logits, dim=-1)                                   # (T, E)
    choices = logits.topk(k, dim=-1).indices                                # (T, k), best first
    cap = math.ceil(k * t_count * capacity_factor / experts)
    claims = torch.nn.functional.one_hot(choices.t(), experts).flatten(0, 1)   # (k·T, E): first choices first
    slot = (claims.cumsum(0) - 1)[claims.bool()]                            # each claim's place in its expert
    expert = choices.t().flatten()                                          # (k·T,) in the same order
    token = torch.arange(t_count, device=logits.device).repeat(k)
    keep = slot < cap
    tokens = torch.full((experts, cap), -1, dtype=torch.long, device=logits.device)
    weights = torch.zeros(experts, cap, dtype=logits.dtype, device=logits.device)
    tokens[expert[keep], slot[keep]] = token[keep]
    weights = weights.index_put((expert[keep], slot[keep]), probs[token[keep], expert[keep]])
    return tokens, weights


def router_losses(logits, k, alpha, beta):
    t_count, experts = logits.shape
    probs = torch.softmax(logits, dim=-1)                                   # (T, E)
    f = torch.bincount(logits.topk(k, dim=-1).indices.flatten(), minlength=experts).to(logits.dtype) / (t_count * k)
    balance = alpha * experts * (f * probs.mean(0)).sum()
    z = beta * (torch.logsumexp(logits, dim=-1) ** 2).mean()
    return balance, z


def moe_layer(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    def all_to_all(dist, rows, output_split_sizes, input_split_sizes):
        out = rows.new_empty(sum(output_split_sizes), *rows.shape[1:])
        dist.all_to_all_single(out, rows, output_split_sizes, input_split_sizes, group=group)
        return out

    exchange = exchange or all_to_all
    n, local = dist.get_world_size(group), experts.shape[0]
    tokens, weights = top_k_route(x @ router, k, capacity_factor)           # (E, C) each
    kept = tokens >= 0
    counts = kept.sum(1)                                                    # (E,) rows for each expert
    got = all_to_all(dist, counts, [local] * n, [local] * n).view(n, local)   # (source, my expert)
    ids = tokens[kept]                                                      # kept rows, sorted by expert
    sent, received = counts.view(n, local).sum(1).tolist(), got.sum(1).tolist()
    rows = exchange(dist, x[ids], received, sent)                           # (Σ received, d)
    blocks = rows.split(got.flatten().tolist())                             # [source][my expert] blocks of rows
    done = torch.cat([block @ experts[i % local] for i, block in enumerate(blocks)])   # one matmul per block
    back = exchange(dist, done, sent, received)                             # (Σ sent, d), in the order sent
    return torch.zeros_like(x).index_add(0, ids, back * weights[kept].unsqueeze(-1))


def moe_layer_backward(dist, x, router, experts, k, capacity_factor, group=None):
    class AllToAll(torch.autograd.Function):
        """all_to_all_single forward; backward, the gradients go back with the split sizes swapped."""

        @staticmethod
        def forward(ctx, rows, output_split_sizes, input_split_sizes):
            ctx.splits = output_split_sizes, input_split_sizes
            out = rows.new_empty(sum(output_split_sizes), *rows.shape[1:])
            dist.all_to_all_single(out, rows.contiguous(), output_split_sizes, input_split_sizes, group=group)
            return out

        @staticmethod
        def backward(ctx, grad):
            output_split_sizes, input_split_sizes = ctx.splits
            out = grad.new_empty(sum(input_split_sizes), *grad.shape[1:])
            dist.all_to_all_single(out, grad.contiguous(), input_split_sizes, output_split_sizes, group=group)
            return out, None, None

    return moe_layer(dist, x, router, experts, k, capacity_factor, group=group,
                     exchange=lambda _dist, rows, out_splits, in_splits: AllToAll.apply(rows, out_splits, in_splits))


def moe_train(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    rank, world = dist.get_rank(), dist.get_world_size()
    ep_groups = [dist.new_group(list(range(i, i + ep_size))) for i in range(0, world, ep_size)]
    dp_groups = [dist.new_group(list(range(j, world, ep_size))) for j in range(ep_size)]
    ep, dp = ep_groups[rank // ep_size], dp_groups[rank % ep_size]
    for x, target in batches:
        router.requires_grad_(), experts.requires_grad_()
        y = moe_layer_backward(dist, x, router, experts, k, capacity_factor, group=ep)
        loss = ((y - target) ** 2).mean()          # this rank's; the objective is the mean over all ranks
        d_router, d_experts = torch.autograd.grad(loss, [router, experts])
        dist.all_reduce(d_router)                  # dense: every rank's tokens
        dist.all_reduce(d_experts, group=dp)       # experts: their replicas only (the EP group summed already)
        with torch.no_grad():
            router = router - lr * d_router / world
            experts = experts - lr * d_experts / world
    return router.detach(), experts.detach()


def smallest_capacity(logits, k, max_dropped):
    t_count, experts = logits.shape
    load = torch.bincount(logits.topk(k, dim=-1).indices.flatten(), minlength=experts)      # (E,)
    allowed = math.floor(max_dropped * t_count * k + 1e-9)      # whole choices, within round-off
    cap = next(c for c in range(1, int(load.max()) + 2) if (load - c).clamp(min=0).sum() <= allowed)
    kept = int(load.clamp(max=cap).sum())
    return cap, cap * experts - kept
