"""Realistic first attempts at notebook 02's puzzles (collectives and data parallelism), none of them in tests/wrong."""

import torch
import torch.nn.functional as F

from tests.mistakes import A_SHARD_FOR_THE_WHOLE, NO_GRADIENT, Attempt

# A result that sums only some ranks' inputs: said by which ranks' inputs it holds, or which it leaves out.
PART_OF_THE_SUM = ("left out of the sum", "only the sum of", "shares only")
LAYOUT = ("holds what", "rotated", "reversed", "in the wrong places")


# ---- param_server_all_reduce --------------------------------------------------------------------------------
def server_without_its_own_x(dist, x):
    """The server sums what it receives into a fresh buffer and sends that back: its own x never joins the sum."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total, buf = torch.zeros_like(x), torch.empty_like(x)
        for src in range(1, world):
            dist.recv(buf, src)
            total += buf
        for dst in range(1, world):
            dist.send(total, dst)
        return total
    dist.send(x, 0)
    dist.recv(x, 0)
    return x


def server_answers_as_it_goes(dist, x):
    """The server sends the running sum back to each worker right after receiving from it: early workers get
    partial sums."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        buf = torch.empty_like(x)
        for src in range(1, world):
            dist.recv(buf, src)
            x += buf
            dist.send(x, src)
        return x
    dist.send(x, 0)
    dist.recv(x, 0)
    return x


def server_receives_into_x(dist, x):
    """dist.recv(x, src) on the server, 'it is a buffer anyway': each worker's tensor overwrites the last."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for src in range(1, world):
            dist.recv(x, src)
        for dst in range(1, world):
            dist.send(x, dst)
        return x
    dist.send(x, 0)
    dist.recv(x, 0)
    return x


def server_averages(dist, x):
    """The server divides by the world size before sending back: the mean, where the statement asks for the sum."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        buf = torch.empty_like(x)
        for src in range(1, world):
            dist.recv(buf, src)
            x += buf
        x /= world
        for dst in range(1, world):
            dist.send(x, dst)
        return x
    dist.send(x, 0)
    dist.recv(x, 0)
    return x


def workers_wait_for_the_sum_first(dist, x):
    """Workers post their recv of the sum before sending their x: every worker waits for a sum the server cannot
    make before it hears from them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        buf = torch.empty_like(x)
        for src in range(1, world):
            dist.recv(buf, src)
            x += buf
        for dst in range(1, world):
            dist.send(x, dst)
        return x
    total = torch.empty_like(x)
    dist.recv(total, 0)
    dist.send(x, 0)
    return total


# ---- ring_reduce_scatter ------------------------------------------------------------------------------------
def _ring_steps(dist, x, steps, sent_index, added_index, accumulate=True):
    """A ring reduce-scatter loop: at each step send chunk sent_index(rank, step) right, and add (or copy) what
    comes from the left into chunk added_index(rank, step). Returns the chunks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = x.chunk(world)
    right, left = (rank + 1) % world, (rank - 1) % world
    buf = torch.empty_like(chunks[0])
    for step in range(steps):
        send = dist.isend(chunks[sent_index(rank, step, world)], right)
        dist.recv(buf, left)
        send.wait()
        target = chunks[added_index(rank, step, world)]
        if accumulate:
            target.add_(buf)
        else:
            target.copy_(buf)
    return chunks


