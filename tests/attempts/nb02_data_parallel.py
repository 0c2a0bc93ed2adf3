"""Notebook 02 (data parallel and collectives): first attempts, written from the notebook alone."""
import torch
import torch.nn.functional as F

import lib
from lib import sim
from puzzles import data_parallel as P


# ---------------------------------------------------------------- puzzle 1: param_server_all_reduce

def param_server_all_reduce_forgot_own(dist, x):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total = torch.zeros_like(x)           # forgot to start from my own x
        buf = torch.empty_like(x)
        for src in range(1, n):
            dist.recv(buf, src)
            total += buf
        for dst in range(1, n):
            dist.send(total, dst)
        return total
    dist.send(x, 0)
    dist.recv(x, 0)
    return x


def param_server_all_reduce_shared_buffer(dist, x):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        bufs = [torch.empty_like(x) for _ in range(n - 1)]
        works = [dist.irecv(bufs[i], i + 1) for i in range(n - 1)]
        total = x.clone()
        for w, b in zip(works, bufs):
            w.wait()
            total += b
        for dst in range(1, n):
            dist.send(total, dst)
        return total
    dist.send(x, 0)
    out = torch.empty_like(x)
    dist.recv(out, 0)
    return out


def param_server_all_reduce_no_wait(dist, x):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total = x.clone()
        for src in range(1, n):
            buf = torch.empty_like(x)
            dist.irecv(buf, src)              # forgot .wait()
            total += buf
        for dst in range(1, n):
            dist.send(total, dst)
        return total
    dist.send(x, 0)
    out = torch.empty_like(x)
    dist.recv(out, 0)
    return out


def param_server_all_reduce_workers_recv_first(dist, x):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total = x.clone()
        buf = torch.empty_like(x)
        for src in range(1, n):
            dist.recv(buf, src)
            total += buf
        for dst in range(1, n):
            dist.send(total, dst)
        return total
    out = torch.empty_like(x)
    dist.recv(out, 0)                         # wait for the sum first, then send mine
    dist.send(x, 0)
    return out


def param_server_all_reduce_mean(dist, x):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total = x.clone()
        buf = torch.empty_like(x)
        for src in range(1, n):
            dist.recv(buf, src)
            total += buf
        total /= n                            # all-reduce averages, I thought
        for dst in range(1, n):
            dist.send(total, dst)
        return total
    dist.send(x, 0)
    out = torch.empty_like(x)
    dist.recv(out, 0)
    return out


def param_server_all_reduce_isend_back(dist, x):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        bufs = [torch.empty_like(x) for _ in range(1, n)]
        for w in [dist.irecv(b, src) for src, b in zip(range(1, n), bufs)]:
            w.wait()
        total = x.clone()
        for b in bufs:
            total += b
        for w in [dist.isend(total, dst) for dst in range(1, n)]:
            w.wait()
        return total
    dist.send(x, 0)
    out = torch.empty_like(x)
    dist.recv(out, 0)
    return out


# ---------------------------------------------------------------- puzzle 2: ring_reduce_scatter

