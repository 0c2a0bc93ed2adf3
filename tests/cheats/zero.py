"""Cheats on notebook 03's puzzles, each with the words its rejection must contain."""

import math
import types

import torch
import torch.nn.functional as F

import lib
import puzzles.zero as P
import solutions.zero as S
from tests.cheats.common import everywhere


def zero3_keeping_full_parameters(dist, model, batches, lr):
    """ZeRO-2 handed in as ZeRO-3: gradients and optimizer state sharded, the full parameters kept on the
    device for the whole run."""
    return S.zero2_train(dist, model, batches, lr)


def zero3_keeping_full_parameters_frugally(dist, model, batches, lr):
    """ZeRO-2 as frugal as it gets, handed in as ZeRO-3: the full parameters kept all along, but activations
    recomputed layer by layer and each gradient reduce-scattered and freed at once, so that its peak meets a
    budget with room for a few gathered layers. It never gathers a layer again for backward. A deliberate copy of
    solutions.zero.zero3_train's layer-by-layer forward and backward, without its gathers and frees."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params = list(model.parameters())
    sizes = [math.ceil(p.numel() / world) for p in params]
    shards = [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].clone()
              for p, c in zip(params, sizes)]
    m, v, grads = ([torch.zeros_like(s) for s in shards] for _ in range(3))
    index = {id(p): i for i, p in enumerate(params)}
    for step, (x, y) in enumerate(batches, start=1):
        inputs, h = [], x
        with torch.no_grad():
            for layer in model:
                inputs.append(h)
                h = layer(h)
        h.requires_grad_()
        F.mse_loss(h, y).backward()
        grad = h.grad
        for layer, inp in zip(reversed(model), reversed(inputs)):
            inp = inp.detach().requires_grad_()
            layer(inp).backward(grad)
            grad = inp.grad
            for p in layer.parameters():
                i = index[id(p)]
                dist.reduce_scatter_single(grads[i], F.pad(p.grad.reshape(-1), (0, world * sizes[i] - p.numel())))
                p.grad = None
        for i, (p, c) in enumerate(zip(params, sizes)):
            grads[i] /= world
            P.adam_update(shards[i], grads[i], m[i], v[i], step, lr)
            full = torch.empty(world * c, dtype=p.dtype, device=p.device)
            dist.all_gather_single(full, shards[i])
            with torch.no_grad():
                p.copy_(full[:p.numel()].view_as(p))
    return {name: p.detach() for name, p in model.named_parameters()}


class _GatheringByBroadcasts:
    """dist, its all-gathers made of broadcasts: each rank's shard sent from its owner into its slice (the bytes an
    all-gather receives, (N-1)/N of the whole per rank)."""

    def __init__(self, dist):
        self._dist = dist

    def __getattr__(self, name):
        return getattr(self._dist, name)

    def all_gather_single(self, full, shard, group=None, async_op=False):
        for owner, part in enumerate(full.chunk(self._dist.get_world_size())):
            if owner == self._dist.get_rank():
                part.copy_(shard)
            self._dist.broadcast(part, src=owner)


def zero3_kept_full_gathering_by_broadcasts(dist, model, batches, lr):
    """zero3_frugal_with_dummy_regathers, its all-gathers made of broadcasts: with no all-gather to open ZeRO-3's
    training phase, its memory while training went unjudged; the whole run's peak caught it, in words that did not
    say it kept every parameter while training."""
    return zero3_frugal_with_dummy_regathers(_GatheringByBroadcasts(dist), model, batches, lr)


class _GatheringByMessages(_GatheringByBroadcasts):
    """dist, its all-gathers made of point-to-point messages: each rank sends its shard to every other rank."""

    def all_gather_single(self, full, shard, group=None, async_op=False):
        me, n = self._dist.get_rank(), self._dist.get_world_size()
        parts = full.chunk(n)
        parts[me].copy_(shard)
        works = [self._dist.isend(shard, peer) for peer in range(n) if peer != me]
        works += [self._dist.irecv(parts[peer], peer) for peer in range(n) if peer != me]
        for work in works:
            work.wait()


def zero3_kept_full_gathering_by_messages(dist, model, batches, lr):
    """As zero3_kept_full_gathering_by_broadcasts, its all-gathers made of isend and irecv: rejected by the whole run's
    peak only, until a rank's receives opened its training phase where it never all-gathers or broadcasts."""
    return zero3_frugal_with_dummy_regathers(_GatheringByMessages(dist), model, batches, lr)


