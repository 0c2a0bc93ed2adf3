"""Realistic first attempts at notebook 07's puzzles (mixture of experts), none of them in tests/wrong."""

import math

import torch

import solutions.moe as S
from tests.mistakes import Attempt
from tests.wrong.moe import searching_capacity_factors


# ---- top_k_route ----------------------------------------------------------------------------------------------
def _claims(logits, k, capacity_factor, *, probs_dim=-1, weights_from="probs", empty=-1, first_slot=0,
            slots_per_choice=False, whole=math.ceil, other_choice=False):
    """Top-k routing as a learner vectorises it, with the knob of one mistake turned."""
    t_count, experts = logits.shape
    probs = torch.softmax(logits, dim=probs_dim)                            # (T, E)
    choices = logits.topk(k, dim=-1).indices                                # (T, k)
    cap = whole(k * t_count * capacity_factor / experts)
    hot = torch.nn.functional.one_hot(choices, experts)                     # (T, k, E)
    if slots_per_choice:                  # each column of choices counted on its own: every choice starts at slot 0
        slots = hot.cumsum(0) - 1 + first_slot                              # (T, k, E)
    else:                                 # first choices of every token, then second choices
        slots = (hot.transpose(0, 1).flatten(0, 1).cumsum(0) - 1 + first_slot).view(k, t_count, experts) \
            .transpose(0, 1)
    slot = (slots * hot).sum(-1)                                            # (T, k): each claim's slot
    tokens = torch.full((experts, cap), empty, dtype=torch.long)
    weights = torch.zeros(experts, cap, dtype=logits.dtype)
    source = {"probs": probs, "logits": logits}[weights_from]
    for j in range(k):
        for t in range(t_count):
            e, s = int(choices[t, j]), int(slot[t, j])
            if s < cap:
                paired = int(choices[t, k - 1 - j]) if other_choice else e      # whose probability weights it
                tokens[e, s], weights[e, s] = t, source[t, paired]
    return tokens, weights


def route_softmax_over_the_batch(logits, k, capacity_factor):
    """torch.softmax(logits, dim=0): each expert's probabilities normalised over the tokens, not each token's over
    the experts."""
    return _claims(logits, k, capacity_factor, probs_dim=0)


def route_weighting_by_the_raw_logits(logits, k, capacity_factor):
    """The kept slots weighted by the router's logits, the softmax left for later."""
    return _claims(logits, k, capacity_factor, weights_from="logits")


def route_filling_empty_slots_with_zeros(logits, k, capacity_factor):
    """tokens = torch.zeros(E, C, dtype=torch.long): an empty slot reads as token 0, where the statement asks -1."""
    return _claims(logits, k, capacity_factor, empty=0)


def route_slots_counted_from_one(logits, k, capacity_factor):
    """The cumulative sum taken as the slot, without the - 1: slots count from 1, and an expert keeps C - 1 tokens."""
    return _claims(logits, k, capacity_factor, first_slot=1)


def route_second_choices_restart_at_slot_zero(logits, k, capacity_factor):
    """The cumulative sum down each column of the (T, k) choices separately: second choices start again at slot 0
    and overwrite the first choices' slots."""
    return _claims(logits, k, capacity_factor, slots_per_choice=True)


def route_capacity_rounded_to_the_nearest(logits, k, capacity_factor):
    """C = round(k·T·factor / E): a fraction of a slot below one half rounds away, where a capacity rounds up."""
    return _claims(logits, k, capacity_factor, whole=round)


# ---- router_losses -------------------------------------------------------------------------------------------
def _losses(logits, k, alpha, beta, *, e_factor=True, f_over="T·k", p_reduce="mean", z="mean of squares",
            z_dim=-1, f_from="counts"):
    """The load-balancing loss and the z-loss as a learner writes them, with the knob of one mistake turned."""
    t_count, experts = logits.shape
    probs = torch.softmax(logits, dim=-1)
    counts = torch.bincount(logits.topk(k, dim=-1).indices.flatten(), minlength=experts).to(logits.dtype)
    f = counts / (t_count * k if f_over == "T·k" else t_count)
    if f_from == "probs":
        f = probs.mean(0).detach()
    p = probs.mean(0) if p_reduce == "mean" else probs.sum(0)
    balance = alpha * (experts if e_factor else 1) * (f * p).sum()
    lse = torch.logsumexp(logits, dim=z_dim)
    zs = {"mean of squares": (lse ** 2).mean(), "square of the mean": lse.mean() ** 2, "sum": (lse ** 2).sum()}
    return balance, beta * zs[z]


