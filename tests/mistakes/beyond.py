"""Realistic first attempts at notebook 09's puzzles (beyond one cluster), none of them in tests/wrong."""

import math

import torch
import torch.nn.functional as F

import solutions.beyond as S
from lib.analytic.cross_site import shard_bounds
from puzzles.beyond import dequantize, quantize
from puzzles.zero import adam_update
from tests.mistakes import Attempt


# ---- diloco_train ----------------------------------------------------------------------------------------------
def _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, *, averaged=True, inner_kept=True,
            outer_kept=True, back_to_start=True, zero_grad=True, nesterov=True):
    """DiLoCo as a learner writes it from the paper's Algorithm 1, with the knob of one mistake turned."""
    params = list(model.parameters())

    def optimizers():
        return (torch.optim.AdamW(params, lr=inner_lr),
                torch.optim.SGD(params, lr=outer_lr, momentum=momentum, nesterov=nesterov))
    inner, outer = optimizers()
    rounds = [batches[i:i + inner_steps] for i in range(0, len(batches), inner_steps)]
    for number, this_round in enumerate(rounds):
        if number:
            fresh_inner, fresh_outer = optimizers()
            inner, outer = inner if inner_kept else fresh_inner, outer if outer_kept else fresh_outer
        start = [p.detach().clone() for p in params]
        for x, y in this_round:
            if zero_grad:
                inner.zero_grad()
            F.mse_loss(model(x), y).backward()
            inner.step()
        pseudo = torch.cat([(s - p.detach()).flatten() for s, p in zip(start, params)])
        dist.all_reduce(pseudo)
        if averaged:
            pseudo /= dist.get_world_size()
        with torch.no_grad():
            for p, s, g in zip(params, start, pseudo.split([p.numel() for p in params])):
                if back_to_start:
                    p.copy_(s)
                p.grad = g.view_as(p).clone()
        outer.step()
    return model


