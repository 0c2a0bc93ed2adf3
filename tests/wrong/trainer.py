"""Wrong answers to notebook 10's seam puzzles, each with the words its failure message must contain."""

import torch

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


WRONG = [
    ("clip_grad_norm", _clip_counting_every_copy, "expected", "TP-replicated"),
    ("clip_grad_norm", clip_without_all_reduce, "expected"),
    ("clip_grad_norm", clip_always_scales, "expected"),
    ("mean_loss", _mean_of_means, "expected", "micro-batches' means"),
    ("mean_loss", mean_loss_one_all_reduce_per_micro_batch, "sent"),
    ("mean_loss", mean_loss_never_divides_by_the_ranks, "expected"),
]