class _GatheringByAllToAll(_GatheringByBroadcasts):
    """dist, its all-gathers made of all-to-alls (synchronous or not): each rank sends its shard to every rank, the
    bytes an all-gather sends."""

    def all_gather_single(self, full, shard, group=None, async_op=False):
        n = self._dist.get_world_size()
        return self._dist.all_to_all_single(full, shard.repeat(n), group=group, async_op=async_op)


class _GatheringByAllReduce(_GatheringByBroadcasts):
    """dist, its all-gathers made of all-reduces: zeros around the rank's shard, summed over the ranks (twice an
    all-gather's bytes)."""

    def all_gather_single(self, full, shard, group=None, async_op=False):
        full.zero_()
        full.chunk(self._dist.get_world_size())[self._dist.get_rank()].copy_(shard)
        return self._dist.all_reduce(full, group=group, async_op=async_op)


def zero3_kept_full_gathering_by_all_to_all(dist, model, batches, lr):
    """As zero3_kept_full_gathering_by_broadcasts, its all-gathers made of all-to-alls: passed while only an
    all-gather, a broadcast or a receive opened ZeRO-3's training phase."""
    return zero3_frugal_with_dummy_regathers(_GatheringByAllToAll(dist), model, batches, lr)


def fsdp_gathering_every_layer_ahead_by_all_to_all(dist, model, batches, lr):
    """fsdp_gathering_every_layer_ahead (below), every gather an asynchronous all-to-all: every full parameter held
    at once while training, and the prefetch's overlap kept."""
    return fsdp_gathering_every_layer_ahead(_GatheringByAllToAll(dist), model, batches, lr)


def _on_the_host(solution):
    """The reference solution with the model moved to host memory, where the device's budget does not look."""
    def cheat(dist, model, batches, lr):
        model.to(lib.host())
        moved = [[(x.to(lib.host()), y.to(lib.host())) for x, y in batches]]
        return solution(dist, model, moved[0], lr)
    cheat.__name__ = f"{solution.__name__}_on_the_host"
    return cheat


def ddp_adam_on_the_host(dist, model, batches, lr):
    """Nothing sharded: data parallelism with Adam, with everything in host memory."""
    model.to(lib.host())
    return P.ddp_adam_train(dist, model, [(x.to(lib.host()), y.to(lib.host())) for x, y in batches], lr)


def zero3_with_matmuls_dodged(dist, model, batches, lr):
    """ZeRO-3 without prefetch handed in as FSDP with prefetch, each linear layer computed as a broadcast multiply
    and sum: were only matmuls costed, its compute would be free and no gather would need hiding."""
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            layer.forward = lambda h, layer=layer: (h[:, :, None] * layer.weight.T[None]).sum(1) + layer.bias
    return S.zero3_train(dist, model, batches, lr)


class _ScatterLocally:
    """A dist whose reduce_scatter_single keeps this rank's slice of its own input, times N (the caller divides
    by N): for a rank that already holds the whole batch's gradient."""

    def __init__(self, dist):
        self._dist = dist

    def __getattr__(self, name):
        return getattr(self._dist, name)

    def reduce_scatter_single(self, output, input, **_):
        world = self._dist.get_world_size()
        output.copy_(input.chunk(world)[self._dist.get_rank()] * world)


def zero1_gathering_the_data(dist, model, batches, lr):
    """ZeRO-1 where the data travels instead of the gradients: every rank all-gathers each step's batch, computes
    the whole batch's gradient itself (N times the work) and skips the reduce-scatter. Sends less than ZeRO-1."""
    world, gathered = dist.get_world_size(), []
    for step in batches:
        whole = []
        for t in step:
            out = torch.empty(world * t.shape[0], *t.shape[1:], dtype=t.dtype, device=t.device)
            dist.all_gather_single(out, t)
            whole.append(out)
        gathered.append(tuple(whole))
    return S.zero1_train(_ScatterLocally(dist), model, gathered, lr)


