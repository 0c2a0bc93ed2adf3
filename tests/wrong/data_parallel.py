"""Wrong answers to notebook 02's puzzles, each with the words its failure message must contain.

A wrong answer must fail, whatever else it gets right; tests/test_content.py runs every catalogue.
"""

import torch
import torch.nn.functional as F



def _sgd(model, batches, lr, before_update=lambda p: None, after_update=lambda p: None):
    """Plain SGD on this rank's batches, with what a wrong answer does to each parameter around its update."""
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                before_update(p)
                p -= lr * p.grad
                after_update(p)
    return model


def ddp_never_communicates(dist, model, batches, lr):
    return _sgd(model, batches, lr)


def ddp_forgets_to_average(dist, model, batches, lr):
    return _sgd(model, batches, lr, before_update=lambda p: dist.all_reduce(p.grad))


def ddp_hook_reduces_the_weights(dist, model, batches, lr, bucket_size):
    """The public-code bug: the post-accumulate hook receives the parameter, not its gradient."""
    world = dist.get_world_size()
    hooks = [p.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.data)) for p in model.parameters()]
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p /= world
                p -= lr * p.grad
    for h in hooks:
        h.remove()
    return model


def ddp_without_overlap(dist, model, batches, lr, bucket_size):
    """DDP's buckets, each all-reduced as one flat tensor, but only after backward: the rule kept, nothing
    overlapped."""
    world = dist.get_world_size()
    params = list(model.parameters())
    buckets, filled = [[]], 0
    for p in reversed(params):                  # DDP's rule: closed once it holds bucket_size elements
        buckets[-1].append(p)
        filled += p.numel()
        if filled >= bucket_size:
            buckets, filled = buckets + [[]], 0
    buckets = [b for b in buckets if b]
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        for bucket in buckets:
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            dist.all_reduce(flat)
            flat /= world
            for p, g in zip(bucket, flat.split([p.numel() for p in bucket])):
                p.grad.copy_(g.view_as(p))
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
    return model


def ring_sends_whole_tensor(dist, x):
    """Right answer, wrong cost: every step forwards the whole tensor around the ring."""
    rank, world = dist.get_rank(), dist.get_world_size()
    total, passing, buf = x.clone(), x.clone(), torch.empty_like(x)
    for _ in range(world - 1):
        req = dist.isend(passing, (rank + 1) % world)
        dist.recv(buf, (rank - 1) % world)
        req.wait()
        passing.copy_(buf)
        total += buf
    return total


def reduce_scatter_off_by_one(dist, x):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = x.chunk(world)
    buf = torch.empty_like(chunks[0])
    for step in range(world - 1):
        req = dist.isend(chunks[(rank - step) % world], (rank + 1) % world)
        dist.recv(buf, (rank - 1) % world)
        req.wait()
        chunks[(rank - step - 1) % world].add_(buf)
    return chunks[rank]


def all_gather_everyone_sends_first(dist, chunk):
    rank, world = dist.get_rank(), dist.get_world_size()
    parts = list(torch.empty(world * chunk.numel()).chunk(world))
    parts[rank].copy_(chunk)
    for step in range(world - 1):
        dist.send(parts[(rank - step) % world], (rank + 1) % world)
        dist.recv(parts[(rank - step - 1) % world], (rank - 1) % world)
    return torch.cat(parts)


def all_reduce_everyone_sends_first(dist, x):
    """Blocking sends before receives on every rank: nobody is receiving, at any N."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks, buf = x.chunk(world), torch.empty_like(x.chunk(world)[0])
    for step in range(world - 1):
        dist.send(chunks[(rank - step - 1) % world], (rank + 1) % world)
        dist.recv(buf, (rank - 1) % world)
        chunks[(rank - step - 2) % world].add_(buf)
    return x


def all_reduce_hard_coded(dist, x):
    return x * dist.get_world_size()


def param_server_with_all_reduce(dist, x):
    dist.all_reduce(x)
    return x


def ddp_ignores_bucket_size(dist, model, batches, lr, bucket_size):
    """Buckets of 1000 elements, the size the example used, whatever bucket_size says."""
    from solutions.data_parallel import bucketed_data_parallel_train
    return bucketed_data_parallel_train(dist, model, batches, lr, 1000)



def ddp_all_gathers_the_gradients(dist, model, batches, lr):
    """Every rank's flattened gradients all-gathered and averaged locally: the right update, with N-1 whole copies
    of the gradients on the link where an all-reduce sends 2(N-1)/N of one (issue 45: the watched traffic avoided by
    another collective)."""
    world = dist.get_world_size()
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        every = torch.empty(world * flat.numel(), dtype=flat.dtype)
        dist.all_gather_single(every, flat)
        mean = every.view(world, -1).mean(0)
        with torch.no_grad():
            for p, g in zip(model.parameters(), mean.split([p.numel() for p in model.parameters()])):
                p -= lr * g.view_as(p)
    return model


WRONG = [
    ("data_parallel_train", ddp_never_communicates, "rank 0: the result", "training alone"),
    ("data_parallel_train", ddp_forgets_to_average, "rank 0: the result", "without dividing by N"),
    ("data_parallel_train", ddp_all_gathers_the_gradients, "over the budget"),
    ("bucketed_data_parallel_train", ddp_hook_reduces_the_weights, "rank 0: the result",
     "the parameters instead of their gradients"),
    ("bucketed_data_parallel_train", ddp_without_overlap, "simulated time"),
    ("bucketed_data_parallel_train", ddp_ignores_bucket_size, "bucket_size ="),
    ("ring_all_reduce", ring_sends_whole_tensor, "over the budget"),
    ("ring_reduce_scatter", reduce_scatter_off_by_one, "expected"),
    ("ring_all_gather", all_gather_everyone_sends_first, "Deadlock"),
    ("ring_all_reduce", all_reduce_everyone_sends_first, "waits in send"),
    ("ring_all_reduce", all_reduce_hard_coded, "expected"),
    ("param_server_all_reduce", param_server_with_all_reduce, "all_reduce"),
]
