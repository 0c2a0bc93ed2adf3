"""Notebook 05 (pipeline parallelism): first attempts, written from the notebook alone.

Puzzles 1 and 2 are written out one by one. For 1F1B, interleaved 1F1B and ZB-H1 the attempts share one
learner's micro-batch operations (``_Ops``: forward, backward, send, receive), each attempt changing the
one thing that learner got wrong.
"""
import torch
import torch.nn.functional as F

from lib import sim
from lib.analytic.formulas import bubble_fraction
from puzzles import pipeline as P


# ---------------------------------------------------------------- puzzle 1: pipeline_stages

def pipeline_stages_rank0_sends_back(dist, stage, batch, targets):
    r, p = dist.get_rank(), dist.get_world_size()
    if r == 0:
        x = batch.clone().requires_grad_()
    else:
        x = torch.empty_like(batch)
        dist.recv(x, r - 1)
        x.requires_grad_()
    out = stage(x)
    if r == p - 1:
        F.mse_loss(out, targets).backward()
    else:
        dist.send(out.detach(), r + 1)
        g = torch.empty_like(out)
        dist.recv(g, r + 1)
        out.backward(g)
    dist.send(x.grad, r - 1)                  # every rank sends its input gradient back
    return stage


def pipeline_stages_no_requires_grad(dist, stage, batch, targets):
    r, p = dist.get_rank(), dist.get_world_size()
    if r == 0:
        x = batch
    else:
        x = torch.empty_like(batch)
        dist.recv(x, r - 1)
    out = stage(x)
    if r == p - 1:
        F.mse_loss(out, targets).backward()
    else:
        dist.send(out.detach(), r + 1)
        g = torch.empty_like(out)
        dist.recv(g, r + 1)
        out.backward(g)
    if r > 0:
        dist.send(x.grad, r - 1)
    return stage


def pipeline_stages_backward_no_grad(dist, stage, batch, targets):
    r, p = dist.get_rank(), dist.get_world_size()
    if r == 0:
        x = batch
    else:
        x = torch.empty_like(batch)
        dist.recv(x, r - 1)
        x.requires_grad_()
    out = stage(x)
    if r == p - 1:
        loss = F.mse_loss(out, targets)
    else:
        dist.send(out.detach(), r + 1)
        g = torch.empty_like(out)
        dist.recv(g, r + 1)
        loss = (out * g).sum()
    loss.backward()
    if r > 0:
        dist.send(x.grad, r - 1)
    return stage


def pipeline_stages_grad_from_wrong_peer(dist, stage, batch, targets):
    r, p = dist.get_rank(), dist.get_world_size()
    if r == 0:
        x = batch
    else:
        x = torch.empty_like(batch)
        dist.recv(x, r - 1)
        x.requires_grad_()
    out = stage(x)
    if r == p - 1:
        F.mse_loss(out, targets).backward()
    else:
        dist.send(out.detach(), r + 1)
        g = torch.empty_like(out)
        dist.recv(g, r - 1 if r > 0 else r + 1)   # "from the previous rank"
        out.backward(g)
    if r > 0:
        dist.send(x.grad, r - 1)
    return stage


def pipeline_stages_sum_loss(dist, stage, batch, targets):
    r, p = dist.get_rank(), dist.get_world_size()
    if r == 0:
        x = batch
    else:
        x = torch.empty_like(batch)
        dist.recv(x, r - 1)
        x.requires_grad_()
    out = stage(x)
    if r == p - 1:
        ((out - targets) ** 2).sum().backward()
    else:
        dist.send(out.detach(), r + 1)
        g = torch.empty_like(out)
        dist.recv(g, r + 1)
        out.backward(g)
    if r > 0:
        dist.send(x.grad, r - 1)
    return stage


def pipeline_stages_nonblocking(dist, stage, batch, targets):
    # correct: isend/irecv with waits, and torch.autograd.backward on the output
    r, p = dist.get_rank(), dist.get_world_size()
    x = batch
    if r > 0:
        x = torch.empty_like(batch)
        dist.irecv(x, r - 1).wait()
        x.requires_grad_()
    out = stage(x)
    if r == p - 1:
        torch.autograd.backward(F.mse_loss(out, targets))
    else:
        dist.isend(out.detach(), r + 1).wait()
        g = torch.empty_like(out)
        dist.irecv(g, r + 1).wait()
        torch.autograd.backward(out, g)
    if r > 0:
        dist.isend(x.grad, r - 1).wait()
    return stage