class _Regathering:
    """A dist that, before each reduce-scatter, all-gathers the rank's shard into a buffer it drops at once: the
    bytes of ZeRO-3's gather for backward, with nothing gathered for use."""

    def __init__(self, dist):
        self._dist = dist

    def __getattr__(self, name):
        return getattr(self._dist, name)

    def reduce_scatter_single(self, output, input, **kwargs):
        self._dist.all_gather_single(torch.empty_like(input), output)
        return self._dist.reduce_scatter_single(output, input, **kwargs)


def zero3_frugal_with_dummy_regathers(dist, model, batches, lr):
    """The frugal ZeRO-2 above, with a useless all-gather per parameter in backward to meet the regather floor's
    bytes: ZeRO-3's traffic, ZeRO-2's memory."""
    return zero3_keeping_full_parameters_frugally(_Regathering(dist), model, batches, lr)


class _PrefetchingInForwardOnly:
    """A dist whose asynchronous all-gathers complete at once while autograd records (the backward's recomputed
    layers): prefetching in forward only."""

    def __init__(self, dist):
        self._dist = dist

    def __getattr__(self, name):
        return getattr(self._dist, name)

    def all_gather_single(self, output, input, async_op=False, **kwargs):
        if async_op and torch.is_grad_enabled():
            self._dist.all_gather_single(output, input, **kwargs)
            return _Done()
        return self._dist.all_gather_single(output, input, async_op=async_op, **kwargs)


class _Done:
    def wait(self):
        return True


def fsdp_prefetching_in_forward_only(dist, model, batches, lr):
    """FSDP's prefetch in forward, none in backward: half the gathers hidden, the budget asks for half of all."""
    return S.fsdp_prefetch_train(_PrefetchingInForwardOnly(dist), model, batches, lr)


def offload_step_on_the_device(dist, model, batches, lr):
    """ZeRO-Offload's state kept in host memory, but Adam's step taken on the device: each shard's master copy,
    m and v carried to the device, updated there and copied back. The host holds the state and computes nothing.
    (Without the host-FLOPs floor it passed on 6 seeds of 10: its device peak is ZeRO-Offload's plus 3 shards.)
    A deliberate copy of solutions.zero.zero_offload_train with the update moved."""
    rank, world = dist.get_rank(), dist.get_world_size()
    host, device = lib.host(), lib.device()
    params = list(model.parameters())
    sizes = [math.ceil(p.numel() / world) for p in params]
    shards = [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].to(host)
              for p, c in zip(params, sizes)]
    m, v = ([torch.zeros(c, dtype=p.dtype, device=host) for p, c in zip(params, sizes)] for _ in range(2))
    grads, index = [None] * len(params), {id(p): i for i, p in enumerate(params)}

    def reduce_scatter(p):
        i = index[id(p)]
        grads[i] = torch.empty(sizes[i], dtype=p.dtype, device=device)
        dist.reduce_scatter_single(grads[i], F.pad(p.grad.reshape(-1), (0, world * sizes[i] - p.numel())))
        p.grad = None

    hooks = [p.register_post_accumulate_grad_hook(reduce_scatter) for p in params]
    for step, (x, y) in enumerate(batches, start=1):
        F.mse_loss(model(x), y).backward()
        for i, (p, c) in enumerate(zip(params, sizes)):
            grads[i] /= world
            shard, m_i, v_i = (t.to(device) for t in (shards[i], m[i], v[i]))
            P.adam_update(shard, grads[i], m_i, v_i, step, lr)
            for kept, new in zip((shards[i], m[i], v[i]), (shard, m_i, v_i)):
                kept.copy_(new)
            grads[i] = None
            full = torch.empty(world * c, dtype=p.dtype, device=device)
            dist.all_gather_single(full, shard)
            del shard, m_i, v_i
            with torch.no_grad():
                p.copy_(full[:p.numel()].view_as(p))
    for h in hooks:
        h.remove()
    return {name: p.detach() for name, p in model.named_parameters()}


