"""Wrong answers to notebook 07's puzzles, each with the words its failure message must contain.

A wrong answer must fail, whatever else it gets right; tests/test_content.py runs every catalogue.
"""

import math

import torch
import torch.nn.functional as F

from solutions.moe import moe_layer, moe_layer_backward, top_k_route


def _route(logits, k, capacity_factor, order="choice", from_the_end=False, with_k=True, whole=math.ceil):
    """Vectorised top-k routing with one mistake chosen by the arguments (`whole`: how C becomes a whole number)."""
    t_count, experts = logits.shape
    probs = torch.softmax(logits, dim=-1)                                   # (T, E)
    choices = probs.topk(k, dim=-1).indices                                 # (T, k)
    cap = max(1, whole((k if with_k else 1) * t_count * capacity_factor / experts))
    by = choices.t() if order == "choice" else choices                      # (k, T) or (T, k)
    token = torch.arange(t_count).repeat(k) if order == "choice" else torch.arange(t_count).repeat_interleave(k)
    expert = by.flatten()
    claims = F.one_hot(expert, experts)                                      # (k·T, E)
    taken = claims.flip(0).cumsum(0).flip(0) if from_the_end else claims.cumsum(0)
    slot = (taken - 1)[claims.bool()]
    keep = slot < cap
    tokens = torch.full((experts, cap), -1, dtype=torch.long)
    weights = torch.zeros(experts, cap, dtype=logits.dtype)
    if from_the_end:           # the kept claims are the last ones; put them in slots in token order again
        slot = slot.clone()
        for e in range(experts):
            mine = keep & (expert == e)
            slot[mine] = torch.arange(int(mine.sum()))
    tokens[expert[keep], slot[keep]] = token[keep]
    weights[expert[keep], slot[keep]] = probs[token[keep], expert[keep]]
    return tokens, weights


def route_dropping_the_first_tokens(logits, k, capacity_factor):
    """Over capacity, keeps the last tokens of the batch and drops the first: the wrong end."""
    return _route(logits, k, capacity_factor, from_the_end=True)


def route_token_by_token(logits, k, capacity_factor):
    """Token 0 claims both its experts before token 1 claims any: second choices outrank later first choices."""
    return _route(logits, k, capacity_factor, order="token")


def route_capacity_without_k(logits, k, capacity_factor):
    """C = ceil(T · factor / E): with k = 2 every expert gets half the slots the k·T choices need."""
    return _route(logits, k, capacity_factor, with_k=False)


def route_capacity_truncated(logits, k, capacity_factor):
    """C = int(k·T·factor / E): one slot short whenever that is not a whole number."""
    return _route(logits, k, capacity_factor, whole=int)


def route_capacity_rounded(logits, k, capacity_factor):
    """C = round(k·T·factor / E): one slot short when the fraction is below one half."""
    return _route(logits, k, capacity_factor, whole=round)


def route_renormalising_the_weights(logits, k, capacity_factor):
    """Mixtral's renormalised top-k weights, where the statement asks for the router's probabilities."""
    tokens, weights = top_k_route(logits, k, capacity_factor)
    top = torch.softmax(logits, -1).topk(k, -1).values.sum(-1)                   # (T,)
    return tokens, torch.where(tokens >= 0, weights / top[tokens.clamp(min=0)], weights)


def _losses(logits, k, alpha, beta, detach=False, soft=False, plain_exp=False, first_only=False):
    t_count, experts = logits.shape
    probs = torch.softmax(logits.detach() if detach else logits, dim=-1)
    counted = 1 if first_only else k
    hard = torch.bincount(logits.topk(counted, -1).indices.flatten(), minlength=experts).to(logits.dtype) / (
        t_count * counted)
    f = probs.mean(0) if soft else hard
    lse = torch.log(torch.exp(logits).sum(-1)) if plain_exp else torch.logsumexp(logits, -1)
    return alpha * experts * (f * probs.mean(0)).sum(), beta * (lse ** 2).mean()