# ---------------------------------------------------------------- puzzle 2: gpipe

def _gpipe(dist, stage, batch, targets, m, *, divide=True, zero_each=False, dim=0, reverse=False,
           interleave_fb=False, concat_loss=False):
    r, p = dist.get_rank(), dist.get_world_size()
    xs, ys = batch.chunk(m, dim=dim), targets.chunk(m, dim=dim)
    stash = []

    def forward(j):
        if r == 0:
            x = xs[j]
        else:
            x = torch.empty_like(xs[j])
            dist.recv(x, r - 1)
            x.requires_grad_()
        out = stage(x)
        if r != p - 1:
            dist.send(out.detach(), r + 1)
        stash.append((x, out))

    def backward(j, x, out):
        if zero_each:
            stage.zero_grad()
        if r == p - 1:
            loss = F.mse_loss(out, ys[j])
            (loss / m if divide else loss).backward()
        else:
            g = torch.empty_like(out)
            dist.recv(g, r + 1)
            out.backward(g)
        if r > 0:
            dist.send(x.grad, r - 1)

    if interleave_fb:
        for j in range(m):
            forward(j)
            backward(j, *stash.pop())
        return stage
    for j in range(m):
        forward(j)
    if concat_loss and r == p - 1:
        outs = torch.cat([o for _, o in stash])
        F.mse_loss(outs, torch.cat(list(ys))).backward()
        if r > 0:
            for x, _ in stash:
                dist.send(x.grad, r - 1)
        return stage
    order = range(m - 1, -1, -1) if reverse else range(m)
    for j in order:
        backward(j, *stash[j])
    return stage


def gpipe_no_divide(dist, stage, batch, targets, m):
    return _gpipe(dist, stage, batch, targets, m, divide=False)


def gpipe_zero_each(dist, stage, batch, targets, m):
    return _gpipe(dist, stage, batch, targets, m, zero_each=True)


def gpipe_wrong_dim(dist, stage, batch, targets, m):
    return _gpipe(dist, stage, batch, targets, m, dim=1)


def gpipe_one_at_a_time(dist, stage, batch, targets, m):
    return _gpipe(dist, stage, batch, targets, m, interleave_fb=True)


def gpipe_concat_loss(dist, stage, batch, targets, m):
    return _gpipe(dist, stage, batch, targets, m, concat_loss=True)


def gpipe_reverse_backward(dist, stage, batch, targets, m):
    return _gpipe(dist, stage, batch, targets, m, reverse=True)


# ---------------------------------------------------------------- the learner's micro-batch operations

class _Ops:
    def __init__(self, dist, modules, batch, targets, m, *, blocking=False, divide=True, tags=True,
                 wrap=True, keep_stash=False):
        self.dist, self.modules, self.m = dist, modules, m
        self.r, self.p = dist.get_rank(), dist.get_world_size()
        self.xs, self.ys = batch.chunk(m), targets.chunk(m)
        self.blocking, self.divide, self.tags, self.wrap, self.keep = blocking, divide, tags, wrap, keep_stash
        self.stash, self.works, self.kept = {}, [], []

    def send(self, t, dst, tag):
        if self.blocking:
            self.dist.send(t, dst, tag=tag if self.tags else 0)
        else:
            self.finish()
            self.works.append(self.dist.isend(t, dst, tag=tag if self.tags else 0))

    def recv(self, like, src, tag):
        t = torch.empty_like(like)
        self.dist.recv(t, src, tag=tag if self.tags else 0)
        return t

    def forward(self, j, c=0, first=None, last=None):
        r, p = self.r, self.p
        first = r == 0 if first is None else first
        last = r == p - 1 if last is None else last
        if first:
            x = self.xs[j]
        else:
            x = self.recv(self.xs[j], (r - 1) % p if self.wrap else r - 1, 0).requires_grad_()
        out = self.modules[c](x)
        if last:
            loss = F.mse_loss(out, self.ys[j])
            out = loss / self.m if self.divide else loss
        else:
            self.send(out.detach(), (r + 1) % p if self.wrap else r + 1, 0)
        self.stash[(c, j)] = (x, out, first, last)

    def backward(self, j, c=0):
        x, out, first, last = self.stash[(c, j)] if self.keep else self.stash.pop((c, j))
        r, p = self.r, self.p
        if last:
            out.backward()
        else:
            out.backward(self.recv(out, (r + 1) % p if self.wrap else r + 1, 1))
        if not first:
            self.send(x.grad, (r - 1) % p if self.wrap else r - 1, 1)

    def finish(self):
        for w in self.works:
            w.wait()
        self.works = []


