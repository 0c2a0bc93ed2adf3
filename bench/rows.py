"""The benchmark rows: each notebook's main algorithm (its reference solution) against PyTorch's own.

A row is one entry of `ROWS`: two `Impl`s sharing one `Setup`, so that both get the same model, the same data
and the same number of steps. An implementation is `fn(dist, *inputs)` that runs one step per item of the
`Steps` among its inputs and returns what both sides must agree on (tests/test_bench.py compares them).
PyTorch's side is the puzzle's own oracle wherever that oracle builds nothing per step; where it would
(a DDP bucket size, a DTensor module, a pipeline schedule), the few lines here build it once, before the steps.

A new notebook adds its row here and nothing else changes (notebooks 06's and 09's, whose solutions run every
step inside one call, are the latest: bench.timing.one_call times their steps from their collectives).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed.fsdp  # noqa: F401  (the oracles' imports, made once here before forking ranks: a
import torch.distributed.optim  # noqa: F401  forked rank would spend seconds importing them in every launch)
import torch.nn.functional as F
from torch.distributed import pipelining as pipe
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import lib
from lib.real.backends import device_mesh
import solutions.data_parallel as dp
import solutions.moe as moe
import solutions.pipeline as pp
import solutions.ring_attention as ra
import solutions.tensor_parallel as tp
import solutions.three_d as three_d
import solutions.beyond as beyond
import solutions.zero as zero
from bench.timing import Steps, one_call
from lib.models import mlp
from puzzles import data_parallel as P02
from puzzles import moe as P07
from puzzles import tensor_parallel as P04
from puzzles import three_d as P06
from puzzles import zero as P03

DTYPE = torch.float32


@dataclass(frozen=True)
class Setup:
    """The inputs both sides of a comparison get: `build(world, rank, steps, **size)`, at full or quick size."""

    build: Callable[..., tuple]
    size: dict
    quick: dict
    rounds: str = ""              # the size's key, if any, saying how many steps make a round (timed as one)

    def inputs(self, quick: bool) -> Callable[[int, int, int], tuple]:
        return functools.partial(self.build, **(self.quick if quick else self.size))

    def round_size(self, quick: bool) -> int:
        return (self.quick if quick else self.size)[self.rounds] if self.rounds else 1

    def describe(self, quick: bool) -> str:
        return ", ".join(f"{k}={v}" for k, v in (self.quick if quick else self.size).items())


@dataclass(frozen=True)
class Impl:
    """One side of a comparison: what the table calls it, the function each rank runs, and its inputs."""

    name: str
    fn: Callable
    setup: Setup


@dataclass(frozen=True)
class Row:
    """Our algorithm against PyTorch's own, with the issue's target for ours / PyTorch's."""

    key: str
    title: str
    notebook: str
    ours: Impl
    theirs: Impl
    target: Optional[float]
    quick: bool = True                        # part of `--quick`
    why: str = ""                             # one line: why ours is slower, shown where the row misses its target
    agrees: bool = True                       # both sides compute the same thing (tests compare their results)

    def message_bytes(self, quick: bool) -> Optional[int]:
        """All-reduce rows: the message's size (for bus bandwidth); None for the others."""
        return (self.ours.setup.quick if quick else self.ours.setup.size).get("nbytes")

    def __post_init__(self) -> None:
        if self.ours.setup is not self.theirs.setup:
            raise ValueError(f"row {self.key}: both sides must share one Setup (same model, same data)")


# ---- inputs ---------------------------------------------------------------------------------------------
def _rand(seed: int, *shape: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=DTYPE).to(lib.device())


def _model(width: int, layers: int):
    return mlp([width] * (layers + 1), seed=0, dtype=DTYPE).to(lib.device())


def _shards(rank: int, steps: int, rows: int, width: int) -> Steps:
    """This rank's shard of each step's global batch: (x, y), `rows` samples."""
    return Steps([(_rand(1000 * s + 2 * rank, rows, width), _rand(1000 * s + 2 * rank + 1, rows, width))
                  for s in range(steps)])


