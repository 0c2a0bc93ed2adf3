"""Realistic first attempts at notebook 03's puzzles (ZeRO and FSDP), none of them in tests/wrong."""

import math

import torch
import torch.nn.functional as F

import lib
from puzzles.zero import adam_update
from tests.mistakes import A_SHARD_FOR_THE_WHOLE, FIRST_STEP, Attempt

# What the ranks hand Adam, said when Adam's normalisation hides a gradient N times too large (or small).
HANDED_TO_ADAM = "hand the optimizer"


def _shards(params, rank, world):
    """Each parameter flat, padded to N·c, and this rank's c elements (the notebook's convention)."""
    sizes = [math.ceil(p.numel() / world) for p in params]
    return sizes, [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].clone()
                   for p, c in zip(params, sizes)]


def _padded_grad(p, c, world):
    return F.pad(p.grad.reshape(-1), (0, world * c - p.numel()))


# ---- zero1_train --------------------------------------------------------------------------------------------
def _zero1(dist, model, batches, lr, *, divide=True, zero=True, fixed_step=None, write_back="copy"):
    """ZeRO-1 as the hints lay it out, with the knob of one mistake turned."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    sizes, shards = _shards(params, rank, world)
    m, v = [torch.zeros_like(s) for s in shards], [torch.zeros_like(s) for s in shards]
    for step, (x, y) in enumerate(batches, start=1):
        if zero:
            model.zero_grad()
        F.mse_loss(model(x), y).backward()
        for i, (p, c) in enumerate(zip(params, sizes)):
            grad = torch.empty_like(shards[i])
            dist.reduce_scatter_single(grad, _padded_grad(p, c, world))
            if divide:
                grad /= world
            adam_update(shards[i], grad, m[i], v[i], fixed_step or step, lr)
            full = torch.empty(world * c, dtype=p.dtype, device=p.device)
            dist.all_gather_single(full, shards[i])
            if write_back == "copy":
                with torch.no_grad():
                    p.copy_(full[:p.numel()].view_as(p))
            else:
                p = full[:p.numel()].view_as(p)          # noqa: F841 (the mistake: only the loop variable changes)
    return {name: p.detach() for name, p in model.named_parameters()}


def zero1_without_dividing(dist, model, batches, lr):
    """The reduce-scattered gradient shard fed to Adam as it comes: the sum over ranks, not the mean. Adam's
    m/√v nearly cancels the factor, so the parameters differ only in the eighth digit."""
    return _zero1(dist, model, batches, lr, divide=False)


def zero1_rebinding_the_parameter(dist, model, batches, lr):
    """p = full[:n].view_as(p) to put the gathered values back: it rebinds the loop variable, the model's
    parameter never changes."""
    return _zero1(dist, model, batches, lr, write_back="rebind")


def zero1_step_stuck_at_one(dist, model, batches, lr):
    """adam_update(..., step=1, ...) on every step: the bias corrections of the first step each time."""
    return _zero1(dist, model, batches, lr, fixed_step=1)


def zero1_without_zero_grad(dist, model, batches, lr):
    """No model.zero_grad(): the second step's gradients add to the first's."""
    return _zero1(dist, model, batches, lr, zero=False)


def zero1_unpadded_chunks(dist, model, batches, lr):
    """Shards as p.reshape(-1).chunk(N), no padding: uneven pieces where N does not divide the size (and chunk may
    even return fewer than N pieces)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    shards = [p.detach().reshape(-1).chunk(world)[rank].clone() for p in params]
    m, v = [torch.zeros_like(s) for s in shards], [torch.zeros_like(s) for s in shards]
    for step, (x, y) in enumerate(batches, start=1):
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        for i, p in enumerate(params):
            grad = torch.empty_like(shards[i])
            dist.reduce_scatter_single(grad, p.grad.reshape(-1))
            grad /= world
            adam_update(shards[i], grad, m[i], v[i], step, lr)
            full = torch.empty(p.numel(), dtype=p.dtype, device=p.device)
            dist.all_gather_single(full, shards[i])
            with torch.no_grad():
                p.copy_(full.view_as(p))
    return {name: p.detach() for name, p in model.named_parameters()}


