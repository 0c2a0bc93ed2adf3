"""Wrong answers to notebook 09's puzzles, each with the words its failure message must contain."""

import math

import torch
import torch.nn.functional as F

from lib.analytic.cross_site import shard_bounds
from puzzles.beyond import dequantize, quantize
from puzzles.zero import adam_update
from solutions.beyond import reshard_checkpoint


def _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, *, sign=1.0, outer_steps=1,
            every_step=False, flat=True):
    """DiLoCo with one mistake switched on: the pseudo-gradient's sign, the outer steps per round, all-reducing
    after every inner step, or one all-reduce per parameter tensor."""
    world = dist.get_world_size()
    params = list(model.parameters())
    inner = torch.optim.AdamW(params, lr=inner_lr)
    outer = torch.optim.SGD(params, lr=outer_lr, momentum=momentum, nesterov=True)
    h = 1 if every_step else inner_steps
    for first in range(0, len(batches), h):
        start = [p.detach().clone() for p in params]
        for x, y in batches[first:first + h]:
            inner.zero_grad()
            F.mse_loss(model(x), y).backward()
            inner.step()
        deltas = [sign * (s - p.detach()) for s, p in zip(start, params)]
        if flat:
            delta = torch.cat([d.reshape(-1) for d in deltas])
            dist.all_reduce(delta)
            deltas = [d.view_as(p) for d, p in zip(delta.split([p.numel() for p in params]), params)]
        else:
            for d in deltas:
                dist.all_reduce(d)
        with torch.no_grad():
            for p, s, d in zip(params, start, deltas):
                p.copy_(s)
                p.grad = d / world
        for _ in range(outer_steps if outer_steps else inner_steps):
            outer.step()
    return model


def diloco_wrong_sign(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, sign=-1.0)


def diloco_outer_momentum_per_inner_step(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """The outer step (and its momentum) taken H times a round, once per inner step."""
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, outer_steps=0)


def diloco_every_inner_step(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """Communicates after every inner step: data parallelism's traffic, and not DiLoCo's result."""
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, every_step=True)


def diloco_per_tensor_all_reduce(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """Right result and bytes; one all-reduce per parameter tensor, each paying the wide-area link's latency."""
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, flat=False)


def _compressed(dist, grad, residual, bits, *, feedback=True, subtract=True, one_scale=False):
    """The int8 all-reduce with one mistake switched on: a deliberate copy of solutions.beyond.compressed_all_reduce."""
    world = dist.get_world_size()
    corrected = grad + residual if feedback else grad.clone()
    if one_scale:
        q, s = quantize(corrected, bits)
        pieces = [(c, s) for c in q.chunk(world)]
    else:
        pieces = [quantize(chunk, bits) for chunk in corrected.chunk(world)]
    sent = torch.cat([dequantize(q, s) for q, s in pieces])
    q_in, s_in = torch.stack([q for q, _ in pieces]), torch.cat([s for _, s in pieces])
    q_out, s_out = torch.empty_like(q_in), torch.empty_like(s_in)
    dist.all_to_all_single(q_out, q_in)
    dist.all_to_all_single(s_out, s_in)
    mean = sum(dequantize(q_out[i], s_out[i]).double() for i in range(world)) / world
    q, s = quantize(mean, bits)
    qs, scales = [torch.empty_like(q) for _ in range(world)], [torch.empty_like(s) for _ in range(world)]
    dist.all_gather(qs, q)
    dist.all_gather(scales, s)
    new = (corrected - sent if subtract else corrected) if feedback else torch.zeros_like(grad)
    return torch.cat([dequantize(a, b) for a, b in zip(qs, scales)]), new


def feedback_forgets_to_subtract(dist, grad, residual, bits):
    return _compressed(dist, grad, residual, bits, subtract=False)


def no_error_feedback(dist, grad, residual, bits):
    return _compressed(dist, grad, residual, bits, feedback=False)


def one_scale_for_the_whole_gradient(dist, grad, residual, bits):
    return _compressed(dist, grad, residual, bits, one_scale=True)


def compressed_in_float32(dist, grad, residual, bits):
    """No compression: a float32 all-reduce, the residual kept as zero."""
    mean = grad + residual
    dist.all_reduce(mean)
    return mean / dist.get_world_size(), torch.zeros_like(grad)


def checkpoint_by_rank_number(files, world, rank):
    """Loads the file this rank saved last time: right only while the world size stays the same."""
    f = files[rank]
    return f["param"], f["exp_avg"], f["exp_avg_sq"], f["step"]


