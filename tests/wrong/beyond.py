"""Wrong answers to notebook 09's puzzles, each with the words its failure message must contain."""

import torch
import torch.nn.functional as F


def _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, *, sign=1.0, outer_steps=1,
            every_step=False, flat=True):
    """DiLoCo with one mistake switched on: the pseudo-gradient's sign, the outer steps per round, all-reducing
    after every inner step, or one all-reduce per parameter tensor."""
    world = dist.get_world_size()
    params = list(model.parameters())
    inner = torch.optim.AdamW(params, lr=inner_lr)
    outer = torch.optim.SGD(params, lr=outer_lr, momentum=momentum, nesterov=True)
    h = 1 if every_step else inner_steps
    for first in range(0, len(batches), h):
        start = [p.detach().clone() for p in params]
        for x, y in batches[first:first + h]:
            inner.zero_grad()
            F.mse_loss(model(x), y).backward()
            inner.step()
        deltas = [sign * (s - p.detach()) for s, p in zip(start, params)]
        if flat:
            delta = torch.cat([d.reshape(-1) for d in deltas])
            dist.all_reduce(delta)
            deltas = [d.view_as(p) for d, p in zip(delta.split([p.numel() for p in params]), params)]
        else:
            for d in deltas:
                dist.all_reduce(d)
        with torch.no_grad():
            for p, s, d in zip(params, start, deltas):
                p.copy_(s)
                p.grad = d / world
        for _ in range(outer_steps if outer_steps else inner_steps):
            outer.step()
    return model


def diloco_wrong_sign(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, sign=-1.0)


def diloco_outer_momentum_per_inner_step(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """The outer step (and its momentum) taken H times a round, once per inner step."""
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, outer_steps=0)


def diloco_every_inner_step(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """Communicates after every inner step: data parallelism's traffic, and not DiLoCo's result."""
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, every_step=True)


def diloco_per_tensor_all_reduce(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """Right result and bytes; one all-reduce per parameter tensor, each paying the wide-area link's latency."""
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, flat=False)


WRONG = [
    ("diloco_train", diloco_wrong_sign, "rank 0: the result", "wrong sign"),
    ("diloco_train", diloco_outer_momentum_per_inner_step, "rank 0: the result", "once per round"),
    ("diloco_train", diloco_every_inner_step, ("rank 0: the result", "over the budget")),
    ("diloco_train", diloco_per_tensor_all_reduce, "simulated time"),
]
