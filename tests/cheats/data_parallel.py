"""Cheats on notebook 02's puzzles, each with the words its rejection must contain."""

import torch
import torch.nn.functional as F

import puzzles.data_parallel as P
from tests.cheats.common import everywhere

_board: dict = {}


def all_reduce_through_a_module_dict(dist, x):
    """Every rank leaves its tensor on a module-level dict and sums the others' after a barrier."""
    _board[dist.get_rank()] = x.clone()
    dist.barrier()
    return torch.stack([_board[r].double() for r in range(dist.get_world_size())]).sum(0).to(x.dtype)


def reduce_scatter_all_to_all(dist, x):
    """The same bytes as a ring, sent straight to each chunk's owner: no ring at all."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = x.chunk(world)
    out, buf = chunks[rank].clone(), torch.empty_like(chunks[rank])
    reqs = [dist.isend(chunks[dst], dst) for dst in range(world) if dst != rank]
    for src in range(world):
        if src != rank:
            dist.recv(buf, src)
            out += buf
    for req in reqs:
        req.wait()
    return out


def reduce_scatter_one_rank_at_a_time(dist, x):
    """A ring whose blocking sends go round one rank after another: N hops per step instead of one. A deliberate
    copy of solutions.data_parallel.ring_reduce_scatter with blocking sends, rank 0's first."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = x.chunk(world)
    right, left = (rank + 1) % world, (rank - 1) % world
    buf = torch.empty_like(chunks[0])
    for step in range(world - 1):
        if rank == 0:
            dist.send(chunks[(rank - step - 1) % world], right)
            dist.recv(buf, left)
        else:
            dist.recv(buf, left)
            dist.send(chunks[(rank - step - 1) % world], right)
        chunks[(rank - step - 2) % world].add_(buf)
    return chunks[rank]


def all_gather_all_to_all(dist, chunk):
    rank, world = dist.get_rank(), dist.get_world_size()
    parts = list(torch.empty(world * chunk.numel(), dtype=chunk.dtype).chunk(world))
    parts[rank].copy_(chunk)
    reqs = [dist.isend(chunk, dst) for dst in range(world) if dst != rank]
    for src in range(world):
        if src != rank:
            dist.recv(parts[src], src)
    for req in reqs:
        req.wait()
    return torch.cat(parts)


def all_reduce_all_to_all(dist, x):
    return all_gather_all_to_all(dist, reduce_scatter_all_to_all(dist, x))


def ddp_on_the_gathered_batch(dist, model, batches, lr):
    """Gathers the data (a few KiB) instead of the gradients, and trains on the whole batch on every rank."""
    world = dist.get_world_size()
    for x, y in batches:
        xs, ys = [torch.empty_like(x) for _ in range(world)], [torch.empty_like(y) for _ in range(world)]
        dist.all_gather(xs, x)
        dist.all_gather(ys, y)
        model.zero_grad()
        F.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return model


def ddp_all_reduce_per_parameter(dist, model, batches, lr, bucket_size):
    """Overlaps by all-reducing each gradient from its hook the moment it is ready: no buckets at all."""
    world, pending = dist.get_world_size(), []
    hooks = [p.register_post_accumulate_grad_hook(lambda p: pending.append(dist.all_reduce(p.grad, async_op=True)))
             for p in model.parameters()]
    for x, y in batches:
        model.zero_grad()
        pending.clear()
        F.mse_loss(model(x), y).backward()
        for work in pending:
            work.wait()
        with torch.no_grad():
            for p in model.parameters():
                p.grad /= world
                p -= lr * p.grad
    for h in hooks:
        h.remove()
    return model


CHEATS = everywhere(P) + [
    ("ring_all_reduce", all_reduce_through_a_module_dict, "SharedMemory"),
    ("ring_reduce_scatter", reduce_scatter_all_to_all, "not the next rank around the ring"),
    ("ring_all_gather", all_gather_all_to_all, "not the next rank around the ring"),
    ("ring_all_reduce", all_reduce_all_to_all, "not the next rank around the ring"),
    ("ring_reduce_scatter", reduce_scatter_one_rank_at_a_time, "simulated time"),
    ("data_parallel_train", ddp_on_the_gathered_batch, "under the floor"),
    ("bucketed_data_parallel_train", ddp_all_reduce_per_parameter, "bucket_size"),
]