def losses_with_a_detached_router(logits, k, alpha, beta):
    """The right values from detached probabilities: the balance loss's gradient is zero, the router never learns."""
    return _losses(logits, k, alpha, beta, detach=True)


def losses_counting_probabilities_as_f(logits, k, alpha, beta):
    """f_i taken as the mean probability too: E·Σ P_i², another loss with another gradient."""
    return _losses(logits, k, alpha, beta, soft=True)


def z_loss_through_plain_exponentials(logits, k, alpha, beta):
    """log(exp(x).sum()): inf once the logits reach the hundreds."""
    return _losses(logits, k, alpha, beta, plain_exp=True)


def moe_guessing_the_split_sizes(dist, x, router, experts, k, capacity_factor):
    """No counts exchanged: each rank expects from every other as many rows as it sends to it."""
    n, local = dist.get_world_size(), experts.shape[0]
    tokens, weights = top_k_route(x @ router, k, capacity_factor)
    kept = tokens >= 0
    ids = tokens[kept]
    sent = kept.sum(1).view(n, local).sum(1).tolist()
    rows = x.new_empty(sum(sent), x.shape[1])
    dist.all_to_all_single(rows, x[ids].contiguous(), sent, sent)
    guess = torch.arange(rows.shape[0]) * local // max(rows.shape[0], 1)     # an even share for each local expert
    done = torch.einsum("rd,rde->re", rows, experts[guess])
    back = torch.empty_like(done)
    dist.all_to_all_single(back, done, sent, sent)
    return torch.zeros_like(x).index_add(0, ids, back * weights[kept].unsqueeze(-1))


def _plain_exchange(dist, rows, out_splits, in_splits, group=None):
    out = rows.new_empty(sum(out_splits), *rows.shape[1:])
    dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits, group=group)
    return out


def _expert_parallel(dist, x, router, experts, k, capacity_factor, route=top_k_route, weighted=True,
                     exchange=_plain_exchange, group=None, assign=False):
    """The right dispatch and combine around a given router (assign: a token's rows written, not added)."""
    n, local = dist.get_world_size(group), experts.shape[0]
    tokens, weights = route(x @ router, k, capacity_factor)
    kept = tokens >= 0
    counts = kept.sum(1)
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts, group=group)
    sent, received = counts.view(n, local).sum(1).tolist(), got.view(n, local).sum(1).tolist()
    ids = tokens[kept]
    rows = exchange(dist, x[ids], received, sent)
    owner = torch.arange(local).repeat(n).repeat_interleave(got)
    done = torch.einsum("rd,rde->re", rows, experts[owner])
    back = exchange(dist, done, sent, received)
    scale = weights[kept] if weighted else torch.ones_like(weights[kept])
    if assign:
        y = torch.zeros_like(x)
        y[ids] = back * scale.unsqueeze(-1)
        return y
    return torch.zeros_like(x).index_add(0, ids, back * scale.unsqueeze(-1))


def moe_without_combine_weights(dist, x, router, experts, k, capacity_factor):
    """Adds the experts' outputs as they come back, without the router's probabilities."""
    return _expert_parallel(dist, x, router, experts, k, capacity_factor, weighted=False)


def moe_combines_by_assignment(dist, x, router, experts, k, capacity_factor):
    """y[ids] = ... instead of adding: right when k = 1, but a token's second expert overwrites its first."""
    return _expert_parallel(dist, x, router, experts, k, capacity_factor, assign=True)


