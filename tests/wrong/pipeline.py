"""Wrong answers to notebook 05's puzzles, each with the words its failure message must contain.

A wrong answer must fail, whatever else it gets right; tests/test_content.py runs every catalogue.
"""

import torch
import torch.nn.functional as F


def _one_f_one_b(dist, stage, batch, targets, m, warm_of, blocking=False, keep_all=False, scale=True, refuse=True):
    """1F1B with knobs for the classic mistakes."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if refuse and m < p:
        raise ValueError(f"1F1B needs m >= p, got m={m}, p={p}")
    xs, ys = batch.chunk(m), targets.chunk(m)
    sends, stash, kept = [], {}, []
    send = (lambda t, peer: dist.send(t, peer)) if blocking else (lambda t, peer: sends.append(dist.isend(t, peer)))

    def forward(j):
        if rank == 0:
            x = xs[j].clone()
        else:
            x = torch.empty_like(xs[j])
            dist.recv(x, rank - 1)
        x.requires_grad_()
        out = stage(x)
        if rank == p - 1:
            out = F.mse_loss(out, ys[j]) / (m if scale else 1)
        else:
            send(out.detach(), rank + 1)
        stash[j] = (x, out)
        if keep_all:
            kept.append(stash[j])

    def backward(j):
        x, out = stash.pop(j)
        if rank == p - 1:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, rank + 1)
            out.backward(grad)
        if rank > 0:
            send(x.grad, rank - 1)

    warm = min(warm_of(p, rank), m)
    for j in range(warm):
        forward(j)
    for i in range(m - warm):
        forward(warm + i)
        backward(i)
    for j in range(m - warm, m):
        backward(j)
    for s in sends:
        s.wait()
    return stage


def one_f_one_b_warm_up_one_too_many(dist, stage, batch, targets, m):
    """Right gradients, but one micro-batch more of activations held on every stage."""
    return _one_f_one_b(dist, stage, batch, targets, m, lambda p, r: p - r)


def one_f_one_b_warm_up_one_too_few(dist, stage, batch, targets, m):
    """p-r-2 forwards before the first backward: less memory, but every stage waits for a gradient that is not
    there yet."""
    return _one_f_one_b(dist, stage, batch, targets, m, lambda p, r: max(p - r - 2, 0))


def one_f_one_b_blocking_sends(dist, stage, batch, targets, m):
    """Stage r sends its activation forward while stage r+1 sends its gradient back: both wait in send."""
    return _one_f_one_b(dist, stage, batch, targets, m, lambda p, r: p - r - 1, blocking=True)


def one_f_one_b_stashes_everything(dist, stage, batch, targets, m):
    """Keeps a reference to every micro-batch's activations until the end: GPipe's memory, 1F1B's order."""
    return _one_f_one_b(dist, stage, batch, targets, m, lambda p, r: p - r - 1, keep_all=True)


def one_f_one_b_is_gpipe(dist, stage, batch, targets, m):
    """All forwards, then all backwards: the right answer in the right time, but m micro-batches held."""
    return _one_f_one_b(dist, stage, batch, targets, m, lambda p, r: m)


def one_f_one_b_accepts_too_few_micro_batches(dist, stage, batch, targets, m):
    """Runs with m < p (every rank only warms up and cools down) instead of raising the ValueError asked for."""
    return _one_f_one_b(dist, stage, batch, targets, m, lambda p, r: min(p - r - 1, m), refuse=False)


def gpipe_forgets_one_over_m(dist, stage, batch, targets, m):
    """The sum of the micro-batch losses instead of their mean: gradients m times too large."""
    return _one_f_one_b(dist, stage, batch, targets, m, lambda p, r: m, scale=False)


def gpipe_one_micro_batch_at_a_time(dist, stage, batch, targets, m):
    """Each micro-batch goes all the way forward and back before the next starts: no overlap at all."""
    for j in range(m):
        _one_f_one_b(dist, stage, batch.chunk(m)[j], targets.chunk(m)[j], 1, lambda p, r: 1, refuse=False)
    for prm in stage.parameters():
        prm.grad /= m
    return stage


def stages_forget_requires_grad(dist, stage, batch, targets):
    """The received input is not marked requires_grad: x.grad stays None and nothing can go back."""
    rank, p = dist.get_rank(), dist.get_world_size()
    x = batch if rank == 0 else torch.empty_like(batch)
    if rank > 0:
        dist.recv(x, rank - 1)
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