class _BusyHost(_GatheringByBroadcasts):
    """dist, its all-gathers preceded by busywork in host memory: as many additions on a throwaway host tensor as
    Adam's step on the shard would compute there."""

    def all_gather_single(self, full, shard, group=None, async_op=False):
        busy = torch.zeros(shard.numel(), dtype=shard.dtype, device=lib.host())
        for _ in range(8):                      # adam_update's FLOPs per element
            busy.add_(1.0)
        return self._dist.all_gather_single(full, shard, group=group, async_op=async_op)


def offload_step_on_the_device_busy_host(dist, model, batches, lr):
    """offload_step_on_the_device, the host-FLOPs floor paid with busywork: additions on a throwaway host tensor, as
    many as Adam's step on the shard, while the step itself runs on the device."""
    return offload_step_on_the_device(_BusyHost(dist), model, batches, lr)


# Moved to the host, a model is over the host's budget, or its first collective is refused (NCCL takes no CPU tensor).
HOST = ("peak host memory", "in host memory")
ADAM_ON_THE_DEVICE = "Adam's step on the device"
TRAINING = "while training"            # ZeRO-3's memory from the first all-gather to the last reduce-scatter
CHEATS = everywhere(P) + [
    ("zero3_train", zero3_keeping_full_parameters, ("under the floor", TRAINING)),
    ("zero3_train", zero3_keeping_full_parameters_frugally, ("under the floor", TRAINING)),
    ("zero3_train", zero3_kept_full_gathering_by_broadcasts, TRAINING),
    ("zero3_train", zero3_kept_full_gathering_by_messages, TRAINING),
    ("fsdp_prefetch_train", zero3_with_matmuls_dodged, ("simulated time", TRAINING)),
    ("zero1_train", zero1_gathering_the_data, "the gradients travel, not the data"),   # ZeRO-2's memory stops it
    ("zero3_train", zero3_frugal_with_dummy_regathers, ("peak memory", TRAINING)),
    ("fsdp_prefetch_train", fsdp_prefetching_in_forward_only, "simulated time"),
    ("zero_offload_train", offload_step_on_the_device, ADAM_ON_THE_DEVICE),
    *[(name, ddp_adam_on_the_host, HOST) for name in ("zero1_train", "zero2_train", "zero3_train",
                                                       "fsdp_prefetch_train")],
    *[(name, _on_the_host(getattr(S, name)), HOST) for name in ("zero1_train", "zero2_train", "zero3_train",
                                                                 "fsdp_prefetch_train")],
]