def zero1_one_flat_gradient_copy(dist, model, batches, lr):
    """The whole model as one flat vector, sharded once: each step F.pad(torch.cat(every p.grad)) reduce-scattered in
    one call, the updated shard all-gathered and split back with torch.split; p.grad kept until the next zero_grad."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    c = math.ceil(total / world)
    shard = F.pad(torch.cat([p.detach().reshape(-1) for p in params]), (0, world * c - total))[rank * c:(rank + 1) * c]
    shard = shard.clone()
    m, v = torch.zeros_like(shard), torch.zeros_like(shard)
    for step, (x, y) in enumerate(batches, start=1):
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        grad = torch.empty_like(shard)
        dist.reduce_scatter_single(grad, F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * c - total)))
        adam_update(shard, grad / world, m, v, step, lr)
        full = torch.empty(world * c, dtype=shard.dtype, device=shard.device)
        dist.all_gather_single(full, shard)
        with torch.no_grad():
            for p, piece in zip(params, full[:total].split([p.numel() for p in params])):
                p.copy_(piece.view_as(p))
    return {name: p.detach() for name, p in model.named_parameters()}


def zero1_state_as_big_as_the_parameter(dist, model, batches, lr):
    """m and v made with torch.zeros_like(p), the whole parameter, then handed to adam_update with the shard."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    sizes, shards = _shards(params, rank, world)
    m, v = [torch.zeros_like(p).reshape(-1) for p in params], [torch.zeros_like(p).reshape(-1) for p in params]
    for step, (x, y) in enumerate(batches, start=1):
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        for i, (p, c) in enumerate(zip(params, sizes)):
            grad = torch.empty_like(shards[i])
            dist.reduce_scatter_single(grad, _padded_grad(p, c, world))
            adam_update(shards[i], grad / world, m[i], v[i], step, lr)
            full = torch.empty(world * c, dtype=p.dtype, device=p.device)
            dist.all_gather_single(full, shards[i])
            with torch.no_grad():
                p.copy_(full[:p.numel()].view_as(p))
    return {name: p.detach() for name, p in model.named_parameters()}


# ---- zero2_train --------------------------------------------------------------------------------------------
def _zero2(dist, model, batches, lr, *, divide=True, free=True, first=1, accumulate=False, gather_first=False,
           hooks_each_step=False):
    """ZeRO-2 as the hints lay it out, with the knob of one mistake turned."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    sizes, shards = _shards(params, rank, world)
    m, v = [torch.zeros_like(s) for s in shards], [torch.zeros_like(s) for s in shards]
    grads = [torch.zeros_like(s) for s in shards]
    index = {id(p): i for i, p in enumerate(params)}

    def reduce_scatter(p):
        i = index[id(p)]
        out = torch.empty_like(grads[i])
        dist.reduce_scatter_single(out, _padded_grad(p, sizes[i], world))
        if accumulate:
            grads[i] += out
        else:
            grads[i].copy_(out)
        if free:
            p.grad = None

    def register():
        return [p.register_post_accumulate_grad_hook(reduce_scatter) for p in params]

    hooks = [] if hooks_each_step else register()

    def gather(i, p):
        full = torch.empty(world * sizes[i], dtype=p.dtype, device=p.device)
        dist.all_gather_single(full, shards[i])
        with torch.no_grad():
            p.copy_(full[:p.numel()].view_as(p))

    for step, (x, y) in enumerate(batches, start=first):
        if hooks_each_step:
            hooks += register()
        F.mse_loss(model(x), y).backward()
        for i, p in enumerate(params):
            if gather_first:
                gather(i, p)
            adam_update(shards[i], grads[i] / world if divide else grads[i], m[i], v[i], step, lr)
            if not gather_first:
                gather(i, p)
    for h in hooks:
        h.remove()
    return {name: p.detach() for name, p in model.named_parameters()}


def zero2_without_dividing(dist, model, batches, lr):
    """The summed gradient shards handed to Adam: N times the mean, which Adam's normalisation nearly hides."""
    return _zero2(dist, model, batches, lr, divide=False)


