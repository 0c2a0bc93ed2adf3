"""Notebook 03 (ZeRO and FSDP): first attempts, written from the notebook alone.

ZeRO-1 and ZeRO-2 attempts are written out one by one. ZeRO-3, FSDP prefetching and ZeRO-Offload are long;
their attempts share one learner's implementation (``_zero3`` and ``_offload``), each attempt switching on
the one thing that learner got wrong, so that the mistake is the only difference between them.
"""
import math

import torch
import torch.nn.functional as F

import lib
from lib.analytic.formulas import model_state_bytes
from lib.units import fmt_bytes
from puzzles import zero as P
from puzzles.zero import adam_update


def _padded(t, n):
    flat = t.detach().reshape(-1)
    c = math.ceil(flat.numel() / n)
    out = torch.zeros(n * c, dtype=flat.dtype)
    out[:flat.numel()] = flat
    return out, c


# ---------------------------------------------------------------- puzzle 1: zero1_train

def zero1_train_all_reduce(dist, model, batches, lr):
    n, r = dist.get_world_size(), dist.get_rank()
    params = list(model.parameters())
    state = []
    for p in params:
        flat, c = _padded(p, n)
        master = flat[r * c:(r + 1) * c].clone()
        state.append((master, torch.zeros(c, dtype=p.dtype), torch.zeros(c, dtype=p.dtype), c))
    for step, (x, y) in enumerate(batches, 1):
        F.mse_loss(model(x), y).backward()
        for p, (master, m, v, c) in zip(params, state):
            g, _ = _padded(p.grad, n)
            dist.all_reduce(g)                # all-reduce, then take my slice
            g = g[r * c:(r + 1) * c] / n
            adam_update(master, g, m, v, step, lr)
            full = torch.empty(n * c, dtype=p.dtype)
            dist.all_gather_single(full, master)
            p.data.copy_(full[:p.numel()].view_as(p))
            p.grad = None
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def zero1_train_no_divide(dist, model, batches, lr):
    n, r = dist.get_world_size(), dist.get_rank()
    params = list(model.parameters())
    state = []
    for p in params:
        flat, c = _padded(p, n)
        state.append((flat[r * c:(r + 1) * c].clone(), torch.zeros(c, dtype=p.dtype), torch.zeros(c, dtype=p.dtype), c))
    for step, (x, y) in enumerate(batches, 1):
        F.mse_loss(model(x), y).backward()
        for p, (master, m, v, c) in zip(params, state):
            g, _ = _padded(p.grad, n)
            out = torch.empty(c, dtype=p.dtype)
            dist.reduce_scatter_single(out, g)
            adam_update(master, out, m, v, step, lr)
            full = torch.empty(n * c, dtype=p.dtype)
            dist.all_gather_single(full, master)
            p.data.copy_(full[:p.numel()].view_as(p))
            p.grad = None
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def zero1_train_no_padding(dist, model, batches, lr):
    n, r = dist.get_world_size(), dist.get_rank()
    params = list(model.parameters())
    state = []
    for p in params:
        shard = p.detach().flatten().chunk(n)[r].clone()
        state.append((shard, torch.zeros_like(shard), torch.zeros_like(shard)))
    for step, (x, y) in enumerate(batches, 1):
        F.mse_loss(model(x), y).backward()
        for p, (master, m, v) in zip(params, state):
            out = torch.empty_like(master)
            dist.reduce_scatter_single(out, p.grad.flatten())
            out /= n
            adam_update(master, out, m, v, step, lr)
            full = torch.empty(p.numel(), dtype=p.dtype)
            dist.all_gather_single(full, master)
            p.data.copy_(full.view_as(p))
            p.grad = None
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def zero1_train_step_from_zero(dist, model, batches, lr):
    n, r = dist.get_world_size(), dist.get_rank()
    params = list(model.parameters())
    state = []
    for p in params:
        flat, c = _padded(p, n)
        state.append((flat[r * c:(r + 1) * c].clone(), torch.zeros(c, dtype=p.dtype), torch.zeros(c, dtype=p.dtype), c))
    for step, (x, y) in enumerate(batches):   # step 0 first
        F.mse_loss(model(x), y).backward()
        for p, (master, m, v, c) in zip(params, state):
            g, _ = _padded(p.grad, n)
            out = torch.empty(c, dtype=p.dtype)
            dist.reduce_scatter_single(out, g)
            out /= n
            adam_update(master, out, m, v, step, lr)
            full = torch.empty(n * c, dtype=p.dtype)
            dist.all_gather_single(full, master)
            p.data.copy_(full[:p.numel()].view_as(p))
            p.grad = None
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def zero1_train_full_state(dist, model, batches, lr):
    n, r = dist.get_world_size(), dist.get_rank()
    params = list(model.parameters())
    # m and v for the whole padded parameter, only my slice used
    state = []
    for p in params:
        flat, c = _padded(p, n)
        state.append((flat.clone(), torch.zeros(n * c, dtype=p.dtype), torch.zeros(n * c, dtype=p.dtype), c))
    for step, (x, y) in enumerate(batches, 1):
        F.mse_loss(model(x), y).backward()
        for p, (master, m, v, c) in zip(params, state):
            g, _ = _padded(p.grad, n)
            out = torch.empty(c, dtype=p.dtype)
            dist.reduce_scatter_single(out, g)
            out /= n
            sl = slice(r * c, (r + 1) * c)
            adam_update(master[sl], out, m[sl], v[sl], step, lr)
            full = torch.empty(n * c, dtype=p.dtype)
            dist.all_gather_single(full, master[sl].contiguous())
            p.data.copy_(full[:p.numel()].view_as(p))
            p.grad = None
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def zero1_train_shard_per_rank_order(dist, model, batches, lr):
    n, r = dist.get_world_size(), dist.get_rank()
    params = list(model.parameters())
    state = []
    for p in params:
        flat, c = _padded(p, n)
        # strided shard: element r, r+N, r+2N ... (thought it balanced better)
        state.append((flat[r::n].clone(), torch.zeros(c, dtype=p.dtype), torch.zeros(c, dtype=p.dtype), c))
    for step, (x, y) in enumerate(batches, 1):
        F.mse_loss(model(x), y).backward()
        for p, (master, m, v, c) in zip(params, state):
            g, _ = _padded(p.grad, n)
            out = torch.empty(c, dtype=p.dtype)
            dist.reduce_scatter_single(out, g)
            out /= n
            adam_update(master, out, m, v, step, lr)
            full = torch.empty(n * c, dtype=p.dtype)
            dist.all_gather_single(full, master)
            p.data.copy_(full[:p.numel()].view_as(p))
            p.grad = None
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def zero1_train_flat_buffer(dist, model, batches, lr):
    # correct: one flat padded buffer for all parameters, one reduce-scatter and one all-gather per step
    n, r = dist.get_world_size(), dist.get_rank()
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    c = math.ceil(total / n)
    flat = torch.zeros(n * c, dtype=params[0].dtype)
    flat[:total] = torch.cat([p.detach().reshape(-1) for p in params])
    master = flat[r * c:(r + 1) * c].clone()
    del flat
    m, v = torch.zeros(c, dtype=master.dtype), torch.zeros(c, dtype=master.dtype)
    for step, (x, y) in enumerate(batches, 1):
        F.mse_loss(model(x), y).backward()
        g = torch.zeros(n * c, dtype=master.dtype)
        g[:total] = torch.cat([p.grad.reshape(-1) for p in params])
        for p in params:
            p.grad = None
        out = torch.empty(c, dtype=master.dtype)
        dist.reduce_scatter_single(out, g)
        del g
        out /= n
        adam_update(master, out, m, v, step, lr)
        full = torch.empty(n * c, dtype=master.dtype)
        dist.all_gather_single(full, master)
        offset = 0
        with torch.no_grad():
            for p in params:
                p.copy_(full[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        del full
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# ---------------------------------------------------------------- puzzle 2: zero2_train

def _zero2(dist, model, batches, lr, *, keep_grad=False, hooks_each_step=False, after_backward=False,
           divide=True, pad=True):
    n, r = dist.get_world_size(), dist.get_rank()
    named = list(model.named_parameters())
    state, shard_grads = {}, {}
    for name, p in named:
        flat, c = _padded(p, n)
        state[name] = (flat[r * c:(r + 1) * c].clone(), torch.zeros(c, dtype=p.dtype), torch.zeros(c, dtype=p.dtype), c)

    def make_hook(name):
        def hook(p):
            c = state[name][3]
            if pad:
                g, _ = _padded(p.grad, n)
            else:
                g = p.grad.reshape(-1)
            out = torch.empty(c, dtype=p.dtype)
            dist.reduce_scatter_single(out, g)
            shard_grads[name] = out / n if divide else out
            if not keep_grad:
                p.grad = None
        return hook

    if not hooks_each_step and not after_backward:
        for name, p in named:
            p.register_post_accumulate_grad_hook(make_hook(name))
    for step, (x, y) in enumerate(batches, 1):
        if hooks_each_step:
            for name, p in named:
                p.register_post_accumulate_grad_hook(make_hook(name))
        F.mse_loss(model(x), y).backward()
        if after_backward:
            for name, p in named:
                make_hook(name)(p)
        for name, p in named:
            master, m, v, c = state[name]
            adam_update(master, shard_grads.pop(name), m, v, step, lr)
            full = torch.empty(n * c, dtype=p.dtype)
            dist.all_gather_single(full, master)
            p.data.copy_(full[:p.numel()].view_as(p))
            if keep_grad:
                p.grad = None
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def zero2_train_keeps_full_grad(dist, model, batches, lr):
    return _zero2(dist, model, batches, lr, keep_grad=True)


def zero2_train_hooks_every_step(dist, model, batches, lr):
    return _zero2(dist, model, batches, lr, hooks_each_step=True)


def zero2_train_after_backward(dist, model, batches, lr):
    return _zero2(dist, model, batches, lr, after_backward=True)


def zero2_train_no_divide(dist, model, batches, lr):
    return _zero2(dist, model, batches, lr, divide=False)


def zero2_train_unpadded_input(dist, model, batches, lr):
    return _zero2(dist, model, batches, lr, pad=False)


def zero2_train_written_out(dist, model, batches, lr):
    # correct, written out: hooks by a factory, shards kept in a list indexed like the parameters
    n, r = dist.get_world_size(), dist.get_rank()
    params = list(model.parameters())
    sizes = [math.ceil(p.numel() / n) for p in params]
    masters, ms, vs = [], [], []
    for p, c in zip(params, sizes):
        flat = torch.zeros(n * c, dtype=p.dtype)
        flat[:p.numel()] = p.detach().reshape(-1)
        masters.append(flat[r * c:(r + 1) * c].clone())
        ms.append(torch.zeros(c, dtype=p.dtype))
        vs.append(torch.zeros(c, dtype=p.dtype))
    grads = [None] * len(params)

    def hook_for(i):
        def hook(p):
            c = sizes[i]
            flat = torch.zeros(n * c, dtype=p.dtype)
            flat[:p.numel()] = p.grad.reshape(-1)
            p.grad = None
            out = torch.empty(c, dtype=p.dtype)
            dist.reduce_scatter_single(out, flat)
            grads[i] = out.div_(n)
        return hook

    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(hook_for(i))
    for step, (x, y) in enumerate(batches, 1):
        F.mse_loss(model(x), y).backward()
        for i, p in enumerate(params):
            adam_update(masters[i], grads[i], ms[i], vs[i], step, lr)
            grads[i] = None
            full = torch.empty(n * sizes[i], dtype=p.dtype)
            dist.all_gather_single(full, masters[i])
            with torch.no_grad():
                p.copy_(full[:p.numel()].view_as(p))
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# ---------------------------------------------------------------- puzzles 3 and 4: zero3_train, fsdp_prefetch_train

def _zero3(dist, model, batches, lr, *, free_after_forward=True, gather_for_backward=True, divide=True,
           gather_at_end=True, prefetch=False, prefetch_backward=True, wait_prefetch=True, wait_at_once=False,
           prefetch_all=False, rs_with_all_reduce=False):
    n, r = dist.get_world_size(), dist.get_rank()
    layers = list(model.children()) if len(list(model.children())) else [model]
    shard = {}
    for layer in layers:
        for p in layer.parameters():
            flat, c = _padded(p, n)
            shard[p] = (flat[r * c:(r + 1) * c].clone(), torch.zeros(c, dtype=p.dtype), torch.zeros(c, dtype=p.dtype),
                        c, p.shape, p.numel())
            p.data = torch.empty(0, dtype=p.dtype)

    def start_gather(layer):
        pending = []
        for p in layer.parameters():
            master, _, _, c, shape, numel = shard[p]
            full = torch.empty(n * c, dtype=p.dtype)
            work = dist.all_gather_single(full, master, async_op=True)
            pending.append((p, full, work, shape, numel))
        return pending

    def finish_gather(pending, wait=True):
        for p, full, work, shape, numel in pending:
            if wait:
                work.wait()
            p.data = full[:numel].view(shape)

    def gather(layer):
        for p in layer.parameters():
            master, _, _, c, shape, numel = shard[p]
            full = torch.empty(n * c, dtype=p.dtype)
            dist.all_gather_single(full, master)
            p.data = full[:numel].view(shape)

    def free(layer):
        for p in layer.parameters():
            p.data = torch.empty(0, dtype=p.dtype)

    grads = {}
    for step, (x, y) in enumerate(batches, 1):
        inputs, h = [], x
        ahead = {}
        if prefetch and prefetch_all:
            for i, layer in enumerate(layers):
                ahead[i] = start_gather(layer)
        elif prefetch:
            ahead[0] = start_gather(layers[0])
        for i, layer in enumerate(layers):
            if prefetch:
                if i + 1 < len(layers) and not prefetch_all:
                    ahead[i + 1] = start_gather(layers[i + 1])
                    if wait_at_once:
                        for _, _, work, _, _ in ahead[i + 1]:
                            work.wait()
                finish_gather(ahead.pop(i), wait=wait_prefetch)
            else:
                gather(layer)
            inputs.append(h)
            with torch.no_grad():
                h = layer(h)
            if free_after_forward:
                free(layer)
        out = h.detach().requires_grad_()
        F.mse_loss(out, y).backward()
        grad = out.grad
        order = list(range(len(layers)))[::-1]
        if prefetch and prefetch_backward:
            ahead = {order[0]: start_gather(layers[order[0]])}
        for j, i in enumerate(order):
            layer = layers[i]
            if prefetch and prefetch_backward:
                if j + 1 < len(order):
                    ahead[order[j + 1]] = start_gather(layers[order[j + 1]])
                finish_gather(ahead.pop(i), wait=wait_prefetch)
            elif gather_for_backward:
                gather(layer)
            inp = inputs[i].detach().requires_grad_()
            layer(inp).backward(grad)
            grad = inp.grad
            for p in layer.parameters():
                master, m, v, c, shape, numel = shard[p]
                flat = torch.zeros(n * c, dtype=p.dtype)
                flat[:numel] = p.grad.reshape(-1)
                p.grad = None
                if rs_with_all_reduce:
                    dist.all_reduce(flat)
                    out_g = flat[r * c:(r + 1) * c].clone()
                else:
                    out_g = torch.empty(c, dtype=p.dtype)
                    dist.reduce_scatter_single(out_g, flat)
                grads[p] = out_g / n if divide else out_g
            free(layer)
        for p, (master, m, v, c, shape, numel) in shard.items():
            adam_update(master, grads.pop(p), m, v, step, lr)
    result = {}
    for name, p in model.named_parameters():
        master, m, v, c, shape, numel = shard[p]
        if gather_at_end:
            full = torch.empty(n * c, dtype=p.dtype)
            dist.all_gather_single(full, master)
            result[name] = full[:numel].view(shape).clone()
        else:
            result[name] = master.clone()
    return result


def zero3_train_keep_after_forward(dist, model, batches, lr):
    return _zero3(dist, model, batches, lr, free_after_forward=False, gather_for_backward=False)


def zero3_train_no_regather(dist, model, batches, lr):
    return _zero3(dist, model, batches, lr, gather_for_backward=False)


def zero3_train_no_divide(dist, model, batches, lr):
    return _zero3(dist, model, batches, lr, divide=False)


def zero3_train_returns_shards(dist, model, batches, lr):
    return _zero3(dist, model, batches, lr, gather_at_end=False)


def zero3_train_all_reduce_grads(dist, model, batches, lr):
    return _zero3(dist, model, batches, lr, rs_with_all_reduce=True)


def zero3_train_output_leaf(dist, model, batches, lr):
    # correct: forward under no_grad, backward started from a detached output's .grad, layer by layer
    return _zero3(dist, model, batches, lr)


def fsdp_prefetch_train_wait_at_once(dist, model, batches, lr):
    return _zero3(dist, model, batches, lr, prefetch=True, wait_at_once=True)


def fsdp_prefetch_train_forward_only(dist, model, batches, lr):
    return _zero3(dist, model, batches, lr, prefetch=True, prefetch_backward=False)


def fsdp_prefetch_train_no_wait(dist, model, batches, lr):
    return _zero3(dist, model, batches, lr, prefetch=True, wait_prefetch=False)


def fsdp_prefetch_train_all_at_once(dist, model, batches, lr):
    return _zero3(dist, model, batches, lr, prefetch=True, prefetch_all=True)


def fsdp_prefetch_train_no_prefetch(dist, model, batches, lr):
    return _zero3(dist, model, batches, lr, prefetch=False)


def fsdp_prefetch_train_no_divide(dist, model, batches, lr):
    return _zero3(dist, model, batches, lr, prefetch=True, divide=False)


# ---------------------------------------------------------------- puzzle 5: zero_offload_train

def _offload(dist, model, batches, lr, *, state_on_host=True, grad_to_host=True, back_to_device=True,
             divide=True, hook=True):
    n, r = dist.get_world_size(), dist.get_rank()
    named = list(model.named_parameters())
    where = lib.host() if state_on_host else lib.device()
    state, shard_grads = {}, {}
    for name, p in named:
        flat, c = _padded(p, n)
        state[name] = (flat[r * c:(r + 1) * c].to(where), torch.zeros(c, dtype=p.dtype, device=where),
                       torch.zeros(c, dtype=p.dtype, device=where), c)

    def reduce(name, p):
        c = state[name][3]
        g, _ = _padded(p.grad, n)
        out = torch.empty(c, dtype=p.dtype)
        dist.reduce_scatter_single(out, g)
        if divide:
            out /= n
        shard_grads[name] = out.to(lib.host()) if grad_to_host else out
        p.grad = None

    if hook:
        for name, p in named:
            p.register_post_accumulate_grad_hook(lambda p, name=name: reduce(name, p))
    for step, (x, y) in enumerate(batches, 1):
        F.mse_loss(model(x), y).backward()
        if not hook:
            for name, p in named:
                reduce(name, p)
        for name, p in named:
            master, m, v, c = state[name]
            adam_update(master, shard_grads.pop(name), m, v, step, lr)
            full = torch.empty(n * c, dtype=p.dtype)
            dist.all_gather_single(full, master.to(lib.device()) if back_to_device else master)
            p.data.copy_(full[:p.numel()].view_as(p))
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def zero_offload_train_gather_host_tensor(dist, model, batches, lr):
    return _offload(dist, model, batches, lr, back_to_device=False)


def zero_offload_train_state_on_device(dist, model, batches, lr):
    return _offload(dist, model, batches, lr, state_on_host=False, grad_to_host=False)


def zero_offload_train_grad_stays_on_device(dist, model, batches, lr):
    return _offload(dist, model, batches, lr, grad_to_host=False)


def zero_offload_train_no_divide(dist, model, batches, lr):
    return _offload(dist, model, batches, lr, divide=False)


def zero_offload_train_after_backward(dist, model, batches, lr):
    return _offload(dist, model, batches, lr, hook=False)


def zero_offload_train_correct(dist, model, batches, lr):
    return _offload(dist, model, batches, lr)


ATTEMPTS = [
    ("zero1_train", zero1_train_all_reduce, "all-reduced the whole gradient and took my slice instead of a reduce-scatter"),
    ("zero1_train", zero1_train_no_divide, "reduce-scattered with SUM and forgot to divide by N"),
    ("zero1_train", zero1_train_no_padding, "no padding: sharded with flatten().chunk(N), uneven when the size does not divide"),
    ("zero1_train", zero1_train_step_from_zero, "Adam's step counted from 0 (bias correction divides by zero)"),
    ("zero1_train", zero1_train_full_state, "allocated m, v and the master copy for the whole parameter, used only my slice"),
    ("zero1_train", zero1_train_shard_per_rank_order, "took a strided shard (r, r+N, ...) while reduce-scatter hands out contiguous blocks"),
    ("zero1_train", zero1_train_flat_buffer, "correct: one flat padded buffer of all parameters, one reduce-scatter and all-gather per step"),
    ("zero2_train", zero2_train_keeps_full_grad, "reduce-scattered in the hook but forgot p.grad = None"),
    ("zero2_train", zero2_train_hooks_every_step, "registered the hooks inside the step loop, so each step adds another"),
    ("zero2_train", zero2_train_after_backward, "reduce-scattered after backward, not from the hooks (all full gradients alive)"),
    ("zero2_train", zero2_train_no_divide, "forgot to divide the gradient shard by N"),
    ("zero2_train", zero2_train_unpadded_input, "passed the unpadded gradient to reduce_scatter_single"),
    ("zero2_train", zero2_train_written_out, "correct: hooks made by a factory, shards in lists indexed like the parameters"),
    ("zero3_train", zero3_train_keep_after_forward, "did not free the gathered weights after forward, kept them for backward"),
    ("zero3_train", zero3_train_no_regather, "freed after forward but forgot to gather again for backward"),
    ("zero3_train", zero3_train_no_divide, "forgot to divide the reduce-scattered gradients by N"),
    ("zero3_train", zero3_train_returns_shards, "returned my shards instead of gathering the full parameters at the end"),
    ("zero3_train", zero3_train_all_reduce_grads, "all-reduced each gradient and kept my slice instead of reduce-scatter"),
    ("zero3_train", zero3_train_output_leaf, "correct: forward under no_grad, backward from a detached output's .grad, one layer recomputed at a time"),
    ("fsdp_prefetch_train", fsdp_prefetch_train_wait_at_once, "waited on the prefetch right after issuing it (no overlap)"),
    ("fsdp_prefetch_train", fsdp_prefetch_train_forward_only, "prefetched in forward only, backward gathers synchronously"),
    ("fsdp_prefetch_train", fsdp_prefetch_train_no_wait, "never waited on the prefetched all-gather before using the weights"),
    ("fsdp_prefetch_train", fsdp_prefetch_train_all_at_once, "issued every layer's all-gather at the start of forward"),
    ("fsdp_prefetch_train", fsdp_prefetch_train_no_prefetch, "submitted my ZeRO-3 unchanged (no prefetch)"),
    ("fsdp_prefetch_train", fsdp_prefetch_train_no_divide, "prefetch right, forgot to divide the gradients by N"),
    ("zero_offload_train", zero_offload_train_gather_host_tensor, "all-gathered the updated shard straight from host memory"),
    ("zero_offload_train", zero_offload_train_state_on_device, "kept the shard, m and v on the device (no offload)"),
    ("zero_offload_train", zero_offload_train_grad_stays_on_device, "forgot to move the gradient shard to the host before adam_update"),
    ("zero_offload_train", zero_offload_train_no_divide, "forgot to divide the gradient shard by N"),
    ("zero_offload_train", zero_offload_train_after_backward, "reduce-scattered after backward (ZeRO-1's memory), not in hooks"),
    ("zero_offload_train", zero_offload_train_correct, "correct: shard, m, v on the host; grad shard to host in the hook; update back to device"),
]
