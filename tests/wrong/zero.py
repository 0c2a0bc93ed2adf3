"""Wrong answers to notebook 03's puzzles, each with the words its failure message must contain.

A wrong answer must fail, whatever else it gets right; tests/test_content.py runs every catalogue.
"""

import math

import torch
import torch.nn.functional as F

import solutions.zero as S
from puzzles.zero import adam_update, ddp_adam_train


def zero1_without_sharding(dist, model, batches, lr):
    """Data parallelism: every rank keeps Adam's state for the whole model."""
    return ddp_adam_train(dist, model, batches, lr)


def zero1_drops_the_remainder(dist, model, batches, lr):
    """Shards of n // N elements: the last n % N elements of a parameter are never updated."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for p in model.parameters():
        c = p.numel() // world
        p.m, p.v = torch.zeros(c, dtype=p.dtype), torch.zeros(c, dtype=p.dtype)
    for step, (x, y) in enumerate(batches, start=1):
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():
            c = p.numel() // world
            grad = torch.empty(c, dtype=p.dtype)
            dist.reduce_scatter_single(grad, p.grad.reshape(-1)[:world * c].contiguous())
            grad /= world
            shard = p.detach().reshape(-1)[rank * c:(rank + 1) * c].clone()
            adam_update(shard, grad, p.m, p.v, step, lr)
            full = torch.empty(world * c, dtype=p.dtype)
            dist.all_gather_single(full, shard)
            with torch.no_grad():
                p.view(-1)[:world * c].copy_(full)
    return {name: p.detach() for name, p in model.named_parameters()}


def zero1_all_reduces(dist, model, batches, lr):
    """All-reduce the gradients, then all-gather the parameters: 1.5x data parallelism's traffic."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    sizes = [math.ceil(p.numel() / world) for p in params]
    m = [torch.zeros(c, dtype=p.dtype) for p, c in zip(params, sizes)]
    v = [torch.zeros(c, dtype=p.dtype) for p, c in zip(params, sizes)]
    for step, (x, y) in enumerate(batches, start=1):
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        for i, (p, c) in enumerate(zip(params, sizes)):
            dist.all_reduce(p.grad)
            grad = F.pad(p.grad.reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c] / world
            shard = F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].clone()
            adam_update(shard, grad, m[i], v[i], step, lr)
            full = torch.empty(world * c, dtype=p.dtype)
            dist.all_gather_single(full, shard)
            with torch.no_grad():
                p.copy_(full[:p.numel()].view_as(p))
    return {name: p.detach() for name, p in model.named_parameters()}


def zero2_all_reduces(dist, model, batches, lr):
    """Stage 2 with an all-reduce in the hook instead of a reduce-scatter."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    sizes = [math.ceil(p.numel() / world) for p in params]
    shards = [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].clone()
              for p, c in zip(params, sizes)]
    m = [torch.zeros_like(s) for s in shards]
    v = [torch.zeros_like(s) for s in shards]
    grads = [torch.zeros_like(s) for s in shards]
    index = {id(p): i for i, p in enumerate(params)}

    def hook(p):
        i = index[id(p)]
        dist.all_reduce(p.grad)
        padded_grad = F.pad(p.grad.reshape(-1), (0, world * sizes[i] - p.numel()))
        grads[i].copy_(padded_grad[rank * sizes[i]:(rank + 1) * sizes[i]])
        p.grad = None

    hooks = [p.register_post_accumulate_grad_hook(hook) for p in params]
    for step, (x, y) in enumerate(batches, start=1):
        F.mse_loss(model(x), y).backward()
        for i, (p, c) in enumerate(zip(params, sizes)):
            grads[i] /= world
            adam_update(shards[i], grads[i], m[i], v[i], step, lr)
            full = torch.empty(world * c, dtype=p.dtype)
            dist.all_gather_single(full, shards[i])
            with torch.no_grad():
                p.copy_(full[:p.numel()].view_as(p))
    for h in hooks:
        h.remove()
    return {name: p.detach() for name, p in model.named_parameters()}


def zero2_keeps_full_gradients(dist, model, batches, lr):
    """Stage 1 handed in as stage 2: every full gradient exists at once. Its peak meets stage 2's budget at N = 2,
    where the activations freed make room for the gradients kept: the order of its reduce-scatters tells."""
    return S.zero1_train(dist, model, batches, lr)


def zero3_gathers_all_layers_at_once(dist, model, batches, lr):
    """Shards the state, but gathers the whole model before forward and keeps it through backward."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    sizes = [math.ceil(p.numel() / world) for p in params]
    shards = [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].clone()
              for p, c in zip(params, sizes)]
    shapes = [p.shape for p in params]
    for p in params:
        p.data = torch.empty(0, dtype=p.dtype)
    m = [torch.zeros_like(s) for s in shards]
    v = [torch.zeros_like(s) for s in shards]
    for step, (x, y) in enumerate(batches, start=1):
        for i, p in enumerate(params):
            full = torch.empty(world * sizes[i], dtype=p.dtype)
            dist.all_gather_single(full, shards[i])
            p.data = full[:shapes[i].numel()].view(shapes[i])
        F.mse_loss(model(x), y).backward()
        for i, p in enumerate(params):
            grad = torch.empty_like(shards[i])
            dist.reduce_scatter_single(grad, F.pad(p.grad.reshape(-1), (0, world * sizes[i] - p.numel())))
            p.grad = None
            p.data = torch.empty(0, dtype=p.dtype)
            grad /= world
            adam_update(shards[i], grad, m[i], v[i], step, lr)
    m.clear(), v.clear()
    for i, p in enumerate(params):
        full = torch.empty(world * sizes[i], dtype=p.dtype)
        dist.all_gather_single(full, shards[i])
        p.data = full[:shapes[i].numel()].view(shapes[i])
    return {name: p.detach() for name, p in model.named_parameters()}


