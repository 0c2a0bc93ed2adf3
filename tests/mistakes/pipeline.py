"""Realistic first attempts at notebook 05's puzzles (pipeline parallelism), none of them in tests/wrong."""

import torch
import torch.nn.functional as F

from tests.mistakes import Attempt, NO_GRADIENT



# ---- pipeline_stages ----------------------------------------------------------------------------------------
def _stages(dist, stage, batch, targets, *, buffer=torch.empty_like, loss=F.mse_loss, grad_to=-1, seed_ones=False,
            grad_from=1, requires_grad=True):
    """One batch through the stages as the hints lay it out, with the knob of one mistake turned."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        x = batch
    else:
        x = buffer(batch)
        dist.recv(x, rank - 1)
    if requires_grad:
        x.requires_grad_()
    out = stage(x)
    if rank == p - 1:
        loss(out, targets).backward()
    elif seed_ones:
        dist.send(out.detach(), rank + 1)
        out.backward(torch.ones_like(out))
    else:
        dist.send(out.detach(), rank + 1)
        grad = torch.empty_like(out)
        dist.recv(grad, (rank + grad_from) % p)
        out.backward(grad)
    if rank > 0:
        dist.send(x.grad, rank + grad_to)
    return stage


def stages_received_input_never_requires_grad(dist, stage, batch, targets):
    """The activation received into torch.zeros_like(batch) and fed to the stage as it is: only the rank's own
    parameters require grad, so the input's .grad sent back is None."""
    return _stages(dist, stage, batch, targets, buffer=torch.zeros_like, requires_grad=False)


def stages_float32_buffers(dist, stage, batch, targets):
    """torch.empty(batch.shape) for the incoming activation: float32 by default, where the model is float64."""
    return _stages(dist, stage, batch, targets, buffer=lambda b: torch.empty(b.shape))


def stages_gradient_sent_forward(dist, stage, batch, targets):
    """x.grad sent to rank + 1, where the activation came from, instead of rank - 1."""
    return _stages(dist, stage, batch, targets, grad_to=+1)


def stages_gradient_from_the_previous_rank(dist, stage, batch, targets):
    """The output's gradient received from (rank - 1) % p, 'the ring the activations came round': the first rank then
    waits on the last, the others on the rank that sent them their input."""
    return _stages(dist, stage, batch, targets, grad_from=-1)


def stages_summed_loss(dist, stage, batch, targets):
    """F.mse_loss(out, targets, reduction='sum') on the last stage: the statement's loss is the mean."""
    return _stages(dist, stage, batch, targets, loss=lambda out, y: F.mse_loss(out, y, reduction="sum"))


def stages_backward_from_ones(dist, stage, batch, targets):
    """The stages before the last call out.backward(torch.ones_like(out)), as for a loss, instead of receiving the
    gradient of their output from rank + 1."""
    return _stages(dist, stage, batch, targets, seed_ones=True)


def stages_gradient_received_into_the_output(dist, stage, batch, targets):
    """dist.recv(out, rank + 1) to save a buffer, then out.backward(out): the gradient overwrites the output
    autograd still needs."""
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
        with torch.no_grad():
            dist.recv(out, rank + 1)
        out.backward(out.detach())
    if rank > 0:
        dist.send(x.grad, rank - 1)
    return stage


# ---- gpipe --------------------------------------------------------------------------------------------------
def _gpipe(dist, stage, batch, targets, m, *, scale=None, split=None, keep=True, chunk_targets=True,
           stash_input=lambda x: x, target_of=lambda j, m: j):
    """GPipe as the hints lay it out, with the knob of one mistake turned."""
    rank, p = dist.get_rank(), dist.get_world_size()
    xs = (split or (lambda t: t.chunk(m)))(batch)
    ys = (split or (lambda t: t.chunk(m)))(targets) if chunk_targets else [targets] * m
    sends, stash, last = [], [], None
    for j in range(m):
        if rank == 0:
            x = xs[j].clone()
        else:
            x = torch.empty_like(xs[j])
            dist.recv(x, rank - 1)
        x.requires_grad_()
        out = stage(x)
        if rank == p - 1:
            out = F.mse_loss(out, ys[target_of(j, m)]) / (scale or m)
        else:
            sends.append(dist.isend(out.detach(), rank + 1))
        last = (stash_input(x), out)
        stash.append(last if keep else None)
    for j in range(m):
        x, out = stash[j] if keep else last
        if rank == p - 1:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, rank + 1)
            out.backward(grad)
        if rank > 0:
            sends.append(dist.isend(x.grad, rank - 1))
    for s in sends:
        s.wait()
    return stage