def fsdp_gathering_every_layer_ahead(dist, model, batches, lr):
    """FSDP whose forward issues every layer's all-gather at its start, each layer freed after use (backward
    prefetches one layer ahead, as the reference): the forward's gathers all hidden, and every full parameter held
    at once. Passed every seed while the memory budget was set by the final gather of all parameters, which holds as
    much. A deliberate copy of solutions.zero.fsdp_prefetch_train with its forward's prefetch made all-ahead."""
    rank, world = dist.get_rank(), dist.get_world_size()
    params, layers = list(model.parameters()), [layer for layer in model if list(layer.parameters())]
    shapes, sizes = [p.shape for p in params], [math.ceil(p.numel() / world) for p in params]
    shards = [F.pad(p.detach().reshape(-1), (0, world * c - p.numel()))[rank * c:(rank + 1) * c].clone()
              for p, c in zip(params, sizes)]
    m, v, grads = ([torch.zeros_like(s) for s in shards] for _ in range(3))
    index = {id(p): i for i, p in enumerate(params)}

    def gather(layer):
        """The layer's all-gathers issued without waiting: [(parameter, buffer, work)]."""
        pending = []
        for p in layer.parameters():
            i = index[id(p)]
            full = torch.empty(world * sizes[i], dtype=p.dtype, device=p.device)
            pending.append((p, full, dist.all_gather_single(full, shards[i], async_op=True)))
        return pending

    def use(pending):
        for p, full, work in pending:
            work.wait()
            shape = shapes[index[id(p)]]
            p.data = full[:shape.numel()].view(shape)

    def free(layer):
        for p in layer.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    for layer in layers:
        free(layer)
    for step, (x, y) in enumerate(batches, start=1):
        inputs, h = [], x
        ahead = {id(layer): gather(layer) for layer in layers}          # every layer, at once
        with torch.no_grad():
            for layer in model:
                if id(layer) in ahead:
                    use(ahead.pop(id(layer)))
                inputs.append(h)
                h = layer(h)
                free(layer)
        h.requires_grad_()
        F.mse_loss(h, y).backward()
        grad, order = h.grad, list(reversed(layers))
        ahead = {id(order[0]): gather(order[0])}
        for layer, inp in zip(reversed(model), reversed(inputs)):
            if id(layer) in ahead:
                k = order.index(layer)
                if k + 1 < len(order):                                    # one layer ahead, as the reference
                    ahead[id(order[k + 1])] = gather(order[k + 1])
                use(ahead.pop(id(layer)))
            inp = inp.detach().requires_grad_()
            layer(inp).backward(grad)
            grad = inp.grad
            for p in layer.parameters():
                i = index[id(p)]
                dist.reduce_scatter_single(grads[i], F.pad(p.grad.reshape(-1), (0, world * sizes[i] - p.grad.numel())))
                p.grad = None
            free(layer)
        for i in range(len(params)):
            grads[i] /= world
            P.adam_update(shards[i], grads[i], m[i], v[i], step, lr)
    m.clear(), v.clear(), grads.clear()
    for layer in layers:
        use(gather(layer))
    return {name: p.detach() for name, p in model.named_parameters()}


def fsdp_gathering_every_layer_ahead_by_all_reduce(dist, model, batches, lr):
    """fsdp_gathering_every_layer_ahead, every gather an asynchronous all-reduce of zeros around the shard."""
    return fsdp_gathering_every_layer_ahead(_GatheringByAllReduce(dist), model, batches, lr)


def zero3_kept_full_gathering_by_all_reduce(dist, model, batches, lr):
    """As zero3_kept_full_gathering_by_all_to_all, its gathers all-reduces: rejected by the whole run's peak only,
    in words that did not say it kept every parameter while training."""
    return zero3_frugal_with_dummy_regathers(_GatheringByAllReduce(dist), model, batches, lr)


# The message names the op that opened the phase: the collective that gathered while training.
BY_ALL_TO_ALL, BY_ALL_REDUCE = "from its first all_to_all", "from its first all_reduce"
CHEATS += [(name, fn, words) for name in ("zero3_train", "fsdp_prefetch_train")
           for fn, words in ((fsdp_gathering_every_layer_ahead, TRAINING),
                             (fsdp_gathering_every_layer_ahead_by_all_to_all, BY_ALL_TO_ALL),
                             (fsdp_gathering_every_layer_ahead_by_all_reduce, BY_ALL_REDUCE))]
CHEATS += [("zero3_train", zero3_kept_full_gathering_by_all_to_all, BY_ALL_TO_ALL),
           ("zero3_train", zero3_kept_full_gathering_by_all_reduce, BY_ALL_REDUCE)]


class _DeviceIsTheHost:
    """lib for an answer that never brings its host shards back: lib.device() answers lib.host()."""

    host = staticmethod(lib.host)
    device = staticmethod(lib.host)


offload_all_gathering_from_the_host = types.FunctionType(
    S.zero_offload_train.__code__, dict(S.__dict__, lib=_DeviceIsTheHost), "offload_all_gathering_from_the_host")
offload_all_gathering_from_the_host.__doc__ = (
    "ZeRO-Offload whose updated shards are all-gathered straight from host memory, never brought to the device: "
    "the simulator accepted it, NCCL refuses a CPU tensor.")
CHEATS += [("zero_offload_train", offload_all_gathering_from_the_host, "in host memory"),
           ("zero_offload_train", offload_step_on_the_device_busy_host, ADAM_ON_THE_DEVICE)]
