"""Notebook 09, beyond one cluster: the reference solutions."""

import torch
import torch.nn.functional as F


def diloco_train(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    world = dist.get_world_size()
    params = list(model.parameters())
    inner = torch.optim.AdamW(params, lr=inner_lr)
    outer = torch.optim.SGD(params, lr=outer_lr, momentum=momentum, nesterov=True)
    for start_step in range(0, len(batches), inner_steps):
        start = [p.detach().clone() for p in params]
        for x, y in batches[start_step:start_step + inner_steps]:
            inner.zero_grad()
            F.mse_loss(model(x), y).backward()
            inner.step()
        # The pseudo-gradient, start - local, averaged over the workers in one all-reduce.
        delta = torch.cat([(s - p.detach()).reshape(-1) for s, p in zip(start, params)])
        dist.all_reduce(delta)
        delta /= world
        with torch.no_grad():
            for p, s, d in zip(params, start, delta.split([p.numel() for p in params])):
                p.copy_(s)
                p.grad = d.view_as(p).clone()
        outer.step()
    return model
