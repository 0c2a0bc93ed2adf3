"""Notebook 09 (beyond one cluster): first attempts, written from the notebook alone.

Some attempts share one learner's implementation with a switch for the one thing that learner got wrong.
"""
import math

import torch
import torch.nn.functional as F

import lib
from lib.analytic.cross_site import Workload, powersgd_values, shard_bounds, step_times, young_interval
from lib.sim.cost import CostModel
from lib.units import fmt_bytes, fmt_rate, fmt_time
from puzzles import beyond as P
from puzzles.beyond import dequantize, quantize
from puzzles.zero import adam_update


# ---------------------------------------------------------------- puzzle 1: diloco_train

def _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, *, sign=1, fresh_opts=False,
            per_param=False, divide=True, reset=True):
    n = dist.get_world_size()
    params = list(model.parameters())
    glob = [p.detach().clone() for p in params]
    inner = torch.optim.AdamW(params, lr=inner_lr)
    outer = torch.optim.SGD(glob, lr=outer_lr, momentum=momentum, nesterov=True)
    for i, (x, y) in enumerate(batches):
        inner.zero_grad()
        F.mse_loss(model(x), y).backward()
        inner.step()
        if (i + 1) % inner_steps:
            continue
        with torch.no_grad():
            deltas = [sign * (g - p) for g, p in zip(glob, params)]
            if per_param:
                for dlt in deltas:
                    dist.all_reduce(dlt)
                flat = torch.cat([dlt.reshape(-1) for dlt in deltas])
            else:
                flat = torch.cat([dlt.reshape(-1) for dlt in deltas])
                dist.all_reduce(flat)
            if divide:
                flat /= n
            offset = 0
            for g in glob:
                g.grad = flat[offset:offset + g.numel()].view_as(g).clone()
                offset += g.numel()
        outer.step()
        outer.zero_grad()
        if reset:
            with torch.no_grad():
                for p, g in zip(params, glob):
                    p.copy_(g)
        if fresh_opts:
            inner = torch.optim.AdamW(params, lr=inner_lr)
            outer = torch.optim.SGD(glob, lr=outer_lr, momentum=momentum, nesterov=True)
    return model


def diloco_train_sign_flipped(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, sign=-1)


def diloco_train_fresh_optimizers(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, fresh_opts=True)


def diloco_train_per_parameter(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, per_param=True)


def diloco_train_no_divide(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, divide=False)


def diloco_train_no_reset(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, reset=False)