# ---------------------------------------------------------------- puzzle 3: one_f_one_b

def _one_f_one_b(dist, stage, batch, targets, m, *, warm=None, check=True, **kw):
    r, p = dist.get_rank(), dist.get_world_size()
    if check and m < p:
        raise ValueError("1F1B needs at least as many micro-batches as stages")
    ops = _Ops(dist, [stage], batch, targets, m, **kw)
    w = min(p - r - 1 if warm is None else warm(r, p), m)
    for j in range(w):
        ops.forward(j)
    for i in range(m - w):
        ops.forward(w + i)
        ops.backward(i)
    for i in range(m - w, m):
        ops.backward(i)
    ops.finish()
    return stage


def one_f_one_b_blocking(dist, stage, batch, targets, m):
    return _one_f_one_b(dist, stage, batch, targets, m, blocking=True)


def one_f_one_b_warmup_p_minus_r(dist, stage, batch, targets, m):
    return _one_f_one_b(dist, stage, batch, targets, m, warm=lambda r, p: p - r)


def one_f_one_b_warmup_r(dist, stage, batch, targets, m):
    return _one_f_one_b(dist, stage, batch, targets, m, warm=lambda r, p: r)


def one_f_one_b_no_check(dist, stage, batch, targets, m):
    return _one_f_one_b(dist, stage, batch, targets, m, check=False)


def one_f_one_b_keeps_stash(dist, stage, batch, targets, m):
    return _one_f_one_b(dist, stage, batch, targets, m, keep_stash=True)


def one_f_one_b_no_divide(dist, stage, batch, targets, m):
    return _one_f_one_b(dist, stage, batch, targets, m, divide=False)


def one_f_one_b_isend(dist, stage, batch, targets, m):
    # correct: every send an isend, each waited before this rank's next send
    return _one_f_one_b(dist, stage, batch, targets, m)


# ---------------------------------------------------------------- puzzle 4: interleaved_1f1b