def reduce_scatter_textbook_indices(dist, x):
    """The textbook schedule (send chunk r - s, add into r - s - 1) ends with chunk r + 1 complete on rank r; the
    learner returns it, though rank r's chunk is r."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = _ring_steps(dist, x, world - 1, lambda r, s, n: (r - s) % n, lambda r, s, n: (r - s - 1) % n)
    return chunks[(rank + 1) % world]


def reduce_scatter_own_chunk_sent_first(dist, x):
    """Each step posts its isend and irecv as a pair (batch_isend_irecv), sending chunk (r - s) % N, 'my own chunk
    first', and adding what arrives into (r - s - 1) % N; it returns chunk r."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in x.chunk(world)]
    for step in range(world - 1):
        got = torch.empty_like(chunks[0])
        ops = [dist.P2POp(dist.isend, chunks[(rank - step) % world], (rank + 1) % world),
               dist.P2POp(dist.irecv, got, (rank - 1) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        chunks[(rank - step - 1) % world] += got
    return chunks[rank]


def reduce_scatter_add_not_in_place(dist, x):
    """The right schedule, each received chunk added with chunk.add(got), whose result (a new tensor) is dropped."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in x.chunk(world)]
    for step in range(world - 1):
        got = torch.empty_like(chunks[0])
        send = dist.isend(chunks[(rank - step - 1) % world], (rank + 1) % world)
        dist.recv(got, (rank - 1) % world)
        send.wait()
        chunks[(rank - step - 2) % world].add(got)
    return chunks[rank]


def reduce_scatter_returns_its_own_partial_chunk(dist, x):
    """The textbook schedule, and chunk r returned: the chunk that schedule leaves with only two ranks' sum."""
    rank, world = dist.get_rank(), dist.get_world_size()
    return _ring_steps(dist, x, world - 1, lambda r, s, n: (r - s) % n, lambda r, s, n: (r - s - 1) % n)[rank]


def reduce_scatter_copies_instead_of_adding(dist, x):
    """The received chunk copied into place (recv straight into it) instead of added: each chunk forgets what the
    ranks before added."""
    rank, world = dist.get_rank(), dist.get_world_size()
    return _ring_steps(dist, x, world - 1, lambda r, s, n: (r - s - 1) % n, lambda r, s, n: (r - s - 2) % n,
                       accumulate=False)[rank]


def reduce_scatter_loop_from_one(dist, x):
    """range(1, N - 1): the loop starts at step 1, as if step 0 were the chunk each rank already holds: one step
    short, so each chunk lacks one rank's part (at N = 2, nothing is ever received)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in x.chunk(world)]
    for step in range(1, world - 1):
        got = torch.empty_like(chunks[0])
        send = dist.isend(chunks[(rank - step - 1) % world], (rank + 1) % world)
        dist.recv(got, (rank - 1) % world)
        send.wait()
        chunks[(rank - step - 2) % world] = chunks[(rank - step - 2) % world] + got
    return chunks[rank]


def reduce_scatter_mirrored_neighbours(dist, x):
    """The neighbours mirrored (send to the left, receive from the right), 'since a ring works either way', the chunk
    indices kept as the hints give them for a ring to the right."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = list(x.clone().chunk(world))
    for step in range(world - 1):
        incoming = torch.zeros_like(chunks[0])
        reqs = [dist.isend(chunks[(rank - step - 1) % world], (rank - 1) % world),
                dist.irecv(incoming, (rank + 1) % world)]
        for req in reqs:
            req.wait()
        chunks[(rank - step - 2) % world] += incoming
    return chunks[rank]


def reduce_scatter_n_steps(dist, x):
    """range(world) steps instead of world - 1: one more lap adds a rank's contribution twice."""
    rank, world = dist.get_rank(), dist.get_world_size()
    return _ring_steps(dist, x, world, lambda r, s, n: (r - s - 1) % n, lambda r, s, n: (r - s - 2) % n)[rank]


def reduce_scatter_averaging(dist, x):
    """The reduced chunk divided by the world size, as DDP's averaging does: a sum was asked for."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = _ring_steps(dist, x, world - 1, lambda r, s, n: (r - s - 1) % n, lambda r, s, n: (r - s - 2) % n)
    return chunks[rank] / world


def reduce_scatter_sending_left(dist, x):
    """Sends to rank - 1 and receives from rank - 1 as well: two ranks wait on each other's opposite sides."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = x.chunk(world)
    left = (rank - 1) % world
    buf = torch.empty_like(chunks[0])
    for step in range(world - 1):
        send = dist.isend(chunks[(rank - step - 1) % world], left)
        dist.recv(buf, left)
        send.wait()
        chunks[(rank - step - 2) % world].add_(buf)
    return chunks[rank]


# ---- ring_all_gather ----------------------------------------------------------------------------------------
def all_gather_in_arrival_order(dist, chunk):
    """Keeps a list: its own chunk, then each chunk as it arrives from the left, concatenated: rank order rotated."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    got, current = [chunk], chunk
    for _ in range(world - 1):
        buf = torch.empty_like(chunk)
        send = dist.isend(current, right)
        dist.recv(buf, left)
        send.wait()
        got.append(buf)
        current = buf
    return torch.cat(got)


def _all_gather_into(dist, chunk, own_index, steps, received_index):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = torch.empty(world * chunk.numel(), dtype=chunk.dtype, device=chunk.device)
    parts = out.chunk(world)
    parts[own_index(rank, world)].copy_(chunk)
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(steps(world)):
        send = dist.isend(parts[(own_index(rank, world) - step) % world], right)
        dist.recv(parts[received_index(rank, step, world)], left)
        send.wait()
    return out


def all_gather_own_chunk_first(dist, chunk):
    """Its own chunk put at place 0 of the output, as if every rank were rank 0."""
    return _all_gather_into(dist, chunk, lambda r, n: 0, lambda n: n - 1, lambda r, s, n: (0 - s - 1) % n)


def all_gather_one_step_short(dist, chunk):
    """range(world - 2) steps: the last chunk to come round is never received, its place left as torch.empty made it."""
    return _all_gather_into(dist, chunk, lambda r, n: r, lambda n: n - 2, lambda r, s, n: (r - s - 1) % n)


def all_gather_received_ahead(dist, chunk):
    """Receives into place r + s + 1, counting forward, while the chunk comes from the left (r - s - 1)."""
    return _all_gather_into(dist, chunk, lambda r, n: r, lambda n: n - 1, lambda r, s, n: (r + s + 1) % n)


def all_gather_stores_by_step(dist, chunk):
    """A list of N slots with its own chunk at r; what arrives at step s stored at slot (r + s) % N, the first one
    over its own chunk, while it sends slot (r - s) % N on."""
    rank, world = dist.get_rank(), dist.get_world_size()
    slots = [None] * world
    slots[rank] = chunk
    for step in range(world - 1):
        received = torch.empty_like(chunk)
        send = dist.isend(slots[(rank - step) % world], (rank + 1) % world)
        dist.recv(received, (rank - 1) % world)
        send.wait()
        slots[(rank + step) % world] = received
    return torch.cat(slots)


def all_gather_one_receive_buffer(dist, chunk):
    """A list of N slots with its own chunk at r, and one receive buffer made before the loop, stored in the slot
    of each step's chunk: every slot it fills is that one tensor."""
    rank, world = dist.get_rank(), dist.get_world_size()
    slots = [None] * world
    slots[rank] = chunk
    received = torch.empty_like(chunk)
    for step in range(world - 1):
        send = dist.isend(slots[(rank - step) % world], (rank + 1) % world)
        dist.recv(received, (rank - 1) % world)
        send.wait()
        slots[(rank - step - 1) % world] = received
    return torch.cat(slots)


def all_gather_sends_the_slot_it_fills(dist, chunk):
    """parts = [None] * N with its own chunk at r; at step s it sends parts[(r - s - 1) % N], the slot it is about to
    receive into, where the chunk to forward is (r - s) % N."""
    rank, world = dist.get_rank(), dist.get_world_size()
    parts = [chunk if i == rank else None for i in range(world)]
    for slot in [(rank - step - 1) % world for step in range(world - 1)]:
        received = torch.empty_like(chunk)
        for req in [dist.isend(parts[slot], (rank + 1) % world), dist.irecv(received, (rank - 1) % world)]:
            req.wait()
        parts[slot] = received
    return torch.cat(parts)


def all_gather_slot_by_arrival(dist, chunk):
    """Each chunk's slot in the output counted by when it arrived: its own at slot 0, step s's at slot s + 1."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = torch.empty(world * chunk.numel(), dtype=chunk.dtype, device=chunk.device)
    parts = out.chunk(world)
    parts[0].copy_(chunk)
    for step in range(world - 1):
        send = dist.isend(parts[step], (rank + 1) % world)
        dist.recv(parts[step + 1], (rank - 1) % world)
        send.wait()
    return out


def all_gather_always_sends_its_own(dist, chunk):
    """Sends its own chunk at every step instead of forwarding the one it just received."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = torch.empty(world * chunk.numel(), dtype=chunk.dtype, device=chunk.device)
    parts = out.chunk(world)
    parts[rank].copy_(chunk)
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send = dist.isend(chunk, right)
        dist.recv(parts[(rank - step - 1) % world], left)
        send.wait()
    return out


# ---- ring_all_reduce ----------------------------------------------------------------------------------------
def all_reduce_phases_disagree(dist, x):
    """The textbook reduce-scatter (chunk r + 1 complete on rank r), then an all-gather that places it as chunk r."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = _ring_steps(dist, x, world - 1, lambda r, s, n: (r - s) % n, lambda r, s, n: (r - s - 1) % n)
    return _all_gather_into(dist, chunks[(rank + 1) % world], lambda r, n: r, lambda n: n - 1,
                            lambda r, s, n: (r - s - 1) % n)


def all_reduce_averaging(dist, x):
    """Reduce-scatter, divide by the world size 'as DDP does', then all-gather: the mean instead of the sum."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = _ring_steps(dist, x, world - 1, lambda r, s, n: (r - s - 1) % n, lambda r, s, n: (r - s - 2) % n)
    return _all_gather_into(dist, chunks[rank] / world, lambda r, n: r, lambda n: n - 1,
                            lambda r, s, n: (r - s - 1) % n)


def all_reduce_gather_adds(dist, x):
    """One loop for both phases: the all-gather phase adds what it receives too, instead of overwriting."""
    world = dist.get_world_size()
    _ring_steps(dist, x, world - 1, lambda r, s, n: (r - s - 1) % n, lambda r, s, n: (r - s - 2) % n)
    _ring_steps(dist, x, world - 1, lambda r, s, n: (r - s) % n, lambda r, s, n: (r - s - 1) % n)
    return x


def all_reduce_gathers_the_input(dist, x):
    """The reduce-scatter summed clones of x's chunks, and the all-gather then sent x.chunk(N)[rank], the input's own
    chunk, whose values the reduce-scatter never touched."""
    rank, world = dist.get_rank(), dist.get_world_size()
    _ring_steps(dist, x.clone(), world - 1, lambda r, s, n: (r - s - 1) % n, lambda r, s, n: (r - s - 2) % n)
    return _all_gather_into(dist, x.chunk(world)[rank], lambda r, n: r, lambda n: n - 1,
                            lambda r, s, n: (r - s - 1) % n)


def all_reduce_chunk_as_floor_plus_one(dist, x):
    """The chunk length as len(x) // N + 1 ('rounded up'): one element more than needed when N divides len(x), so x
    is padded by N zeros that travel round the ring."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunk = x.numel() // world + 1
    padded = torch.cat([x, x.new_zeros(chunk * world - x.numel())])
    chunks = _ring_steps(dist, padded, world - 1, lambda r, s, n: (r - s - 1) % n, lambda r, s, n: (r - s - 2) % n)
    return _all_gather_into(dist, chunks[rank], lambda r, n: r, lambda n: n - 1,
                            lambda r, s, n: (r - s - 1) % n)[:x.numel()]


def all_reduce_padded_by_n_mod_n(dist, x):
    """x padded by len(x) % N zeros where (-len(x)) % N belong (the sign forgotten), then cut into N chunks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in F.pad(x, (0, x.numel() % world)).chunk(world)]
    for step in range(world - 1):
        got = torch.empty_like(chunks[(rank - step - 2) % world])
        send = dist.isend(chunks[(rank - step - 1) % world], (rank + 1) % world)
        dist.recv(got, (rank - 1) % world)
        send.wait()
        chunks[(rank - step - 2) % world] += got
    for step in range(world - 1):
        got = torch.empty_like(chunks[(rank - step - 1) % world])
        send = dist.isend(chunks[(rank - step) % world], (rank + 1) % world)
        dist.recv(got, (rank - 1) % world)
        send.wait()
        chunks[(rank - step - 1) % world] = got
    return torch.cat(chunks)[:x.numel()]


def _all_reduce_padded(dist, x, front: bool):
    """The ring all-reduce of x padded by (-len(x)) % N zeros, in front of x or after it; the padded sum returned."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pad = -x.numel() % world
    padded = F.pad(x, (pad, 0) if front else (0, pad))
    chunks = _ring_steps(dist, padded, world - 1, lambda r, s, n: (r - s - 1) % n, lambda r, s, n: (r - s - 2) % n)
    return _all_gather_into(dist, chunks[rank], lambda r, n: r, lambda n: n - 1, lambda r, s, n: (r - s - 1) % n)


def all_reduce_unpadded_buffers_like_its_own_chunk(dist, x):
    """x.chunk(N) without padding, and every receive into a buffer shaped like the rank's own chunk r: where N does
    not divide x's length the last chunk is shorter than the others."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in x.chunk(world)]
    for step in range(world - 1):
        buf = torch.empty_like(chunks[rank])
        send = dist.isend(chunks[(rank - step - 1) % world], (rank + 1) % world)
        dist.recv(buf, (rank - 1) % world)
        send.wait()
        chunks[(rank - step - 2) % world] += buf
    for step in range(world - 1):
        buf = torch.empty_like(chunks[rank])
        send = dist.isend(chunks[(rank - step) % world], (rank + 1) % world)
        dist.recv(buf, (rank - 1) % world)
        send.wait()
        chunks[(rank - step - 1) % world] = buf
    return torch.cat(chunks)


def all_reduce_padding_in_front(dist, x):
    """F.pad(x, (pad, 0)), the padding in front of x ('the first number pads the start'), then result[:len(x)]."""
    return _all_reduce_padded(dist, x, front=True)[:x.numel()]


def all_reduce_padding_cut_from_the_front(dist, x):
    """The padding added at the end, and cut off as result[pad:], the front of the result."""
    return _all_reduce_padded(dist, x, front=False)[-x.numel():]


def all_reduce_padding_kept(dist, x):
    """x padded to N chunks, and the padded sum returned as it is."""
    return _all_reduce_padded(dist, x, front=False)


def all_reduce_forgets_the_gather(dist, x):
    """Only the reduce-scatter: each rank returns its reduced chunk, 1/N of the tensor."""
    rank, world = dist.get_rank(), dist.get_world_size()
    return _ring_steps(dist, x, world - 1, lambda r, s, n: (r - s - 1) % n, lambda r, s, n: (r - s - 2) % n)[rank]


def all_reduce_by_passing_sums(dist, x):
    """Each rank passes its running total round the ring N-1 times: the sum everywhere, but the whole tensor at
    every step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    total, passing, buf = x.clone(), x.clone(), torch.empty_like(x)
    for _ in range(world - 1):
        send = dist.isend(passing, right)
        dist.recv(buf, left)
        send.wait()
        total += buf
        passing = buf.clone()
    return total


# ---- data_parallel_train ------------------------------------------------------------------------------------
def _ddp(dist, model, batches, lr, *, zero=True, after_backward=None, divide=1):
    """Data-parallel SGD written as a learner would, with one step changed."""
    world = dist.get_world_size()
    for x, y in batches:
        if zero:
            model.zero_grad()
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():
            (after_backward or (lambda p: (dist.all_reduce(p.grad), p.grad.div_(world))))(p)
        with torch.no_grad():
            for p in model.parameters():
                p -= lr / divide * p.grad
    return model


def ddp_without_zero_grad(dist, model, batches, lr):
    """No model.zero_grad() at the top of the step: the second step's gradients add to the first's."""
    return _ddp(dist, model, batches, lr, zero=False)


def ddp_average_op_then_divide(dist, model, batches, lr):
    """ReduceOp.AVG already averages, and the learner divides by the world size again; the gradients let go with
    zero_grad(set_to_none=True) after each update, the usual loop order."""
    world = dist.get_world_size()
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
                p -= lr * p.grad / world
        model.zero_grad(set_to_none=True)
    return model


def ddp_dividing_twice(dist, model, batches, lr):
    """Gradients averaged after the all-reduce, and the learning rate divided by the world size as well ('linear
    scaling rule' read backwards)."""
    return _ddp(dist, model, batches, lr, divide=dist.get_world_size())


def ddp_weights_only(dist, model, batches, lr):
    """Only the weight matrices all-reduced (p.dim() > 1): the biases keep each rank's own gradient."""
    world = dist.get_world_size()

    def weights_only(p):
        if p.dim() > 1:
            dist.all_reduce(p.grad)
            p.grad /= world
    return _ddp(dist, model, batches, lr, after_backward=weights_only)


def ddp_async_never_waited(dist, model, batches, lr):
    """dist.all_reduce(p.grad, async_op=True) for overlap, and the work handles never waited on."""
    world = dist.get_world_size()
    return _ddp(dist, model, batches, lr,
                after_backward=lambda p: (dist.all_reduce(p.grad, async_op=True), p.grad.div_(world)))


def ddp_last_parameter_left_out(dist, model, batches, lr):
    """The all-reduce loop over list(model.parameters())[:-1]: the output layer's bias keeps each rank's gradient."""
    world = dist.get_world_size()
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in list(model.parameters())[:-1]:
                dist.all_reduce(p.grad)
                p.grad /= world
            for p in model.parameters():
                p -= lr * p.grad
    return model


def ddp_loss_divided_instead(dist, model, batches, lr):
    """The loss divided by the world size before backward 'to average', and no all-reduce at all."""
    world = dist.get_world_size()
    for x, y in batches:
        model.zero_grad()
        (F.mse_loss(model(x), y) / world).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return model


# ---- bucketed_data_parallel_train ---------------------------------------------------------------------------
def _bucketed(dist, model, batches, lr, bucket_size, *, order=reversed, reset=True, write_back=True,
              wait_in_hook=False, divide=True, register=lambda p, hook: p.register_post_accumulate_grad_hook(hook),
              zero=True, drop_partial=False):
    """Bucketed DDP as the hints lay it out, with one step changed."""
    world = dist.get_world_size()
    params = list(model.parameters())
    buckets, current = [], []
    for p in order(params):
        current.append(p)
        if sum(q.numel() for q in current) >= bucket_size:
            buckets.append(current)
            current = []
    if current and not drop_partial:
        buckets.append(current)
    bucket_of = {id(p): i for i, b in enumerate(buckets) for p in b}
    pending, ready = [], [0] * len(buckets)

    def on_grad(p):
        if id(p) not in bucket_of:
            return
        i = bucket_of[id(p)]
        ready[i] += 1
        if ready[i] == len(buckets[i]):
            flat = torch.cat([q.grad.reshape(-1) for q in buckets[i]])
            work = dist.all_reduce(flat, async_op=True)
            if wait_in_hook:
                work.wait()
            pending.append((buckets[i], flat, work))

    hooks = [register(p, on_grad) for p in params]
    for x, y in batches:
        if zero:
            model.zero_grad()
        pending.clear()
        if reset:
            ready[:] = [0] * len(buckets)
        F.mse_loss(model(x), y).backward()
        for bucket, flat, work in pending:
            work.wait()
            if divide:
                flat /= world
            for p, g in zip(bucket, flat.split([q.numel() for q in bucket])):
                if write_back:
                    p.grad.copy_(g.view_as(p))
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
    for h in hooks:
        h.remove()
    return model


def bucketed_only_full_buckets(dist, model, batches, lr, bucket_size):
    """Buckets planned ahead, in backward's order, and only those that reach bucket_size kept ('a bucket is launched
    when full'): the remainder, the first layer's gradients, is in no bucket and never all-reduced."""
    return _bucketed(dist, model, batches, lr, bucket_size, drop_partial=True)


def bucketed_counters_never_reset(dist, model, batches, lr, bucket_size):
    """The per-bucket counters of ready gradients are not reset between steps: from step 2 no bucket ever
    completes, so nothing is all-reduced."""
    return _bucketed(dist, model, batches, lr, bucket_size, reset=False)


def bucketed_results_left_in_the_flat_buffer(dist, model, batches, lr, bucket_size):
    """The flat bucket all-reduced and averaged, but never copied back into p.grad: torch.cat made a copy."""
    return _bucketed(dist, model, batches, lr, bucket_size, write_back=False)


def bucketed_with_tensor_hooks(dist, model, batches, lr, bucket_size):
    """p.register_hook(lambda grad: on_grad(p)) where the hints say register_post_accumulate_grad_hook: a tensor
    hook fires before the gradient is accumulated, so p.grad is not there yet (pytorch/pytorch#76464)."""
    return _bucketed(dist, model, batches, lr, bucket_size, register=lambda p, hook: p.register_hook(
        lambda grad: hook(p)))


def bucketed_waiting_in_the_hook(dist, model, batches, lr, bucket_size):
    """work.wait() right after launching each bucket's all-reduce inside the hook: backward stops until it ends."""
    return _bucketed(dist, model, batches, lr, bucket_size, wait_in_hook=True)


def bucketed_zero_grad_forgotten(dist, model, batches, lr, bucket_size):
    """The hooks' buckets right, and no model.zero_grad() in the loop: a hook fires on the accumulated .grad, so from
    the second step each bucket carries the previous steps' gradients as well."""
    return _bucketed(dist, model, batches, lr, bucket_size, zero=False)


def bucketed_without_averaging(dist, model, batches, lr, bucket_size):
    """Buckets all-reduced and copied back, but the division by the world size forgotten."""
    return _bucketed(dist, model, batches, lr, bucket_size, divide=False)



def all_reduce_a_grad_read_before_backward(dist, model, batches, lr):
    """Each gradient read into a name and all-reduced before backward has run: the name holds None."""
    world = dist.get_world_size()
    for x, y in batches:
        model.zero_grad(set_to_none=True)
        for p in model.parameters():
            grad = p.grad
            dist.all_reduce(grad)
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad / world
    return model


def all_reduce_gather_waits_its_send_first(dist, x):
    """Reduce-scatter as the notebook's; the all-gather waits on each isend before posting the recv its peer needs."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n = x.numel()
    chunks = list(F.pad(x, (0, -n % world)).chunk(world))
    buf = torch.empty_like(chunks[0])
    for step in range(world - 1):
        send = dist.isend(chunks[(rank - step - 1) % world], (rank + 1) % world)
        dist.recv(buf, (rank - 1) % world)
        send.wait()
        chunks[(rank - step - 2) % world] = chunks[(rank - step - 2) % world] + buf
    for step in range(world - 1):
        dist.isend(chunks[(rank - step) % world], (rank + 1) % world).wait()
        dist.recv(chunks[(rank - step - 1) % world], (rank - 1) % world)
    return torch.cat(chunks)[:n]

MISTAKES = [
    Attempt("param_server_all_reduce", server_without_its_own_x, named=PART_OF_THE_SUM),
    Attempt("param_server_all_reduce", server_answers_as_it_goes, named=PART_OF_THE_SUM),
    Attempt("param_server_all_reduce", server_receives_into_x, named=PART_OF_THE_SUM),
    Attempt("param_server_all_reduce", server_averages, named="N, the world size"),
    Attempt("param_server_all_reduce", workers_wait_for_the_sum_first, named="Deadlock"),
    Attempt("ring_reduce_scatter", reduce_scatter_textbook_indices, named="holds what rank"),
    Attempt("ring_reduce_scatter", reduce_scatter_returns_its_own_partial_chunk, named=PART_OF_THE_SUM),
    Attempt("ring_reduce_scatter", reduce_scatter_copies_instead_of_adding, named=PART_OF_THE_SUM),
    Attempt("ring_reduce_scatter", reduce_scatter_n_steps, named=("N steps where N-1", "one step too many")),
    Attempt("ring_reduce_scatter", reduce_scatter_averaging, named="N, the world size"),
    Attempt("ring_reduce_scatter", reduce_scatter_loop_from_one, named=("left out of the sum", "nothing received")),
    Attempt("ring_reduce_scatter", reduce_scatter_mirrored_neighbours, named="a ring run to the left"),
    Attempt("ring_reduce_scatter", reduce_scatter_sending_left, named=("wrong peer", "Deadlock")),
    Attempt("ring_reduce_scatter", reduce_scatter_own_chunk_sent_first, named="if the chunk indices are one ahead"),
    Attempt("ring_reduce_scatter", reduce_scatter_add_not_in_place, named="chunk.add(buf) returns a new tensor"),
    Attempt("ring_all_gather", all_gather_one_receive_buffer, named="the slots share one tensor"),
    Attempt("ring_all_gather", all_gather_stores_by_step, named=("is not the one it sends on one step later",
                                                                  "no step stored what it received there")),
    Attempt("ring_all_reduce", all_reduce_unpadded_buffers_like_its_own_chunk, named="Pad x to a multiple of N first"),
    Attempt("bucketed_data_parallel_train", bucketed_only_full_buckets, named="each step's last bucket"),
    Attempt("ring_all_gather", all_gather_in_arrival_order, named=LAYOUT),
    Attempt("ring_all_gather", all_gather_own_chunk_first, named=LAYOUT),
    Attempt("ring_all_gather", all_gather_one_step_short, named="uninitialised"),
    Attempt("ring_all_gather", all_gather_received_ahead, named=LAYOUT + ("no step wrote that part",)),
    Attempt("ring_all_gather", all_gather_always_sends_its_own, named=LAYOUT),
    Attempt("ring_all_gather", all_gather_sends_the_slot_it_fills, named="no earlier step wrote that slot"),
    Attempt("ring_all_gather", all_gather_slot_by_arrival, named="in the order they arrived"),
    Attempt("ring_all_reduce", all_reduce_phases_disagree, named=LAYOUT),
    Attempt("ring_all_reduce", all_reduce_averaging, named="N, the world size"),
    Attempt("ring_all_reduce", all_reduce_gather_adds, named=("adds what it receives", "added where it should copy")),
    Attempt("ring_all_reduce", all_reduce_forgets_the_gather, named=A_SHARD_FOR_THE_WHOLE),
    Attempt("ring_all_reduce", all_reduce_gathers_the_input, named="before the reduce-scatter summed it"),
    # x of 2 at N = 2 pads to 4, the bytes of a ring that sends the whole x: there only the budget can say it
    Attempt("ring_all_reduce", all_reduce_chunk_as_floor_plus_one, named=("is padded only up to the next multiple",
                                                                         "over the budget of 8 B")),
    Attempt("ring_all_reduce", all_reduce_by_passing_sums, named="over the budget"),
    Attempt("ring_all_reduce", all_reduce_padded_by_n_mod_n, named="over the budget"),
    Attempt("ring_all_reduce", all_reduce_padding_in_front, named=("toward the end", "went in front of x")),
    Attempt("ring_all_reduce", all_reduce_padding_cut_from_the_front, named=("toward the start", "cut off its front")),
    Attempt("ring_all_reduce", all_reduce_padding_kept, named="the padding was never cut off"),
    Attempt("data_parallel_train", ddp_without_zero_grad, named="at step 2"),
    Attempt("data_parallel_train", ddp_dividing_twice, named="N, the world size"),
    Attempt("data_parallel_train", ddp_average_op_then_divide, named="N, the world size"),
    Attempt("data_parallel_train", ddp_weights_only, named=("gradient was not averaged across ranks",
                                                            "were never all-reduced")),
    Attempt("data_parallel_train", ddp_async_never_waited, named="wait"),
    Attempt("data_parallel_train", ddp_last_parameter_left_out, named="was never all-reduced, each rank updating it"),
    Attempt("data_parallel_train", ddp_loss_divided_instead, named=("never all-reduced", "training alone")),
    Attempt("bucketed_data_parallel_train", bucketed_counters_never_reset, named="at step 2"),
    Attempt("bucketed_data_parallel_train", bucketed_results_left_in_the_flat_buffer,
            named=("never all-reduced", "training alone")),
    Attempt("bucketed_data_parallel_train", bucketed_with_tensor_hooks, named=NO_GRADIENT),
    Attempt("data_parallel_train", all_reduce_a_grad_read_before_backward, named="backward never reached"),
    Attempt("ring_all_reduce", all_reduce_gather_waits_its_send_first, named="before waiting on a send"),
    Attempt("bucketed_data_parallel_train", bucketed_waiting_in_the_hook, named="simulated time"),
    Attempt("bucketed_data_parallel_train", bucketed_zero_grad_forgotten, named=("never zeroed", "at step 2")),
    Attempt("bucketed_data_parallel_train", bucketed_without_averaging,
            named=("N, the world size", "without dividing by N")),
]
