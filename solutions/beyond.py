"""Notebook 09, beyond one cluster: the reference solutions."""

import math

import torch
import torch.nn.functional as F

from lib.analytic.cross_site import shard_bounds
from puzzles.beyond import dequantize, quantize
from puzzles.zero import adam_update


def diloco_train(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    world = dist.get_world_size()
    params = list(model.parameters())
    inner = torch.optim.AdamW(params, lr=inner_lr)
    outer = torch.optim.SGD(params, lr=outer_lr, momentum=momentum, nesterov=True)
    for start_step in range(0, len(batches), inner_steps):
        start = [p.detach().clone() for p in params]
        for x, y in batches[start_step:start_step + inner_steps]:
            inner.zero_grad()
            F.mse_loss(model(x), y).backward()
            inner.step()
        # The pseudo-gradient, start - local, averaged over the workers in one all-reduce.
        delta = torch.cat([(s - p.detach()).reshape(-1) for s, p in zip(start, params)])
        dist.all_reduce(delta)
        delta /= world
        with torch.no_grad():
            for p, s, d in zip(params, start, delta.split([p.numel() for p in params])):
                p.copy_(s)
                p.grad = d.view_as(p).clone()
        outer.step()
    return model


def compressed_all_reduce(dist, grad, residual, bits):
    world = dist.get_world_size()
    corrected = grad + residual
    pieces = [quantize(chunk, bits) for chunk in corrected.chunk(world)]
    sent = torch.cat([dequantize(q, s) for q, s in pieces])
    # Chunk j to rank j; slice i of what arrives is rank i's quantised copy of this rank's chunk.
    q_in, s_in = torch.stack([q for q, _ in pieces]), torch.cat([s for _, s in pieces])   # (N, c), (N,)
    q_out, s_out = torch.empty_like(q_in), torch.empty_like(s_in)
    dist.all_to_all_single(q_out, q_in)
    dist.all_to_all_single(s_out, s_in)
    mean = sum(dequantize(q_out[i], s_out[i]).double() for i in range(world)) / world
    q, s = quantize(mean, bits)
    qs, scales = [torch.empty_like(q) for _ in range(world)], [torch.empty_like(s) for _ in range(world)]
    dist.all_gather(qs, q)
    dist.all_gather(scales, s)
    return torch.cat([dequantize(a, b) for a, b in zip(qs, scales)]), corrected - sent


def reshard_checkpoint(files, world, rank):
    total = sum(f["param"].numel() for f in files)
    lo, hi = shard_bounds(total, world, rank)
    loaded = []
    for key in ("param", "exp_avg", "exp_avg_sq"):
        pieces = []
        for f in files:
            start, end = max(lo, f["offset"]), min(hi, f["offset"] + f[key].numel())
            if start < end:
                pieces.append(f[key][start - f["offset"]:end - f["offset"]])
        loaded.append(torch.cat(pieces) if pieces else files[0][key].new_empty(0))
    return (*loaded, files[0]["step"])


def survive_failure(dist, files, grads, every, lr):
    members, group, saved = list(range(dist.get_world_size())), None, files
    total = sum(f["param"].numel() for f in files)
    while True:
        n, me = len(members), members.index(dist.get_rank())
        *state, step = reshard_checkpoint(saved, n, me)
        param, m, v = (t.clone() for t in state)
        try:
            while step < len(grads):
                adam_update(param, grads(step), m, v, step + 1, lr)     # this rank's shard of step's gradient
                step += 1
                if step % every == 0:
                    # Checkpoint: every rank's shard, padded to the same length, gathered on every rank.
                    size = -(-total // n)
                    mine = torch.zeros(3, size, dtype=param.dtype, device=param.device)
                    for row, t in zip(mine, (param, m, v)):
                        row[:t.numel()] = t
                    parts = [torch.empty_like(mine) for _ in range(n)]
                    dist.all_gather(parts, mine, group=group)
                    saved = []
                    for r, part in enumerate(parts):
                        a, b = shard_bounds(total, n, r)
                        saved.append({"offset": a, "step": step, "param": part[0, :b - a].clone(),
                                      "exp_avg": part[1, :b - a].clone(), "exp_avg_sq": part[2, :b - a].clone()})
            return param, m, v
        except RuntimeError as e:       # a peer failed: carry on without it, from the last checkpoint
            members.remove(e.rank)
            group = dist.new_group(members)


def inner_steps_for(params, tokens, world, bandwidth, latency, flops, share):
    compute = 6 * params * tokens / flops
    all_reduce = 2 * (world - 1) * latency + 2 * (world - 1) / world * 4 * params / bandwidth
    return max(1, math.ceil(all_reduce / (share * compute)))