def gpipe_summed_losses_one_backward(dist, stage, batch, targets, m):
    """The last stage adds up the m micro-batch losses (each / m) and calls backward once on the sum, then sends the
    m input gradients back: the stage before it waits for the whole batch."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank != p - 1:
        return _gpipe(dist, stage, batch, targets, m)
    xs, ys = [], targets.chunk(m)
    total = 0
    for j in range(m):
        x = torch.empty_like(batch.chunk(m)[j])
        dist.recv(x, rank - 1)
        x.requires_grad_()
        total = total + F.mse_loss(stage(x), ys[j]) / m
        xs.append(x)
    total.backward()
    for x in xs:
        dist.send(x.grad, rank - 1)
    return stage


def gpipe_only_the_last_stash(dist, stage, batch, targets, m):
    """x, out = ... overwritten by every forward and no list kept: each backward runs on the last micro-batch's
    graph."""
    return _gpipe(dist, stage, batch, targets, m, keep=False)


def gpipe_divided_by_the_stages(dist, stage, batch, targets, m):
    """Each micro-batch's loss divided by p, the number of stages, instead of m."""
    return _gpipe(dist, stage, batch, targets, m, scale=dist.get_world_size())


def gpipe_targets_whole(dist, stage, batch, targets, m):
    """The batch cut into micro-batches, the targets not: each micro-batch's output compared with all targets."""
    return _gpipe(dist, stage, batch, targets, m, chunk_targets=False)


def gpipe_targets_popped(dist, stage, batch, targets, m):
    """ys = list(targets.chunk(m)) and ys.pop() at each micro-batch: the targets taken from the end, in reverse."""
    return _gpipe(dist, stage, batch, targets, m, target_of=lambda j, m: m - 1 - j)


def gpipe_stash_of_detached_inputs(dist, stage, batch, targets, m):
    """Each micro-batch's input stashed as x.detach(), 'so the stash holds no graph': its x.grad is never filled."""
    return _gpipe(dist, stage, batch, targets, m, stash_input=torch.Tensor.detach)


def gpipe_chunks_the_features(dist, stage, batch, targets, m):
    """batch.chunk(m, dim=-1), 'the last dimension is the batch' as in a column-major sketch: each micro-batch gets
    every row and 1/m of the features."""
    return _gpipe(dist, stage, batch, targets, m, split=lambda t: t.chunk(m, dim=-1))


def gpipe_split_instead_of_chunk(dist, stage, batch, targets, m):
    """batch.split(m): pieces of m rows each, not m pieces; the first m of them are used."""
    return _gpipe(dist, stage, batch, targets, m, split=lambda t: t.split(m))


def gpipe_first_stage_waits_for_the_loss(dist, stage, batch, targets, m):
    """GPipe as the hints lay it out; the first stage then receives the loss from the last stage, to report it, and the
    last stage was never told to send one."""
    _gpipe(dist, stage, batch, targets, m)
    if dist.get_rank() == 0:
        dist.recv(torch.empty(()), dist.get_world_size() - 1)
    return stage


