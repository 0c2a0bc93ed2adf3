"""Notebook 07 (mixture of experts): first attempts, written from the notebook alone.

The expert-parallel layers share one learner's implementation (``_moe``), each attempt switching on the one
thing that learner got wrong.
"""
import math

import torch
import torch.nn.functional as F

import lib
from lib.units import fmt_bytes
from puzzles import moe as P


# ---------------------------------------------------------------- puzzle 1: top_k_route

def _route(logits, k, capacity_factor, *, order="choice", renorm=False, with_k=True, ceil=True,
           use_logits=False, dim=-1):
    T, E = logits.shape
    cap = k * T * capacity_factor / E if with_k else T * capacity_factor / E
    C = math.ceil(cap) if ceil else int(cap)
    probs = torch.softmax(logits, dim=dim)
    top_p, top_e = probs.topk(k, dim=-1)
    if renorm:
        top_p = top_p / top_p.sum(-1, keepdim=True)
    tokens = torch.full((E, C), -1, dtype=torch.int64)
    weights = torch.zeros((E, C), dtype=logits.dtype)
    fill = [0] * E
    if order == "choice":
        pairs = [(t, c) for c in range(k) for t in range(T)]
    else:
        pairs = [(t, c) for t in range(T) for c in range(k)]
    ids = top_e.tolist()
    for t, c in pairs:
        e = ids[t][c]
        if fill[e] < C:
            tokens[e, fill[e]] = t
            weights[e, fill[e]] = logits[t, e] if use_logits else top_p[t, c]
            fill[e] += 1
    return tokens, weights


def top_k_route_token_order(logits, k, capacity_factor):
    return _route(logits, k, capacity_factor, order="token")


def top_k_route_renormalised(logits, k, capacity_factor):
    return _route(logits, k, capacity_factor, renorm=True)


def top_k_route_no_k_in_capacity(logits, k, capacity_factor):
    return _route(logits, k, capacity_factor, with_k=False)


def top_k_route_floor(logits, k, capacity_factor):
    return _route(logits, k, capacity_factor, ceil=False)


def top_k_route_logit_weights(logits, k, capacity_factor):
    return _route(logits, k, capacity_factor, use_logits=True)


def top_k_route_softmax_over_tokens(logits, k, capacity_factor):
    return _route(logits, k, capacity_factor, dim=0)


def top_k_route_cumsum(logits, k, capacity_factor):
    # correct: slots by a cumulative sum of one-hots, choice by choice
    T, E = logits.shape
    C = math.ceil(k * T * capacity_factor / E)
    probs = torch.softmax(logits, dim=-1)
    top = probs.topk(k, dim=-1).indices
    tokens = torch.full((E, C), -1, dtype=torch.int64)
    weights = torch.zeros((E, C), dtype=probs.dtype)
    fill = torch.zeros(E, dtype=torch.int64)
    rows = torch.arange(T)
    for c in range(k):
        e = top[:, c]
        onehot = F.one_hot(e, E)
        pos = (onehot.cumsum(0) - 1 + fill)[rows, e]
        keep = pos < C
        tokens[e[keep], pos[keep]] = rows[keep]
        weights[e[keep], pos[keep]] = probs[rows[keep], e[keep]]
        fill += onehot.sum(0)
    return tokens, weights


# ---------------------------------------------------------------- puzzle 2: router_losses

def router_losses_f_over_T(logits, k, alpha, beta):
    T, E = logits.shape
    probs = torch.softmax(logits, -1)
    top = probs.topk(k, -1).indices
    f = F.one_hot(top, E).sum((0, 1)).to(logits.dtype) / T      # share over T, not T*k
    balance = alpha * E * (f * probs.mean(0)).sum()
    z = beta * (torch.logsumexp(logits, -1) ** 2).mean()
    return balance, z


def router_losses_naive_lse(logits, k, alpha, beta):
    T, E = logits.shape
    probs = torch.softmax(logits, -1)
    top = probs.topk(k, -1).indices
    f = F.one_hot(top, E).sum((0, 1)).to(logits.dtype) / (T * k)
    balance = alpha * E * (f * probs.mean(0)).sum()
    z = beta * (torch.log(torch.exp(logits).sum(-1)) ** 2).mean()
    return balance, z


def router_losses_f_is_p(logits, k, alpha, beta):
    E = logits.shape[1]
    probs = torch.softmax(logits, -1)
    P_ = probs.mean(0)
    f = P_                                    # f = P, as in the picture
    balance = alpha * E * (f * P_).sum()
    z = beta * (torch.logsumexp(logits, -1) ** 2).mean()
    return balance, z


