"""Wrong answers to notebook 02's puzzles, each with the words its failure message must contain.

A wrong answer must fail, whatever else it gets right; tests/test_content.py runs every catalogue.
"""

import torch
import torch.nn.functional as F



def ddp_never_communicates(dist, model, batches, lr):
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return model


def ddp_forgets_to_average(dist, model, batches, lr):
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return model


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
    """One bucket of every gradient, all-reduced after backward: DDP's bucket rule kept, nothing overlapped."""
    world = dist.get_world_size()
    params = list(model.parameters())
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= world
        with torch.no_grad():
            for p, g in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(g.view_as(p))
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


WRONG = [
    ("data_parallel_train", ddp_never_communicates, "rank 0: the result", "training alone"),
    ("data_parallel_train", ddp_forgets_to_average, "rank 0: the result", "without dividing by N"),
    ("bucketed_data_parallel_train", ddp_hook_reduces_the_weights, "rank 0: the result",
     "the parameters instead of their gradients"),
    ("bucketed_data_parallel_train", ddp_without_overlap, "simulated time"),
    ("ring_all_reduce", ring_sends_whole_tensor, "over the budget"),
    ("ring_reduce_scatter", reduce_scatter_off_by_one, "expected"),
    ("ring_all_gather", all_gather_everyone_sends_first, "Deadlock"),
    ("ring_all_reduce", all_reduce_everyone_sends_first, "waits in send"),
    ("ring_all_reduce", all_reduce_hard_coded, "expected"),
    ("param_server_all_reduce", param_server_with_all_reduce, "all_reduce"),
]