def moe_with_capacity_per_rank(dist, x, router, experts, k, capacity_factor):
    """A rank's experts share one pool of slots: an overloaded expert borrows its sibling's spare capacity."""
    local = experts.shape[0]

    def pooled(logits, k, factor):
        t_count, e_count = logits.shape
        probs = torch.softmax(logits, -1)
        choices = probs.topk(k, -1).indices.t().flatten()                  # (k·T,), first choices first
        token = torch.arange(t_count).repeat(k)
        cap = math.ceil(k * t_count * factor / e_count)
        pool = F.one_hot(choices // local, e_count // local)               # claims per rank
        keep = ((pool.cumsum(0) - 1)[pool.bool()] < cap * local)
        slots = F.one_hot(choices, e_count)
        slot = (slots[keep].cumsum(0) - 1)[slots[keep].bool()]
        tokens = torch.full((e_count, cap * local), -1, dtype=torch.long)
        weights = torch.zeros(e_count, cap * local, dtype=logits.dtype)
        tokens[choices[keep], slot] = token[keep]
        weights[choices[keep], slot] = probs[token[keep], choices[keep]]
        return tokens, weights
    return _expert_parallel(dist, x, router, experts, k, capacity_factor, route=pooled)


def moe_with_padded_buffers(dist, x, router, experts, k, capacity_factor):
    """Right values by GShard's dense dispatch: every expert's whole capacity, padding included, in even splits."""
    n, local = dist.get_world_size(), experts.shape[0]
    tokens, weights = top_k_route(x @ router, k, capacity_factor)
    e_count, cap = tokens.shape
    kept = tokens >= 0
    rows = x[tokens.clamp(min=0)] * kept.unsqueeze(-1)                      # (E, C, d)
    arrived = torch.empty_like(rows)
    dist.all_to_all_single(arrived, rows)
    arrived = arrived.view(n, local, cap, -1).transpose(0, 1)              # (E/N, N, C, d)
    done = torch.einsum("lncd,lde->lnce", arrived, experts).transpose(0, 1).contiguous()
    back = torch.empty_like(done)
    dist.all_to_all_single(back, done)
    back = back.view(e_count, cap, -1) * (weights * kept).unsqueeze(-1)
    return torch.zeros_like(x).index_add(0, tokens.clamp(min=0).flatten(), back.flatten(0, 1))


def moe_by_gathering_the_experts(dist, x, router, experts, k, capacity_factor):
    """Every rank gathers every expert and computes its own tokens: no expert parallelism."""
    everyone = [torch.empty_like(experts) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, experts)
    w = torch.cat(everyone)
    tokens, weights = top_k_route(x @ router, k, capacity_factor)
    kept = tokens >= 0
    e = torch.arange(w.shape[0]).unsqueeze(1).expand_as(tokens)[kept]
    out = torch.einsum("rd,rde->re", x[tokens[kept]], w[e]) * weights[kept].unsqueeze(-1)
    return torch.zeros_like(x).index_add(0, tokens[kept], out)


def _autograd_exchange(dist, swap=True, group=None):
    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx, rows, out_splits, in_splits):
            ctx.splits = out_splits, in_splits
            return _plain_exchange(dist, rows, out_splits, in_splits, group)

        @staticmethod
        def backward(ctx, grad):
            out_splits, in_splits = ctx.splits if swap else ctx.splits[::-1]
            return _plain_exchange(dist, grad, in_splits, out_splits, group), None, None
    return lambda _dist, rows, out_splits, in_splits: AllToAll.apply(rows, out_splits, in_splits)


def backward_with_a_detached_router(dist, x, router, experts, k, capacity_factor):
    """The combine weights from a detached router: y is right, the router gets no gradient."""
    return moe_layer(dist, x, router.detach(), experts, k, capacity_factor, exchange=_autograd_exchange(dist))


def _backward_by_assignment(dist, x, router, experts, k, capacity_factor, group=None):
    return _expert_parallel(dist, x, router, experts, k, capacity_factor, group=group, assign=True,
                            exchange=_autograd_exchange(dist, group=group))


def backward_combines_by_assignment(dist, x, router, experts, k, capacity_factor):
    """A token's rows written into y, not added: with k = 2 its first expert's output and gradient are lost."""
    return _backward_by_assignment(dist, x, router, experts, k, capacity_factor)


