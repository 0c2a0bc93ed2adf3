"""Wrong answers to notebook 05's puzzles, each with the words its failure message must contain.

A wrong answer must fail, whatever else it gets right; tests/test_content.py runs every catalogue.
"""

import torch
import torch.nn.functional as F


def _one_f_one_b(dist, stage, batch, targets, m, warm_of, blocking=False, keep_all=False, scale=True):
    """1F1B with knobs for the classic mistakes."""
    rank, p = dist.get_rank(), dist.get_world_size()
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


def one_f_one_b_blocking_sends(dist, stage, batch, targets, m):
    """Stage r sends its activation forward while stage r+1 sends its gradient back: both wait in send."""
    return _one_f_one_b(dist, stage, batch, targets, m, lambda p, r: p - r - 1, blocking=True)


def one_f_one_b_stashes_everything(dist, stage, batch, targets, m):
    """Keeps a reference to every micro-batch's activations until the end: GPipe's memory, 1F1B's order."""
    return _one_f_one_b(dist, stage, batch, targets, m, lambda p, r: p - r - 1, keep_all=True)


def one_f_one_b_is_gpipe(dist, stage, batch, targets, m):
    """All forwards, then all backwards: the right answer in the right time, but m micro-batches held."""
    return _one_f_one_b(dist, stage, batch, targets, m, lambda p, r: m)


def gpipe_forgets_one_over_m(dist, stage, batch, targets, m):
    """The sum of the micro-batch losses instead of their mean: gradients m times too large."""
    return _one_f_one_b(dist, stage, batch, targets, m, lambda p, r: m, scale=False)


def gpipe_one_micro_batch_at_a_time(dist, stage, batch, targets, m):
    """Each micro-batch goes all the way forward and back before the next starts: no overlap at all."""
    for j in range(m):
        _one_f_one_b(dist, stage, batch.chunk(m)[j], targets.chunk(m)[j], 1, lambda p, r: 1)
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


WRONG = [
    ("one_f_one_b", one_f_one_b_warm_up_one_too_many, "peak memory"),
    ("one_f_one_b", one_f_one_b_blocking_sends, "waits in send"),
    ("one_f_one_b", one_f_one_b_stashes_everything, "peak memory"),
    ("one_f_one_b", one_f_one_b_is_gpipe, "peak memory"),
    ("gpipe", gpipe_forgets_one_over_m, ".grad"),
    ("gpipe", gpipe_one_micro_batch_at_a_time, "simulated time"),
    ("pipeline_stages", stages_forget_requires_grad, "rank"),
    ("pipeline_stages", stages_only_the_last_trains, "grad is None"),
]