def _interleaved(dist, chunks, batch, targets, m, *, reverse_bwd=True, warm_rule="megatron", check=True,
                 order="megatron", **kw):
    r, p, v = dist.get_rank(), dist.get_world_size(), len(chunks)
    if check and m % p:
        raise ValueError("m must be a multiple of p")
    ops = _Ops(dist, chunks, batch, targets, m, **kw)
    total = m * v

    def fwd_id(k):
        if order == "megatron":
            return (k // (p * v)) * p + k % p, (k // p) % v
        return k % m, k // m                  # every micro-batch through chunk 0, then chunk 1...

    def bwd_id(k):
        mb, c = fwd_id(k)
        return mb, (v - 1 - c) if reverse_bwd else c

    def stage_of(c):
        s = c * p + r
        return s == 0, s == p * v - 1

    if warm_rule == "megatron":
        warm = min((p - r - 1) * 2 + (v - 1) * p, total)
    else:
        warm = min(p - r - 1, total)
    for k in range(warm):
        mb, c = fwd_id(k)
        ops.forward(mb, c, *stage_of(c))
    for i in range(total - warm):
        mb, c = fwd_id(warm + i)
        ops.forward(mb, c, *stage_of(c))
        mb, c = bwd_id(i)
        ops.backward(mb, c)
    for i in range(total - warm, total):
        mb, c = bwd_id(i)
        ops.backward(mb, c)
    ops.finish()
    return chunks


def interleaved_1f1b_same_chunk_backward(dist, chunks, batch, targets, m):
    return _interleaved(dist, chunks, batch, targets, m, reverse_bwd=False)


def interleaved_1f1b_no_tags(dist, chunks, batch, targets, m):
    return _interleaved(dist, chunks, batch, targets, m, tags=False)


def interleaved_1f1b_plain_warmup(dist, chunks, batch, targets, m):
    return _interleaved(dist, chunks, batch, targets, m, warm_rule="1f1b")


def interleaved_1f1b_chunk_major(dist, chunks, batch, targets, m):
    return _interleaved(dist, chunks, batch, targets, m, order="chunk-major")


def interleaved_1f1b_no_check(dist, chunks, batch, targets, m):
    return _interleaved(dist, chunks, batch, targets, m, check=False)


def interleaved_1f1b_no_wrap(dist, chunks, batch, targets, m):
    return _interleaved(dist, chunks, batch, targets, m, wrap=False)


def interleaved_1f1b_blocking(dist, chunks, batch, targets, m):
    return _interleaved(dist, chunks, batch, targets, m, blocking=True)


# ---------------------------------------------------------------- puzzle 5: zero_bubble

def _zero_bubble(dist, stage, batch, targets, m, *, defer=True, keep_outputs=False, transpose=False,
                 out_of_place=False, bias=True, threshold=lambda waiting, r: waiting > r, include_batch=False,
                 check=True):
    r, p = dist.get_rank(), dist.get_world_size()
    if check and m < p:
        raise ValueError("m < p")
    xs, ys = batch.chunk(m), targets.chunk(m)
    stash, waiting, works = {}, [], []

    def isend(t, dst):
        while works:
            works.pop().wait()
        works.append(dist.isend(t, dst))

    def forward(j):
        if r == 0:
            x = xs[j]
            if include_batch:
                x = x.clone()
        else:
            x = torch.empty_like(xs[j])
            dist.recv(x, r - 1)
            x.requires_grad_()
        h, linears = x, []
        for layer in stage:
            if isinstance(layer, torch.nn.Linear):
                inp = h
                h = layer(h)
                linears.append((layer, inp, h))
            else:
                h = layer(h)
        if r == p - 1:
            h = F.mse_loss(h, ys[j]) / m
        else:
            isend(h.detach(), r + 1)
        stash[j] = (x, h, linears)

    def run_w(item):
        if keep_outputs:
            for layer, y, dy in item:
                prms = [q for q in (layer.weight, layer.bias) if q is not None]
                for prm, g in zip(prms, torch.autograd.grad(y, prms, dy, retain_graph=True)):
                    prm.grad = g if prm.grad is None else prm.grad + g
            return
        for layer, X, dY in item:
            dY2, X2 = dY.reshape(-1, dY.shape[-1]), X.reshape(-1, X.shape[-1])
            dW = X2.t() @ dY2 if transpose else dY2.t() @ X2
            db = dY2.sum(0)
            pairs = [(layer.weight, dW)] + ([(layer.bias, db)] if bias and layer.bias is not None else [])
            for prm, g in pairs:
                if prm.grad is None:
                    prm.grad = g
                elif out_of_place:
                    prm.grad = prm.grad + g
                else:
                    prm.grad += g

    def backward_b(j):
        x, out, linears = stash.pop(j)
        grad = None
        if r != p - 1:
            grad = torch.empty_like(out)
            dist.recv(grad, r + 1)
        ys_ = [y for _, _, y in linears]
        wrt = ys_ + ([x] if r > 0 or include_batch else [])
        if not defer:
            out.backward(grad)
            if r > 0:
                isend(x.grad, r - 1)
            return
        grads = torch.autograd.grad(out, wrt, grad, retain_graph=keep_outputs)
        if r > 0:
            isend(grads[-1], r - 1)
        if keep_outputs:
            waiting.append([(layer, y, dy) for (layer, _, y), dy in zip(linears, grads[:len(ys_)])])
        else:
            waiting.append([(layer, X.detach(), dy) for (layer, X, _), dy in zip(linears, grads[:len(ys_)])])
        while threshold(len(waiting), r):
            run_w(waiting.pop(0))

    w = min(p - r - 1, m)
    for j in range(w):
        forward(j)
    for i in range(m - w):
        forward(w + i)
        backward_b(i)
    for i in range(m - w, m):
        backward_b(i)
    while waiting:
        run_w(waiting.pop(0))
    for work in works:
        work.wait()
    return stage


def zero_bubble_w_at_once(dist, stage, batch, targets, m):
    return _zero_bubble(dist, stage, batch, targets, m, defer=False)


def zero_bubble_keep_outputs(dist, stage, batch, targets, m):
    return _zero_bubble(dist, stage, batch, targets, m, keep_outputs=True)


def zero_bubble_transposed_dw(dist, stage, batch, targets, m):
    return _zero_bubble(dist, stage, batch, targets, m, transpose=True)


def zero_bubble_out_of_place(dist, stage, batch, targets, m):
    return _zero_bubble(dist, stage, batch, targets, m, out_of_place=True)


def zero_bubble_no_bias(dist, stage, batch, targets, m):
    return _zero_bubble(dist, stage, batch, targets, m, bias=False)


def zero_bubble_threshold_off_by_one(dist, stage, batch, targets, m):
    return _zero_bubble(dist, stage, batch, targets, m, threshold=lambda waiting, r: waiting >= r and waiting > 0)


def zero_bubble_batch_in_grad(dist, stage, batch, targets, m):
    return _zero_bubble(dist, stage, batch, targets, m, include_batch=True)


ATTEMPTS = [
    ("pipeline_stages", pipeline_stages_rank0_sends_back, "rank 0 also sends its input gradient back, to rank -1"),
    ("pipeline_stages", pipeline_stages_no_requires_grad, "forgot requires_grad_() on the received activation: x.grad is None"),
    ("pipeline_stages", pipeline_stages_backward_no_grad, "correct: middle stages backward through (out * g).sum() instead of out.backward(g)"),
    ("pipeline_stages", pipeline_stages_grad_from_wrong_peer, "received the gradient from the previous rank instead of the next"),
    ("pipeline_stages", pipeline_stages_sum_loss, "summed squared error instead of F.mse_loss's mean"),
    ("pipeline_stages", pipeline_stages_nonblocking, "correct: isend/irecv with immediate waits and torch.autograd.backward"),
    ("gpipe", gpipe_no_divide, "forgot to divide each micro-batch's loss by m"),
    ("gpipe", gpipe_zero_each, "zeroed the stage's gradients before each micro-batch's backward"),
    ("gpipe", gpipe_wrong_dim, "chunked the batch along dim 1 instead of the rows"),
    ("gpipe", gpipe_one_at_a_time, "forward then backward of each micro-batch in turn: no pipelining"),
    ("gpipe", gpipe_concat_loss, "the last stage concatenates all outputs and does one backward"),
    ("gpipe", gpipe_reverse_backward, "correct: the backwards in reverse micro-batch order"),
    ("one_f_one_b", one_f_one_b_blocking, "blocking sends in the steady state: neighbours both send and deadlock"),
    ("one_f_one_b", one_f_one_b_warmup_p_minus_r, "warm-up of p - r forwards instead of p - r - 1"),
    ("one_f_one_b", one_f_one_b_warmup_r, "warm-up of r forwards: the first stage starts backward at once"),
    ("one_f_one_b", one_f_one_b_no_check, "no ValueError when m < p"),
    ("one_f_one_b", one_f_one_b_keeps_stash, "never freed the micro-batches' stash after their backward"),
    ("one_f_one_b", one_f_one_b_no_divide, "forgot to divide each micro-batch's loss by m"),
    ("one_f_one_b", one_f_one_b_isend, "correct: non-blocking sends, each waited before the rank's next send"),
    ("interleaved_1f1b", interleaved_1f1b_same_chunk_backward, "backward ran chunk floor(k/p) mod v, not v-1 minus it"),
    ("interleaved_1f1b", interleaved_1f1b_no_tags, "no tags: with p=2 a recv takes a gradient for an activation"),
    ("interleaved_1f1b", interleaved_1f1b_plain_warmup, "used plain 1F1B's p-r-1 warm-up"),
    ("interleaved_1f1b", interleaved_1f1b_chunk_major, "all micro-batches through chunk 0 before chunk 1 (not Megatron's groups of p)"),
    ("interleaved_1f1b", interleaved_1f1b_no_check, "no ValueError when m is not a multiple of p"),
    ("interleaved_1f1b", interleaved_1f1b_no_wrap, "sent to r+1 without modulo p: the last rank has nowhere to send"),
    ("interleaved_1f1b", interleaved_1f1b_blocking, "blocking sends"),
    ("zero_bubble", zero_bubble_w_at_once, "ran the whole backward (B and W together) like 1F1B"),
    ("zero_bubble", zero_bubble_keep_outputs, "kept the outputs y and called y.backward(dy) later for W"),
    ("zero_bubble", zero_bubble_transposed_dw, "dW = X^T dY instead of dY^T X (square layers, so no shape error)"),
    ("zero_bubble", zero_bubble_out_of_place, "p.grad = p.grad + dW (out of place)"),
    ("zero_bubble", zero_bubble_no_bias, "forgot the bias gradient in W"),
    ("zero_bubble", zero_bubble_threshold_off_by_one, "ran a W as soon as r were waiting (>= r instead of > r)"),
    ("zero_bubble", zero_bubble_batch_in_grad, "asked autograd.grad for the batch's gradient on rank 0 too"),
]
