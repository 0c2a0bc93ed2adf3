"""Cheats on notebook 07's puzzles, each with the words its rejection must contain."""

import inspect

import torch

import lib.analytic.formulas
import puzzles.moe as P
from solutions.moe import top_k_route
from tests.cheats.common import everywhere


def route_by_the_course_arithmetic(logits, k, capacity_factor):
    """The capacity looked up in lib.analytic.moe, which the figures use, instead of derived."""
    from lib.analytic.moe import capacity

    tokens, weights = top_k_route(logits, k, capacity_factor)
    capacity(logits.shape[0], logits.shape[1], k, capacity_factor)
    return tokens, weights


def _combine_with(x, tokens, weights, expert_of):
    """y[t] = Σ over t's kept slots of weight · x[t] @ W_e, with W_e = expert_of[e] at hand on this rank."""
    kept = tokens >= 0
    e = torch.arange(tokens.shape[0], device=x.device).unsqueeze(1).expand_as(tokens)[kept]
    weights_at_hand = torch.stack([expert_of[int(i)] for i in e]) if len(e) else x.new_empty(0, x.shape[1], x.shape[1])
    out = torch.einsum("rd,rde->re", x[tokens[kept]], weights_at_hand) * weights[kept].unsqueeze(-1)
    return torch.zeros_like(x).index_add(0, tokens[kept], out)


def moe_by_moving_the_experts(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    """All-to-all only, but of the experts' weights: every rank receives every expert and keeps its tokens home."""
    n = dist.get_world_size()
    rows = experts.repeat(n, 1, 1)                                          # (N·E/N, d, d): a copy for each rank
    everyone = torch.empty_like(rows)
    dist.all_to_all_single(everyone, rows)
    tokens, weights = top_k_route(x @ router, k, capacity_factor)
    return _combine_with(x, tokens, weights, everyone)


def moe_by_moving_the_experts_padded(dist, x, router, experts, k, capacity_factor, exchange=None, group=None):
    """The experts' weights moved instead of the tokens, in the tokens' exact bytes: the counts all-to-all as the
    lesson's, then to each rank the experts it uses (d rows of d each) padded with zeros to the rows the tokens'
    way would send it there and back (both sides know both numbers from the counts). It passed the byte floor and
    ceiling wherever the experts fit (2 seeds in 20) until d was sized so that no expert ever fits."""
    n, rank, local, d = dist.get_world_size(), dist.get_rank(), experts.shape[0], x.shape[1]
    tokens, weights = top_k_route(x @ router, k, capacity_factor)
    counts = (tokens >= 0).sum(1)
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts)
    mine_to, theirs_from = counts.view(n, local), got.view(n, local)       # (rank, its expert): rows each way
    rows = mine_to.sum(1) + theirs_from.sum(1)                              # what the tokens' way sends each rank

    def padded(used: torch.Tensor, s: int) -> int:
        return 0 if s == rank else max(d * int(used.sum()), int(rows[s]))

    send = [padded(theirs_from[s] > 0, s) for s in range(n)]
    recv = [padded(mine_to[s] > 0, s) for s in range(n)]
    wanted = [experts[theirs_from[s] > 0].reshape(-1, d) for s in range(n)]  # the experts rank s uses, d rows each
    blocks = [torch.cat([wanted[s], x.new_zeros(send[s] - len(wanted[s]), d)]) for s in range(n) if s != rank]
    out = x.new_empty(sum(recv), d)
    dist.all_to_all_single(out, torch.cat(blocks) if blocks else x.new_empty(0, d), recv, send)
    expert_of, parts = {}, out.split(recv)
    for s in range(n):
        arrived = experts if s == rank else parts[s][:d * int((mine_to[s] > 0).sum())].view(-1, d, d)
        used = range(local) if s == rank else (mine_to[s] > 0).nonzero().flatten().tolist()
        expert_of.update({s * local + i: w for i, w in zip(used, arrived)})
    return _combine_with(x, tokens, weights, expert_of)