# ---- one_f_one_b --------------------------------------------------------------------------------------------
def _one_f_one_b(dist, stage, batch, targets, m, *, warm_of=lambda p, r: p - r - 1, lifo=False,
                 backward_first=False, cool_short=False):
    """1F1B as the hints lay it out, with the knob of one mistake turned."""
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
        x, out = stash.pop(max(stash) if lifo else j)
        if rank == p - 1:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, rank + 1)
            out.backward(grad)
        if rank > 0:
            sends.append(dist.isend(x.grad, rank - 1))

    warm = min(warm_of(p, rank), m)
    for j in range(warm):
        forward(j)
    for i in range(m - warm):
        if backward_first:
            backward(i)
            forward(warm + i)
        else:
            forward(warm + i)
            backward(i)
    for j in range(m - warm, m - 1 if cool_short else m):
        backward(j)
    for s in sends:
        s.wait()
    return stage


def one_f_one_b_warm_up_counting_itself(dist, stage, batch, targets, m):
    """The warm-up counts the stages from this one to the last, itself included: p - r forwards, one more than the
    micro-batches in flight between it and the last stage."""
    return _one_f_one_b(dist, stage, batch, targets, m, warm_of=lambda p, r: len(range(r, p)))


def one_f_one_b_newest_first(dist, stage, batch, targets, m):
    """The stash kept as a stack and popped from the top: backward takes the newest micro-batch, while the
    gradients arrive oldest first."""
    return _one_f_one_b(dist, stage, batch, targets, m, lifo=True)


def one_f_one_b_backward_then_forward(dist, stage, batch, targets, m):
    """In the steady state, backward(i) before forward(warm + i): the last stage backs up a micro-batch it has not
    run forward."""
    return _one_f_one_b(dist, stage, batch, targets, m, backward_first=True)


def one_f_one_b_same_warm_up_everywhere(dist, stage, batch, targets, m):
    """p - 1 warm-up forwards on every stage, the depth of stage 0: the later stages hold more than they need."""
    return _one_f_one_b(dist, stage, batch, targets, m, warm_of=lambda p, r: p - 1)


def one_f_one_b_warm_up_by_rank(dist, stage, batch, targets, m):
    """warm = rank, the count reversed: the first stage starts backward before the last has anything to send."""
    return _one_f_one_b(dist, stage, batch, targets, m, warm_of=lambda p, r: r)


def one_f_one_b_cool_down_one_short(dist, stage, batch, targets, m):
    """range(m - warm, m - 1) in the cool-down: the last micro-batch's backward never runs."""
    return _one_f_one_b(dist, stage, batch, targets, m, cool_short=True)