def checkpoint_without_the_moments(files, world, rank):
    """The right parameters, and Adam's moments started again from zero."""
    full = torch.cat([f["param"] for f in files])
    size = -(-full.numel() // world)
    param = full[rank * size:(rank + 1) * size].clone()
    return param, torch.zeros_like(param), torch.zeros_like(param), files[0]["step"]


def checkpoint_split_by_floor(files, world, rank):
    """Shards of total // N elements, the remainder on the last rank: not the layout training uses."""
    full = {k: torch.cat([f[k] for f in files]) for k in ("param", "exp_avg", "exp_avg_sq")}
    size = full["param"].numel() // world
    hi = full["param"].numel() if rank == world - 1 else (rank + 1) * size
    return (*(full[k][rank * size:hi].clone() for k in ("param", "exp_avg", "exp_avg_sq")), files[0]["step"])


def _survive(dist, files, grads, every, lr, *, regroup=True, replay=True, relayout=True):
    """Surviving a failure with one mistake switched on: retrying with the dead rank still in the group, going on
    from the step reached instead of the checkpoint's, or reloading the old layout by rank number."""
    members, group, saved = list(range(dist.get_world_size())), None, files
    total, reached = sum(f["param"].numel() for f in files), None
    while True:
        n, me = len(members), members.index(dist.get_rank())
        *state, step = (reshard_checkpoint(saved, n, me) if relayout or n == dist.get_world_size()
                        else reshard_checkpoint(saved, dist.get_world_size(), dist.get_rank()))
        param, m, v = (t.clone() for t in state)
        step = step if replay or reached is None else reached
        try:
            while step < len(grads):
                adam_update(param, grads(step), m, v, step + 1, lr)
                step += 1
                reached = step
                if step % every == 0:
                    size = -(-total // n)
                    mine = torch.zeros(3, size, dtype=param.dtype, device=param.device)
                    for row, t in zip(mine, (param, m, v)):
                        row[:t.numel()] = t
                    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size() if group is None else n)]
                    dist.all_gather(parts, mine, group=group)
                    saved = [{"offset": a, "step": step, "param": p[0, :b - a].clone(), "exp_avg": p[1, :b - a].clone(),
                              "exp_avg_sq": p[2, :b - a].clone()}
                             for p, (a, b) in zip(parts, (shard_bounds(total, n, r) for r in range(n)))]
            return param, m, v
        except RuntimeError as e:
            if len(members) < dist.get_world_size():          # a second failure: only the first was injected
                raise
            members.remove(e.rank)
            group = dist.new_group(members) if regroup else None


def survivors_wait_on_the_dead_rank(dist, files, grads, every, lr):
    """Reloads and goes on with the default group, the dead rank still in it: in real NCCL that hangs until the
    timeout; here its next collective fails, uncaught."""
    return _survive(dist, files, grads, every, lr, regroup=False)


def survivors_go_on_from_where_they_were(dist, files, grads, every, lr):
    """Reloads the checkpoint but skips the steps since it: the dead rank's updates of those steps are lost."""
    return _survive(dist, files, grads, every, lr, replay=False)


def survivors_reload_by_old_rank_number(dist, files, grads, every, lr):
    return _survive(dist, files, grads, every, lr, relayout=False)


def diloco_averaging_the_parameters(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """Local SGD, an honest shortcut: after each round the workers' parameters averaged by one flat all-reduce, the
    same bytes as DiLoCo's pseudo-gradient, but no outer optimizer: parameters averaged where an outer step belongs."""
    params = list(model.parameters())
    inner = torch.optim.AdamW(params, lr=inner_lr)
    for i in range(0, len(batches), inner_steps):
        for x, y in batches[i:i + inner_steps]:
            inner.zero_grad()
            F.mse_loss(model(x), y).backward()
            inner.step()
        flat = torch.cat([p.detach().flatten() for p in params])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        with torch.no_grad():
            for p, v in zip(params, flat.split([p.numel() for p in params])):
                p.copy_(v.view_as(p))
    return model


def checkpoint_step_from_my_own_file(files, world, rank):
    """The right shard, and the step read from files[rank], "my file": right only while no more ranks load than
    saved."""
    *state, _ = reshard_checkpoint(files, world, rank)
    return (*state, files[rank]["step"])


def inner_steps_without_latency(params, tokens, world, bandwidth, latency, flops, share):
    """Bandwidth only: a wide-area link's milliseconds of latency per message forgotten."""
    compute = 6 * params * tokens / flops
    return max(1, math.ceil(2 * (world - 1) / world * 4 * params / bandwidth / (share * compute)))


def inner_steps_with_half_the_bytes(params, tokens, world, bandwidth, latency, flops, share):
    """(N-1)/N of the bytes, as a reduce-scatter alone would send."""
    compute = 6 * params * tokens / flops
    comm = 2 * (world - 1) * latency + (world - 1) / world * 4 * params / bandwidth
    return max(1, math.ceil(comm / (share * compute)))


WRONG = [
    ("diloco_train", diloco_wrong_sign, "rank 0: the result", "wrong sign"),
    ("diloco_train", diloco_outer_momentum_per_inner_step, "rank 0: the result", "once per round"),
    ("diloco_train", diloco_every_inner_step, ("rank 0: the result", "over the budget")),
    ("diloco_train", diloco_per_tensor_all_reduce, "simulated time"),
    ("compressed_all_reduce", feedback_forgets_to_subtract, "rank 0: the result", "forgot to subtract"),
    ("compressed_all_reduce", no_error_feedback, "rank 0: the result", "no error feedback"),
    ("compressed_all_reduce", one_scale_for_the_whole_gradient, "rank 0: the result"),
    ("compressed_all_reduce", compressed_in_float32, "all_reduce"),
    ("reshard_checkpoint", checkpoint_by_rank_number, ("elements [", "rank 0: the result")),
    ("reshard_checkpoint", checkpoint_without_the_moments, "rank 0: the result"),
    ("reshard_checkpoint", checkpoint_split_by_floor, ("elements [", "the result")),
    ("survive_failure", survivors_wait_on_the_dead_rank, "which died at its communication call"),
    ("survive_failure", survivors_go_on_from_where_they_were, "the result"),
    ("survive_failure", survivors_reload_by_old_rank_number, ("the result", "rank")),
    ("inner_steps_for", inner_steps_without_latency, "the result"),
    ("diloco_train", diloco_averaging_the_parameters, "rank 0: the result", "parameters averaged"),
    ("reshard_checkpoint", checkpoint_step_from_my_own_file, "read past its end"),
    ("inner_steps_for", inner_steps_with_half_the_bytes, "the result"),
]
