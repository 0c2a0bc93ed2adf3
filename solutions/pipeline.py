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


def interleaved_1f1b(dist, chunks, batch, targets, m):
    rank, p = dist.get_rank(), dist.get_world_size()
    v = len(chunks)                                      # chunk c of this rank is virtual stage c·p + rank
    if m % p:
        raise ValueError(f"interleaved 1F1B runs micro-batches in groups of p: m={m} must be a multiple of p={p}")
    xs, ys = batch.chunk(m), targets.chunk(m)
    last = p * v - 1
    ahead, behind = (rank + 1) % p, (rank - 1) % p       # stage s+1 is on the next rank, round the ring
    ACT, GRAD = 0, 1                                     # tags: rank p-1 -> 0 carries both when p = 2
    sends, stash, inbox = [], {}, {}
    total = m * v

    def unit(k, forward):
        """This rank's k-th forward (or backward): micro-batches in groups of p, each group through
        every chunk (forwards chunk 0, 1, ..., backwards chunk v-1, ..., 0)."""
        c, j = k // p % v, k // (p * v) * p + k % p
        return (c, j) if forward else (v - 1 - c, j)

    def take(kind, k):
        """The input of this rank's k-th forward ("F") or backward ("B"), received ahead: the irecv for
        the next one is posted now, so a sender never waits for this rank to reach its recv."""
        for i in (k, k + 1):
            c, j = unit(i, kind == "F") if i < total else (None, None)
            s = None if c is None else c * p + rank
            if (kind, i) not in inbox and s is not None and (s > 0 if kind == "F" else s < last):
                buf = torch.empty_like(xs[j])
                inbox[kind, i] = buf, dist.irecv(buf, behind if kind == "F" else ahead,
                                                 tag=ACT if kind == "F" else GRAD)
        buf, work = inbox.pop((kind, k))
        work.wait()
        return buf

    def forward(k):
        c, j = unit(k, True)
        s = c * p + rank
        x = xs[j].clone() if s == 0 else take("F", k)
        x.requires_grad_()
        out = chunks[c](x)
        if s == last:
            out = F.mse_loss(out, ys[j]) / m
        else:
            sends.append(dist.isend(out.detach(), ahead, tag=ACT))
        stash[c, j] = (x, out)

    def backward(k):
        c, j = unit(k, False)
        s = c * p + rank
        x, out = stash.pop((c, j))
        if s == last:
            out.backward()
        else:
            out.backward(take("B", k))
        if s > 0:
            sends.append(dist.isend(x.grad, behind, tag=GRAD))

    warm = min((p - rank - 1) * 2 + (v - 1) * p, total)  # Megatron-LM's warm-up depth
    for k in range(warm):
        forward(k)
    for i in range(total - warm):                        # steady state: one forward, one backward
        forward(warm + i)
        backward(i)
    for k in range(total - warm, total):                 # cool-down
        backward(k)
    for s in sends:
        s.wait()
    return chunks


def zero_bubble(dist, stage, batch, targets, m):
    rank, p = dist.get_rank(), dist.get_world_size()
    if m < p:
        raise ValueError(f"ZB-H1 needs at least as many micro-batches as stages: m={m} < p={p}")
    xs, ys = batch.chunk(m), targets.chunk(m)
    sends, stash, waiting = [], {}, []

    def forward(j):
        if rank == 0:
            x = xs[j].clone()                            # the batch needs no gradient: B skips that matmul
        else:
            x = torch.empty_like(xs[j])
            dist.recv(x, rank - 1)
            x.requires_grad_()
        h, linears = x, []
        for layer in stage:                              # layer by layer, keeping each Linear's input and output
            out = layer(h)
            if isinstance(layer, torch.nn.Linear):
                linears.append((layer, h, out))
            h = out
        if rank == p - 1:
            h = F.mse_loss(h, ys[j]) / m
        else:
            sends.append(dist.isend(h.detach(), rank + 1))
        stash[j] = (x, h, linears)

    def input_grad(j):                                   # B: on the critical path, the previous stage waits for it
        x, out, linears = stash.pop(j)
        grad = None
        if rank < p - 1:
            grad = torch.empty_like(out)
            dist.recv(grad, rank + 1)
        wanted = [y for _, _, y in linears] + ([x] if rank > 0 else [])
        grads = torch.autograd.grad(out, wanted, grad)   # input gradients only; the graph is freed
        if rank > 0:
            sends.append(dist.isend(grads[-1], rank - 1))
        waiting.append([(layer, inp.detach(), dy) for (layer, inp, _), dy in zip(linears, grads)])

    def weight_grad():                                   # W: dW = dYᵀX and db = ΣdY for each Linear
        for layer, inp, dy in waiting.pop(0):
            for prm, g in ((layer.weight, dy.T @ inp), (layer.bias, dy.sum(0))):
                if prm.grad is None:
                    prm.grad = g
                else:
                    prm.grad += g

    warm = p - rank - 1
    for j in range(warm):                                # warm-up, as 1F1B
        forward(j)
    for j in range(m):
        if warm + j < m:
            forward(warm + j)
        input_grad(j)
        if len(waiting) > rank:                          # ZB-H1: rank r keeps at most r W waiting
            weight_grad()
    while waiting:                                       # the W left fill the cool-down
        weight_grad()
    for s in sends:
        s.wait()
    return stage