def moe_backward_by_moving_the_experts(dist, x, router, experts, k, capacity_factor, group=None):
    """The experts' weights to every rank through a differentiable all-to-all, their gradients back through the
    same: the tokens and their gradients stay home."""
    n = dist.get_world_size()

    class Exchange(torch.autograd.Function):
        """Block i to rank i, both ways: the experts out forward, the gradients of their copies back backward."""

        @staticmethod
        def forward(ctx, rows):
            out = torch.empty_like(rows)
            dist.all_to_all_single(out, rows.contiguous())
            return out

        @staticmethod
        def backward(ctx, grad):
            out = torch.empty_like(grad)
            dist.all_to_all_single(out, grad.contiguous())
            return out

    everyone = Exchange.apply(experts.repeat(n, 1, 1))
    tokens, weights = top_k_route(x @ router, k, capacity_factor)
    return _combine_with(x, tokens, weights, everyone)


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
    router, experts = router.clone(), shards.flatten(0, 1)
    for step in range(mine.shape[0]):                                       # single-device SGD, the whole layer
        router, experts = router.detach().requires_grad_(), experts.detach().requires_grad_()
        losses = [((_layer(x, router, experts, k, capacity_factor) - target) ** 2).mean()
                  for x, target in everyone[:, step]]
        d_router, d_experts = torch.autograd.grad(torch.stack(losses).mean(), [router, experts])
        router, experts = router - lr * d_router, experts - lr * d_experts
    return router.detach(), experts.detach().chunk(ep_size)[rank % ep_size].clone()


def _layer(x, router, experts, k, capacity_factor):
    """The whole MoE layer on one device, written by the learner (the puzzle's is an answer key)."""
    tokens, weights = top_k_route(x @ router, k, capacity_factor)
    return _combine_with(x, tokens, weights, experts)


def route_by_the_reference(logits, k, capacity_factor):
    """The notebook's own P module holds the check's reference."""
    return P.route_reference(logits, k, capacity_factor)


def losses_by_the_reference(logits, k, alpha, beta):
    return P.losses_reference(logits, k, alpha, beta)


def capacity_by_the_reference(logits, k, max_dropped):
    return P.capacity_reference(logits, k, max_dropped)


def route_with_the_formula_librarys_capacity(logits, k, capacity_factor):
    """The capacity from lib.analytic.formulas.expert_capacity, the routing done by hand."""
    lib.analytic.formulas.expert_capacity(logits.shape[0] * k, logits.shape[1], capacity_factor)
    return top_k_route(logits, k, capacity_factor)


_ROUTE_SOURCE = inspect.getsource(P.route_reference).replace("def route_reference(", "def my_route(")
_MOE = dict(vars(P))


def route_by_a_copy_of_the_reference(logits, k, capacity_factor):
    """The reference's source (inspect.getsource) exec'd under another name: no call of the reference itself."""
    namespace = dict(_MOE)
    exec(_ROUTE_SOURCE, namespace)
    return namespace["my_route"](logits, k, capacity_factor)


ANSWER_KEY = "computes the expected answer of a puzzle's check"

CHEATS = everywhere(P) + [
    ("top_k_route", route_by_the_course_arithmetic, "lib.analytic.moe"),
    ("moe_layer", moe_by_moving_the_experts, "moved the experts' weights instead of the tokens"),
    ("moe_layer", moe_by_moving_the_experts_padded, "moved the experts' weights instead of the tokens"),
    ("moe_layer_backward", moe_backward_by_moving_the_experts, "moved the experts' weights instead of the tokens"),
    ("moe_train", moe_train_without_expert_parallelism, "over the budget"),
    ("top_k_route", route_by_the_reference, "called puzzles.moe.route_reference"),
    ("router_losses", losses_by_the_reference, "called puzzles.moe.losses_reference"),
    ("smallest_capacity", capacity_by_the_reference, "called puzzles.moe.capacity_reference"),
    ("top_k_route", route_with_the_formula_librarys_capacity, "called lib.analytic.formulas.expert_capacity"),
    ("top_k_route", route_by_a_copy_of_the_reference, "ran a copy of puzzles.moe.route_reference"),
]