def backward_through_a_plain_all_to_all(dist, x, router, experts, k, capacity_factor):
    """dist.all_to_all_single is not differentiable: the gradients of the experts and the tokens stop there."""
    return moe_layer(dist, x, router, experts, k, capacity_factor)


def backward_with_the_splits_unswapped(dist, x, router, experts, k, capacity_factor):
    """The gradients sent back with the forward's split sizes: they go to the wrong ranks, or do not fit."""
    return moe_layer(dist, x, router, experts, k, capacity_factor, exchange=_autograd_exchange(dist, swap=False))


def _train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, experts_over="dp", divisor="world",
           router_reduced=True, layer=moe_layer_backward):
    """EP × DP SGD with one mistake chosen by the arguments."""
    rank, world = dist.get_rank(), dist.get_world_size()
    eps = [dist.new_group(list(range(i, i + ep_size))) for i in range(0, world, ep_size)]
    dps = [dist.new_group(list(range(j, world, ep_size))) for j in range(ep_size)]
    ep, dp = eps[rank // ep_size], dps[rank % ep_size]
    for x, target in batches:
        router, experts = router.detach().requires_grad_(), experts.detach().requires_grad_()
        y = layer(dist, x, router, experts, k, capacity_factor, group=ep)
        d_router, d_experts = torch.autograd.grad(((y - target) ** 2).mean(), [router, experts])
        if router_reduced:
            dist.all_reduce(d_router)
        dist.all_reduce(d_experts, group=None if experts_over == "world" else dp)
        by = world if divisor == "world" else dist.get_world_size(dp)
        router, experts = router - lr * d_router / world, experts - lr * d_experts / by
    return router.detach(), experts.detach()


def train_averaging_experts_over_the_world(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    """All-reduces the experts' gradients over every rank: rank 0's expert 0 gets rank 1's expert 1's gradient."""
    return _train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, experts_over="world")


def train_dividing_experts_by_the_dp_size(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    """Averages the experts' gradients over their DP group: each already sums the EP group's losses, so they come
    out ep_size times too large."""
    return _train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, divisor="dp")


def train_without_reducing_the_router(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    """Each rank steps its router with its own tokens' gradient only: the replicas drift apart."""
    return _train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, router_reduced=False)


def _capacity(logits, k, max_dropped, padding_of="kept", choices=None, inclusive=True):
    t_count, experts = logits.shape
    load = torch.bincount(logits.topk(choices or k, dim=-1).indices.flatten(), minlength=experts)
    allowed = max_dropped * t_count * k
    fits = (lambda drops: drops <= allowed) if inclusive else (lambda drops: drops < allowed or drops == 0)
    cap = next(c for c in range(1, int(load.max()) + 2) if fits((load - c).clamp(min=0).sum()))
    kept = int(load.clamp(max=cap).sum()) if padding_of == "kept" else t_count * k
    return cap, cap * experts - kept


def capacity_padding_as_if_nothing_dropped(logits, k, max_dropped):
    """Padding counted as C·E - T·k: the dropped choices fill no slot, so it is more than that."""
    return _capacity(logits, k, max_dropped, padding_of="all")


def capacity_from_first_choices(logits, k, max_dropped):
    """The load of first choices only: with k = 2 the second choices need slots too."""
    return _capacity(logits, k, max_dropped, choices=1)


def losses_counting_first_choices_only(logits, k, alpha, beta):
    """f from each token's first choice, over T: right for k = 1, but with k = 2 second choices load experts too."""
    return _losses(logits, k, alpha, beta, first_only=True)


def train_combining_by_assignment(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    """The EP × DP step around a layer that writes a token's rows instead of adding them (k = 2 loses one)."""
    return _train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, layer=_backward_by_assignment)


def capacity_with_the_budget_excluded(logits, k, max_dropped):
    """Drops < max_dropped·T·k: "at most" includes the budget itself, so this is one slot too many when a
    capacity drops exactly that many."""
    return _capacity(logits, k, max_dropped, inclusive=False)


def moe_on_the_whole_world(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    """The group accepted and ignored: every collective on the whole world, right only while the group is it."""
    return moe_layer(dist, x, router, experts, k, capacity_factor, exchange=exchange)


def backward_on_the_whole_world(dist, x, router, experts, k, capacity_factor, group=None):
    """The same for the differentiable layer."""
    return moe_layer_backward(dist, x, router, experts, k, capacity_factor)


def searching_capacity_factors(logits, k, max_dropped, parts: int):
    """The first capacity factor of 1/parts, 2/parts, ... whose C = ceil(k·T·factor / E) meets the budget: right while
    a step of factor moves C by at most one slot."""
    t_count, experts = logits.shape
    load = torch.bincount(logits.topk(k, dim=-1).indices.flatten(), minlength=experts)
    step = 1
    while True:
        cap = math.ceil(k * t_count * step / parts / experts)
        if int((load - cap).clamp(min=0).sum()) <= max_dropped * t_count * k:
            return cap, cap * experts - int(load.clamp(max=cap).sum())
        step += 1


def capacity_by_factor_steps(logits, k, max_dropped):
    """Capacity factors tried in steps of 0.05."""
    return searching_capacity_factors(logits, k, max_dropped, 20)


WRONG = [
    ("top_k_route", route_dropping_the_first_tokens, "rank 0", "keeping the last tokens"),
    ("top_k_route", route_token_by_token, "rank 0", "every first choice outranks"),
    ("top_k_route", route_capacity_without_k, "rank 0"),
    ("top_k_route", route_capacity_truncated, "rank 0"),
    ("top_k_route", route_capacity_rounded, "rank 0"),
    ("router_losses", losses_counting_first_choices_only, "rank 0"),
    ("moe_layer", moe_combines_by_assignment, "rank"),
    ("moe_layer_backward", backward_combines_by_assignment, "rank"),
    ("moe_train", train_combining_by_assignment, "rank"),
    ("smallest_capacity", capacity_with_the_budget_excluded, "rank 0"),
    ("top_k_route", route_renormalising_the_weights, "rank 0"),
    ("router_losses", losses_with_a_detached_router, "rank 0"),
    ("router_losses", losses_counting_probabilities_as_f, "rank 0"),
    ("router_losses", z_loss_through_plain_exponentials, "rank 0"),
    ("moe_layer", moe_guessing_the_split_sizes, ("expects", "rank")),
    ("moe_layer", moe_without_combine_weights, "rank", "forgetting the combine weights"),
    ("moe_layer", moe_with_capacity_per_rank, "rank", "sharing capacity between a rank's experts"),
    ("moe_layer", moe_with_padded_buffers, ("empty ones included", "over the budget")),
    ("moe_layer", moe_by_gathering_the_experts, "used all_gather"),
    ("moe_layer_backward", backward_with_a_detached_router, "rank"),
    ("moe_layer_backward", backward_through_a_plain_all_to_all, "rank"),
    ("moe_layer_backward", backward_with_the_splits_unswapped, ("rank", "expects")),
    ("moe_train", train_averaging_experts_over_the_world, "rank"),
    ("moe_train", train_dividing_experts_by_the_dp_size, "rank"),
    ("moe_train", train_without_reducing_the_router, "rank"),
    ("smallest_capacity", capacity_padding_as_if_nothing_dropped, "rank 0"),
    ("smallest_capacity", capacity_from_first_choices, "rank 0"),
    ("moe_layer", moe_on_the_whole_world, "group is not the whole world"),
    ("moe_layer_backward", backward_on_the_whole_world, "group is not the whole world"),
    ("smallest_capacity", capacity_by_factor_steps, "rank 0", "capacity factors"),
]