def zero3_never_frees(dist, model, batches, lr):
    """Gathers each layer just before use, as it should, but never frees what it gathered."""
    world = dist.get_world_size()
    rank = dist.get_rank()
    params = list(model.parameters())
    sizes = [math.ceil(p.numel() / world) for p in params]
    shards = [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].clone()
              for p, c in zip(params, sizes)]
    shapes = [p.shape for p in params]
    index = {id(p): i for i, p in enumerate(params)}
    m = [torch.zeros_like(s) for s in shards]
    v = [torch.zeros_like(s) for s in shards]
    grads = [torch.zeros_like(s) for s in shards]
    kept = []

    def gather(layer):
        for p in layer.parameters():
            i = index[id(p)]
            full = torch.empty(world * sizes[i], dtype=p.dtype)
            dist.all_gather_single(full, shards[i])
            kept.append(full)
            p.data = full[:shapes[i].numel()].view(shapes[i])

    for step, (x, y) in enumerate(batches, start=1):
        kept.clear()
        inputs, h = [], x
        with torch.no_grad():
            for layer in model:
                inputs.append(h)
                gather(layer)
                h = layer(h)
        h.requires_grad_()
        F.mse_loss(h, y).backward()
        grad = h.grad
        for layer, inp in zip(reversed(model), reversed(inputs)):
            gather(layer)
            inp = inp.detach().requires_grad_()
            layer(inp).backward(grad)
            grad = inp.grad
            for p in layer.parameters():
                i = index[id(p)]
                dist.reduce_scatter_single(grads[i], F.pad(p.grad.reshape(-1), (0, world * sizes[i] - p.numel())))
                p.grad = None
        for i in range(len(params)):
            grads[i] /= world
            adam_update(shards[i], grads[i], m[i], v[i], step, lr)
    for layer in model:
        gather(layer)
    return {name: p.detach() for name, p in model.named_parameters()}


def fsdp_without_prefetch(dist, model, batches, lr):
    return S.zero3_train(dist, model, batches, lr)


def offload_keeps_adam_on_the_device(dist, model, batches, lr):
    return S.zero2_train(dist, model, batches, lr)


WRONG = [
    ("zero1_train", zero1_without_sharding, "peak memory"),
    ("zero1_train", zero1_drops_the_remainder, "rank 0: the result"),
    ("zero1_train", zero1_all_reduces, "sent"),
    ("zero2_train", zero2_all_reduces, "sent"),
    ("zero2_train", zero2_keeps_full_gradients, "ZeRO-1's order"),     # its peak met stage 2's budget at N = 2
    ("zero3_train", zero3_gathers_all_layers_at_once, ("under the floor", "while training")),
    ("zero3_train", zero3_never_frees, ("peak memory", "while training")),
    ("fsdp_prefetch_train", fsdp_without_prefetch, "simulated time"),
    ("zero_offload_train", offload_keeps_adam_on_the_device, "Adam's step on the device"),
]