def router_losses_first_choice(logits, k, alpha, beta):
    T, E = logits.shape
    probs = torch.softmax(logits, -1)
    f = F.one_hot(probs.argmax(-1), E).sum(0).to(logits.dtype) / T   # GShard's first choices
    balance = alpha * E * (f * probs.mean(0)).sum()
    z = beta * (torch.logsumexp(logits, -1) ** 2).mean()
    return balance, z


def router_losses_no_E(logits, k, alpha, beta):
    T, E = logits.shape
    probs = torch.softmax(logits, -1)
    top = probs.topk(k, -1).indices
    f = F.one_hot(top, E).sum((0, 1)).to(logits.dtype) / (T * k)
    balance = alpha * (f * probs.mean(0)).sum()
    z = beta * (torch.logsumexp(logits, -1) ** 2).mean()
    return balance, z


def router_losses_square_of_mean(logits, k, alpha, beta):
    T, E = logits.shape
    probs = torch.softmax(logits, -1)
    top = probs.topk(k, -1).indices
    f = F.one_hot(top, E).sum((0, 1)).to(logits.dtype) / (T * k)
    balance = alpha * E * (f * probs.mean(0)).sum()
    z = beta * torch.logsumexp(logits, -1).mean() ** 2
    return balance, z


def router_losses_bincount(logits, k, alpha, beta):
    # correct: f by bincount of the top-k indices, no gradient through it
    T, E = logits.shape
    probs = logits.softmax(dim=1)
    chosen = logits.detach().topk(k, dim=1).indices.reshape(-1)
    f = torch.bincount(chosen, minlength=E).to(logits.dtype) / chosen.numel()
    balance = alpha * E * torch.dot(f, probs.mean(dim=0))
    z = beta * logits.logsumexp(dim=1).pow(2).mean()
    return balance, z


# ---------------------------------------------------------------- the learner's top_k_route, reused

def _my_route(logits, k, capacity_factor):
    return _route(logits, k, capacity_factor)


# ---------------------------------------------------------------- puzzles 3 and 4: moe_layer, moe_layer_backward

def _moe(dist, x, router, experts, k, capacity_factor, exchange=None, group=None, *, weighted=True,
         counts="exchange", swap_dispatch=False, padded=False, ignore_group=False, autograd=False,
         backward_swap=True, backward_identity=False, detach_weights=False, transpose_expert=False,
         sort_by_argsort=False):
    kw = {} if ignore_group or group is None else {"group": group}
    N = dist.get_world_size() if ignore_group else dist.get_world_size(group)
    T, d = x.shape
    E = router.shape[1]
    local = E // N
    tokens, weights = _my_route(x @ router, k, capacity_factor)
    C = tokens.shape[1]
    if padded:
        flat_tok = tokens.reshape(-1)
        valid = flat_tok >= 0
        rows = torch.zeros(E * C, d, dtype=x.dtype)
        rows[valid] = x[flat_tok[valid]]
        per_expert = torch.full((E,), C, dtype=torch.int64)
        tok_ids = flat_tok.clamp(min=0)
        w = weights.reshape(-1) * valid
    else:
        keep = tokens >= 0
        if sort_by_argsort:
            e_of = torch.arange(E).unsqueeze(1).expand(E, C)[keep]
            order = torch.argsort(e_of, stable=True)
            tok_ids = tokens[keep][order]
            w = weights[keep][order]
        else:
            tok_ids = tokens[keep]
            w = weights[keep]
        rows = x[tok_ids]
        per_expert = keep.sum(1)
    if detach_weights:
        w = w.detach()
    send_counts = per_expert.view(N, local).sum(1).tolist()
    if counts == "exchange":
        recv_per_expert = torch.empty_like(per_expert)
        dist.all_to_all_single(recv_per_expert, per_expert, **kw)
    else:
        recv_per_expert = per_expert.clone()  # assumed everyone sends what I send
    recv_counts = recv_per_expert.view(N, local).sum(1).tolist()

    def a2a(inp, out_splits, in_splits):
        if swap_dispatch:
            out_splits, in_splits = in_splits, out_splits
        if autograd:
            return _A2A.apply(inp, out_splits, in_splits, dist, kw, backward_swap, backward_identity)
        if exchange is not None:
            return exchange(dist, inp, out_splits, in_splits)
        out = torch.empty(sum(out_splits), d, dtype=inp.dtype)
        dist.all_to_all_single(out, inp.contiguous(), out_splits, in_splits, **kw)
        return out

    recv = a2a(rows, recv_counts, send_counts)
    idx = torch.arange(local).repeat(N).repeat_interleave(recv_per_expert.view(-1))
    out = recv.new_zeros(recv.shape)
    for e in range(local):
        sel = (idx == e).nonzero().squeeze(1)
        if sel.numel():
            prod = recv[sel] @ (experts[e].t() if transpose_expert else experts[e])
            out = out.index_add(0, sel, prod)
    back = a2a(out, send_counts, recv_counts)
    contrib = back * w.unsqueeze(1) if weighted else back
    return x.new_zeros(T, d).index_add(0, tok_ids, contrib)


