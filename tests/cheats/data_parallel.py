"""Cheats on notebook 02's puzzles, each with the words its rejection must contain."""

import torch
import torch.nn.functional as F

import puzzles.data_parallel as P
import solutions.data_parallel as S
from solutions.data_parallel import bucketed_data_parallel_train
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
    n = x.numel()
    padded = F.pad(x, (0, -n % dist.get_world_size()))
    return all_gather_all_to_all(dist, reduce_scatter_all_to_all(dist, padded))[:n]


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


def _per_parameter(dist, model, batches, lr, start, finish):
    """Data-parallel SGD where start(p) runs from each gradient's hook (returning what finish needs) and
    finish(p, started) after backward; then the average and the update."""
    world, pending = dist.get_world_size(), []
    hooks = [p.register_post_accumulate_grad_hook(lambda p: pending.append((p, start(p)))) for p in model.parameters()]
    for x, y in batches:
        model.zero_grad()
        pending.clear()
        F.mse_loss(model(x), y).backward()
        for p, started in pending:
            finish(p, started)
        with torch.no_grad():
            for p in model.parameters():
                p.grad /= world
                p -= lr * p.grad
    for h in hooks:
        h.remove()
    return model


def ddp_all_reduce_per_parameter(dist, model, batches, lr, bucket_size):
    """Overlaps by all-reducing each gradient from its hook the moment it is ready: no buckets at all."""
    return _per_parameter(dist, model, batches, lr, lambda p: dist.all_reduce(p.grad, async_op=True),
                          lambda p, work: work.wait())


def param_server_through_the_environment(dist, x):
    """Every rank writes its x into os.environ as text (threads of one process share it; processes do not), and
    1-element sends only keep the order. Each simulated rank now has its own environment, as a process does
    (lib.sim.environ): the server finds nothing there; the byte floor would refuse it too."""
    import os

    rank, world = dist.get_rank(), dist.get_world_size()
    token = torch.zeros(1)
    os.environ[f"COURSE_CHEAT_X{rank}"] = repr(x.tolist())
    if rank == 0:
        for src in range(1, world):
            dist.recv(token, src)
        total = sum(torch.tensor(eval(os.environ[f"COURSE_CHEAT_X{r}"]), dtype=torch.float64) for r in range(world))
        os.environ["COURSE_CHEAT_SUM"] = repr(total.tolist())
        for dst in range(1, world):
            dist.send(token, dst)
    else:
        dist.send(token, 0)
        dist.recv(token, 0)
    return torch.tensor(eval(os.environ["COURSE_CHEAT_SUM"]), dtype=torch.float64).to(x.dtype)


def ddp_batch_inside_a_gradient_sized_all_reduce(dist, model, batches, lr):
    """The bytes of the gradients' all-reduce, spent on the data: every rank's shard packed into a zero buffer the
    size of the gradients, all-reduced, and the whole batch trained on every rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    numel = sum(p.numel() for p in model.parameters())
    for x, y in batches:
        n = x.numel() + y.numel()
        buf = torch.zeros(numel, dtype=x.dtype)
        buf[rank * n:(rank + 1) * n] = torch.cat([x.reshape(-1), y.reshape(-1)])
        dist.all_reduce(buf)
        parts = buf[:world * n].view(world, n)
        model.zero_grad()
        F.mse_loss(model(parts[:, :x.numel()].reshape(-1, x.shape[1])),
                   parts[:, x.numel():].reshape(-1, y.shape[1])).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return model


def ddp_buckets_of_half_the_model(dist, model, batches, lr, bucket_size):
    """Hooks and asynchronous all-reduces, but two buckets of half the model each, whatever bucket_size says: fewer
    latencies, and the first all-reduce starts halfway through backward."""
    return bucketed_data_parallel_train(dist, model, batches, lr, sum(p.numel() for p in model.parameters()) // 2)


def ddp_reduce_scatter_and_all_gather_per_parameter(dist, model, batches, lr, bucket_size):
    """No buckets, and no all_reduce for the bucket rule to count: each gradient reduce-scattered from its hook
    (asynchronously), then all-gathered after backward."""
    world = dist.get_world_size()

    def start(p):
        flat = torch.cat([p.grad.reshape(-1), p.grad.new_zeros((-p.numel()) % world)])
        part = flat.new_empty(flat.numel() // world)
        return flat, part, dist.reduce_scatter_tensor(part, flat, async_op=True)

    def finish(p, started):
        flat, part, work = started
        work.wait()
        dist.all_gather_into_tensor(flat, part)
        p.grad.copy_(flat[:p.numel()].view_as(p.grad))
    return _per_parameter(dist, model, batches, lr, start, finish)


def ddp_ring_per_parameter(dist, model, batches, lr, bucket_size):
    """No collective at all: every gradient all-reduced on its own by a send/recv ring after backward."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world

    def ring_all_reduce(g):
        chunks = list(torch.cat([g, g.new_zeros((-g.numel()) % world)]).chunk(world))
        buf = torch.empty_like(chunks[0])
        for step in range(world - 1):
            req = dist.isend(chunks[(rank - step - 1) % world].clone(), right)
            dist.recv(buf, left)
            req.wait()
            chunks[(rank - step - 2) % world].add_(buf)
        for step in range(world - 1):
            req = dist.isend(chunks[(rank - step) % world].clone(), right)
            dist.recv(chunks[(rank - step - 1) % world], left)
            req.wait()
        return torch.cat(chunks)[:g.numel()]
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p.grad.copy_(ring_all_reduce(p.grad.reshape(-1)).view_as(p) / world)
                p -= lr * p.grad
    return model


OFF_RING = ("belongs", "not the same way around the ring")

CHEATS = everywhere(P) + [
    ("ring_all_reduce", all_reduce_through_a_module_dict, "SharedMemory"),
    ("ring_reduce_scatter", reduce_scatter_all_to_all, OFF_RING),
    ("ring_all_gather", all_gather_all_to_all, OFF_RING),
    ("ring_all_reduce", all_reduce_all_to_all, OFF_RING),
    ("ring_reduce_scatter", reduce_scatter_one_rank_at_a_time, "simulated time"),
    ("data_parallel_train", ddp_on_the_gathered_batch, "under the floor"),
    ("bucketed_data_parallel_train", ddp_all_reduce_per_parameter, "bucket_size"),
    ("param_server_all_reduce", param_server_through_the_environment,
     ("which rank 1 set during the run", "under the floor")),
    ("data_parallel_train", ddp_batch_inside_a_gradient_sized_all_reduce, "FLOPs counted"),
    ("bucketed_data_parallel_train", ddp_buckets_of_half_the_model, "bucket_size ="),
    ("bucketed_data_parallel_train", ddp_reduce_scatter_and_all_gather_per_parameter, "by reduce_scatter"),
    ("bucketed_data_parallel_train", ddp_ring_per_parameter, ("simulated time", "sent is")),
]


def ring_all_reduce_without_padding(dist, x):
    """Reduce-scatter then all-gather on x as it comes, with no padding: right whenever N divides x's length, which
    every case used to draw."""
    return S.ring_all_gather(dist, S.ring_reduce_scatter(dist, x))


CHEATS += [("ring_all_reduce", ring_all_reduce_without_padding, "not a multiple of N")]