def diloco_outer_step_on_a_copy(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """The outer Nesterov step taken on a copy of the parameters ("the global model"), which never goes back into
    the model: each worker trains on from its own inner steps."""
    params = list(model.parameters())
    shared = [p.detach().clone().requires_grad_() for p in params]
    inner = torch.optim.AdamW(params, lr=inner_lr)
    outer = torch.optim.SGD(shared, lr=outer_lr, momentum=momentum, nesterov=True)
    for i in range(0, len(batches), inner_steps):
        for x, y in batches[i:i + inner_steps]:
            inner.zero_grad()
            F.mse_loss(model(x), y).backward()
            inner.step()
        pseudo = torch.cat([(s - p).detach().flatten() for s, p in zip(shared, params)])
        dist.all_reduce(pseudo)
        pseudo /= dist.get_world_size()
        for s, g in zip(shared, pseudo.split([p.numel() for p in params])):
            s.grad = g.view_as(s).clone()
        outer.step()
    return model


def diloco_summing_the_pseudo_gradients(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """The pseudo-gradients all-reduced (summed) and handed to the outer step as they are, not averaged."""
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, averaged=False)


def diloco_new_adamw_every_round(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """torch.optim.AdamW made at the top of each round: its moments start from zero every H steps, where DiLoCo's
    workers keep their inner state."""
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, inner_kept=False)


def diloco_new_outer_sgd_every_round(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """The outer Nesterov SGD made again each round: its momentum buffer never survives to the next round."""
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, outer_kept=False)


def diloco_outer_step_from_the_local_weights(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """p.grad = the averaged pseudo-gradient, without p.copy_(start): the outer step moves the worker's own
    weights, not the round's starting point."""
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, back_to_start=False)


def diloco_gradients_accumulating_across_inner_steps(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """No inner.zero_grad(): each inner step's gradient adds onto the last one's (and onto the pseudo-gradient
    left in p.grad by the outer step)."""
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, zero_grad=False)


def diloco_plain_momentum(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """torch.optim.SGD(..., momentum=momentum) without nesterov=True: heavy-ball momentum, where DiLoCo's outer
    optimizer is Nesterov's."""
    return _diloco(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum, nesterov=False)


# ---- compressed_all_reduce -------------------------------------------------------------------------------------
def _compressed(dist, grad, residual, bits, *, mean=True, residual_of="corrected - sent", owners_add="values",
                mean_quantized=True):
    """The int8 all-reduce with error feedback as a learner writes it, with the knob of one mistake turned."""
    world = dist.get_world_size()
    corrected = grad + residual
    pieces = [quantize(c, bits) for c in corrected.chunk(world)]
    sent = torch.cat([dequantize(q, s) for q, s in pieces])
    q_out, s_out = torch.empty(world, pieces[0][0].numel(), dtype=torch.int8), torch.empty(world)
    dist.all_to_all_single(q_out, torch.stack([q for q, _ in pieces]))
    dist.all_to_all_single(s_out, torch.cat([s for _, s in pieces]))
    if owners_add == "values":
        total = sum(dequantize(q_out[i], s_out[i][None]).double() for i in range(world))
    elif owners_add == "integers":    # the integers added, then scaled by the first sender's scale
        total = dequantize(q_out.sum(0), s_out[0][None]).double()
    else:                             # the integers added, then scaled by the largest scale ("none overflows")
        total = (q_out.long().sum(0) * s_out.max()).double()
    mine = total / world if mean else total
    if mean_quantized:
        q, s = quantize(mine, bits)
        qs, ss = [torch.empty_like(q) for _ in range(world)], [torch.empty_like(s) for _ in range(world)]
        dist.all_gather(qs, q)
        dist.all_gather(ss, s)
        result = torch.cat([dequantize(a, b) for a, b in zip(qs, ss)])
    else:
        parts = [torch.empty_like(mine.float()) for _ in range(world)]
        dist.all_gather(parts, mine.float())
        result = torch.cat(parts)
    new_residual = {"corrected - sent": corrected - sent, "sent - corrected": sent - corrected,
                    "grad - sent": grad - sent, "residual + grad - result": residual + grad - result}[residual_of]
    return result, new_residual


def compressed_sum_where_the_mean_belongs(dist, grad, residual, bits):
    """The owners' sums of what arrived, never divided by N."""
    return _compressed(dist, grad, residual, bits, mean=False)


def compressed_residual_the_wrong_way_round(dist, grad, residual, bits):
    """The new residual as sent - (grad + residual): the quantisation error with its sign flipped."""
    return _compressed(dist, grad, residual, bits, residual_of="sent - corrected")


def compressed_residual_without_the_old_one(dist, grad, residual, bits):
    """The new residual as grad - sent: what was sent included the old residual, the difference leaves it out."""
    return _compressed(dist, grad, residual, bits, residual_of="grad - sent")


def compressed_adding_the_integers(dist, grad, residual, bits):
    """The owners add the int8 values they receive and dequantise the sum with one sender's scale: each sender's
    integers have a scale of their own."""
    return _compressed(dist, grad, residual, bits, owners_add="integers")


def compressed_integers_scaled_by_the_largest(dist, grad, residual, bits):
    """The owners add the int8 values as integers and scale the sum by the largest sender's scale, so that nothing
    overflows: each sender's integers are in units of its own scale."""
    return _compressed(dist, grad, residual, bits, owners_add="integers, largest scale")


def compressed_residual_updated_by_the_mean(dist, grad, residual, bits):
    """residual += grad - result: the residual moved by what the all-reduce returned, where it keeps what
    quantising this rank's own values lost."""
    return _compressed(dist, grad, residual, bits, residual_of="residual + grad - result")


def compressed_means_gathered_as_they_are(dist, grad, residual, bits):
    """The owners' means all-gathered in float32, unquantised: 4 bytes a value on the way back."""
    return _compressed(dist, grad, residual, bits, mean_quantized=False)


# ---- reshard_checkpoint ----------------------------------------------------------------------------------------
def _reshard(files, world, rank, *, inclusive=False, relative=True, swap_moments=False, step_after=0,
             layout_world=None, total_from_offsets=False, step_of=lambda files, world, rank: files[0]["step"]):
    """reshard_checkpoint as a learner writes it, with the knob of one mistake turned."""
    total = sum(f["param"].numel() for f in files)
    if total_from_offsets:            # where the last file starts, and one file's length
        total = files[-1]["offset"] + files[0]["param"].numel()
    lo, hi = shard_bounds(total, layout_world or world, rank)
    keys = ("param", "exp_avg_sq", "exp_avg") if swap_moments else ("param", "exp_avg", "exp_avg_sq")
    out = []
    for key in keys:
        pieces = []
        for f in files:
            first, last = f["offset"], f["offset"] + f[key].numel()
            a, b = max(lo, first), min(hi, last) + (1 if inclusive else 0)
            if a < b:
                base = first if relative else 0
                pieces.append(f[key][a - base:b - base])
        out.append(torch.cat(pieces) if pieces else files[0][key][:0])
    return (*out, step_of(files, world, rank) + step_after)


def reshard_overlap_end_plus_one(files, world, rank):
    """Each file's overlap taken up to min(hi, end) + 1, "inclusive": one element more from every file."""
    return _reshard(files, world, rank, inclusive=True)


def reshard_slicing_files_by_global_index(files, world, rank):
    """f[key][start:end] with the global bounds, the file's offset never subtracted."""
    return _reshard(files, world, rank, relative=False)


def reshard_with_the_moments_crossed(files, world, rank):
    """Returns (param, exp_avg_sq, exp_avg): Adam's two moments in each other's place."""
    return _reshard(files, world, rank, swap_moments=True)


def reshard_resuming_at_the_next_step(files, world, rank):
    """Returns the saved step + 1, "the step to run next": the files' step is the count of steps taken, and
    training resumes with step + 1."""
    return _reshard(files, world, rank, step_after=1)


def reshard_total_from_the_last_offset(files, world, rank):
    """The state's length as the last file's offset plus a file's length (files[0]'s): the last file is shorter."""
    return _reshard(files, world, rank, total_from_offsets=True)


def reshard_step_from_the_last_rank_file(files, world, rank):
    """The step read from files[world - 1], "the last rank's file": the files are as many as the ranks that saved
    them, not as the ranks that load them."""
    return _reshard(files, world, rank, step_of=lambda files, world, rank: files[world - 1]["step"])


def reshard_bounds_of_the_old_layout(files, world, rank):
    """shard_bounds(total, len(files), rank): this rank's bounds in the layout that saved the files."""
    return _reshard(files, world, rank, layout_world=len(files))


# ---- survive_failure -------------------------------------------------------------------------------------------
def _survive(dist, files, grads, every, lr, *, catch=True, reload=True, save_before_update=False, moments=True,
             adam_step=1, reload_layout="survivors"):
    """Training with checkpoints and a failure to survive, as a learner writes it, with the knob of one mistake
    turned."""
    alive, group, last = list(range(dist.get_world_size())), None, files
    total = sum(f["param"].numel() for f in files)
    param = m = v = None
    while True:
        n, me = len(alive), alive.index(dist.get_rank())
        if param is None or reload:
            world_layout = reload_layout == "world"
            *state, step = S.reshard_checkpoint(last, *((dist.get_world_size(), dist.get_rank()) if world_layout
                                                        else (n, me)))
            param, m, v = (t.clone() for t in state)
        try:
            while step < len(grads):
                if save_before_update and step % every == 0:
                    last = _checkpoint(dist, group, param, m, v, step, total, n, moments)
                adam_update(param, grads(step), m, v, step + adam_step, lr)
                step += 1
                if not save_before_update and step % every == 0:
                    last = _checkpoint(dist, group, param, m, v, step, total, n, moments)
            return param, m, v
        except RuntimeError as e:
            if not catch:
                raise
            alive.remove(e.rank)
            group = dist.new_group(alive)


def _checkpoint(dist, group, param, m, v, step, total, n, moments):
    """Every rank's padded shard gathered, cut back to shard_bounds; with moments=False the parameters alone, and
    the moments saved as zeros ("a checkpoint is the model")."""
    size = math.ceil(total / n)
    kept = (param, m, v) if moments else (param,)
    mine = torch.zeros(len(kept), size, dtype=param.dtype, device=param.device)
    for row, t in zip(mine, kept):
        row[:t.numel()] = t
    rows = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(rows, mine, group=group)
    files = []
    for r, got in enumerate(rows):
        lo, hi = shard_bounds(total, n, r)
        state = [got[i, :hi - lo].clone() for i in range(len(kept))]
        state += [torch.zeros_like(state[0])] * (3 - len(kept))
        files.append({"offset": lo, "step": step, **dict(zip(("param", "exp_avg", "exp_avg_sq"), state))})
    return files


def survive_without_catching_the_failure(dist, files, grads, every, lr):
    """Training and checkpoints, no try/except around them: the failed peer's error ends every survivor too."""
    return _survive(dist, files, grads, every, lr, catch=False)


def survive_going_on_with_the_shard_it_holds(dist, files, grads, every, lr):
    """After the failure: a new group of the survivors, and training goes on from the shard each still holds,
    nothing reloaded: the failed rank's elements have no owner, and the layout has changed."""
    return _survive(dist, files, grads, every, lr, reload=False)


def survive_reloading_in_the_layout_of_every_rank(dist, files, grads, every, lr):
    """After the failure the last checkpoint is reloaded, but with reshard_checkpoint(saved, world size, rank): the
    layout of every rank, the failed one included."""
    return _survive(dist, files, grads, every, lr, reload_layout="world")


def survive_checkpointing_before_the_update(dist, files, grads, every, lr):
    """`if step % every == 0: checkpoint` at the top of the loop, before the step's update: what it saves is right,
    but it saves again what is already saved (the first files, where the run starts at a multiple of `every`; the
    checkpoint just reloaded after the failure) and skips the one after the last step: more all-gathers than due."""
    return _survive(dist, files, grads, every, lr, save_before_update=True)


def survive_checkpointing_the_parameters_alone(dist, files, grads, every, lr):
    """Checkpoints of the parameters only, "the model": after the failure Adam's moments restart from zero."""
    return _survive(dist, files, grads, every, lr, moments=False)


def survive_counting_adam_steps_from_the_saved_step(dist, files, grads, every, lr):
    """adam_update(..., step, lr) with the saved step as it is: Adam counts steps from 1, so its bias correction
    runs one step behind."""
    return _survive(dist, files, grads, every, lr, adam_step=0)


# ---- inner_steps_for -------------------------------------------------------------------------------------------
def _inner_steps(params, tokens, world, bandwidth, latency, flops, share, *, messages=None, forward_only=False,
                 ring_share=True, whole=math.ceil, value_bytes=4):
    """inner_steps_for as a learner derives it, with the knob of one mistake turned."""
    compute = (2 if forward_only else 6) * params * tokens / flops
    share_of_bytes = {True: 2 * (world - 1) / world, False: 1}.get(ring_share, ring_share)
    sent = share_of_bytes * value_bytes * params / bandwidth
    comm = (2 * (world - 1) if messages is None else messages) * latency + sent
    return max(1, whole(comm / (share * compute)))


def inner_steps_one_latency(params, tokens, world, bandwidth, latency, flops, share):
    """One latency for the all-reduce, as for one message: a ring sends 2(N-1) of them one after another."""
    return _inner_steps(params, tokens, world, bandwidth, latency, flops, share, messages=1)


def inner_steps_forward_flops_only(params, tokens, world, bandwidth, latency, flops, share):
    """2 · params · tokens FLOPs a step, the forward's: the backward's 4 · params · tokens forgotten."""
    return _inner_steps(params, tokens, world, bandwidth, latency, flops, share, forward_only=True)


def inner_steps_for_the_ring_between_the_sites(params, tokens, world, bandwidth, latency, flops, share):
    """The ring drawn between the two datacenters, world=2 in the all-reduce's formula: only the wide-area hop."""
    return _inner_steps(params, tokens, 2, bandwidth, latency, flops, share)


def inner_steps_a_reduce_scatters_bytes(params, tokens, world, bandwidth, latency, flops, share):
    """(N-1)/N of the bytes, what a reduce-scatter sends: the all-reduce's all-gather half forgotten."""
    return _inner_steps(params, tokens, world, bandwidth, latency, flops, share, ring_share=(world - 1) / world)


def inner_steps_sending_the_bytes_once(params, tokens, world, bandwidth, latency, flops, share):
    """The pseudo-gradient's bytes over the bandwidth once, without the ring's 2(N-1)/N."""
    return _inner_steps(params, tokens, world, bandwidth, latency, flops, share, ring_share=False)


def inner_steps_rounded_down(params, tokens, world, bandwidth, latency, flops, share):
    """int() of the ratio, where the fewest H that keeps communication within its share is its ceiling."""
    return _inner_steps(params, tokens, world, bandwidth, latency, flops, share, whole=int)


def inner_steps_for_a_bf16_pseudo_gradient(params, tokens, world, bandwidth, latency, flops, share):
    """2 bytes a value, "the model trains in bf16": DiLoCo all-reduces the float32 pseudo-gradient, 4 bytes."""
    return _inner_steps(params, tokens, world, bandwidth, latency, flops, share, value_bytes=2)


MISTAKES = [
    Attempt("diloco_train", diloco_outer_step_on_a_copy, "never copied into the workers"),
    Attempt("diloco_train", diloco_summing_the_pseudo_gradients, "N, the world size"),
    Attempt("diloco_train", diloco_new_adamw_every_round, "at step 2"),
    Attempt("diloco_train", diloco_new_outer_sgd_every_round, "at step 2"),
    Attempt("diloco_train", diloco_outer_step_from_the_local_weights, ("start of the round", "copy_(start)")),
    Attempt("diloco_train", diloco_gradients_accumulating_across_inner_steps, ("not zeroed", "zero_grad")),
    Attempt("diloco_train", diloco_plain_momentum, ("Nesterov's", "heavy-ball")),
    Attempt("compressed_all_reduce", compressed_sum_where_the_mean_belongs, "N, the world size"),
    Attempt("compressed_all_reduce", compressed_residual_the_wrong_way_round, "the opposite sign"),
    Attempt("compressed_all_reduce", compressed_residual_without_the_old_one, ("old residual", "the input residual")),
    Attempt("compressed_all_reduce", compressed_adding_the_integers, ("scale of their own", "each sender's scale")),
    Attempt("compressed_all_reduce", compressed_integers_scaled_by_the_largest, "largest scale"),
    Attempt("compressed_all_reduce", compressed_residual_updated_by_the_mean, "minus the all-reduced mean"),
    Attempt("compressed_all_reduce", compressed_means_gathered_as_they_are, ("unquantised", "quantise the mean")),
    Attempt("reshard_checkpoint", reshard_overlap_end_plus_one, ("one element too many", "inclusive")),
    Attempt("reshard_checkpoint", reshard_slicing_files_by_global_index, ("offset never subtracted",
                                                                          "relative to the file")),
    Attempt("reshard_checkpoint", reshard_with_the_moments_crossed, "holds what"),
    Attempt("reshard_checkpoint", reshard_resuming_at_the_next_step, ("off by one", "step + 1")),
    Attempt("reshard_checkpoint", reshard_total_from_the_last_offset, "the first file's length"),
    Attempt("reshard_checkpoint", reshard_step_from_the_last_rank_file, "read past its end"),
    Attempt("reshard_checkpoint", reshard_bounds_of_the_old_layout, ("old layout", "len(files)")),
    Attempt("survive_failure", survive_without_catching_the_failure, ("try", "except RuntimeError")),
    Attempt("survive_failure", survive_going_on_with_the_shard_it_holds, ("reload the last", "the shard it held")),
    Attempt("survive_failure", survive_reloading_in_the_layout_of_every_rank, "in the layout of all"),
    Attempt("survive_failure", survive_checkpointing_before_the_update, ("already saved", "just reloaded")),
    Attempt("survive_failure", survive_checkpointing_the_parameters_alone, ("moments", "exp_avg")),
    Attempt("survive_failure", survive_counting_adam_steps_from_the_saved_step, "bias correction"),
    Attempt("inner_steps_for", inner_steps_one_latency, "2(N-1) (the ring's messages one after another) left out"),
    Attempt("inner_steps_for", inner_steps_forward_flops_only, "the backward (4 × P × tokens) left out"),
    Attempt("inner_steps_for", inner_steps_for_the_ring_between_the_sites, "over the 2 datacenters"),
    Attempt("inner_steps_for", inner_steps_a_reduce_scatters_bytes, "(N-1)/N (what a reduce-scatter"),
    Attempt("inner_steps_for", inner_steps_sending_the_bytes_once, "2(N-1)/N (the share of the bytes"),
    Attempt("inner_steps_for", inner_steps_rounded_down, ("rounded down", "ceil")),
    Attempt("inner_steps_for", inner_steps_for_a_bf16_pseudo_gradient, ("2 B a value", "half the bytes")),
]