# ---- interleaved_1f1b ---------------------------------------------------------------------------------------
def _interleaved(dist, chunks, batch, targets, m, *, scale=None, refuse=True, last_by_rank=False,
                 first_by_rank=False, depth_first=False, wait_at_once=False, chunk_major=False,
                 backward_in_forward_order=False, one_tag=None, warm_of=lambda p, v, r: (p - r - 1) * 2 + (v - 1) * p):
    """Interleaved 1F1B as the hints lay it out (solutions/pipeline.py's order), with the knob of one mistake."""
    rank, p = dist.get_rank(), dist.get_world_size()
    v = len(chunks)
    if refuse and m % p:
        raise ValueError(f"interleaved 1F1B runs micro-batches in groups of p: m={m} must be a multiple of p={p}")
    xs, ys = batch.chunk(m), targets.chunk(m)
    last = p * v - 1
    ahead, behind = (rank + 1) % p, (rank - 1) % p
    sends, stash, inbox = [], {}, {}
    total = m * v

    def unit(k, forward):
        if chunk_major:
            c, j = k // m, k % m
        else:
            c, j = (k % v, k // v) if depth_first else (k // p % v, k // (p * v) * p + k % p)
        return (c, j) if forward or backward_in_forward_order else (v - 1 - c, j)

    def is_first(c):
        return rank == 0 if first_by_rank else c * p + rank == 0

    def is_last(c):
        return rank == p - 1 if last_by_rank else c * p + rank == last

    def take(kind, k):
        for i in (k, k + 1):
            c, j = unit(i, kind == "F") if i < total else (None, None)
            if (kind, i) not in inbox and c is not None and (not is_first(c) if kind == "F" else not is_last(c)):
                buf = torch.empty_like(xs[j])
                inbox[kind, i] = buf, dist.irecv(buf, behind if kind == "F" else ahead,
                                                   tag=one_tag if one_tag is not None else 0 if kind == "F" else 1)
        buf, work = inbox.pop((kind, k))
        work.wait()
        return buf

    def forward(k):
        c, j = unit(k, True)
        x = xs[j].clone() if is_first(c) else take("F", k)
        x.requires_grad_()
        out = chunks[c](x)
        if is_last(c):
            out = F.mse_loss(out, ys[j]) / (scale or m)
        else:
            sends.append(dist.isend(out.detach(), ahead, tag=0 if one_tag is None else one_tag))
            if wait_at_once:
                sends.pop().wait()
        stash[c, j] = (x, out)

    def backward(k):
        c, j = unit(k, False)
        x, out = stash.pop((c, j))
        if is_last(c):
            out.backward()
        else:
            out.backward(take("B", k))
        if not is_first(c):
            sends.append(dist.isend(x.grad, behind, tag=1 if one_tag is None else one_tag))
            if wait_at_once:
                sends.pop().wait()

    warm = min(warm_of(p, v, rank), total)
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


def interleaved_isend_waited_at_once(dist, chunks, batch, targets, m):
    """dist.isend(...).wait() on every send, 'to be safe with the buffer': each send then blocks until the peer
    receives, and in the steady state both ranks send first."""
    return _interleaved(dist, chunks, batch, targets, m, wait_at_once=True)


def interleaved_loss_over_m_times_v(dist, chunks, batch, targets, m):
    """The loss divided by m·v, 'one term per chunk pass': only the last virtual stage computes a loss, once per
    micro-batch."""
    return _interleaved(dist, chunks, batch, targets, m, scale=m * len(chunks))


def interleaved_accepts_any_m(dist, chunks, batch, targets, m):
    """No check of m % p: the schedule's groups of p micro-batches then run past the last one."""
    return _interleaved(dist, chunks, batch, targets, m, refuse=False)


def interleaved_loss_on_the_last_rank(dist, chunks, batch, targets, m):
    """1F1B's test kept: the loss on rank p - 1 (every chunk of it), where it belongs on virtual stage p·v - 1 only."""
    return _interleaved(dist, chunks, batch, targets, m, last_by_rank=True)


def interleaved_batch_on_rank_zero(dist, chunks, batch, targets, m):
    """1F1B's test kept: rank 0 feeds the batch to each of its chunks, where only chunk 0 (stage 0) reads it."""
    return _interleaved(dist, chunks, batch, targets, m, first_by_rank=True)


def interleaved_depth_first(dist, chunks, batch, targets, m):
    """Each micro-batch through all of this rank's chunks before the next (chunk k % v of micro-batch k // v),
    with Megatron's warm-up depth: the order the warm-up was computed for is breadth-first, p micro-batches at a
    time."""
    return _interleaved(dist, chunks, batch, targets, m, depth_first=True)


def interleaved_warm_up_of_two_per_later_stage(dist, chunks, batch, targets, m):
    """The warm-up (p - r - 1)·2, the first term of Megatron's alone: the (v - 1)·p forwards the other chunks add
    are left out."""
    return _interleaved(dist, chunks, batch, targets, m, warm_of=lambda p, v, r: (p - r - 1) * 2)


def interleaved_every_micro_batch_per_chunk(dist, chunks, batch, targets, m):
    """Forward k is micro-batch k % m on chunk k // m: every micro-batch through chunk 0, then through chunk 1, as
    one would loop `for c in range(v): for j in range(m)`."""
    return _interleaved(dist, chunks, batch, targets, m, chunk_major=True)


def interleaved_one_tag_for_both_kinds(dist, chunks, batch, targets, m):
    # "a tag per direction is enough": activations and gradients both under tag 3. Its receives are posted one step
    # ahead, so nothing deadlocks: at p = 2 a receive silently takes a message of the other kind (the same shape),
    # and only the values are wrong, which the run cannot yet tell from other wrong values
    return _interleaved(dist, chunks, batch, targets, m, one_tag=3)


def interleaved_backwards_in_forward_order(dist, chunks, batch, targets, m):
    """The k-th backward on the k-th forward's chunk, (k // p) % v, where the backwards run the chunks in reverse."""
    return _interleaved(dist, chunks, batch, targets, m, backward_in_forward_order=True)


# ---- zero_bubble --------------------------------------------------------------------------------------------
def _zero_bubble(dist, stage, batch, targets, m, *, bias_grad=lambda dy: dy.sum(0), flush=True, ask_x_on_rank0=False,
                 send_index=-1, weight_grad_of=lambda inp, dy: dy.T @ inp):
    """ZB-H1 as the hints lay it out, with the knob of one mistake turned."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if m < p:
        raise ValueError(f"ZB-H1 needs at least as many micro-batches as stages: m={m} < p={p}")
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
        wanted = [y for _, _, y in linears] + ([x] if rank > 0 or ask_x_on_rank0 else [])
        grads = torch.autograd.grad(out, wanted, grad)
        if rank > 0:
            sends.append(dist.isend(grads[send_index], rank - 1))
        waiting.append([(layer, inp.detach(), dy) for (layer, inp, _), dy in zip(linears, grads)])

    def weight_grad():
        for layer, inp, dy in waiting.pop(0):
            for prm, g in ((layer.weight, weight_grad_of(inp, dy)), (layer.bias, bias_grad and bias_grad(dy))):
                if g is None:
                    continue
                if prm.grad is None:
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
        if len(waiting) > rank:
            weight_grad()
    while flush and waiting:
        weight_grad()
    for s in sends:
        s.wait()
    return stage


def zero_bubble_bias_grad_over_features(dist, stage, batch, targets, m):
    """db = dY.sum(1), over the features: the bias gradient sums over the micro-batch's rows, dim 0."""
    return _zero_bubble(dist, stage, batch, targets, m, bias_grad=lambda dy: dy.sum(1))


def zero_bubble_bias_grad_mean(dist, stage, batch, targets, m):
    """db = dY.mean(0): the bias gradient is the sum of dY over the rows, not their mean."""
    return _zero_bubble(dist, stage, batch, targets, m, bias_grad=lambda dy: dy.mean(0))


def zero_bubble_weight_grad_by_einsum(dist, stage, batch, targets, m):
    """dW = einsum('bi,bo->io', X, dY), the indices in the order x @ W would take them: nn.Linear's W is (out, in)."""
    return _zero_bubble(dist, stage, batch, targets, m,
                        weight_grad_of=lambda inp, dy: torch.einsum("bi,bo->io", inp, dy))


def zero_bubble_weights_only(dist, stage, batch, targets, m):
    """W computed for layer.weight alone, 'the matmul is all W delays': the biases get no gradient."""
    return _zero_bubble(dist, stage, batch, targets, m, bias_grad=None)


def zero_bubble_without_the_final_flush(dist, stage, batch, targets, m):
    """No loop over the W still waiting after the last B: up to `rank` micro-batches' weight gradients never added."""
    return _zero_bubble(dist, stage, batch, targets, m, flush=False)


def zero_bubble_asks_for_the_batch_gradient(dist, stage, batch, targets, m):
    """x among the inputs of torch.autograd.grad on rank 0 as well, whose x is the batch and needs no gradient."""
    return _zero_bubble(dist, stage, batch, targets, m, ask_x_on_rank0=True)


def zero_bubble_sends_the_first_layers_gradient(dist, stage, batch, targets, m):
    """grads[0] sent back as x's gradient: the first Linear's output gradient, where x's is the last of the list."""
    return _zero_bubble(dist, stage, batch, targets, m, send_index=0)



MISTAKES = [
    Attempt("pipeline_stages", stages_float32_buffers, named="receives into ("),
    Attempt("pipeline_stages", stages_received_input_never_requires_grad, named="x.requires_grad_() on it right after"),
    Attempt("gpipe", gpipe_summed_losses_one_backward, named="joined into one loss"),
    Attempt("one_f_one_b", one_f_one_b_warm_up_counting_itself, named="its warm-ups differ from 1F1B's"),
    Attempt("interleaved_1f1b", interleaved_warm_up_of_two_per_later_stage, named="warm-up ran too few forwards"),
    Attempt("interleaved_1f1b", interleaved_every_micro_batch_per_chunk,
            named="groups of p micro-batches through each chunk in turn"),
    Attempt("interleaved_1f1b", interleaved_backwards_in_forward_order, named="backwards on the chunks in reverse"),
    Attempt("interleaved_1f1b", interleaved_one_tag_for_both_kinds, named="two kinds of message", named_yet=False),
    Attempt("pipeline_stages", stages_gradient_sent_forward, named="called send with peer"),
    Attempt("pipeline_stages", stages_gradient_from_the_previous_rank, named="waits on the wrong peer"),
    Attempt("pipeline_stages", stages_summed_loss, named="the values of the batch (rows × width)"),
    Attempt("pipeline_stages", stages_backward_from_ones, named="which has already returned"),
    Attempt("pipeline_stages", stages_gradient_received_into_the_output, named="modified by an inplace operation"),
    Attempt("gpipe", gpipe_only_the_last_stash, named="backward ran twice through the same graph"),
    Attempt("gpipe", gpipe_divided_by_the_stages, named="m, the number of micro-batches"),
    Attempt("gpipe", gpipe_targets_whole, named=("the whole targets", "targets of the micro-batch",
                                                  "the whole batch or targets met one m-th")),
    Attempt("gpipe", gpipe_targets_popped, named="another micro-batch's targets"),
    Attempt("gpipe", gpipe_stash_of_detached_inputs, named=NO_GRADIENT),
    Attempt("gpipe", gpipe_chunks_the_features, named="cut along its last dimension"),
    Attempt("gpipe", gpipe_first_stage_waits_for_the_loss, named="receives once more than its peer sends"),
    Attempt("gpipe", gpipe_split_instead_of_chunk, named=("split(m)", "pieces of m rows")),
    Attempt("one_f_one_b", one_f_one_b_newest_first,
            named=("newest first", "pairs the gradient of one micro-batch with the activations of another")),
    Attempt("one_f_one_b", one_f_one_b_backward_then_forward, named=("before its forward", "not run forward")),
    Attempt("one_f_one_b", one_f_one_b_same_warm_up_everywhere, named=("the same warm-up", "p - 1 forwards on")),
    Attempt("one_f_one_b", one_f_one_b_warm_up_by_rank, named=("gradient from rank", "before any forward")),
    Attempt("one_f_one_b", one_f_one_b_cool_down_one_short, named="which has already returned"),
    Attempt("interleaved_1f1b", interleaved_isend_waited_at_once, named="before waiting on a send"),
    Attempt("interleaved_1f1b", interleaved_loss_over_m_times_v, named="v, the virtual stages"),
    Attempt("interleaved_1f1b", interleaved_accepts_any_m, named="asks for a ValueError"),
    Attempt("interleaved_1f1b", interleaved_loss_on_the_last_rank, named="not the last stage: that is p·v - 1"),
    Attempt("interleaved_1f1b", interleaved_batch_on_rank_zero, named=("on every chunk", "chunk 0 only"),
            named_yet=False),
    Attempt("interleaved_1f1b", interleaved_depth_first, named="simulated time"),
    Attempt("zero_bubble", zero_bubble_bias_grad_over_features, named=("over the features", "sum over dim 0")),
    Attempt("zero_bubble", zero_bubble_bias_grad_mean, named="b, the rows of a micro-batch"),
    Attempt("zero_bubble", zero_bubble_weight_grad_by_einsum, named="the transpose of the right gradient"),
    Attempt("zero_bubble", zero_bubble_weights_only, named="A bias needs its gradient too"),
    Attempt("zero_bubble", zero_bubble_without_the_final_flush, named=("never added", "still waiting")),
    Attempt("zero_bubble", zero_bubble_asks_for_the_batch_gradient, named="does not require grad"),
    Attempt("zero_bubble", zero_bubble_sends_the_first_layers_gradient, named=("holds what", "wrong tensor")),
]