def losses_z_as_square_of_the_mean(logits, k, alpha, beta):
    """z = β · logsumexp(logits).mean() ** 2: the hint's "mean of logsumexp(logits)²" read as (mean of lse)²."""
    return _losses(logits, k, alpha, beta, z="square of the mean")


def losses_balance_without_e(logits, k, alpha, beta):
    """balance = α · Σ f_i · P_i, without the E that makes a uniform router's loss α whatever the number of experts."""
    return _losses(logits, k, alpha, beta, e_factor=False)


def losses_f_over_tokens(logits, k, alpha, beta):
    """f_i = (choices of expert i) / T: a share of the tokens, where it is a share of the T·k choices."""
    return _losses(logits, k, alpha, beta, f_over="T")


def losses_p_summed(logits, k, alpha, beta):
    """P = probs.sum(0): each expert's total probability, where the loss takes its mean over the tokens."""
    return _losses(logits, k, alpha, beta, p_reduce="sum")


def losses_z_over_the_tokens(logits, k, alpha, beta):
    """torch.logsumexp(logits, dim=0): the log-sum-exp down each expert's column, where each token's row belongs."""
    return _losses(logits, k, alpha, beta, z_dim=0)


def losses_f_from_detached_probabilities(logits, k, alpha, beta):
    """f = probs.mean(0).detach(): the hint's "never from detached probabilities" read as "detach them", so f is the
    mean probability without a gradient, never the count of top-k choices."""
    return _losses(logits, k, alpha, beta, f_from="probs")


def losses_z_summed(logits, k, alpha, beta):
    """z = β · Σ_t logsumexp(logits[t])²: summed over the tokens, where ST-MoE averages."""
    return _losses(logits, k, alpha, beta, z="sum")


# ---- moe_layer -----------------------------------------------------------------------------------------------
def _exchange(dist, rows, output_split_sizes, input_split_sizes, group=None):
    out = rows.new_empty(sum(output_split_sizes), *rows.shape[1:])
    dist.all_to_all_single(out, rows, output_split_sizes, input_split_sizes, group=group)
    return out


def _by_hand(dist, x, router, experts, k, capacity_factor, *, expert_of_block, back_splits_swapped=False,
             apply=lambda rows, w: rows @ w, route=S.top_k_route, group=None, counts_exchanged=True,
             there_splits_swapped=False):
    """Dispatch, compute and combine written out: rows sorted by expert, counts exchanged first, each arriving block
    run through `expert_of_block(i, n, local)`, and the results sent back."""
    n, local = dist.get_world_size(group), experts.shape[0]
    tokens, weights = route(x @ router, k, capacity_factor)                  # (E, C)
    kept = tokens >= 0
    mine = kept.sum(1)                                                       # rows I send to each expert
    theirs = torch.empty_like(mine)
    if counts_exchanged:
        dist.all_to_all_single(theirs, mine, group=group)                    # rows each rank sends my experts
    else:
        theirs = mine.clone()
    out_rows, in_rows = mine.view(n, local).sum(1).tolist(), theirs.view(n, local).sum(1).tolist()
    ids = tokens[kept]
    arrived = _exchange(dist, x[ids], *((out_rows, in_rows) if there_splits_swapped else (in_rows, out_rows)), group)
    blocks = arrived.split(theirs.tolist())
    done = torch.cat([apply(b, experts[expert_of_block(i, n, local)]) for i, b in enumerate(blocks)])
    back = _exchange(dist, done, *((in_rows, out_rows) if back_splits_swapped else (out_rows, in_rows)), group)
    return torch.zeros_like(x).index_add(0, ids, back * weights[kept].unsqueeze(-1))