def zero2_keeps_each_gradient(dist, model, batches, lr):
    """Reduce-scatters in the hook but never sets p.grad = None: every full gradient stays alive, and the next
    step's backward adds to it (nothing else zeroes it)."""
    return _zero2(dist, model, batches, lr, free=False)


def zero2_counting_steps_from_zero(dist, model, batches, lr):
    """for step, (x, y) in enumerate(batches): Adam's step t = 0, and its bias correction divides by 1 - β^0 = 0."""
    return _zero2(dist, model, batches, lr, first=0)


def zero2_accumulating_shards(dist, model, batches, lr):
    """grads[i] += shard in the hook, as gradients accumulate, and the shards never zeroed between steps."""
    return _zero2(dist, model, batches, lr, accumulate=True)


def zero2_gathers_before_the_update(dist, model, batches, lr):
    """The parameters all-gathered first, then each shard updated: the model always runs one step behind."""
    return _zero2(dist, model, batches, lr, gather_first=True)


def zero2_hooks_registered_every_step(dist, model, batches, lr):
    """The hooks registered at the top of the step loop: from step 2 each gradient has two hooks, and the second
    finds p.grad already freed by the first."""
    return _zero2(dist, model, batches, lr, hooks_each_step=True)


# ---- zero3_train and fsdp_prefetch_train --------------------------------------------------------------------
def _zero3(dist, model, batches, lr, *, divide=True, gather_for_backward=True, free_grads=True, unpadded_view=False,
           result="gathered", prefetch=None):
    """ZeRO-3 as the hints lay it out, with the knob of one mistake turned. `prefetch`: how the next layer's
    gather is started and awaited (None: no prefetch, each layer gathered when reached)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    shapes = [p.shape for p in params]
    sizes, shards = _shards(params, rank, world)
    m, v = [torch.zeros_like(s) for s in shards], [torch.zeros_like(s) for s in shards]
    grads = [torch.zeros_like(s) for s in shards]
    index = {id(p): i for i, p in enumerate(params)}
    layers = list(model)

    def start(layer):
        pending = []
        for p in layer.parameters():
            i = index[id(p)]
            full = torch.empty(world * sizes[i], dtype=shards[i].dtype, device=shards[i].device)
            pending.append((p, full, dist.all_gather_single(full, shards[i], async_op=True)))
        return pending

    def finish(pending, wait=True):
        for p, full, work in pending:
            if wait:
                work.wait()
            i = index[id(p)]
            p.data = full.view(shapes[i]) if unpadded_view else full[:shapes[i].numel()].view(shapes[i])

    def free(layer):
        for p in layer.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def walk(order, step_back):
        """Gather each layer of `order` as it is reached, prefetching as `prefetch` says; yields the layers."""
        order = list(order)
        units = [j for j in order if list(layers[j].parameters())]
        ahead = {}
        if prefetch == "everything":
            ahead = {u: start(layers[u]) for u in units}
        for j in order:
            if j in units:
                if prefetch in ("next", "wait at once", "no wait", "forward direction"):
                    if j not in ahead:
                        ahead[j] = start(layers[j])
                    nxt = _next(units, j, step_back and prefetch != "forward direction")
                    if nxt is not None and nxt not in ahead:
                        ahead[nxt] = start(layers[nxt])
                        if prefetch == "wait at once":
                            finish(ahead[nxt])
                    finish(ahead.pop(j), wait=prefetch != "no wait")
                elif prefetch == "everything":
                    finish(ahead.pop(j))
                else:
                    finish(start(layers[j]))
            yield j

    for layer in layers:
        free(layer)
    for step, (x, y) in enumerate(batches, start=1):
        inputs, h = [], x
        with torch.no_grad():
            for j in walk(range(len(layers)), False):
                inputs.append(h)
                h = layers[j](h)
                free(layers[j])
        h.requires_grad_()
        F.mse_loss(h, y).backward()
        grad = h.grad
        order = walk(reversed(range(len(layers))), True) if gather_for_backward else reversed(range(len(layers)))
        for j in order:
            inp = inputs[j].detach().requires_grad_()
            layers[j](inp).backward(grad)
            grad = inp.grad
            for p in layers[j].parameters():
                i = index[id(p)]
                dist.reduce_scatter_single(grads[i], F.pad(p.grad.reshape(-1), (0, world * sizes[i] - p.numel())))
                if free_grads:
                    p.grad = None
            free(layers[j])
        for i in range(len(params)):
            adam_update(shards[i], grads[i] / world if divide else grads[i], m[i], v[i], step, lr)
    if result == "shards":
        return {name: shards[index[id(p)]] for name, p in model.named_parameters()}
    m.clear(), v.clear(), grads.clear()
    for layer in layers:
        finish(start(layer))
    return {name: p.detach() for name, p in model.named_parameters()}


def _next(units, j, backward):
    """The layer with parameters after j in the walk's direction (before j in backward), or None."""
    later = [u for u in units if (u < j if backward else u > j)]
    return (later[-1] if backward else later[0]) if later else None