def stages_only_the_last_trains(dist, stage, batch, targets):
    """Forward by send/recv, but no gradient goes back: only the last stage's gradients exist."""
    rank, p = dist.get_rank(), dist.get_world_size()
    x = batch if rank == 0 else torch.empty_like(batch)
    if rank > 0:
        dist.recv(x, rank - 1)
    out = stage(x)
    if rank == p - 1:
        F.mse_loss(out, targets).backward()
    else:
        dist.send(out.detach(), rank + 1)
    return stage


def _interleaved(dist, chunks, batch, targets, m, warm_of=None, tags=(0, 1), contiguous=False,
                 backward_chunks_reversed=True):
    """Interleaved 1F1B with knobs for the classic mistakes (the reference solution when left alone)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if m % p:
        raise ValueError(f"m={m} must be a multiple of p={p}")
    v = len(chunks)
    xs, ys = batch.chunk(m), targets.chunk(m)
    last, total = p * v - 1, m * v
    ACT, GRAD = tags
    sends, stash, inbox = [], {}, {}

    def stage_of(c):
        return rank * v + c if contiguous else c * p + rank

    def peer(s):
        return s // v if contiguous else s % p

    def unit(k, forward):
        c, j = k // p % v, k // (p * v) * p + k % p
        return (c, j) if forward or not backward_chunks_reversed else (v - 1 - c, j)

    def take(kind, k):
        for i in (k, k + 1):                         # the next one's irecv posted ahead
            if i >= total or (kind, i) in inbox:
                continue
            c, j = unit(i, kind == "F")
            s = stage_of(c)
            if (s > 0 and peer(s - 1) != rank) if kind == "F" else (s < last and peer(s + 1) != rank):
                buf = torch.empty_like(xs[j])
                src = peer(s - 1) if kind == "F" else peer(s + 1)
                inbox[kind, i] = buf, dist.irecv(buf, src, tag=ACT if kind == "F" else GRAD)
        buf, work = inbox.pop((kind, k))
        work.wait()
        return buf

    local = {}                                           # contiguous chunks: stage s+1 on the same rank

    def forward(k):
        c, j = unit(k, True)
        s = stage_of(c)
        if s == 0:
            x = xs[j].clone()
        elif peer(s - 1) == rank:
            x = local.pop(("F", s, j))
        else:
            x = take("F", k)
        x.requires_grad_()
        out = chunks[c](x)
        if s == last:
            out = F.mse_loss(out, ys[j]) / m
        elif peer(s + 1) == rank:
            local["F", s + 1, j] = out.detach()
        else:
            sends.append(dist.isend(out.detach(), peer(s + 1), tag=ACT))
        stash[c, j] = (x, out)

    def backward(k):
        c, j = unit(k, False)
        s = stage_of(c)
        x, out = stash.pop((c, j))
        if s == last:
            out.backward()
        elif peer(s + 1) == rank:
            out.backward(local.pop(("B", s, j)))
        else:
            out.backward(take("B", k))
        if s > 0:
            if peer(s - 1) == rank:
                local["B", s - 1, j] = x.grad
            else:
                sends.append(dist.isend(x.grad, peer(s - 1), tag=GRAD))

    warm = min((warm_of or (lambda p, r, v: (p - r - 1) * 2 + (v - 1) * p))(p, rank, v), total)
    for k in range(warm):
        forward(k)
    for i in range(total - warm):
        forward(warm + i)
        backward(i)
    for k in range(total - warm, total):
        backward(k)
    for s in sends:
        s.wait()
    return chunks


def interleaved_warm_up_of_1f1b(dist, chunks, batch, targets, m):
    """1F1B's warm-up depth, p-r-1, with the interleaved order: rank 0 waits for a gradient of chunk v-1
    whose forward has not even started on the ranks after it."""
    return _interleaved(dist, chunks, batch, targets, m, warm_of=lambda p, r, v: p - r - 1)


def interleaved_backwards_in_forward_chunk_order(dist, chunks, batch, targets, m):
    """Backwards through chunk 0 first, as the forwards: chunk 0's gradient comes from chunk 1, whose
    backward this order has not reached, so every rank waits for another."""
    return _interleaved(dist, chunks, batch, targets, m, backward_chunks_reversed=False)


def interleaved_all_forwards_first(dist, chunks, batch, targets, m):
    """Every (chunk, micro-batch) forward, then every backward: m·v chunk activations held."""
    return _interleaved(dist, chunks, batch, targets, m, warm_of=lambda p, r, v: 10 ** 9)


def interleaved_one_tag(dist, chunks, batch, targets, m):
    """Activations and gradients on the same tag: with p = 2 a recv can take the wrong kind of message."""
    return _interleaved(dist, chunks, batch, targets, m, tags=(0, 0))


def interleaved_contiguous_chunks(dist, chunks, batch, targets, m):
    """Takes rank r's chunks for stages r·v .. r·v+v-1 (a plain cut into p·v stages), not c·p + r."""
    return _interleaved(dist, chunks, batch, targets, m, contiguous=True)


