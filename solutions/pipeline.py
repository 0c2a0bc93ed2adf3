"""Notebook 05, pipeline parallelism: the reference solutions."""

import torch
import torch.nn.functional as F


def pipeline_stages(dist, stage, batch, targets):
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        x = batch
    else:
        x = torch.empty_like(batch)
        dist.recv(x, rank - 1)
    x.requires_grad_()
    out = stage(x)
    if rank == p - 1:
        F.mse_loss(out, targets).backward()
    else:
        dist.send(out.detach(), rank + 1)
        grad = torch.empty_like(out)
        dist.recv(grad, rank + 1)
        out.backward(grad)
    if rank > 0:
        dist.send(x.grad, rank - 1)
    return stage


def gpipe(dist, stage, batch, targets, m):
    rank, p = dist.get_rank(), dist.get_world_size()
    xs, ys = batch.chunk(m), targets.chunk(m)
    sends, stash = [], []
    for j in range(m):                                   # every forward ...
        if rank == 0:
            x = xs[j].clone()
        else:
            x = torch.empty_like(xs[j])
            dist.recv(x, rank - 1)
        x.requires_grad_()
        out = stage(x)
        if rank == p - 1:
            out = F.mse_loss(out, ys[j]) / m             # the mean over micro-batches
        else:
            sends.append(dist.isend(out.detach(), rank + 1))
        stash.append((x, out))
    for j in range(m):                                   # ... then every backward
        x, out = stash[j]
        if rank == p - 1:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, rank + 1)
            out.backward(grad)
        if rank > 0:
            sends.append(dist.isend(x.grad, rank - 1))
        stash[j] = None                                  # this micro-batch's activations are freed
    for s in sends:
        s.wait()
    return stage


def one_f_one_b(dist, stage, batch, targets, m):
    rank, p = dist.get_rank(), dist.get_world_size()
    if m < p:
        raise ValueError(f"1F1B needs at least as many micro-batches as stages: m={m} < p={p}")
    xs, ys = batch.chunk(m), targets.chunk(m)
    sends, stash = [], {}

    def forward(j):
        if rank == 0:
            x = xs[j].clone()
        else:
            x = torch.empty_like(xs[j])
            dist.recv(x, rank - 1)
        x.requires_grad_()
        out = stage(x)
        if rank == p - 1:
            out = F.mse_loss(out, ys[j]) / m
        else:
            sends.append(dist.isend(out.detach(), rank + 1))
        stash[j] = (x, out)

    def backward(j):
        x, out = stash.pop(j)
        if rank == p - 1:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, rank + 1)
            out.backward(grad)
        if rank > 0:
            sends.append(dist.isend(x.grad, rank - 1))

    warm = p - rank - 1
    for j in range(warm):                                # warm-up
        forward(j)
    for i in range(m - warm):                            # steady state: one forward, one backward
        forward(warm + i)
        backward(i)
    for j in range(m - warm, m):                         # cool-down
        backward(j)
    for s in sends:
        s.wait()
    return stage