def zero3_no_gather_for_backward(dist, model, batches, lr):
    """Gathers each layer for forward and frees it, then recomputes each layer in backward without gathering it
    again: the layer runs on its freed, empty parameters ('mat2 must be a matrix, got 1-D tensor', as FSDP users
    meet it: pytorch/tutorials#2610, huggingface/diffusers#6540)."""
    return _zero3(dist, model, batches, lr, gather_for_backward=False)


def zero3_without_dividing(dist, model, batches, lr):
    """The summed gradient shards handed to Adam, N times the mean."""
    return _zero3(dist, model, batches, lr, divide=False)


def zero3_returns_its_shards(dist, model, batches, lr):
    """Returns {name: this rank's shard} at the end, 'the state is sharded': the final all-gather left out."""
    return _zero3(dist, model, batches, lr, result="shards")


def zero3_keeps_full_gradients(dist, model, batches, lr):
    """Reduce-scatters each layer's gradients but never sets p.grad = None: every full gradient piles up, and the
    next step's backward adds to them."""
    return _zero3(dist, model, batches, lr, free_grads=False)


def zero3_views_the_padded_buffer(dist, model, batches, lr):
    """p.data = full.view(shape) on the padded buffer, without cutting the padding off with full[:n] first."""
    return _zero3(dist, model, batches, lr, unpadded_view=True)


def prefetch_waits_at_once(dist, model, batches, lr):
    """The next layer's all-gather started with async_op=True and waited on right away: nothing overlaps."""
    return _zero3(dist, model, batches, lr, prefetch="wait at once")


def prefetch_everything_up_front(dist, model, batches, lr):
    """Every layer's all-gather started at the top of forward (and of backward): all of the model at once."""
    return _zero3(dist, model, batches, lr, prefetch="everything")


def prefetch_never_waits(dist, model, batches, lr):
    """The gathered buffer used as soon as the next layer is reached, work.wait() forgotten."""
    return _zero3(dist, model, batches, lr, prefetch="no wait")


def prefetch_without_dividing(dist, model, batches, lr):
    """Prefetching right, the summed gradient shards handed to Adam."""
    return _zero3(dist, model, batches, lr, prefetch="next", divide=False)


def prefetch_forward_direction_in_backward(dist, model, batches, lr):
    """Backward copied from forward: it prefetches layer j + 1, already done, instead of layer j - 1."""
    return _zero3(dist, model, batches, lr, prefetch="forward direction")


