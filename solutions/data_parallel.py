"""Notebook 02, data parallel and collectives: the reference solutions."""

import torch
import torch.nn.functional as F


def param_server_all_reduce(dist, x):
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        buf = torch.empty_like(x)
        for src in range(1, world):
            dist.recv(buf, src)
            x += buf
        for dst in range(1, world):
            dist.send(x, dst)
    else:
        dist.send(x, 0)
        dist.recv(x, 0)
    return x


def ring_reduce_scatter(dist, x):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = x.chunk(world)
    right, left = (rank + 1) % world, (rank - 1) % world
    buf = torch.empty_like(chunks[0])
    for step in range(world - 1):
        # Pass on the chunk finished last step; add the incoming one to ours.
        send = dist.isend(chunks[(rank - step - 1) % world], right)
        dist.recv(buf, left)
        send.wait()
        chunks[(rank - step - 2) % world].add_(buf)
    return chunks[rank]


def ring_all_gather(dist, chunk):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = torch.empty(world * chunk.numel(), dtype=chunk.dtype, device=chunk.device)
    parts = out.chunk(world)
    parts[rank].copy_(chunk)
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send = dist.isend(parts[(rank - step) % world], right)
        dist.recv(parts[(rank - step - 1) % world], left)
        send.wait()
    return out


def ring_all_reduce(dist, x):
    n = x.numel()
    padded = F.pad(x, (0, -n % dist.get_world_size()))       # N equal chunks, whatever x's length
    return ring_all_gather(dist, ring_reduce_scatter(dist, padded))[:n]


def data_parallel_train(dist, model, batches, lr):
    world = dist.get_world_size()
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return model


def bucketed_data_parallel_train(dist, model, batches, lr, bucket_size):
    world = dist.get_world_size()
    params = list(model.parameters())
    # Gradients arrive from the last layer backwards: fill buckets in that order.
    buckets, current = [], []
    for p in reversed(params):
        current.append(p)
        if sum(q.numel() for q in current) >= bucket_size:
            buckets.append(current)
            current = []
    if current:
        buckets.append(current)
    bucket_of = {id(p): i for i, b in enumerate(buckets) for p in b}
    pending, ready = [], [0] * len(buckets)

    def on_grad(p):
        i = bucket_of[id(p)]
        ready[i] += 1
        if ready[i] == len(buckets[i]):
            flat = torch.cat([q.grad.reshape(-1) for q in buckets[i]])
            pending.append((buckets[i], flat, dist.all_reduce(flat, async_op=True)))

    hooks = [p.register_post_accumulate_grad_hook(on_grad) for p in params]
    for x, y in batches:
        model.zero_grad()
        pending.clear()
        ready[:] = [0] * len(buckets)
        F.mse_loss(model(x), y).backward()
        for bucket, flat, work in pending:
            work.wait()
            flat /= world
            for p, g in zip(bucket, flat.split([q.numel() for q in bucket])):
                p.grad.copy_(g.view_as(p))
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
    for h in hooks:
        h.remove()
    return model
