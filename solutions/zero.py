"""Notebook 03, ZeRO and FSDP: the reference solutions."""

import math

import torch
import torch.nn.functional as F

import lib
from puzzles.zero import adam_update


def zero1_train(dist, model, batches, lr):
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    sizes = [math.ceil(p.numel() / world) for p in params]           # c: elements of each shard
    shards = [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].clone()
              for p, c in zip(params, sizes)]
    m = [torch.zeros_like(s) for s in shards]
    v = [torch.zeros_like(s) for s in shards]
    for step, (x, y) in enumerate(batches, start=1):
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        for i, (p, c) in enumerate(zip(params, sizes)):
            grad = torch.empty_like(shards[i])
            dist.reduce_scatter_single(grad, F.pad(p.grad.reshape(-1), (0, world * c - p.numel())))
            grad /= world
            adam_update(shards[i], grad, m[i], v[i], step, lr)
            full = torch.empty(world * c, dtype=p.dtype, device=p.device)
            dist.all_gather_single(full, shards[i])
            with torch.no_grad():
                p.copy_(full[:p.numel()].view_as(p))
    return {name: p.detach() for name, p in model.named_parameters()}


def zero2_train(dist, model, batches, lr):
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    sizes = [math.ceil(p.numel() / world) for p in params]
    shards = [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].clone()
              for p, c in zip(params, sizes)]
    m = [torch.zeros_like(s) for s in shards]
    v = [torch.zeros_like(s) for s in shards]
    grads = [torch.zeros_like(s) for s in shards]
    index = {id(p): i for i, p in enumerate(params)}

    def reduce_scatter(p):
        # As soon as backward has p's gradient: keep this rank's shard of the sum, drop the rest.
        i = index[id(p)]
        dist.reduce_scatter_single(grads[i], F.pad(p.grad.reshape(-1), (0, world * sizes[i] - p.numel())))
        p.grad = None

    hooks = [p.register_post_accumulate_grad_hook(reduce_scatter) for p in params]
    for step, (x, y) in enumerate(batches, start=1):
        F.mse_loss(model(x), y).backward()
        for i, (p, c) in enumerate(zip(params, sizes)):
            grads[i] /= world
            adam_update(shards[i], grads[i], m[i], v[i], step, lr)
            full = torch.empty(world * c, dtype=p.dtype, device=p.device)
            dist.all_gather_single(full, shards[i])
            with torch.no_grad():
                p.copy_(full[:p.numel()].view_as(p))
    for h in hooks:
        h.remove()
    return {name: p.detach() for name, p in model.named_parameters()}


def zero3_train(dist, model, batches, lr):
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    shapes = [p.shape for p in params]
    sizes = [math.ceil(p.numel() / world) for p in params]
    shards = [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].clone()
              for p, c in zip(params, sizes)]
    m = [torch.zeros_like(s) for s in shards]
    v = [torch.zeros_like(s) for s in shards]
    grads = [torch.zeros_like(s) for s in shards]
    index = {id(p): i for i, p in enumerate(params)}

    def gather(layer):
        for p in layer.parameters():
            i = index[id(p)]
            full = torch.empty(world * sizes[i], dtype=shards[i].dtype, device=shards[i].device)
            dist.all_gather_single(full, shards[i])
            p.data = full[:shapes[i].numel()].view(shapes[i])

    def free(layer):
        for p in layer.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    for layer in model:
        free(layer)                                   # from now on, only the shards live here
    for step, (x, y) in enumerate(batches, start=1):
        inputs, h = [], x
        with torch.no_grad():
            for layer in model:
                inputs.append(h)
                gather(layer)
                h = layer(h)
                free(layer)
        h.requires_grad_()
        F.mse_loss(h, y).backward()
        grad = h.grad
        for layer, inp in zip(reversed(model), reversed(inputs)):
            gather(layer)
            inp = inp.detach().requires_grad_()
            layer(inp).backward(grad)                 # recompute the layer's forward, then its backward
            grad = inp.grad
            for p in layer.parameters():
                i = index[id(p)]
                dist.reduce_scatter_single(grads[i], F.pad(p.grad.reshape(-1), (0, world * sizes[i] - p.numel())))
                p.grad = None
            free(layer)
        for i in range(len(params)):
            grads[i] /= world
            adam_update(shards[i], grads[i], m[i], v[i], step, lr)
    m.clear(), v.clear(), grads.clear()              # training is over: only the parameters are returned
    for layer in model:
        gather(layer)
    return {name: p.detach() for name, p in model.named_parameters()}