# ---- zero_offload_train -------------------------------------------------------------------------------------
def _offload(dist, model, batches, lr, *, divide=True, back_to_device=True, accumulate=False, fixed_step=None,
             grad_to_host_first=False, after_backward=False, late_to_host=False, hooks_each_step=False,
             strided=False):
    """ZeRO-Offload as the hints lay it out, with the knob of one mistake turned."""
    rank, world = dist.get_rank(), dist.get_world_size()
    host = lib.host()
    params = list(model.parameters())
    sizes, shards = _shards(params, rank, world)
    if strided:                     # every N-th element from the rank's own: p[r::N] of the padded flat tensor
        shards = [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank::world].clone()
                  for p, c in zip(params, sizes)]
    shards = [s.to(host) for s in shards]
    m = [torch.zeros(c, dtype=p.dtype, device=host) for p, c in zip(params, sizes)]
    v = [torch.zeros(c, dtype=p.dtype, device=host) for p, c in zip(params, sizes)]
    grads = [torch.zeros(c, dtype=p.dtype, device=host) for p, c in zip(params, sizes)]
    index = {id(p): i for i, p in enumerate(params)}

    def reduce_scatter(p):
        i = index[id(p)]
        grad = F.pad(p.grad.reshape(-1), (0, world * sizes[i] - p.numel()))
        shard = torch.empty(sizes[i], dtype=p.dtype, device=host if grad_to_host_first else p.device)
        dist.reduce_scatter_single(shard, grad.to(host) if grad_to_host_first else grad)
        p.grad = None
        if accumulate:
            grads[i] += shard.to(host)
        else:
            grads[i] = shard if late_to_host else shard.to(host)

    hooks = [] if after_backward or hooks_each_step else [p.register_post_accumulate_grad_hook(reduce_scatter)
                                                          for p in params]
    for step, (x, y) in enumerate(batches, start=1):
        if hooks_each_step:
            hooks += [p.register_post_accumulate_grad_hook(reduce_scatter) for p in params]
        F.mse_loss(model(x), y).backward()
        for p in params if after_backward else ():
            reduce_scatter(p)
        for i, (p, c) in enumerate(zip(params, sizes)):
            grad = grads[i].to(host) if late_to_host else grads[i]
            adam_update(shards[i], grad / world if divide else grad, m[i], v[i], fixed_step or step, lr)
            full = torch.empty(world * c, dtype=p.dtype, device=p.device)
            dist.all_gather_single(full, shards[i].to(lib.device()) if back_to_device else shards[i])
            with torch.no_grad():
                p.copy_(full[:p.numel()].view_as(p))
    for h in hooks:
        h.remove()
    return {name: p.detach() for name, p in model.named_parameters()}


def offload_without_dividing(dist, model, batches, lr):
    """The host shards of the summed gradient handed to Adam, N times the mean."""
    return _offload(dist, model, batches, lr, divide=False)


def offload_gathers_from_the_host(dist, model, batches, lr):
    """The updated host shard all-gathered as it is, without bringing it back to the device first."""
    return _offload(dist, model, batches, lr, back_to_device=False)


def offload_accumulating_host_gradients(dist, model, batches, lr):
    """grads[i] += shard.to(host), 'accumulating on the host', and the host gradients never zeroed."""
    return _offload(dist, model, batches, lr, accumulate=True)


def offload_step_stuck_at_one(dist, model, batches, lr):
    """adam_update(..., 1, lr) with the step number hard-coded from the first try."""
    return _offload(dist, model, batches, lr, fixed_step=1)


def offload_reduce_scatters_on_the_host(dist, model, batches, lr):
    """Each gradient moved to the host first, then reduce-scattered there, 'to free the device sooner'."""
    return _offload(dist, model, batches, lr, grad_to_host_first=True)


def offload_reducing_after_backward(dist, model, batches, lr):
    """Backward to the end, then every gradient reduce-scattered and sent to the host in one loop, as in ZeRO-1."""
    return _offload(dist, model, batches, lr, after_backward=True)


def offload_moving_gradients_at_the_step(dist, model, batches, lr):
    """The reduced shards kept on the device through backward, each moved to the host only when Adam needs it."""
    return _offload(dist, model, batches, lr, late_to_host=True)