def message(world: int, rank: int, steps: int, nbytes: int) -> tuple:
    return (Steps([_rand(s * 100 + rank, nbytes // 4) for s in range(steps)]),)


def training(world: int, rank: int, steps: int, width: int, layers: int, rows: int, lr: float) -> tuple:
    """An MLP, this rank's batches, a learning rate: data parallelism's and ZeRO's inputs."""
    return _model(width, layers), _shards(rank, steps, rows, width), lr


def bucketed(world: int, rank: int, steps: int, bucket: int, **size) -> tuple:
    return (*training(world, rank, steps, **size), bucket)


def mlp_shards(world: int, rank: int, steps: int, tokens: int, hidden: int) -> tuple:
    """This rank's slices of a transformer MLP (fc1 by rows, fc2 by columns), and (x, upstream gradient) per step."""
    w1, b1 = _rand(1, 4 * hidden, hidden) * hidden ** -0.5, _rand(2, 4 * hidden) * 0.1
    w2, b2 = _rand(3, hidden, 4 * hidden) * (4 * hidden) ** -0.5, _rand(4, hidden) * 0.1
    mine = [t.chunk(world, d)[rank].clone().requires_grad_() for t, d in ((w1, 0), (b1, 0), (w2, 1))]
    data = Steps([(_rand(10 + s, tokens, 1, hidden).requires_grad_(), _rand(20 + s, tokens, 1, hidden))
                  for s in range(steps)])
    return (*mine, b2.requires_grad_(), data)


def sequence_shards(world: int, rank: int, steps: int, tokens: int, hidden: int) -> tuple:
    """As mlp_shards, with x and its gradient cut along the sequence (sequence parallelism)."""
    *weights, b2, data = mlp_shards(world, rank, steps, tokens, hidden)
    cut = Steps([(x.detach().chunk(world)[rank].clone().requires_grad_(), dy.chunk(world)[rank].clone())
                 for x, dy in data.items])
    return (*weights, cut)


def attention_shards(world: int, rank: int, steps: int, tokens: int, heads: int, dim: int) -> tuple:
    """This rank's s/N tokens of q, k and v per step (one sequence of `tokens`), and the ring's key block."""
    chunk = tokens // world
    data = Steps([tuple(_rand(100 * s + i, 1, heads, tokens, dim)[:, :, rank * chunk:(rank + 1) * chunk].clone()
                        for i in range(3)) for s in range(steps)])              # (1, heads, s/N, dim) each
    return data, chunk // 2


def expert_shards(world: int, rank: int, steps: int, tokens: int, hidden: int, experts: int, k: int,
                  factor: float) -> tuple:
    """The router (hidden, E), this rank's E/N experts (E/N, hidden, hidden), k, the capacity factor, and per step
    this rank's tokens (tokens, hidden) with the gradient of the layer's output."""
    router = _rand(5, hidden, experts) * hidden ** -0.5
    mine = (_rand(6, experts, hidden, hidden) * hidden ** -0.5).chunk(world)[rank].clone()
    data = Steps([(_rand(100 * s + 2 * rank + 30, tokens, hidden), _rand(100 * s + 2 * rank + 31, tokens, hidden))
                  for s in range(steps)])
    return router, mine, k, factor, data


def mesh_training(world: int, rank: int, steps: int, hidden: int, rows: int, lr: float) -> tuple:
    """Notebook 06's inputs: the whole MLP (fc1 4h x h, fc2 h x 4h) and the global batch, the same on every rank,
    the (dp, tp) mesh's shape (tp = 2 where the world is even, dp the rest), a learning rate, and the steps (their
    items unused: every step trains on the same batch, as the puzzle's does)."""
    h = hidden
    weights = {"fc1_w": _rand(1, 4 * h, h) * h ** -0.5, "fc1_b": _rand(2, 4 * h) * 0.1,
               "fc2_w": _rand(3, h, 4 * h) * (4 * h) ** -0.5, "fc2_b": _rand(4, h) * 0.1}
    tp_size = 2 if world % 2 == 0 else 1
    return weights, _rand(5, rows, h), _rand(6, rows, h), world // tp_size, tp_size, lr, Steps([None] * steps)


def local_training(world: int, rank: int, steps: int, width: int, layers: int, rows: int, inner_steps: int,
                   inner_lr: float, outer_lr: float, momentum: float) -> tuple:
    """Notebook 09's inputs: an MLP, this rank's batches, DiLoCo's H and its inner and outer optimizers' settings."""
    return _model(width, layers), _shards(rank, steps, rows, width), inner_steps, inner_lr, outer_lr, momentum


def _batch(steps: int, rows: int, width: int) -> Steps:
    return Steps([(_rand(10 + s, rows, width), _rand(20 + s, rows, width)) for s in range(steps)])


def stages(world: int, rank: int, steps: int, width: int, layers: int, micro: int, rows: int) -> tuple:
    """This rank's stage (`layers` Linear+ReLU of one MLP cut in `world`), and a batch of `micro` micro-batches."""
    model = _model(width, layers * world)
    return model[2 * layers * rank:2 * layers * (rank + 1)], _batch(steps, micro * rows, width), micro


def chunks(world: int, rank: int, steps: int, width: int, layers: int, micro: int, rows: int, v: int) -> tuple:
    """Interleaved: the model cut in world·v chunks of layers/v; rank r holds chunks r, r+world, ..."""
    per = layers // v
    model = _model(width, layers * world)
    mine = [model[2 * per * s:2 * per * (s + 1)] for s in range(rank, world * v, world)]
    return mine, _batch(steps, micro * rows, width), micro


# ---- our side: the reference solutions, one call per step where the solution is one step ----------------
# Each side returns what both must agree on (tests/test_bench.py compares them): the same work, not just as long.
def ring(dist, steps):
    for x in steps:
        out = dp.ring_all_reduce(dist, x)
    return {"x": out}


def _mlp_grads(w1, b1, w2, b2) -> dict:
    return {"fc1_w": w1, "fc1_b": b1, "fc2_w": w2, "fc2_b": b2}


def megatron(dist, w1, b1, w2, b2, steps):
    for x, dy in steps:
        tp.megatron_mlp(dist, x, w1, b1, w2, b2).backward(dy)
    return _mlp_grads(w1.grad, b1.grad, w2.grad, b2.grad)


def sequence_parallel(dist, w1, b1, w2, steps):
    for x, dy in steps:
        tp.sequence_parallel_mlp(dist, x, w1, b1, w2).backward(dy)
    return {"fc1_w": w1.grad, "fc1_b": b1.grad, "fc2_w": w2.grad}


def blocking_ddp(dist, model, steps, lr, bucket):
    """Notebook 02's first data-parallel step: all-reduce every gradient after backward (no bucket, no overlap)."""
    return dp.data_parallel_train(dist, model, steps, lr)


def _grads(stage) -> dict:
    mine = stage if isinstance(stage, list) else [stage]
    return {f"{c}.{n}": p.grad for c, s in enumerate(mine) for n, p in s.named_parameters()}


def _each_step(solution: Callable) -> Callable:
    """A pipeline schedule is one step of the solution; the benchmark runs it once per batch."""
    def run(dist, stage, steps, m):
        for batch, targets in steps:
            for s in (stage if isinstance(stage, list) else [stage]):
                s.zero_grad()
            solution(dist, stage, batch, targets, m)
        return _grads(stage)
    run.__name__ = solution.__name__
    return run


def ring_attention(dist, steps, block):
    for q, k, v in steps:
        out, _ = ra.ring_attention(dist, q, k, v, block)
    return {"out": out}


def moe_step(layer: Callable) -> Callable:
    """An expert-parallel MoE layer's forward and backward per step (notebook 07's harness): output and gradients."""
    def run(dist, router, experts, k, factor, steps):
        for x, dy in steps:
            y, dx, drouter, dexperts = P07._backward_harness(layer, dist, x, router, experts, k, factor, dy)
        return {"y": y, "dx": dx, "drouter": drouter, "dexperts": dexperts}
    run.__name__ = layer.__name__
    return run


def tp_dp(dist, weights, batch, targets, dp, tp, lr, steps):
    """Notebook 06's tp_dp_train, which runs every step in one call, its steps timed from its collectives."""
    return one_call(dist, steps, lambda paced: three_d.tp_dp_train(paced, weights, batch, targets, dp, tp,
                                                                     len(steps), lr))


def diloco(dist, model, steps, inner_steps, inner_lr, outer_lr, momentum):
    """Notebook 09's diloco_train on this rank's batches (a list it slices), timed a round at a time from its
    outer all-reduce."""
    return one_call(dist, steps, lambda paced: beyond.diloco_train(paced, model, steps.items, inner_steps, inner_lr,
                                                                     outer_lr, momentum))


# ---- PyTorch's side -------------------------------------------------------------------------------------
def all_reduce(dist, steps):
    for x in steps:
        P02._all_reduce_oracle(dist, x)
    return {"x": x}


def ddp(dist, model, steps, lr, bucket):
    """DistributedDataParallel with our bucket size (the puzzle's oracle keeps DDP's default 25 MiB)."""
    return P02._ddp_oracle(dist, model, steps, lr, bucket_cap_mb=bucket * DTYPE.itemsize / 2**20)


def gathered_sdpa(dist, steps, block):
    """Context parallelism the plain way: all-gather K and V along the sequence, then PyTorch's fused attention."""
    world = dist.get_world_size()
    for q, k, v in steps:
        whole = []
        for t in (k, v):
            parts = torch.empty((world * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)  # (N, h, s/N, d)
            dist.all_gather_single(parts, t.contiguous())
            whole.append(torch.cat(parts.chunk(world), 2))                              # (1, heads, s, dim)
        out = F.scaled_dot_product_attention(q, *whole)
    return {"out": out}


def parallelize(dist, w1, b1, w2, b2, steps):
    """The puzzle's DTensor MLP (fc1 ColwiseParallel, fc2 RowwiseParallel), built once, then run per step."""
    module = P04._MLP(P04._linear(dist, w1, b1, 0, True), P04._linear(dist, w2, b2, 1, False))
    parallelize_module(module, device_mesh(dist), {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    for x, dy in steps:
        module(x).backward(dy)
    return _mlp_grads(*(P04._local(p.grad) for p in (module.fc1.weight, module.fc1.bias, module.fc2.weight,
                                                         module.fc2.bias)))


def fsdp_tp(dist, weights, batch, targets, dp, tp, lr, steps):
    """The puzzle's oracle's module (FSDP2 over "dp", DTensor Colwise fc1 and Rowwise fc2 over "tp"), built once
    in the batch's dtype, then a step per item with torch.optim.SGD; this rank's TP shards at the end, as
    tp_dp_train returns them."""
    import warnings

    warnings.filterwarnings("ignore", message="Full backward hook is firing")  # FSDP2's: the batch needs no grad
    model, d, t = P06.fsdp_tp_mlp(dist, weights, dp, tp, batch.dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = batch.chunk(dp)[d], targets.chunk(dp)[d]
    for _ in steps:
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return P06.fsdp_tp_shards(model, tp, t)


def ddp_adamw(dist, model, steps, inner_steps, inner_lr, outer_lr, momentum):
    """DistributedDataParallel with DiLoCo's inner optimizer (AdamW, its learning rate): every step all-reduces
    the gradients, where DiLoCo all-reduces once per round."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model)
    _fit(ddp, torch.optim.AdamW(ddp.parameters(), lr=inner_lr), steps)
    return model


def _fit(module, optimizer, steps) -> None:
    """An optimizer step per batch, loss F.mse_loss (the puzzles' DDP oracle's loop, with another optimizer)."""
    for x, y in steps:
        optimizer.zero_grad()
        F.mse_loss(module(x), y).backward()
        optimizer.step()


def pipelining(schedule: str) -> Callable:
    """torch.distributed.pipelining's `schedule` over this rank's stage (or chunks), built once. Not the puzzles'
    oracles (puzzles.pipeline), which build it at each call: its first step sets up the stages, shapes sent
    between neighbours included, and that set-up must not count in every timed step."""
    def run(dist, stage, steps, m):
        rank, p = dist.get_rank(), dist.get_world_size()
        mine = stage if isinstance(stage, list) else [stage]
        built = [pipe.PipelineStage(s, c * p + rank, p * len(mine), lib.device()) for c, s in enumerate(mine)]
        sched = getattr(pipe, schedule)(built if isinstance(stage, list) else built[0], n_microbatches=m,
                                        loss_fn=F.mse_loss)
        for batch, targets in steps:
            for s in mine:
                s.zero_grad()
            if rank == 0:
                sched.step(batch)
            elif rank == p - 1:
                sched.step(target=targets, losses=[])
            else:
                sched.step()
        return _grads(stage)
    run.__name__ = schedule
    return run


# ---- the rows -------------------------------------------------------------------------------------------
RING_SIZES = [2**10, 2**16, 2**20, 2**22, 2**24]         # 1 KiB .. 16 MiB
RING_QUICK = {2**16, 2**20}
TRAIN = dict(width=512, layers=4, rows=32, lr=1e-3)
TRAIN_QUICK = dict(width=64, layers=4, rows=8, lr=1e-3)
TRAIN_NO_LR, TRAIN_QUICK_NO_LR = ({k: v for k, v in t.items() if k != "lr"} for t in (TRAIN, TRAIN_QUICK))
DDP = Setup(bucketed, dict(bucket=2**18, **TRAIN), dict(bucket=2**12, **TRAIN_QUICK))
ZERO = Setup(training, TRAIN, TRAIN_QUICK)
MLP = Setup(mlp_shards, dict(tokens=512, hidden=512), dict(tokens=32, hidden=32))
SP_MLP = Setup(sequence_shards, MLP.size, MLP.quick)
PIPE_SIZE, PIPE_QUICK = dict(width=512, layers=4, micro=8, rows=16), dict(width=32, layers=2, micro=4, rows=4)
PIPE = Setup(stages, PIPE_SIZE, PIPE_QUICK)
INTERLEAVED = Setup(chunks, dict(v=2, **PIPE_SIZE), dict(v=2, **PIPE_QUICK))


def _ring_row(nbytes: int) -> Row:
    setup = Setup(message, dict(nbytes=nbytes), dict(nbytes=nbytes))
    size = f"{nbytes // 2**20} MiB" if nbytes >= 2**20 else f"{nbytes // 2**10} KiB"
    return Row(f"ring-{nbytes // 2**10}k", f"ring all-reduce, {size}", "02", Impl("ring_all_reduce", ring, setup),
               Impl("dist.all_reduce", all_reduce, setup), target=1.3 if nbytes >= 2**20 else None,
               quick=nbytes in RING_QUICK,
               why="gloo's all_reduce is one C++ call that pipelines chunks around the ring; ours is 2(N-1) "
                   "steps of Python isend/recv, each waiting for both neighbours to get a core")


OVERLAPPED_DDP = Impl("bucketed_data_parallel_train", dp.bucketed_data_parallel_train, DDP)
ZERO1 = Impl("zero1_train", zero.zero1_train, ZERO)
ZERO3 = Impl("zero3_train", zero.zero3_train, ZERO)
FULLY_SHARD = Impl("fully_shard", P03._fsdp_oracle(reshard_after_forward=True), ZERO)
MEGATRON = Impl("megatron_mlp", megatron, MLP)
ONE_F_ONE_B = Impl("one_f_one_b", _each_step(pp.one_f_one_b), PIPE)
INTERLEAVED_1F1B = Impl("interleaved_1f1b", _each_step(pp.interleaved_1f1b), INTERLEAVED)

EXPERTS = Setup(expert_shards, dict(tokens=2048, hidden=256, experts=8, k=2, factor=1.25),
                dict(tokens=64, hidden=16, experts=4, k=2, factor=1.25))
CONTEXT = Setup(attention_shards, dict(tokens=4096, heads=8, dim=64), dict(tokens=64, heads=2, dim=8))
MESH = Setup(mesh_training, dict(hidden=512, rows=512, lr=0.1), dict(hidden=16, rows=8, lr=0.1))
LOCAL = Setup(local_training, dict(inner_steps=8, inner_lr=1e-3, outer_lr=0.7, momentum=0.9, **TRAIN_NO_LR),
              dict(inner_steps=2, inner_lr=1e-3, outer_lr=0.7, momentum=0.9, **TRAIN_QUICK_NO_LR), rounds="inner_steps")

ROWS: list[Row] = [
    *(_ring_row(n) for n in RING_SIZES),
    Row("ddp", "bucketed, overlapped DDP step", "02", OVERLAPPED_DDP, Impl("DistributedDataParallel", ddp, DDP),
        target=1.2, why="DDP's C++ reducer writes gradients into persistent bucket views; ours concatenates each "
                        "bucket (torch.cat) and copies it back, from Python hooks"),
    Row("zero1", "ZeRO-1 step (Adam)", "03", ZERO1,
        Impl("ZeroRedundancyOptimizer", P03._zero_redundancy_oracle, ZERO), target=1.2,
        why="ours reduce-scatters and all-gathers (NCCL's way, the lesson's), and gloo's reduce-scatter is slower "
            "than its all-reduce (collectives line below); ZeroRedundancyOptimizer all-reduces, then broadcasts"),
    Row("zero2", "ZeRO-2 step (Adam)", "03", Impl("zero2_train", zero.zero2_train, ZERO),
        Impl("fully_shard(reshard_after_forward=False)", P03._fsdp_oracle(reshard_after_forward=False), ZERO),
        target=1.3, quick=False),
    Row("zero3", "ZeRO-3 / FSDP step (Adam)", "03", ZERO3, FULLY_SHARD, target=1.3,
        why="the lesson's ZeRO-3 recomputes each layer's forward in backward (4/3 of the compute) and gathers "
            "parameter by parameter; FSDP2 keeps the activations and gathers a layer in one flat buffer"),
    Row("fsdp-prefetch", "FSDP step with prefetch (Adam)", "03",
        Impl("fsdp_prefetch_train", zero.fsdp_prefetch_train, ZERO), FULLY_SHARD, target=1.3, quick=False),
    Row("tp-mlp", "Megatron MLP, forward + backward", "04", MEGATRON,
        Impl("parallelize_module (Colwise, Rowwise)", parallelize, MLP), target=1.2),
    Row("1f1b", "1F1B pipeline step", "05", ONE_F_ONE_B, Impl("Schedule1F1B", pipelining("Schedule1F1B"), PIPE),
        target=1.3),
    Row("interleaved", "interleaved 1F1B step (v=2)", "05", INTERLEAVED_1F1B,
        Impl("ScheduleInterleaved1F1B", pipelining("ScheduleInterleaved1F1B"), INTERLEAVED), target=1.3),
    Row("tp-dp", "2-D TP × DP step (SGD)", "06", Impl("tp_dp_train", tp_dp, MESH),
        Impl("fully_shard + parallelize_module, 2-D mesh", fsdp_tp, MESH), target=1.3,
        quick=True),
    Row("moe", "expert-parallel MoE layer, forward + backward", "07",
        Impl("moe_layer_backward", moe_step(moe.moe_layer_backward), EXPERTS),
        Impl("padded dispatch, all_to_all_single_autograd", moe_step(P07.padded_dispatch), EXPERTS), target=None,
        why="no PyTorch layer to compare with: its side is GShard's padded dispatch (every expert's whole capacity "
            "sent) through torch's differentiable all-to-all, the real cells' oracle"),
    Row("ring-attention", "ring attention, forward", "08", Impl("ring_attention", ring_attention, CONTEXT),
        Impl("SDPA on the gathered sequence", gathered_sdpa, CONTEXT), target=1.3,
        why="ours computes attention block by block in separate ops (matmuls, exp, the merges: the lesson's "
            "algorithm, PyTorch's kernel refused in the puzzle); SDPA is one fused kernel over the gathered K/V"),
    Row("diloco", "DiLoCo step (mean over rounds of H steps)", "09",
        Impl("diloco_train", diloco, LOCAL), Impl("DistributedDataParallel (AdamW)", ddp_adamw, LOCAL), target=None,
        agrees=False,
        why="not the same computation: DiLoCo all-reduces a pseudo-gradient once per round of H steps, DDP every "
            "gradient every step; a step's time is a whole round's over H (mean, the outer all-reduce included), "
            "DDP's the same way"),
]


@dataclass(frozen=True)
class Pair:
    """Two schedules of one notebook: the simulator predicts time(a) / time(b); the real ranks measure it."""

    notebook: str
    what: str
    a: Impl
    b: Impl


PAIRS: list[Pair] = [
    Pair("02", "overlapped / blocking DDP", OVERLAPPED_DDP, Impl("data_parallel_train", blocking_ddp, DDP)),
    Pair("03", "ZeRO-3 / ZeRO-1", ZERO3, ZERO1),
    Pair("04", "sequence-parallel / Megatron MLP", Impl("sequence_parallel_mlp", sequence_parallel, SP_MLP), MEGATRON),
    Pair("05", "GPipe / 1F1B", Impl("gpipe", _each_step(pp.gpipe), PIPE), ONE_F_ONE_B),
    Pair("05", "interleaved 1F1B / 1F1B", INTERLEAVED_1F1B, ONE_F_ONE_B),
]