def _zero_bubble(dist, stage, batch, targets, m, keep_waiting=lambda p, r: r, split=True, w_recomputes=False,
                 send_after_w=False, run_w=True, transpose=False, accumulate=True, outer=None):
    """ZB-H1 with knobs for the classic mistakes (the reference solution when left alone)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if m < p:
        raise ValueError(f"ZB-H1 needs m >= p, got m={m}, p={p}")
    xs, ys = batch.chunk(m), targets.chunk(m)
    sends, stash, waiting = [], {}, []

    def forward(j):
        if rank == 0:
            x = xs[j].clone()
        else:
            x = torch.empty_like(xs[j])
            dist.recv(x, rank - 1)
            x.requires_grad_()
        h, linears = x, []
        for layer in stage:
            out = layer(h)
            if isinstance(layer, torch.nn.Linear):
                linears.append((layer, h, out))
            h = out
        if rank == p - 1:
            h = F.mse_loss(h, ys[j]) / m
        else:
            sends.append(dist.isend(h.detach(), rank + 1))
        stash[j] = (x, h, linears)

    def input_grad(j):
        x, out, linears = stash.pop(j)
        grad = None
        if rank < p - 1:
            grad = torch.empty_like(out)
            dist.recv(grad, rank + 1)
        if not split:                                     # the whole backward at once: 1F1B
            out.backward(grad)
            if rank > 0:
                sends.append(dist.isend(x.grad, rank - 1))
            return
        if w_recomputes:                                  # B asks for x alone; W goes through the graph again
            if rank > 0:
                sends.append(dist.isend(torch.autograd.grad(out, x, grad, retain_graph=True)[0], rank - 1))
            waiting.append(("graph", out, grad))
            return
        wanted = [y for _, _, y in linears] + ([x] if rank > 0 else [])
        grads = torch.autograd.grad(out, wanted, grad)
        item = [(layer, inp.detach(), dy) for (layer, inp, _), dy in zip(linears, grads)]
        if rank > 0 and not send_after_w:
            sends.append(dist.isend(grads[-1], rank - 1))
        waiting.append(item)
        if send_after_w:
            weight_grad()
            if rank > 0:
                sends.append(dist.isend(grads[-1], rank - 1))

    def weight_grad():
        item = waiting.pop(0)
        if not run_w:
            return
        if item[0] == "graph":
            _, out, grad = item
            out.backward(grad, inputs=list(stage.parameters()))
            return
        for layer, inp, dy in item:
            dw = outer(dy, inp) if outer else inp.T @ dy if transpose else dy.T @ inp
            for prm, g in ((layer.weight, dw), (layer.bias, dy.sum(0))):
                if prm.grad is None or not accumulate:
                    prm.grad = g
                else:
                    prm.grad += g

    warm = p - rank - 1
    for j in range(warm):
        forward(j)
    for j in range(m):
        if warm + j < m:
            forward(warm + j)
        input_grad(j)
        if split and len(waiting) > keep_waiting(p, rank):
            weight_grad()
    while waiting:
        weight_grad()
    for s in sends:
        s.wait()
    return stage


def zero_bubble_is_1f1b(dist, stage, batch, targets, m):
    """The whole backward at once: right gradients, 1F1B's bubble, three times ZB-H1's."""
    return _zero_bubble(dist, stage, batch, targets, m, split=False)


def zero_bubble_w_right_after_its_b(dist, stage, batch, targets, m):
    """Split, but W runs at once after its B: the bubble at the end is still there, W did not move into it."""
    return _zero_bubble(dist, stage, batch, targets, m, keep_waiting=lambda p, r: 0)


def zero_bubble_every_w_at_the_end(dist, stage, batch, targets, m):
    """All W after the last B: rank 0 then runs m W after everything else instead of inside its bubble (and
    holds every micro-batch's W inputs at once)."""
    return _zero_bubble(dist, stage, batch, targets, m, keep_waiting=lambda p, r: 10 ** 9)


def zero_bubble_forgets_w(dist, stage, batch, targets, m):
    """B only: the input gradients go back, but no weight ever gets a gradient."""
    return _zero_bubble(dist, stage, batch, targets, m, run_w=False)


def zero_bubble_w_through_the_graph_again(dist, stage, batch, targets, m):
    """W as out.backward(grad, inputs=parameters) on the retained graph: autograd recomputes the input-gradient
    matmuls of the later layers to reach the earlier weights, so W costs more than the weight matmuls."""
    return _zero_bubble(dist, stage, batch, targets, m, w_recomputes=True)


def zero_bubble_sends_after_w(dist, stage, batch, targets, m):
    """Runs W before sending B's input gradient: the previous stage waits for W, which was meant to wait for it."""
    return _zero_bubble(dist, stage, batch, targets, m, send_after_w=True, keep_waiting=lambda p, r: 10 ** 9)


def zero_bubble_one_w_too_many_waiting(dist, stage, batch, targets, m):
    """Rank r keeps r + 1 W waiting: the same time, one micro-batch more held than ZB-H1 needs."""
    return _zero_bubble(dist, stage, batch, targets, m, keep_waiting=lambda p, r: r + 1)


def zero_bubble_transposed_weight_grad(dist, stage, batch, targets, m):
    """dW = XᵀdY: nn.Linear keeps its weight as (out, in), so its gradient is dYᵀX (square layers hide the shape)."""
    return _zero_bubble(dist, stage, batch, targets, m, transpose=True)


def zero_bubble_w_overwrites_grad(dist, stage, batch, targets, m):
    """prm.grad = dW on every micro-batch: only the last micro-batch's gradient is left."""
    return _zero_bubble(dist, stage, batch, targets, m, accumulate=False)


WRONG = [
    ("zero_bubble", zero_bubble_is_1f1b, "simulated time"),
    ("zero_bubble", zero_bubble_w_right_after_its_b, "simulated time"),
    ("zero_bubble", zero_bubble_every_w_at_the_end, "simulated time"),
    ("zero_bubble", zero_bubble_one_w_too_many_waiting, ("peak memory", "simulated time")),   # time at m = p
    ("zero_bubble", zero_bubble_forgets_w, "grad is None"),
    ("zero_bubble", zero_bubble_w_through_the_graph_again, "simulated time"),
    ("zero_bubble", zero_bubble_sends_after_w, "simulated time"),
    ("zero_bubble", zero_bubble_transposed_weight_grad, ".grad"),
    ("zero_bubble", zero_bubble_w_overwrites_grad, ".grad"),
    ("interleaved_1f1b", interleaved_warm_up_of_1f1b, "KeyError"),
    ("interleaved_1f1b", interleaved_backwards_in_forward_chunk_order, "Deadlock"),
    ("interleaved_1f1b", interleaved_all_forwards_first, "peak memory"),
    ("interleaved_1f1b", interleaved_one_tag, ".grad"),
    ("interleaved_1f1b", interleaved_contiguous_chunks, "Deadlock"),
    ("one_f_one_b", one_f_one_b_warm_up_one_too_many, "peak memory"),
    ("one_f_one_b", one_f_one_b_warm_up_one_too_few, "simulated time"),
    ("one_f_one_b", one_f_one_b_blocking_sends, "waits in send"),
    ("one_f_one_b", one_f_one_b_stashes_everything, "peak memory"),
    ("one_f_one_b", one_f_one_b_is_gpipe, "peak memory"),
    ("one_f_one_b", one_f_one_b_accepts_too_few_micro_batches, "asks for a ValueError"),
    ("gpipe", gpipe_forgets_one_over_m, ".grad", "= m, the number of micro-batches"),
    ("gpipe", gpipe_one_micro_batch_at_a_time, ("simulated time", "forwards and backwards interleaved")),
    ("pipeline_stages", stages_forget_requires_grad, "rank"),
    ("pipeline_stages", stages_only_the_last_trains, "grad is None"),
]