def offload_hooking_every_step(dist, model, batches, lr):
    """The gradient hooks registered at the top of the step loop, beside the forward they serve."""
    return _offload(dist, model, batches, lr, hooks_each_step=True)


def offload_strided_host_shards(dist, model, batches, lr):
    """Host shards cut as every N-th element from the rank's own (p[r::N]), 'to spread each row over the ranks'."""
    return _offload(dist, model, batches, lr, strided=True)


MISTAKES = [
    Attempt("zero1_train", zero1_without_dividing, named=HANDED_TO_ADAM),
    Attempt("zero1_train", zero1_rebinding_the_parameter, named=("unchanged", "the update itself is wrong")),
    Attempt("zero1_train", zero1_step_stuck_at_one, named="at step 2"),
    Attempt("zero1_train", zero1_without_zero_grad, named="at step 2"),
    Attempt("zero1_train", zero1_unpadded_chunks, named=("not a multiple of N", "pad it to")),
    Attempt("zero1_train", zero1_state_as_big_as_the_parameter, named=("the whole tensor where a shard belongs",
                                                                         "kept whole where the rank holds 1/N")),
    Attempt("zero1_train", zero1_one_flat_gradient_copy, named="a flat copy of the whole model's gradients"),
    Attempt("zero2_train", zero2_without_dividing, named=HANDED_TO_ADAM),
    Attempt("zero2_train", zero2_keeps_each_gradient, named="at step 2"),
    Attempt("zero2_train", zero2_counting_steps_from_zero, named="division by zero"),
    Attempt("zero2_train", zero2_accumulating_shards, named="at step 2"),
    Attempt("zero2_train", zero2_gathers_before_the_update, named=FIRST_STEP),
    Attempt("zero2_train", zero2_hooks_registered_every_step, named="the hook ran twice for one parameter"),
    Attempt("zero3_train", zero3_no_gather_for_backward, named=("Gather it first", "before it was gathered")),
    Attempt("zero3_train", zero3_without_dividing, named=HANDED_TO_ADAM),
    Attempt("zero3_train", zero3_returns_its_shards, named=A_SHARD_FOR_THE_WHOLE),
    Attempt("zero3_train", zero3_keeps_full_gradients, named="at step 2"),
    Attempt("zero3_train", zero3_views_the_padded_buffer, named="the padding"),
    Attempt("fsdp_prefetch_train", prefetch_waits_at_once, named="simulated time"),
    Attempt("fsdp_prefetch_train", prefetch_everything_up_front, named=("peak memory", "more layers gathered at once")),
    Attempt("fsdp_prefetch_train", prefetch_never_waits, named="wait"),
    Attempt("fsdp_prefetch_train", prefetch_without_dividing, named=HANDED_TO_ADAM),
    Attempt("fsdp_prefetch_train", prefetch_forward_direction_in_backward,
            named=("a prefetch of a layer done already", "in backward the walk goes the other way")),
    Attempt("zero_offload_train", offload_without_dividing, named=HANDED_TO_ADAM),
    Attempt("zero_offload_train", offload_accumulating_host_gradients, named="at step 2"),
    Attempt("zero_offload_train", offload_step_stuck_at_one, named="at step 2"),
    Attempt("zero_offload_train", offload_reduce_scatters_on_the_host, named="host memory"),
    Attempt("zero_offload_train", offload_reducing_after_backward, named="after its backward was over"),
    Attempt("zero_offload_train", offload_moving_gradients_at_the_step, named="stayed in device memory"),
    Attempt("zero_offload_train", offload_hooking_every_step, named="the hook ran twice for one parameter"),
    Attempt("zero_offload_train", offload_strided_host_shards, named="Your shard was strided"),
    # Passed while the simulator let a collective read a host tensor, which NCCL refuses (issue 32 §4).
    Attempt("zero_offload_train", offload_gathers_from_the_host, named=("host memory", "device memory")),
]