def fsdp_prefetch_train(dist, model, batches, lr):
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    shapes = [p.shape for p in params]
    sizes = [math.ceil(p.numel() / world) for p in params]
    shards = [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].clone()
              for p, c in zip(params, sizes)]
    m = [torch.zeros_like(s) for s in shards]
    v = [torch.zeros_like(s) for s in shards]
    grads = [torch.zeros_like(s) for s in shards]
    index = {id(p): i for i, p in enumerate(params)}
    layers = list(model)

    def start_gather(layer):
        """Issue the layer's all-gathers without waiting: (buffer, work) per parameter."""
        pending = []
        for p in layer.parameters():
            i = index[id(p)]
            full = torch.empty(world * sizes[i], dtype=shards[i].dtype, device=shards[i].device)
            pending.append((p, full, dist.all_gather_single(full, shards[i], async_op=True)))
        return pending

    def finish_gather(pending):
        for p, full, work in pending:
            work.wait()
            i = index[id(p)]
            p.data = full[:shapes[i].numel()].view(shapes[i])

    def free(layer):
        for p in layer.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    units = [j for j, layer in enumerate(layers) if list(layer.parameters())]   # the layers with parameters
    for layer in layers:
        free(layer)
    for step, (x, y) in enumerate(batches, start=1):
        inputs, h = [], x
        ahead = {units[0]: start_gather(layers[units[0]])}
        with torch.no_grad():
            for j, layer in enumerate(layers):
                if j in ahead:
                    later = [u for u in units if u > j]
                    if later:                         # the next layer's gather runs while this one computes
                        ahead[later[0]] = start_gather(layers[later[0]])
                    finish_gather(ahead.pop(j))
                inputs.append(h)
                h = layer(h)
                free(layer)
        h.requires_grad_()
        F.mse_loss(h, y).backward()
        grad = h.grad
        ahead = {units[-1]: start_gather(layers[units[-1]])}
        for j in reversed(range(len(layers))):
            if j in ahead:
                earlier = [u for u in units if u < j]
                if earlier:                           # in backward, the previous layer is next
                    ahead[earlier[-1]] = start_gather(layers[earlier[-1]])
                finish_gather(ahead.pop(j))
            inp = inputs[j].detach().requires_grad_()
            layers[j](inp).backward(grad)
            grad = inp.grad
            for p in layers[j].parameters():
                i = index[id(p)]
                dist.reduce_scatter_single(grads[i], F.pad(p.grad.reshape(-1), (0, world * sizes[i] - p.numel())))
                p.grad = None
            free(layers[j])
        for i in range(len(params)):
            grads[i] /= world
            adam_update(shards[i], grads[i], m[i], v[i], step, lr)
    m.clear(), v.clear(), grads.clear()
    for layer in layers:
        finish_gather(start_gather(layer))
    return {name: p.detach() for name, p in model.named_parameters()}


def zero_offload_train(dist, model, batches, lr):
    rank, world = dist.get_rank(), dist.get_world_size()
    host = lib.host()
    params = list(model.parameters())
    sizes = [math.ceil(p.numel() / world) for p in params]
    # The shard's master parameters, gradients, m and v all live in host memory.
    shards = [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].to(host)
              for p, c in zip(params, sizes)]
    m = [torch.zeros(c, dtype=p.dtype, device=host) for p, c in zip(params, sizes)]
    v = [torch.zeros(c, dtype=p.dtype, device=host) for p, c in zip(params, sizes)]
    grads = [None] * len(params)
    index = {id(p): i for i, p in enumerate(params)}

    def reduce_scatter(p):
        i = index[id(p)]
        shard = torch.empty(sizes[i], dtype=p.dtype, device=p.device)
        dist.reduce_scatter_single(shard, F.pad(p.grad.reshape(-1), (0, world * sizes[i] - p.numel())))
        p.grad = None
        grads[i] = shard.to(host)

    hooks = [p.register_post_accumulate_grad_hook(reduce_scatter) for p in params]
    for step, (x, y) in enumerate(batches, start=1):
        F.mse_loss(model(x), y).backward()
        for i, (p, c) in enumerate(zip(params, sizes)):
            grads[i] /= world
            adam_update(shards[i], grads[i], m[i], v[i], step, lr)
            grads[i] = None
            full = torch.empty(world * c, dtype=p.dtype, device=p.device)
            dist.all_gather_single(full, shards[i].to(lib.device()))
            with torch.no_grad():
                p.copy_(full[:p.numel()].view_as(p))
    for h in hooks:
        h.remove()
    return {name: p.detach() for name, p in model.named_parameters()}
