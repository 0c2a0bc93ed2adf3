"""Notebook 10, your own trainer: the reference solutions of its seams."""

import torch


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