def diloco_train_outer_on_local(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    # outer step applied to the model's own (local) parameters, with the averaged delta as gradient
    n = dist.get_world_size()
    params = list(model.parameters())
    start = [p.detach().clone() for p in params]
    inner = torch.optim.AdamW(params, lr=inner_lr)
    outer = torch.optim.SGD(params, lr=outer_lr, momentum=momentum, nesterov=True)
    for i, (x, y) in enumerate(batches):
        inner.zero_grad()
        F.mse_loss(model(x), y).backward()
        inner.step()
        if (i + 1) % inner_steps == 0:
            with torch.no_grad():
                flat = torch.cat([(s - p).reshape(-1) for s, p in zip(start, params)])
                dist.all_reduce(flat)
                flat /= n
                offset = 0
                for p in params:
                    p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
                    offset += p.numel()
            outer.step()
            start = [p.detach().clone() for p in params]
    return model


def diloco_train_reset_then_outer(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    # correct: reset the model to theta, set p.grad = averaged delta, outer SGD on the model's parameters
    n = dist.get_world_size()
    params = list(model.parameters())
    theta = [p.detach().clone() for p in params]
    inner = torch.optim.AdamW(params, lr=inner_lr)
    outer = torch.optim.SGD(params, lr=outer_lr, momentum=momentum, nesterov=True)
    for i, (x, y) in enumerate(batches):
        inner.zero_grad()
        F.mse_loss(model(x), y).backward()
        inner.step()
        if (i + 1) % inner_steps == 0:
            with torch.no_grad():
                flat = torch.cat([(t - p).reshape(-1) for t, p in zip(theta, params)])
                dist.all_reduce(flat)
                flat /= n
                offset = 0
                for p, t in zip(params, theta):
                    p.copy_(t)
                    p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
                    offset += p.numel()
            outer.step()
            theta = [p.detach().clone() for p in params]
    return model


# ---------------------------------------------------------------- puzzle 2: compressed_all_reduce

def _compressed(dist, grad, residual, bits, *, add_residual=True, residual_sign=1, int_sum=False, divide=True,
                residual_from_mean=False):
    n, r = dist.get_world_size(), dist.get_rank()
    c = grad + residual if add_residual else grad.clone()
    chunks = c.chunk(n)
    sizes = [ch.numel() for ch in chunks]
    qs, scales, sent = [], [], []
    for ch in chunks:
        q, s = quantize(ch, bits)
        qs.append(q.reshape(-1))
        scales.append(s.reshape(-1))
        sent.append(dequantize(q, s).reshape(-1))
    sent = torch.cat(sent).view_as(c)
    mine = sizes[r]
    got_q = torch.empty(n * mine, dtype=torch.int8)
    dist.all_to_all_single(got_q, torch.cat(qs), [mine] * n, sizes)
    got_s = torch.empty(n, dtype=torch.float32)
    dist.all_to_all_single(got_s, torch.cat(scales))
    parts = got_q.view(n, mine)
    if int_sum:
        total = parts.sum(0).to(torch.float64) * got_s.to(torch.float64).mean()
    else:
        total = torch.zeros(mine, dtype=torch.float64)
        for j in range(n):
            total += dequantize(parts[j], got_s[j:j + 1]).to(torch.float64)
    mean_chunk = (total / n if divide else total).to(torch.float32)
    qm, sm = quantize(mean_chunk, bits)
    width = max(sizes)
    padded = torch.zeros(width, dtype=torch.int8)
    padded[:mine] = qm.reshape(-1)
    all_q = torch.empty(n * width, dtype=torch.int8)
    dist.all_gather_single(all_q, padded)
    all_s = torch.empty(n, dtype=torch.float32)
    dist.all_gather_single(all_s, sm.reshape(-1))
    mean = torch.cat([dequantize(all_q[j * width:j * width + sizes[j]], all_s[j:j + 1]).reshape(-1)
                      for j in range(n)]).view_as(c)
    if residual_from_mean:
        return mean, c - mean
    return mean, residual_sign * (c - sent)


def compressed_all_reduce_no_residual_in(dist, grad, residual, bits):
    return _compressed(dist, grad, residual, bits, add_residual=False)


def compressed_all_reduce_residual_sign(dist, grad, residual, bits):
    return _compressed(dist, grad, residual, bits, residual_sign=-1)


def compressed_all_reduce_int_sum(dist, grad, residual, bits):
    return _compressed(dist, grad, residual, bits, int_sum=True)


def compressed_all_reduce_no_divide(dist, grad, residual, bits):
    return _compressed(dist, grad, residual, bits, divide=False)


def compressed_all_reduce_residual_vs_mean(dist, grad, residual, bits):
    return _compressed(dist, grad, residual, bits, residual_from_mean=True)


def compressed_all_reduce_float(dist, grad, residual, bits):
    # all-reduce c in float32, then quantise the result: simpler
    n = dist.get_world_size()
    c = grad + residual
    total = c.clone()
    dist.all_reduce(total)
    q, s = quantize(total / n, bits)
    return dequantize(q, s).view_as(c), c - c


def compressed_all_reduce_correct(dist, grad, residual, bits):
    # correct: scales exchanged in their own all-to-all, the means' all-gather padded to the largest chunk
    return _compressed(dist, grad, residual, bits)


# ---------------------------------------------------------------- puzzle 3: reshard_checkpoint

KEYS = ("param", "exp_avg", "exp_avg_sq")


def reshard_checkpoint_assumes_equal(files, world, rank):
    total = len(files) * len(files[0]["param"])          # all files the same length
    lo, hi = shard_bounds(total, world, rank)
    out = []
    for key in KEYS:
        pieces = []
        for f in files:
            a, b = f["offset"], f["offset"] + len(f[key])
            s, e = max(lo, a), min(hi, b)
            if s < e:
                pieces.append(f[key][s - a:e - a])
        out.append((torch.cat(pieces) if pieces else files[0][key][:0]).clone())
    return out[0], out[1], out[2], files[0]["step"]


def reshard_checkpoint_read_all(files, world, rank):
    total = sum(len(f["param"]) for f in files)
    lo, hi = shard_bounds(total, world, rank)
    ordered = sorted(files, key=lambda f: f["offset"])
    out = [torch.cat([f[key] * 1 for f in ordered])[lo:hi].clone() for key in KEYS]   # whole state, then slice
    return out[0], out[1], out[2], files[0]["step"]


def reshard_checkpoint_inclusive_end(files, world, rank):
    total = sum(len(f["param"]) for f in files)
    lo, hi = shard_bounds(total, world, rank)
    out = []
    for key in KEYS:
        pieces = []
        for f in sorted(files, key=lambda f: f["offset"]):
            a, b = f["offset"], f["offset"] + len(f[key])
            s, e = max(lo, a), min(hi, b)
            if s <= e:
                pieces.append(f[key][s - a:e - a + 1])     # inclusive end
        out.append((torch.cat(pieces) if pieces else files[0][key][:0]).clone())
    return out[0], out[1], out[2], files[0]["step"]


def reshard_checkpoint_global_slice(files, world, rank):
    total = sum(len(f["param"]) for f in files)
    lo, hi = shard_bounds(total, world, rank)
    out = []
    for key in KEYS:
        pieces = []
        for f in sorted(files, key=lambda f: f["offset"]):
            a, b = f["offset"], f["offset"] + len(f[key])
            s, e = max(lo, a), min(hi, b)
            if s < e:
                pieces.append(f[key][s:e])                  # forgot to subtract the file's offset
        out.append((torch.cat(pieces) if pieces else files[0][key][:0]).clone())
    return out[0], out[1], out[2], files[0]["step"]


def reshard_checkpoint_step_of_rank(files, world, rank):
    total = sum(len(f["param"]) for f in files)
    lo, hi = shard_bounds(total, world, rank)
    out = []
    for key in KEYS:
        pieces = []
        for f in sorted(files, key=lambda f: f["offset"]):
            a, b = f["offset"], f["offset"] + len(f[key])
            s, e = max(lo, a), min(hi, b)
            if s < e:
                pieces.append(f[key][s - a:e - a])
        out.append((torch.cat(pieces) if pieces else files[0][key][:0]).clone())
    return out[0], out[1], out[2], files[rank]["step"]      # my old file's step


def reshard_checkpoint_copy_paste(files, world, rank):
    total = sum(len(f["param"]) for f in files)
    lo, hi = shard_bounds(total, world, rank)
    out = []
    for key in ("param", "exp_avg", "exp_avg"):             # copy-paste slip
        pieces = []
        for f in sorted(files, key=lambda f: f["offset"]):
            a, b = f["offset"], f["offset"] + len(f[key])
            s, e = max(lo, a), min(hi, b)
            if s < e:
                pieces.append(f[key][s - a:e - a])
        out.append((torch.cat(pieces) if pieces else files[0][key][:0]).clone())
    return out[0], out[1], out[2], files[0]["step"]


def reshard_checkpoint_own_bounds(files, world, rank):
    # correct: the shard's bounds computed by hand (ceil, last one shorter) instead of shard_bounds
    total = sum(len(f["param"]) for f in files)
    c = -(-total // world)
    lo, hi = min(rank * c, total), min((rank + 1) * c, total)
    result = {}
    for key in KEYS:
        pieces = []
        for f in files:
            a = f["offset"]
            s, e = max(lo, a), min(hi, a + len(f[key]))
            if s < e:
                pieces.append((s, f[key][s - a:e - a]))
        pieces.sort(key=lambda t: t[0])
        result[key] = torch.cat([p for _, p in pieces]) if pieces else files[0][key][:0].clone()
    return result["param"], result["exp_avg"], result["exp_avg_sq"], files[0]["step"]


def _my_reshard(files, world, rank):
    total = sum(len(f["param"]) for f in files)
    lo, hi = shard_bounds(total, world, rank)
    out = []
    for key in KEYS:
        pieces = []
        for f in sorted(files, key=lambda f: f["offset"]):
            a = f["offset"]
            s, e = max(lo, a), min(hi, a + len(f[key]))
            if s < e:
                pieces.append(f[key][s - a:e - a])
        out.append((torch.cat(pieces) if pieces else files[0][key][:0]).clone())
    return out[0], out[1], out[2], files[0]["step"]


# ---------------------------------------------------------------- puzzle 4: survive_failure

def _survive(dist, files, grads, every, lr, *, reload=True, drop_dead=True, from_files=False, global_index=False,
             step_off=0, pad=True, use_group=True):
    world, me = dist.get_world_size(), dist.get_rank()
    total = sum(len(f["param"]) for f in files)
    members = list(range(world))
    group = None
    param, m, v, step = _my_reshard(files, world, me)
    checkpoint = files
    while step < len(grads):
        try:
            adam_update(param, grads(step), m, v, step + 1, lr)
            step += 1
            if step % every == 0:
                n = len(members)
                c = -(-total // n)
                mine = torch.stack([param, m, v])
                if pad:
                    buf = torch.zeros(3, c, dtype=param.dtype)
                    buf[:, :param.numel()] = mine
                else:
                    buf = mine
                out = torch.empty((n,) + tuple(buf.shape), dtype=buf.dtype)
                kw = {"group": group} if (group is not None and use_group) else {}
                dist.all_gather_single(out, buf.unsqueeze(0).contiguous(), **kw)
                new = []
                for i in range(n):
                    lo, hi = shard_bounds(total, n, i)
                    new.append({"offset": lo, "step": step + step_off, "param": out[i, 0, :hi - lo].clone(),
                                "exp_avg": out[i, 1, :hi - lo].clone(), "exp_avg_sq": out[i, 2, :hi - lo].clone()})
                checkpoint = new
        except RuntimeError as err:
            dead = getattr(err, "rank", None)
            if dead is None:
                raise
            members = [x for x in members if x != dead] if drop_dead else members
            group = dist.new_group(members)
            if not reload:
                continue
            n = len(members)
            index = me if global_index else members.index(me)
            source = files if from_files else checkpoint
            param, m, v, step = _my_reshard(source, n, index)
    return param, m, v


def survive_failure_no_reload(dist, files, grads, every, lr):
    return _survive(dist, files, grads, every, lr, reload=False)


def survive_failure_dead_in_group(dist, files, grads, every, lr):
    return _survive(dist, files, grads, every, lr, drop_dead=False)


def survive_failure_from_files(dist, files, grads, every, lr):
    return _survive(dist, files, grads, every, lr, from_files=True)


def survive_failure_global_rank(dist, files, grads, every, lr):
    return _survive(dist, files, grads, every, lr, global_index=True)


def survive_failure_step_off_by_one(dist, files, grads, every, lr):
    return _survive(dist, files, grads, every, lr, step_off=-1)


def survive_failure_no_padding(dist, files, grads, every, lr):
    return _survive(dist, files, grads, every, lr, pad=False)


def survive_failure_world_group(dist, files, grads, every, lr):
    return _survive(dist, files, grads, every, lr, use_group=False)


def survive_failure_correct(dist, files, grads, every, lr):
    # correct: padded all-gather of (param, m, v), survivors' group, reload the last in-memory checkpoint
    return _survive(dist, files, grads, every, lr)


# ---------------------------------------------------------------- puzzle 5: inner_steps_for

def _inner(params, tokens, world, bandwidth, latency, flops, share, *, with_latency=True, bytes_per=4,
           factor=lambda n: 2 * (n - 1) / n, hops=lambda n: 2 * (n - 1), rounding="ceil", flop_factor=6,
           ranks=None):
    n = world if ranks is None else ranks
    compute = flop_factor * params * tokens / flops
    t = factor(n) * bytes_per * params / bandwidth + (hops(n) * latency if with_latency else 0)
    h = t / (share * compute)
    if rounding == "ceil":
        return max(1, math.ceil(h))
    return max(1, int(h))


def inner_steps_for_no_latency(params, tokens, world, bandwidth, latency, flops, share):
    return _inner(params, tokens, world, bandwidth, latency, flops, share, with_latency=False)


def inner_steps_for_one_byte(params, tokens, world, bandwidth, latency, flops, share):
    return _inner(params, tokens, world, bandwidth, latency, flops, share, bytes_per=1)


def inner_steps_for_half_factor(params, tokens, world, bandwidth, latency, flops, share):
    return _inner(params, tokens, world, bandwidth, latency, flops, share, factor=lambda n: (n - 1) / n)


def inner_steps_for_latency_once(params, tokens, world, bandwidth, latency, flops, share):
    return _inner(params, tokens, world, bandwidth, latency, flops, share, hops=lambda n: 1)


def inner_steps_for_floor(params, tokens, world, bandwidth, latency, flops, share):
    return _inner(params, tokens, world, bandwidth, latency, flops, share, rounding="floor")


def inner_steps_for_forward_flops(params, tokens, world, bandwidth, latency, flops, share):
    return _inner(params, tokens, world, bandwidth, latency, flops, share, flop_factor=2)


def inner_steps_for_two_sites(params, tokens, world, bandwidth, latency, flops, share):
    return _inner(params, tokens, world, bandwidth, latency, flops, share, ranks=2)


def inner_steps_for_loop(params, tokens, world, bandwidth, latency, flops, share):
    # correct: count H up from 1 until the spread all-reduce fits in the share
    compute = 6 * params * tokens / flops
    ring = 2 * (world - 1) * latency + 2 * (world - 1) / world * 4 * params / bandwidth
    h = 1
    while ring / h > share * compute:
        h += 1
    return h


ATTEMPTS = [
    ("diloco_train", diloco_train_sign_flipped, "pseudo-gradient as local minus shared (wrong sign)"),
    ("diloco_train", diloco_train_fresh_optimizers, "made new AdamW and SGD every round (state lost)"),
    ("diloco_train", diloco_train_per_parameter, "one all-reduce per parameter, not one flat tensor"),
    ("diloco_train", diloco_train_no_divide, "summed the pseudo-gradients, forgot to divide by N"),
    ("diloco_train", diloco_train_no_reset, "outer step on the shared copy but never copied it back into the model"),
    ("diloco_train", diloco_train_outer_on_local, "outer step applied to the local parameters without resetting them to theta"),
    ("diloco_train", diloco_train_reset_then_outer, "correct: reset the model to theta, p.grad = averaged delta, outer SGD on the model"),
    ("compressed_all_reduce", compressed_all_reduce_no_residual_in, "forgot to add the residual before compressing"),
    ("compressed_all_reduce", compressed_all_reduce_residual_sign, "residual = sent - c (wrong sign)"),
    ("compressed_all_reduce", compressed_all_reduce_int_sum, "the owner summed the int8 values and multiplied by the mean scale"),
    ("compressed_all_reduce", compressed_all_reduce_no_divide, "the owner summed and forgot to divide by N"),
    ("compressed_all_reduce", compressed_all_reduce_residual_vs_mean, "residual = c - the final mean (includes others' gradients)"),
    ("compressed_all_reduce", compressed_all_reduce_float, "all-reduced c in float32 and quantised the result afterwards"),
    ("compressed_all_reduce", compressed_all_reduce_correct, "correct: scales in their own all-to-all, padded all-gather of the means"),
    ("reshard_checkpoint", reshard_checkpoint_assumes_equal, "total = number of files x first file's length (files assumed equal)"),
    ("reshard_checkpoint", reshard_checkpoint_read_all, "concatenated every file, then sliced my shard (reads everything)"),
    ("reshard_checkpoint", reshard_checkpoint_inclusive_end, "overlap end taken inclusive: one element too many per file"),
    ("reshard_checkpoint", reshard_checkpoint_global_slice, "sliced files with global indices, forgot to subtract the file's offset"),
    ("reshard_checkpoint", reshard_checkpoint_step_of_rank, "took the step from files[rank], which need not exist"),
    ("reshard_checkpoint", reshard_checkpoint_copy_paste, "copy-paste: exp_avg_sq read from exp_avg"),
    ("reshard_checkpoint", reshard_checkpoint_own_bounds, "correct: bounds by hand (ceil, last shorter), pieces sorted by position"),
    ("survive_failure", survive_failure_no_reload, "regrouped but did not reload: kept my old shard and carried on"),
    ("survive_failure", survive_failure_dead_in_group, "made the new group with the dead rank still in it"),
    ("survive_failure", survive_failure_from_files, "reloaded from the original files instead of the last in-memory checkpoint"),
    ("survive_failure", survive_failure_global_rank, "used my old global rank as my index among the survivors"),
    ("survive_failure", survive_failure_step_off_by_one, "recorded the checkpoint's step one too low"),
    ("survive_failure", survive_failure_no_padding, "all-gathered uneven shards without padding"),
    ("survive_failure", survive_failure_world_group, "after regrouping, kept all-gathering over the whole world (no group=)"),
    ("survive_failure", survive_failure_correct, "correct: padded all-gather checkpoint, survivors' group, reload the last checkpoint"),
    ("inner_steps_for", inner_steps_for_no_latency, "left out the latency"),
    ("inner_steps_for", inner_steps_for_one_byte, "counted one byte per parameter instead of four (float32)"),
    ("inner_steps_for", inner_steps_for_half_factor, "(N-1)/N of the data instead of all-reduce's 2(N-1)/N"),
    ("inner_steps_for", inner_steps_for_latency_once, "paid the latency once instead of once per ring step, 2(N-1)"),
    ("inner_steps_for", inner_steps_for_floor, "rounded H down (int) instead of up"),
    ("inner_steps_for", inner_steps_for_forward_flops, "2 * params * tokens FLOPs per step (forward only)"),
    ("inner_steps_for", inner_steps_for_two_sites, "ring over the 2 datacenters instead of the world GPUs"),
    ("inner_steps_for", inner_steps_for_loop, "correct: counts H up from 1"),
]