class _A2A(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, out_splits, in_splits, dist, kw, backward_swap, backward_identity):
        ctx.dist, ctx.kw, ctx.splits = dist, kw, (out_splits, in_splits)
        ctx.swap, ctx.identity = backward_swap, backward_identity
        out = torch.empty(sum(out_splits), inp.shape[1], dtype=inp.dtype)
        dist.all_to_all_single(out, inp.contiguous(), out_splits, in_splits, **kw)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        if ctx.identity:
            return grad, None, None, None, None, None, None
        o, i = (in_splits, out_splits) if ctx.swap else (out_splits, in_splits)
        g = torch.empty(sum(o), grad.shape[1], dtype=grad.dtype)
        ctx.dist.all_to_all_single(g, grad.contiguous(), o, i, **ctx.kw)
        return g, None, None, None, None, None, None


def moe_layer_unweighted(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    return _moe(dist, x, router, experts, k, capacity_factor, exchange, group, weighted=False)


def moe_layer_no_counts(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    return _moe(dist, x, router, experts, k, capacity_factor, exchange, group, counts="assume")


def moe_layer_swapped_splits(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    return _moe(dist, x, router, experts, k, capacity_factor, exchange, group, swap_dispatch=True)


def moe_layer_padded(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    return _moe(dist, x, router, experts, k, capacity_factor, exchange, group, padded=True)


def moe_layer_ignores_group(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    return _moe(dist, x, router, experts, k, capacity_factor, exchange, group, ignore_group=True)


def moe_layer_transposed_expert(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    return _moe(dist, x, router, experts, k, capacity_factor, exchange, group, transpose_expert=True)


def moe_layer_argsort(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    # correct: orders the kept pairs by expert with a stable argsort instead of reading the table row by row
    return _moe(dist, x, router, experts, k, capacity_factor, exchange, group, sort_by_argsort=True)


def moe_layer_backward_no_autograd(dist, x, router, experts, k, capacity_factor, group=None):
    return _moe(dist, x, router, experts, k, capacity_factor, None, group)


def moe_layer_backward_same_splits(dist, x, router, experts, k, capacity_factor, group=None):
    return _moe(dist, x, router, experts, k, capacity_factor, None, group, autograd=True, backward_swap=False)


def moe_layer_backward_identity(dist, x, router, experts, k, capacity_factor, group=None):
    return _moe(dist, x, router, experts, k, capacity_factor, None, group, autograd=True, backward_identity=True)


def moe_layer_backward_detached_weights(dist, x, router, experts, k, capacity_factor, group=None):
    return _moe(dist, x, router, experts, k, capacity_factor, None, group, autograd=True, detach_weights=True)


def moe_layer_backward_ignores_group(dist, x, router, experts, k, capacity_factor, group=None):
    return _moe(dist, x, router, experts, k, capacity_factor, None, group, autograd=True, ignore_group=True)


def moe_layer_backward_correct(dist, x, router, experts, k, capacity_factor, group=None):
    # correct: an autograd Function around all_to_all_single, splits swapped in backward
    return _moe(dist, x, router, experts, k, capacity_factor, None, group, autograd=True)


# ---------------------------------------------------------------- puzzle 5: moe_train

def _groups(dist, ep_size, *, only_mine=False, dp_consecutive=False):
    N, r = dist.get_world_size(), dist.get_rank()
    ep_group = dp_group = None
    for g in range(N // ep_size):
        ranks = list(range(g * ep_size, (g + 1) * ep_size))
        if only_mine and r not in ranks:
            continue
        grp = dist.new_group(ranks)
        if r in ranks:
            ep_group = grp
    for j in range(ep_size):
        ranks = list(range(j * (N // ep_size), (j + 1) * (N // ep_size))) if dp_consecutive else list(range(j, N, ep_size))
        if only_mine and r not in ranks:
            continue
        grp = dist.new_group(ranks)
        if r in ranks:
            dp_group = grp
    return ep_group, dp_group


def _moe_train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, *, experts_world=False,
               experts_divisor="N", router_reduce="world", only_mine=False, dp_consecutive=False):
    N = dist.get_world_size()
    ep_group, dp_group = _groups(dist, ep_size, only_mine=only_mine, dp_consecutive=dp_consecutive)
    router = router.detach().clone().requires_grad_()
    experts = experts.detach().clone().requires_grad_()
    for x, target in batches:
        y = moe_layer_backward_correct(dist, x, router, experts, k, capacity_factor, group=ep_group)
        ((y - target) ** 2).mean().backward()
        with torch.no_grad():
            if router_reduce == "world":
                dist.all_reduce(router.grad)
                router.grad /= N
            elif router_reduce == "ep":
                dist.all_reduce(router.grad, group=ep_group)
                router.grad /= ep_size
            if experts_world:
                dist.all_reduce(experts.grad)
            else:
                dist.all_reduce(experts.grad, group=dp_group)
            experts.grad /= N if experts_divisor == "N" else N // ep_size
            router -= lr * router.grad
            experts -= lr * experts.grad
            router.grad = None
            experts.grad = None
    return router.detach(), experts.detach()


def moe_train_experts_over_world(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    return _moe_train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, experts_world=True)


def moe_train_divide_by_dp_size(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    return _moe_train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, experts_divisor="dp")


def moe_train_router_not_averaged(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    return _moe_train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, router_reduce="none")


def moe_train_router_over_ep(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    return _moe_train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, router_reduce="ep")


def moe_train_only_my_groups(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    return _moe_train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, only_mine=True)


def moe_train_dp_consecutive(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    return _moe_train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, dp_consecutive=True)


def moe_train_correct(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    # correct: all groups made on every rank; router over the world, experts over their DP group, both / N
    return _moe_train(dist, batches, router, experts, k, capacity_factor, lr, ep_size)


# ---------------------------------------------------------------- puzzle 6: smallest_capacity

def _claims(logits, k):
    E = logits.shape[1]
    return torch.bincount(logits.topk(k, dim=-1).indices.reshape(-1), minlength=E).tolist()


def _smallest(logits, k, max_dropped, *, over_T=False, padded_ignores_drops=False, off_by_one=False,
              as_count=False, strict=False, first_only=False):
    T, E = logits.shape
    n = _claims(logits, 1 if first_only else k)
    total = T * (1 if first_only else k)
    budget = max_dropped if as_count else max_dropped * (T if over_T else total)
    C = 0
    while True:
        dropped = sum(max(0, c - C) for c in n)
        if (dropped < budget) if strict else (dropped <= budget):
            break
        C += 1
    if off_by_one:
        C += 1
    dropped = sum(max(0, c - C) for c in n)
    padded = C * E - total if padded_ignores_drops else C * E - (total - dropped)
    return C, padded


def smallest_capacity_budget_over_T(logits, k, max_dropped):
    return _smallest(logits, k, max_dropped, over_T=True)


def smallest_capacity_padding_ignores_drops(logits, k, max_dropped):
    return _smallest(logits, k, max_dropped, padded_ignores_drops=True)


def smallest_capacity_one_too_many(logits, k, max_dropped):
    return _smallest(logits, k, max_dropped, off_by_one=True)


def smallest_capacity_budget_as_count(logits, k, max_dropped):
    return _smallest(logits, k, max_dropped, as_count=True)


def smallest_capacity_strict(logits, k, max_dropped):
    return _smallest(logits, k, max_dropped, strict=True)


def smallest_capacity_first_choice(logits, k, max_dropped):
    return _smallest(logits, k, max_dropped, first_only=True)


def smallest_capacity_factor_search(logits, k, max_dropped):
    # searched capacity factors in steps of 0.05 through the notebook's C formula
    T, E = logits.shape
    n = _claims(logits, k)
    cf = 0.05
    while True:
        C = math.ceil(k * T * cf / E)
        dropped = sum(max(0, c - C) for c in n)
        if dropped <= max_dropped * T * k:
            return C, C * E - (T * k - dropped)
        cf += 0.05


def smallest_capacity_bisect(logits, k, max_dropped):
    # correct: bisection over C on the per-expert claim counts
    T, E = logits.shape
    n = _claims(logits, k)
    lo, hi = 0, max(n)
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(max(0, c - mid) for c in n) <= max_dropped * T * k:
            hi = mid
        else:
            lo = mid + 1
    kept = sum(min(c, lo) for c in n)
    return lo, lo * E - kept


ATTEMPTS = [
    ("top_k_route", top_k_route_token_order, "filled slots token by token (all of a token's choices first), not first choices first"),
    ("top_k_route", top_k_route_renormalised, "renormalised the weights over the k chosen experts"),
    ("top_k_route", top_k_route_no_k_in_capacity, "capacity ceil(T*factor/E), forgot k"),
    ("top_k_route", top_k_route_floor, "int() (floor) for the capacity instead of ceil"),
    ("top_k_route", top_k_route_logit_weights, "stored the raw logits as weights, not the probabilities"),
    ("top_k_route", top_k_route_softmax_over_tokens, "softmax over dim 0 (tokens) instead of the experts"),
    ("top_k_route", top_k_route_cumsum, "correct: slot positions by cumsum of one-hots, one choice at a time"),
    ("router_losses", router_losses_f_over_T, "f divided by T instead of T*k"),
    ("router_losses", router_losses_naive_lse, "z-loss with log(exp(z).sum()): overflows"),
    ("router_losses", router_losses_f_is_p, "used f = P (the probabilities) instead of the counted choices"),
    ("router_losses", router_losses_first_choice, "counted first choices only (GShard) when k > 1"),
    ("router_losses", router_losses_no_E, "forgot the factor E"),
    ("router_losses", router_losses_square_of_mean, "z-loss as the square of the mean logsumexp"),
    ("router_losses", router_losses_bincount, "correct: bincount of the top-k indices and torch.dot"),
    ("moe_layer", moe_layer_unweighted, "forgot to weight the experts' outputs by the router probabilities"),
    ("moe_layer", moe_layer_no_counts, "no count exchange: assumed every rank sends what I send"),
    ("moe_layer", moe_layer_swapped_splits, "swapped output_split_sizes and input_split_sizes in the dispatch"),
    ("moe_layer", moe_layer_padded, "padded dispatch: every expert's whole capacity, empty slots included"),
    ("moe_layer", moe_layer_ignores_group, "ignored group: world size and collectives over the whole world"),
    ("moe_layer", moe_layer_transposed_expert, "applied the expert as W_e^T (v W_e^T instead of v W_e)"),
    ("moe_layer", moe_layer_argsort, "correct: kept pairs ordered by a stable argsort on the expert"),
    ("moe_layer_backward", moe_layer_backward_no_autograd, "plain all_to_all_single: autograd does not see it"),
    ("moe_layer_backward", moe_layer_backward_same_splits, "backward all-to-all with the same split sizes, not swapped"),
    ("moe_layer_backward", moe_layer_backward_identity, "the all-to-all's backward returns the gradient unchanged"),
    ("moe_layer_backward", moe_layer_backward_detached_weights, "detached the routing weights: router gets no gradient"),
    ("moe_layer_backward", moe_layer_backward_ignores_group, "ignored group in the all-to-alls"),
    ("moe_layer_backward", moe_layer_backward_correct, "correct: one Function around all_to_all_single, splits swapped"),
    ("moe_train", moe_train_experts_over_world, "all-reduced the experts' gradients over the world, mixing different experts"),
    ("moe_train", moe_train_divide_by_dp_size, "divided the experts' gradient by the DP group size, not N"),
    ("moe_train", moe_train_router_not_averaged, "never averaged the router's gradient"),
    ("moe_train", moe_train_router_over_ep, "averaged the router over the EP group only"),
    ("moe_train", moe_train_only_my_groups, "each rank created only its own groups"),
    ("moe_train", moe_train_dp_consecutive, "DP groups of consecutive ranks (same as EP) instead of rank % ep_size"),
    ("moe_train", moe_train_correct, "correct: router over the world, experts over their DP group, both divided by N"),
    ("smallest_capacity", smallest_capacity_budget_over_T, "budget as a share of T, not of T*k"),
    ("smallest_capacity", smallest_capacity_padding_ignores_drops, "padded = C*E - T*k, forgetting that dropped claims fill no slot"),
    ("smallest_capacity", smallest_capacity_one_too_many, "off by one: returned one more slot than needed"),
    ("smallest_capacity", smallest_capacity_budget_as_count, "read max_dropped as a number of choices, not a share"),
    ("smallest_capacity", smallest_capacity_strict, "dropped < budget instead of <="),
    ("smallest_capacity", smallest_capacity_first_choice, "counted first choices only"),
    ("smallest_capacity", smallest_capacity_factor_search, "searched capacity factors in steps of 0.05, not C itself"),
    ("smallest_capacity", smallest_capacity_bisect, "correct: bisection on C over the per-expert claim counts"),
]