def ring_reduce_scatter_off_by_one(dist, x):
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in x.flatten().chunk(n)]
    for step in range(n - 1):
        send_i = (r - step) % n               # starts with my own chunk
        recv_i = (r - step - 1) % n
        buf = torch.empty_like(chunks[recv_i])
        w = dist.isend(chunks[send_i], (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        w.wait()
        chunks[recv_i] += buf
    return chunks[r]


def ring_reduce_scatter_blocking(dist, x):
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in x.flatten().chunk(n)]
    for step in range(n - 1):
        send_i = (r - step - 1) % n
        recv_i = (r - step - 2) % n
        buf = torch.empty_like(chunks[recv_i])
        dist.send(chunks[send_i], (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        chunks[recv_i] += buf
    return chunks[r]


def ring_reduce_scatter_n_steps(dist, x):
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in x.flatten().chunk(n)]
    for step in range(n):                     # N steps, to go all the way round
        send_i = (r - step - 1) % n
        recv_i = (r - step - 2) % n
        buf = torch.empty_like(chunks[recv_i])
        w = dist.isend(chunks[send_i], (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        w.wait()
        chunks[recv_i] += buf
    return chunks[r]


def ring_reduce_scatter_overwrite(dist, x):
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in x.flatten().chunk(n)]
    for step in range(n - 1):
        send_i = (r - step - 1) % n
        recv_i = (r - step - 2) % n
        buf = torch.empty_like(chunks[recv_i])
        w = dist.isend(chunks[send_i], (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        w.wait()
        chunks[recv_i] = buf                  # replaced instead of adding
    return chunks[r]


def ring_reduce_scatter_inplace_views(dist, x):
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = x.view(-1).chunk(n)              # views of the caller's x, added into in place
    for step in range(n - 1):
        send_i = (r - step - 1) % n
        recv_i = (r - step - 2) % n
        buf = torch.empty_like(chunks[recv_i])
        w = dist.isend(chunks[send_i], (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        w.wait()
        chunks[recv_i].add_(buf)
    return chunks[r]


def ring_reduce_scatter_wrong_direction(dist, x):
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in x.flatten().chunk(n)]
    for step in range(n - 1):
        send_i = (r - step - 1) % n
        recv_i = (r - step - 2) % n
        buf = torch.empty_like(chunks[recv_i])
        w = dist.isend(chunks[send_i], (r - 1) % n)   # sent to the left neighbour
        dist.recv(buf, (r + 1) % n)
        w.wait()
        chunks[recv_i] += buf
    return chunks[r]


def ring_reduce_scatter_even_odd(dist, x):
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in x.flatten().chunk(n)]
    for step in range(n - 1):
        send_i = (r - step - 1) % n
        recv_i = (r - step - 2) % n
        buf = torch.empty_like(chunks[recv_i])
        if r % 2 == 0:
            dist.send(chunks[send_i], (r + 1) % n)
            dist.recv(buf, (r - 1) % n)
        else:
            dist.recv(buf, (r - 1) % n)
            dist.send(chunks[send_i], (r + 1) % n)
        chunks[recv_i] = chunks[recv_i] + buf
    return chunks[r]


# ---------------------------------------------------------------- puzzle 3: ring_all_gather

def ring_all_gather_rotated(dist, chunk):
    r, n = dist.get_rank(), dist.get_world_size()
    got = [chunk]
    current = chunk
    for step in range(n - 1):
        buf = torch.empty_like(chunk)
        w = dist.isend(current, (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        w.wait()
        got.append(buf)
        current = buf
    return torch.cat(got)                     # in the order they arrived


def ring_all_gather_wrong_slot(dist, chunk):
    r, n = dist.get_rank(), dist.get_world_size()
    parts = [None] * n
    parts[r] = chunk
    for step in range(n - 1):
        send_i = (r - step) % n
        recv_i = (r + step + 1) % n           # the chunk comes from the right, I thought
        buf = torch.empty_like(chunk)
        w = dist.isend(parts[send_i], (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        w.wait()
        parts[recv_i] = buf
    return torch.cat(parts)


def ring_all_gather_resend_own(dist, chunk):
    r, n = dist.get_rank(), dist.get_world_size()
    parts = [None] * n
    parts[r] = chunk
    for step in range(n - 1):
        recv_i = (r - step - 1) % n
        buf = torch.empty_like(chunk)
        w = dist.isend(chunk, (r + 1) % n)    # kept sending my own chunk
        dist.recv(buf, (r - 1) % n)
        w.wait()
        parts[recv_i] = buf
    return torch.cat(parts)


def ring_all_gather_direct(dist, chunk):
    r, n = dist.get_rank(), dist.get_world_size()
    parts = [None] * n
    parts[r] = chunk
    sends = [dist.isend(chunk, d) for d in range(n) if d != r]
    for s in range(n):
        if s != r:
            parts[s] = torch.empty_like(chunk)
            dist.recv(parts[s], s)
    for w in sends:
        w.wait()
    return torch.cat(parts)


def ring_all_gather_blocking(dist, chunk):
    r, n = dist.get_rank(), dist.get_world_size()
    parts = [None] * n
    parts[r] = chunk
    for step in range(n - 1):
        send_i = (r - step) % n
        recv_i = (r - step - 1) % n
        buf = torch.empty_like(chunk)
        dist.send(parts[send_i], (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        parts[recv_i] = buf
    return torch.cat(parts)


def ring_all_gather_preallocated(dist, chunk):
    r, n = dist.get_rank(), dist.get_world_size()
    k = chunk.shape[0]
    out = torch.empty((n * k,) + tuple(chunk.shape[1:]), dtype=chunk.dtype)
    out[r * k:(r + 1) * k] = chunk
    for step in range(n - 1):
        s_i, r_i = (r - step) % n, (r - step - 1) % n
        w = dist.isend(out[s_i * k:(s_i + 1) * k].contiguous(), (r + 1) % n)
        buf = torch.empty_like(chunk)
        dist.recv(buf, (r - 1) % n)
        w.wait()
        out[r_i * k:(r_i + 1) * k] = buf
    return out


# ---------------------------------------------------------------- puzzle 4: ring_all_reduce

def _rs(dist, flat):
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in flat.chunk(n)]
    for step in range(n - 1):
        s_i, r_i = (r - step - 1) % n, (r - step - 2) % n
        buf = torch.empty_like(chunks[r_i])
        w = dist.isend(chunks[s_i], (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        w.wait()
        chunks[r_i] += buf
    return chunks[r]


def _ag(dist, chunk):
    r, n = dist.get_rank(), dist.get_world_size()
    parts = [None] * n
    parts[r] = chunk
    for step in range(n - 1):
        s_i, r_i = (r - step) % n, (r - step - 1) % n
        buf = torch.empty_like(chunk)
        w = dist.isend(parts[s_i], (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        w.wait()
        parts[r_i] = buf
    return torch.cat(parts)


def ring_all_reduce_no_padding(dist, x):
    return _ag(dist, _rs(dist, x.flatten())).reshape(x.shape)


def ring_all_reduce_flat_result(dist, x):
    n = dist.get_world_size()
    flat = x.flatten()
    pad = (-flat.numel()) % n
    flat = torch.cat([flat, flat.new_zeros(pad)])
    return _ag(dist, _rs(dist, flat))[:x.numel()]   # forgot to reshape back


def ring_all_reduce_mean(dist, x):
    n = dist.get_world_size()
    flat = x.flatten()
    pad = (-flat.numel()) % n
    flat = torch.cat([flat, flat.new_zeros(pad)])
    return (_ag(dist, _rs(dist, flat))[:x.numel()] / n).reshape(x.shape)


def ring_all_reduce_gather_whole(dist, x):
    # reduce-scatter, then I all-gathered x's own chunk instead of the reduced one
    n = dist.get_world_size()
    flat = x.flatten()
    pad = (-flat.numel()) % n
    flat = torch.cat([flat, flat.new_zeros(pad)])
    reduced = _rs(dist, flat)
    mine = flat.chunk(n)[dist.get_rank()]
    return _ag(dist, mine)[:x.numel()].reshape(x.shape)


def ring_all_reduce_pad_by_one(dist, x):
    n = dist.get_world_size()
    flat = x.flatten()
    pad = n - flat.numel() % n                # pads n zeros when it already divides
    flat = torch.cat([flat, flat.new_zeros(pad)])
    return _ag(dist, _rs(dist, flat))[:x.numel()].reshape(x.shape)


def ring_all_reduce_padded(dist, x):
    n = dist.get_world_size()
    flat = x.reshape(-1)
    c = -(-flat.numel() // n)
    padded = flat.new_zeros(n * c)
    padded[:flat.numel()] = flat
    return _ag(dist, _rs(dist, padded))[:flat.numel()].view_as(x)


# ---------------------------------------------------------------- puzzle 5: data_parallel_train

def data_parallel_train_no_divide(dist, model, batches, lr):
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p -= lr * p.grad
                p.grad = None
    return model


def data_parallel_train_keeps_grads(dist, model, batches, lr):
    n = dist.get_world_size()
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= n
                p -= lr * p.grad
    return model


def data_parallel_train_reduce_weights(dist, model, batches, lr):
    n = dist.get_world_size()
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
                dist.all_reduce(p)            # average the models after the step
                p /= n
                p.grad = None
    return model


def data_parallel_train_async_no_wait(dist, model, batches, lr):
    n = dist.get_world_size()
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.grad, async_op=True)
                p -= lr * p.grad / n
                p.grad = None
    return model


def data_parallel_train_step_before_reduce(dist, model, batches, lr):
    n = dist.get_world_size()
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
                dist.all_reduce(p.grad)
                p.grad /= n
                p.grad = None
    return model


def data_parallel_train_scaled_loss(dist, model, batches, lr):
    n = dist.get_world_size()
    for x, y in batches:
        model.zero_grad(set_to_none=True)
        (F.mse_loss(model(x), y) / n).backward()
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.sub_(lr * p.grad)
    return model


# ---------------------------------------------------------------- puzzle 6: bucketed_data_parallel_train

def _sgd_from_buckets(dist, model, pending, lr, divide=True):
    n = dist.get_world_size()
    with torch.no_grad():
        for work, flat, params in pending:
            work.wait()
            if divide:
                flat /= n
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        for p in model.parameters():
            p -= lr * p.grad
            p.grad = None


def bucketed_data_parallel_train_reduce_param(dist, model, batches, lr, bucket_size):
    n = dist.get_world_size()
    state = {"bucket": [], "works": []}

    def hook(p):
        state["bucket"].append(p)
        if sum(q.numel() for q in state["bucket"]) >= bucket_size:
            for q in state["bucket"]:
                state["works"].append(dist.all_reduce(q.data, async_op=True))   # what the hook receives
            state["bucket"] = []

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        for q in state["bucket"]:
            state["works"].append(dist.all_reduce(q.data, async_op=True))
        state["bucket"] = []
        for w in state["works"]:
            w.wait()
        state["works"] = []
        with torch.no_grad():
            for p in model.parameters():
                p /= n
                p -= lr * p.grad
                p.grad = None
    return model


def bucketed_data_parallel_train_hooks_each_step(dist, model, batches, lr, bucket_size):
    for x, y in batches:
        state = {"bucket": [], "pending": []}

        def hook(p, state=state):
            state["bucket"].append(p)
            if sum(q.numel() for q in state["bucket"]) >= bucket_size:
                flat = torch.cat([q.grad.flatten() for q in state["bucket"]])
                state["pending"].append((dist.all_reduce(flat, async_op=True), flat, state["bucket"]))
                state["bucket"] = []

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(hook)   # registered again every step
        F.mse_loss(model(x), y).backward()
        if state["bucket"]:
            flat = torch.cat([q.grad.flatten() for q in state["bucket"]])
            state["pending"].append((dist.all_reduce(flat, async_op=True), flat, state["bucket"]))
        _sgd_from_buckets(dist, model, state["pending"], lr)
    return model


def bucketed_data_parallel_train_no_flush(dist, model, batches, lr, bucket_size):
    state = {"bucket": [], "pending": []}

    def hook(p):
        state["bucket"].append(p)
        if sum(q.numel() for q in state["bucket"]) >= bucket_size:
            flat = torch.cat([q.grad.flatten() for q in state["bucket"]])
            state["pending"].append((dist.all_reduce(flat, async_op=True), flat, state["bucket"]))
            state["bucket"] = []

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        # forgot the last, smaller bucket
        _sgd_from_buckets(dist, model, state["pending"], lr)
        state["pending"], state["bucket"] = [], []
    return model


def bucketed_data_parallel_train_sync(dist, model, batches, lr, bucket_size):
    state = {"bucket": [], "pending": []}

    class Done:
        def wait(self):
            pass

    def hook(p):
        state["bucket"].append(p)
        if sum(q.numel() for q in state["bucket"]) >= bucket_size:
            flat = torch.cat([q.grad.flatten() for q in state["bucket"]])
            dist.all_reduce(flat)             # blocking, to be safe
            state["pending"].append((Done(), flat, state["bucket"]))
            state["bucket"] = []

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        if state["bucket"]:
            flat = torch.cat([q.grad.flatten() for q in state["bucket"]])
            dist.all_reduce(flat)
            state["pending"].append((Done(), flat, state["bucket"]))
        _sgd_from_buckets(dist, model, state["pending"], lr)
        state["pending"], state["bucket"] = [], []
    return model


def bucketed_data_parallel_train_per_param(dist, model, batches, lr, bucket_size):
    state = {"pending": []}

    def hook(p):
        flat = p.grad.flatten().clone()       # one all-reduce per gradient, simpler
        state["pending"].append((dist.all_reduce(flat, async_op=True), flat, [p]))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        _sgd_from_buckets(dist, model, state["pending"], lr)
        state["pending"] = []
    return model


def bucketed_data_parallel_train_no_average(dist, model, batches, lr, bucket_size):
    state = {"bucket": [], "pending": []}

    def hook(p):
        state["bucket"].append(p)
        if sum(q.numel() for q in state["bucket"]) >= bucket_size:
            flat = torch.cat([q.grad.flatten() for q in state["bucket"]])
            state["pending"].append((dist.all_reduce(flat, async_op=True), flat, state["bucket"]))
            state["bucket"] = []

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        if state["bucket"]:
            flat = torch.cat([q.grad.flatten() for q in state["bucket"]])
            state["pending"].append((dist.all_reduce(flat, async_op=True), flat, state["bucket"]))
        _sgd_from_buckets(dist, model, state["pending"], lr, divide=False)
        state["pending"], state["bucket"] = [], []
    return model


def bucketed_data_parallel_train_prescaled(dist, model, batches, lr, bucket_size):
    n = dist.get_world_size()
    pending, bucket = [], []

    def launch():
        flat = torch.cat([q.grad.flatten() for q in bucket]) / n   # divide before the sum
        pending.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
        bucket.clear()

    def hook(p):
        bucket.append(p)
        if sum(q.numel() for q in bucket) >= bucket_size:
            launch()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        if bucket:
            launch()
        _sgd_from_buckets(dist, model, pending, lr, divide=False)
        pending.clear()
    return model


ATTEMPTS = [
    ("param_server_all_reduce", param_server_all_reduce_forgot_own, "the server summed the others' x but not its own"),
    ("param_server_all_reduce", param_server_all_reduce_no_wait, "irecv without .wait() before adding"),
    ("param_server_all_reduce", param_server_all_reduce_workers_recv_first, "workers wait for the sum before sending their x (deadlock)"),
    ("param_server_all_reduce", param_server_all_reduce_mean, "divided by N: returned the mean, not the sum"),
    ("param_server_all_reduce", param_server_all_reduce_shared_buffer, "correct: the server posts every irecv at once"),
    ("param_server_all_reduce", param_server_all_reduce_isend_back, "correct: isend of the sum to every worker, then wait on all"),
    ("ring_reduce_scatter", ring_reduce_scatter_off_by_one, "ring step index off by one: first send is my own chunk, so I end with chunk r+1"),
    ("ring_reduce_scatter", ring_reduce_scatter_blocking, "blocking send before recv on every rank (deadlock)"),
    ("ring_reduce_scatter", ring_reduce_scatter_n_steps, "ran N steps instead of N-1"),
    ("ring_reduce_scatter", ring_reduce_scatter_overwrite, "replaced the chunk with the received one instead of adding"),
    ("ring_reduce_scatter", ring_reduce_scatter_inplace_views, "correct: adds into views of x in place, which the statement lets a rank use as scratch"),
    ("ring_reduce_scatter", ring_reduce_scatter_wrong_direction, "sent left and received from the right, with the right-going indices"),
    ("ring_reduce_scatter", ring_reduce_scatter_even_odd, "correct: blocking calls, even ranks send first and odd ranks receive first"),
    ("ring_all_gather", ring_all_gather_rotated, "concatenated in arrival order, starting from my own chunk"),
    ("ring_all_gather", ring_all_gather_wrong_slot, "stored the received chunk at r+step+1 instead of r-step-1"),
    ("ring_all_gather", ring_all_gather_resend_own, "sent my own chunk at every step instead of forwarding the last received"),
    ("ring_all_gather", ring_all_gather_direct, "sent my chunk straight to every rank, not round the ring"),
    ("ring_all_gather", ring_all_gather_blocking, "blocking send before recv (deadlock)"),
    ("ring_all_gather", ring_all_gather_preallocated, "correct: writes into one preallocated output and sends slices of it"),
    ("ring_all_reduce", ring_all_reduce_no_padding, "no padding: when numel does not divide by N, chunk() gives the wrong number of pieces"),
    ("ring_all_reduce", ring_all_reduce_flat_result, "forgot to reshape the flat result back to x's shape"),
    ("ring_all_reduce", ring_all_reduce_mean, "divided by N (mean instead of sum)"),
    ("ring_all_reduce", ring_all_reduce_gather_whole, "all-gathered my unreduced chunk instead of the reduce-scatter's result"),
    ("ring_all_reduce", ring_all_reduce_pad_by_one, "padding formula pads N extra zeros when the size already divides"),
    ("ring_all_reduce", ring_all_reduce_padded, "correct: pad to N*ceil(n/N), reduce-scatter, all-gather, cut and view"),
    ("data_parallel_train", data_parallel_train_no_divide, "summed the gradients, forgot to divide by N"),
    ("data_parallel_train", data_parallel_train_keeps_grads, "never zeroed the gradients between steps"),
    ("data_parallel_train", data_parallel_train_reduce_weights, "stepped locally and averaged the weights instead of the gradients"),
    ("data_parallel_train", data_parallel_train_async_no_wait, "async all-reduce without wait()"),
    ("data_parallel_train", data_parallel_train_step_before_reduce, "updated the weights before all-reducing the gradients"),
    ("data_parallel_train", data_parallel_train_scaled_loss, "correct: divides the loss by N before backward, then sums the gradients"),
    ("bucketed_data_parallel_train", bucketed_data_parallel_train_reduce_param, "all-reduced what the hook receives (the parameter), averaging weights"),
    ("bucketed_data_parallel_train", bucketed_data_parallel_train_hooks_each_step, "registered the hooks again every step, so they pile up"),
    ("bucketed_data_parallel_train", bucketed_data_parallel_train_no_flush, "never launched the last, smaller bucket"),
    ("bucketed_data_parallel_train", bucketed_data_parallel_train_sync, "blocking all-reduce inside the hook (no overlap)"),
    ("bucketed_data_parallel_train", bucketed_data_parallel_train_per_param, "one all-reduce per gradient, ignoring bucket_size"),
    ("bucketed_data_parallel_train", bucketed_data_parallel_train_no_average, "forgot to divide the buckets by N"),
    ("bucketed_data_parallel_train", bucketed_data_parallel_train_prescaled, "correct: divides each bucket by N before its all-reduce"),
]