def moe_experts_placed_round_robin(dist, x, router, experts, k, capacity_factor):
    """Expert e sent to rank e % N and run there as its local expert e // N (round-robin), where rank r holds the
    contiguous experts r·E/N ... (r+1)·E/N - 1."""
    e_count = router.shape[1]
    n = dist.get_world_size()
    local = e_count // n
    at = [(e % n) * local + e // n for e in range(e_count)]     # where the learner's expert e really lives
    placed = torch.empty_like(router)
    placed[:, at] = router                                       # the routing of expert e lands on that expert
    return S.moe_layer(dist, x, placed, experts, k, capacity_factor)


def moe_receiving_what_it_sends(dist, x, router, experts, k, capacity_factor):
    """No count exchange: each rank sizes what it receives from each rank by what it sends that rank."""
    return _by_hand(dist, x, router, experts, k, capacity_factor, expert_of_block=lambda i, n, local: i % local,
                    counts_exchanged=False)


def moe_dispatch_with_the_splits_in_the_wrong_slots(dist, x, router, experts, k, capacity_factor):
    """all_to_all_single(out, rows, send_counts, recv_counts): the splits passed in the order the learner thinks of
    them, where torch takes output_split_sizes first."""
    return _by_hand(dist, x, router, experts, k, capacity_factor, expert_of_block=lambda i, n, local: i % local,
                    there_splits_swapped=True)


def moe_blocks_read_expert_major(dist, x, router, experts, k, capacity_factor):
    """Arriving blocks taken as [my expert][source], so block i runs through expert i // N: they come as
    [source][my expert]."""
    return _by_hand(dist, x, router, experts, k, capacity_factor, expert_of_block=lambda i, n, local: i // n)


def moe_blocks_by_global_expert_index(dist, x, router, experts, k, capacity_factor):
    """Block i run through experts[i], as if each rank held every expert: only E/N are here."""
    return _by_hand(dist, x, router, experts, k, capacity_factor, expert_of_block=lambda i, n, local: i)


def moe_same_splits_both_ways(dist, x, router, experts, k, capacity_factor):
    """The results sent back with the dispatch's split sizes as they were: the way back is the way there reversed."""
    return _by_hand(dist, x, router, experts, k, capacity_factor, expert_of_block=lambda i, n, local: i % local,
                    back_splits_swapped=True)


def moe_rows_as_column_vectors(dist, x, router, experts, k, capacity_factor):
    """Each block run as column vectors, (W_e @ rowsᵀ)ᵀ, the way a linear layer's W x reads: rows @ W_eᵀ, the
    expert transposed."""
    return _by_hand(dist, x, router, experts, k, capacity_factor, expert_of_block=lambda i, n, local: i % local,
                    apply=lambda rows, w: (w @ rows.T).T)


def moe_rows_exchanged_on_the_world(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    """The counts exchanged within the group, but the rows' all-to-all written without group=: it runs on every rank
    of the world, with the group's splits."""
    def rows_everywhere(dist, rows, output_split_sizes, input_split_sizes):
        out = rows.new_empty(sum(output_split_sizes), *rows.shape[1:])
        dist.all_to_all_single(out, rows, output_split_sizes, input_split_sizes)
        return out
    return S.moe_layer(dist, x, router, experts, k, capacity_factor, exchange=rows_everywhere, group=group)


def moe_weights_of_the_other_choice(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    """Each kept expert weighted by the probability of the token's other choice: the weights taken in ascending order
    (probs.sort().values[:, -k:]) against topk's descending indices. Identity experts add the two weights up, so only
    a dropped choice or a learned layer with k = 2 shows it."""
    def route(logits, k, capacity_factor):
        return _claims(logits, k, capacity_factor, other_choice=True)
    return _by_hand(dist, x, router, experts, k, capacity_factor, expert_of_block=lambda i, n, local: i % local,
                    route=route, group=group)


def moe_local_experts_only(dist, x, router, experts, k, capacity_factor):
    """Each rank runs its own tokens through the experts it holds and skips the others ("the all-to-all later")."""
    local, first = experts.shape[0], dist.get_rank() * experts.shape[0]
    tokens, weights = S.top_k_route(x @ router, k, capacity_factor)
    y = torch.zeros_like(x)
    for j in range(local):
        kept = tokens[first + j] >= 0
        ids = tokens[first + j][kept]
        y.index_add_(0, ids, (x[ids] @ experts[j]) * weights[first + j][kept].unsqueeze(-1))
    return y


def moe_capacity_buffers_sent_whole(dist, x, router, experts, k, capacity_factor):
    """The (E, C) capacity buffer sent as it is, with even splits: every slot travels, zeros in the empty ones, so
    no counts need exchanging."""
    n, local = dist.get_world_size(), experts.shape[0]
    tokens, weights = S.top_k_route(x @ router, k, capacity_factor)          # (E, C)
    kept = tokens >= 0
    slots = x[tokens.clamp(min=0)] * kept.unsqueeze(-1)                      # (E, C, d), empty slots zero
    arrived = torch.empty_like(slots.flatten(0, 1))
    dist.all_to_all_single(arrived, slots.flatten(0, 1).contiguous())       # [source][my expert][slot]
    done = torch.einsum("sjcd,jdo->sjco", arrived.view(n, local, -1, x.shape[1]), experts)
    back = torch.empty_like(done.flatten(0, 2))
    dist.all_to_all_single(back, done.flatten(0, 2).contiguous())
    back = back.view(*tokens.shape, -1)
    return torch.zeros_like(x).index_add(0, tokens[kept], back[kept] * weights[kept].unsqueeze(-1))


# ---- moe_layer_backward -------------------------------------------------------------------------------------
def _differentiable(dist, backward, detach_rows=False):
    """An exchange for moe_layer: the all-to-all forward, `backward(dist, ctx, grad)` back."""
    class Exchange(torch.autograd.Function):
        @staticmethod
        def forward(ctx, rows, output_split_sizes, input_split_sizes):
            ctx.splits = output_split_sizes, input_split_sizes
            return _exchange(dist, rows.contiguous(), output_split_sizes, input_split_sizes)

        @staticmethod
        def backward(ctx, grad):
            return backward(dist, ctx, grad.contiguous())

    def exchange(_dist, rows, output_split_sizes, input_split_sizes):
        return Exchange.apply(rows.detach() if detach_rows else rows, output_split_sizes, input_split_sizes)
    return exchange


def _reverse(dist, ctx, grad):
    out_splits, in_splits = ctx.splits
    return _exchange(dist, grad, in_splits, out_splits), None, None


def backward_returning_the_gradient_unexchanged(dist, x, router, experts, k, capacity_factor):
    """backward returns (grad, None, None): the gradient stays on the rank that computed it, never sent back."""
    return S.moe_layer(dist, x, router, experts, k, capacity_factor,
                       exchange=_differentiable(dist, lambda d, ctx, grad: (grad, None, None)))


def backward_averaging_over_ranks(dist, x, router, experts, k, capacity_factor):
    """The reverse all-to-all divided by N, "as DDP averages gradients": an all-to-all moves rows, it sums nothing."""
    def averaged(d, ctx, grad):
        sent, *_ = _reverse(d, ctx, grad)
        return sent / d.get_world_size(), None, None
    return S.moe_layer(dist, x, router, experts, k, capacity_factor, exchange=_differentiable(dist, averaged))


def backward_through_detached_rows(dist, x, router, experts, k, capacity_factor):
    """What goes into each exchange detached first ("dist cannot carry gradients"): the Function would carry them,
    and now the experts and the tokens' path through them get none."""
    return S.moe_layer(dist, x, router, experts, k, capacity_factor,
                       exchange=_differentiable(dist, _reverse, detach_rows=True))


def backward_receiving_into_a_forward_sized_tensor(dist, x, router, experts, k, capacity_factor):
    """The splits swapped in backward, but the receive buffer sized by sum(output_split_sizes), the forward's."""
    def sized_wrong(d, ctx, grad):
        out_splits, in_splits = ctx.splits
        out = grad.new_empty(sum(out_splits), *grad.shape[1:])
        d.all_to_all_single(out, grad, in_splits, out_splits)
        return out, None, None
    return S.moe_layer(dist, x, router, experts, k, capacity_factor, exchange=_differentiable(dist, sized_wrong))


def backward_returning_one_gradient(dist, x, router, experts, k, capacity_factor):
    """backward returns the reverse all-to-all alone, no None for the two split-size arguments."""
    return S.moe_layer(dist, x, router, experts, k, capacity_factor,
                       exchange=_differentiable(dist, lambda d, ctx, grad: _reverse(d, ctx, grad)[0]))


# ---- moe_train -----------------------------------------------------------------------------------------------
def _train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, *, divide=True, experts_by="world",
           same_batch=False, in_place=False, router_over="world", experts_over="dp"):
    """EP × DP SGD as a learner writes it, with the knob of one mistake turned."""
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"ep": [dist.new_group(list(range(s, s + ep_size))) for s in range(0, world, ep_size)],
              "dp": [dist.new_group(list(range(j, world, ep_size))) for j in range(ep_size)]}
    ep, dp = groups["ep"][rank // ep_size], groups["dp"][rank % ep_size]
    for x, target in batches:
        x, target = batches[0] if same_batch else (x, target)
        router.requires_grad_()
        experts.requires_grad_()
        y = S.moe_layer_backward(dist, x, router, experts, k, capacity_factor, group=ep)
        d_router, d_experts = torch.autograd.grad(((y - target) ** 2).mean(), [router, experts])
        dist.all_reduce(d_router, group=ep if router_over == "ep" else None)
        dist.all_reduce(d_experts, group={"dp": dp, "ep": ep}[experts_over])
        scale = {"world": world, "ep": ep_size}[experts_by] if divide else 1
        if in_place:
            router -= lr * d_router / (world if divide else 1)
            experts -= lr * d_experts / scale
        else:
            router = (router - lr * d_router / (world if divide else 1)).detach()
            experts = (experts - lr * d_experts / scale).detach()
    return router.detach(), experts.detach()


def train_summing_without_dividing(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    """The gradients all-reduced (summed) and stepped as they are: the objective is the mean over the N ranks."""
    return _train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, divide=False)


def train_experts_divided_by_the_ep_size(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    """The experts' gradient divided by ep_size ("the EP group shares an expert's tokens"), the router's by N."""
    return _train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, experts_by="ep")


def train_experts_reduced_within_their_ep_group(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    """The experts' gradient all-reduced over the EP group (the group the experts were "shared" in), where the ranks
    holding the same experts are the DP group."""
    return _train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, experts_over="ep")


def train_on_the_first_batch_every_step(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    """x, target = batches[0] inside the loop: every step trains on the first batch."""
    return _train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, same_batch=True)


def train_stepping_leaves_in_place(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    """router -= lr * grad on the tensors that require a gradient, outside torch.no_grad()."""
    return _train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, in_place=True)


def train_router_reduced_within_its_ep_group(dist, batches, router, experts, k, capacity_factor, lr, ep_size):
    """The router's gradient all-reduced over the EP group only ("the group the all-to-all ran in"): DP replicas'
    tokens never reach it, and their routers drift apart."""
    return _train(dist, batches, router, experts, k, capacity_factor, lr, ep_size, router_over="ep")


# ---- smallest_capacity --------------------------------------------------------------------------------------
def _capacity(logits, k, max_dropped, *, clamp=True, allowed_of="T·k", ignore_budget=False, second="padded",
              search_to="max + 1", strictly=False, past=0):
    """The capacity search as a learner writes it, with the knob of one mistake turned."""
    t_count, experts = logits.shape
    load = torch.bincount(logits.topk(k, dim=-1).indices.flatten(), minlength=experts)
    allowed = max_dropped * {"T·k": t_count * k, "T": t_count, "T·E": logits.numel(), "a count": 1}[allowed_of]
    most = int(load.max())

    def drops(c):
        over = load - c
        return int((over.clamp(min=0) if clamp else over).sum())
    ends = {"max + 1": most + 1, "max": most}
    fits = (lambda c: drops(c) < allowed) if strictly else (lambda c: drops(c) <= allowed)
    cap = most if ignore_budget else next(c for c in range(1, ends[search_to] + strictly) if fits(c)) + past
    kept = int(load.clamp(max=cap).sum())
    return cap, cap * experts - kept if second == "padded" else drops(cap)


def capacity_drops_summed_with_negatives(logits, k, max_dropped):
    """Drops as (load - C).sum(): experts under capacity count negative and cancel the overflow of the others."""
    return _capacity(logits, k, max_dropped, clamp=False)


def capacity_budget_of_tokens(logits, k, max_dropped):
    """The drop budget as max_dropped · T: a share of the tokens, where the choices number T·k."""
    return _capacity(logits, k, max_dropped, allowed_of="T")


def capacity_budget_of_every_logit(logits, k, max_dropped):
    """The drop budget as max_dropped · logits.numel(): T·E, where only the T·k top-k choices claim slots."""
    return _capacity(logits, k, max_dropped, allowed_of="T·E")


def capacity_budget_as_a_number_of_choices(logits, k, max_dropped):
    """drops(c) <= max_dropped: the share taken for a number of choices, so 0.05 lets none drop."""
    return _capacity(logits, k, max_dropped, allowed_of="a count")


def capacity_one_past_the_last_slot_index(logits, k, max_dropped):
    """The first fitting capacity taken for the last slot's index (slots 0 .. C), and one added to count the slots."""
    return _capacity(logits, k, max_dropped, past=1)


def capacity_strictly_under_the_budget(logits, k, max_dropped):
    """drops(c) < max_dropped · T·k: "at most" read as "less than", a capacity that drops the budget exactly refused."""
    return _capacity(logits, k, max_dropped, strictly=True)


def capacity_as_the_largest_load(logits, k, max_dropped):
    """C = the busiest expert's load ("no token dropped"), the drop budget never used."""
    return _capacity(logits, k, max_dropped, ignore_budget=True)


def capacity_second_number_of_lost_choices(logits, k, max_dropped):
    """Returns (C, the choices C drops): "padding" taken for the slots a capacity lacks, not the slots it leaves
    empty."""
    return _capacity(logits, k, max_dropped, second="drops")


def capacity_search_stopping_before_the_largest_load(logits, k, max_dropped):
    """for c in range(1, load.max()): the end excluded, so a budget only the largest load meets finds nothing."""
    return _capacity(logits, k, max_dropped, search_to="max")


def capacity_by_factors_of_a_tenth(logits, k, max_dropped):
    """Tries capacity factors 0.1, 0.2, ... through C = ceil(k·T·factor / E), as the notebook's capacity formula
    suggests, and keeps the first that meets the budget: on a large batch a tenth of factor is several slots."""
    return searching_capacity_factors(logits, k, max_dropped, 10)


def capacity_loads_by_argmax(logits, k, max_dropped):
    """Each expert's load as bincount(logits.argmax(-1)): the tokens whose favourite it is, one choice a token, where
    all k choices of every token claim a slot."""
    t_count, experts = logits.shape
    load = torch.bincount(logits.argmax(-1), minlength=experts)
    allowed = max_dropped * t_count * k
    cap = next(c for c in range(1, int(load.max()) + 2) if int((load - c).clamp(min=0).sum()) <= allowed)
    return cap, cap * experts - int(load.clamp(max=cap).sum())


# The words of each message that would name the mistake; named_yet=False where today's message does not.
MISTAKES = [
    Attempt("top_k_route", route_capacity_rounded_to_the_nearest, ("round for ceil", "round() all give")),
    Attempt("top_k_route", route_softmax_over_the_batch, ("over the tokens", "dim=0")),
    Attempt("top_k_route", route_weighting_by_the_raw_logits, ("logits where", "before the softmax")),
    Attempt("top_k_route", route_filling_empty_slots_with_zeros, ("where -1 belongs", "empty slot")),
    Attempt("top_k_route", route_slots_counted_from_one, ("off by one", "rotated by 1")),
    Attempt("top_k_route", route_second_choices_restart_at_slot_zero, ("restart at slot 0", "overwrite")),
    Attempt("router_losses", losses_z_as_square_of_the_mean, ("square of the mean", "mean of the squares")),
    Attempt("router_losses", losses_balance_without_e, "E, the number of experts"),
    Attempt("router_losses", losses_f_over_tokens, "k, the experts each token chooses"),
    Attempt("router_losses", losses_p_summed, "T, the tokens"),
    Attempt("router_losses", losses_z_over_the_tokens, ("over the tokens (dim 0)", "dim=0")),
    Attempt("router_losses", losses_z_summed, "T, the tokens"),
    Attempt("router_losses", losses_f_from_detached_probabilities, "(f = P)"),
    Attempt("moe_layer", moe_experts_placed_round_robin, ("e % N", "round-robin (e")),
    Attempt("moe_layer", moe_blocks_read_expert_major, ("[source][", "source-major")),
    Attempt("moe_layer", moe_blocks_by_global_expert_index, ("local index", "E/N experts",
                                                             "must be shifted by the shard's offset")),
    Attempt("moe_layer", moe_same_splits_both_ways, ("splits swapped", "swap")),
    Attempt("moe_layer", moe_receiving_what_it_sends, "exchange the split sizes first"),
    Attempt("moe_layer", moe_capacity_buffers_sent_whole, "empty ones included"),
    Attempt("moe_layer", moe_dispatch_with_the_splits_in_the_wrong_slots, "the two are swapped"),
    Attempt("moe_layer", moe_rows_as_column_vectors, "each expert transposed"),
    Attempt("moe_layer", moe_rows_exchanged_on_the_world, "group=group"),
    Attempt("moe_layer", moe_weights_of_the_other_choice, ("paired with the wrong experts", "probs[t, e]")),
    Attempt("moe_layer", moe_local_experts_only, ("never received", "other ranks' experts")),
    Attempt("moe_layer_backward", backward_returning_the_gradient_unexchanged,
            ("reverse all-to-all", "never sent back")),
    Attempt("moe_layer_backward", backward_averaging_over_ranks, "N, the world size"),
    Attempt("moe_layer_backward", backward_through_detached_rows, ("a .detach()", "cut off from the loss")),
    Attempt("moe_layer_backward", backward_receiving_into_a_forward_sized_tensor,
            ("sized by the forward", "the backward's", "a buffer sized for the other direction's")),
    Attempt("moe_layer_backward", backward_returning_one_gradient, ("one gradient per input", "None for")),
    Attempt("moe_train", train_summing_without_dividing, "N, the world size"),
    Attempt("moe_train", train_experts_divided_by_the_ep_size, "dp, the data-parallel replicas"),
    Attempt("moe_train", train_experts_reduced_within_their_ep_group, "hold different experts"),
    Attempt("moe_train", train_on_the_first_batch_every_step, "at step 2"),
    Attempt("moe_train", train_stepping_leaves_in_place, "in-place operation"),
    Attempt("moe_train", train_router_reduced_within_its_ep_group, ("EP group only", "DP replicas")),
    Attempt("smallest_capacity", capacity_drops_summed_with_negatives, ("count negative", "below capacity")),
    Attempt("smallest_capacity", capacity_budget_of_tokens, "k left out"),
    Attempt("smallest_capacity", capacity_budget_of_every_logit, ("E where k", "T·E")),
    Attempt("smallest_capacity", capacity_as_the_largest_load, ("budget", "a smaller capacity")),
    Attempt("smallest_capacity", capacity_budget_as_a_number_of_choices, "is a share of the T·k"),
    Attempt("smallest_capacity", capacity_strictly_under_the_budget, "dropped <= budget, not <"),
    Attempt("smallest_capacity", capacity_one_past_the_last_slot_index, "one slot too many"),
    Attempt("smallest_capacity", capacity_second_number_of_lost_choices, ("the choices it drops", "not the padding")),
    Attempt("smallest_capacity", capacity_by_factors_of_a_tenth, "search over capacity factors"),
    Attempt("smallest_capacity", capacity_loads_by_argmax, "first choices alone"),
    Attempt("smallest_capacity", capacity_search_stopping_before_the_largest_load, ("range's end", "excluded")),
]
