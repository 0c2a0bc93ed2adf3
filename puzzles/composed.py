"""Notebook 10's trainer: lib.models' TinyGPT on a (dp, pp, tp) mesh, every part of the step one of the learner's
own functions, run along its axis of the mesh through lib.group_as_world; and the single-device run it must equal.

Each piece keeps the signature its notebook gave it. Two adapters let a piece written for a toy run a GPT:
notebook 05's schedules move tensors of the batch's shape and end in `F.mse_loss(out, y) / m`, so the first stage
takes the tokens in channel 0 of a (b, s, h) carrier, and the last stage returns √(cross-entropy) against a zero
target (its MSE is the cross-entropy itself, with the same gradient). Notebook 03's zeroK_train owns the loop and
calls `model(x)` then `mse_loss(...).backward()` (ZeRO-3 gathering each layer's weights around its forward and its
recomputed backward): the model it gets is one layer, the whole pipeline stage, whose forward runs one pipelined step
on a working copy of the weights and returns a number whose MSE against 0 has that step's gradient, handed to the
weights by the one backward the learner's loop runs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

import lib
from lib.group_as_world import GroupAsWorld
from lib.models import GPTConfig
from lib.sim.context import current_rank, memory_mark
from lib.sim.mesh import coordinates as mesh_coordinates
from lib.sim.traffic import MeshAxes
from puzzles.parallel_gpt import GPTStage, shard_gpt, tiny_gpt
from puzzles.trainer import hsdp_shards
from puzzles.zero import adam_update

AXES = ("dp", "pp", "tp")
# Shards of a block's matrices differ on each TP rank; every other parameter is whole on every TP rank, with the
# same gradient there (a LayerNorm, the biases added after g, the embeddings, the head).
SHARDED = ("qkv.weight", "qkv.bias", "proj.weight", "fc1.weight", "fc1.bias", "fc2.weight")


@dataclass(frozen=True)
class Parts:
    """What the trainer is made of: the mesh, the ZeRO stage of the optimizer (or HSDP as the DP axis: `hsdp_nodes`
    nodes of dp / hsdp_nodes ranks, the learner's hsdp_gradients averaging the gradients and Adam updating the shard
    it returns), the micro-batches per step, and the run (Adam's learning rate, the clipping threshold: None leaves
    gradients unclipped)."""

    dp: int = 2
    pp: int = 2
    tp: int = 2
    zero: int = 0
    micro_batches: int = 2
    micro_batch: int = 1
    steps: int = 3
    lr: float = 3e-3
    max_norm: Optional[float] = 0.5
    seed: int = 0
    hsdp_nodes: int = 0

    def __post_init__(self) -> None:
        if self.hsdp_nodes and (self.hsdp_nodes < 2 or self.dp % self.hsdp_nodes or self.zero):
            raise ValueError(f"Parts(dp={self.dp}, hsdp_nodes={self.hsdp_nodes}, zero={self.zero}): HSDP splits the "
                             "DP axis into hsdp_nodes >= 2 nodes of dp / hsdp_nodes ranks each (hsdp_nodes must divide "
                             "dp), and it is the optimizer's sharding itself: leave zero=0.")

    @property
    def hsdp(self) -> bool:
        return self.hsdp_nodes > 0

    @property
    def per_node(self) -> int:
        """HSDP's shard group: the DP ranks of one node."""
        return self.dp // self.hsdp_nodes if self.hsdp else self.dp

    @property
    def clips(self) -> bool:
        """Whether the step clips: zeroK_train owns its optimizer step, so only the replicated optimizer clips."""
        return self.max_norm is not None and self.zero == 0

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def rows(self) -> int:
        """Sequences per step, over every DP rank."""
        return self.dp * self.micro_batches * self.micro_batch


def coordinates(rank: int, parts: Parts) -> tuple[int, int, int]:
    """(dp, pp, tp) of a rank, TP innermost."""
    return mesh_coordinates(rank, (parts.dp, parts.pp, parts.tp))


def where(rank: int, parts: Parts) -> str:
    """A rank and its coordinates, as messages name it."""
    d, p, t = coordinates(rank, parts)
    return f"rank {rank} (dp {d}, stage {p}, tp {t})"


def quick(parts: Parts, **changes) -> Parts:
    """`parts` with some settings changed (a notebook cell's one-liner)."""
    return replace(parts, **changes)


def config(seq: int = 16) -> GPTConfig:
    """The GPT the trainer trains: bytes in, bytes out, two blocks (one per stage at pp = 2)."""
    return GPTConfig(vocab=256, seq=seq, hidden=32, heads=4, layers=2, tied=False)


def replicated(stage: nn.Module) -> list[bool]:
    """Per parameter of a stage, in order: whether every TP rank holds it whole (so its gradient is counted once)."""
    return [not name.endswith(SHARDED) or not name.startswith("blocks.") for name, _ in stage.named_parameters()]


# ---- the single device ------------------------------------------------------------------------------------------
def reference_run(parts: Parts, data: list) -> tuple[list[float], Any, dict]:
    """One device: the whole batch each step, mean cross-entropy, the gradient clipped as torch's clip_grad_norm_
    does, Adam. Returns (the loss before each step, the trained model, step 1's gradient by parameter name)."""
    model = tiny_gpt(config(data[0][0].shape[1]), parts.seed)
    params = list(model.parameters())
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    losses, first = [], {}
    for step, (tokens, targets) in enumerate(data, start=1):
        loss = model.loss(tokens, targets)
        losses.append(loss.item())
        loss.backward()
        first = first or {n: p.grad.clone() for n, p in model.named_parameters()}
        if parts.clips:                                 # torch.nn.utils.clip_grad_norm_'s rule, written out
            coef = parts.max_norm / (torch.stack([p.grad.pow(2).sum() for p in params]).sum().sqrt() + 1e-6)
            for p in params:
                p.grad.mul_(coef.clamp(max=1.0))
        with torch.no_grad():
            for p, (m, v) in zip(params, moments):
                adam_update(p, p.grad, m, v, step, parts.lr)
                p.grad = None
    return losses, model, first


def shards(parts: Parts) -> list[GPTStage]:
    """Rank r's stage of the untrained model, for every rank of the mesh in order."""
    stages = shard_gpt(tiny_gpt(config(), parts.seed), parts.pp, parts.tp)
    return [stages[p][t] for _d in range(parts.dp) for p in range(parts.pp) for t in range(parts.tp)]


def expected_shards(model, parts: Parts, values: Optional[dict] = None) -> list[dict[str, torch.Tensor]]:
    """Rank r's parameters after the reference run (or its shards of `values`, one tensor per parameter name)."""
    if values is not None:
        model = copy.deepcopy(model)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(values[name])
    stages = shard_gpt(model, parts.pp, parts.tp)
    return [{n: p.detach() for n, p in stages[p][t].named_parameters()}
            for _d in range(parts.dp) for p in range(parts.pp) for t in range(parts.tp)]


# ---- one rank of the composed trainer ----------------------------------------------------------------------------
HSDP_AXES = ("replicate", "shard", "pp", "tp")     # the mesh with HSDP's DP axis split, nodes outermost


def mesh_of(parts: Parts) -> MeshAxes:
    """The mesh's axes: (dp, pp, tp), or with HSDP (replicate, shard, pp, tp), the DP axis split into nodes."""
    if parts.hsdp:
        return MeshAxes((parts.hsdp_nodes, parts.per_node, parts.pp, parts.tp), HSDP_AXES)
    return MeshAxes((parts.dp, parts.pp, parts.tp), AXES)


@dataclass
class Axes:
    """This rank's place: its coordinates, and a world-like dist along each axis (and over its model replica; with
    HSDP, over its node's shard group and over its node's model copies, whose gradient shards make one model)."""

    coords: tuple
    dp: GroupAsWorld
    pp: GroupAsWorld
    tp: GroupAsWorld
    replica: GroupAsWorld          # every rank of one model copy: its pp × tp ranks, TP innermost
    shard: Optional[GroupAsWorld] = None        # HSDP: the DP ranks of this rank's node
    node: Optional[GroupAsWorld] = None         # HSDP: every rank of this node (shard × pp × tp, TP innermost)
    marks: list = field(default_factory=list)     # Mark(...) in the order they came: simulated ranks only


@dataclass(frozen=True)
class Mark:
    """A moment of a rank's step, where its memory timeline was then (an index into RankStats.memory), for
    puzzles.trainer_memory: "start" before the first step, "step" as a pipelined step begins ("recompute" for the
    second run of a ZeRO-3 step), "schedule" as the learner's schedule is called, "forward" as a micro-batch's forward
    returns (`grads`: the bytes of the stage's gradients then), "update" once the schedule has returned."""

    what: str
    index: int
    grads: int = 0


def mark(marks: Optional[list], what: str, grads: int = 0) -> None:
    """Note where the memory timeline is now, on a simulated rank (nowhere on a real one)."""
    if marks is not None and current_rank() is not None:
        marks.append(Mark(what, memory_mark(), grads))


def mesh_axes(dist, pieces: dict, parts: Parts) -> Axes:
    """Every group of the mesh, created by every rank in the same order; this rank's coordinates by the learner's
    mesh_coordinates."""
    mesh = MeshAxes((parts.dp, parts.pp, parts.tp), AXES)
    rank = dist.get_rank()
    coords = tuple(pieces["mesh_coordinates"](dist, mesh.shape))
    mine = {}
    for axis in AXES:
        every = sorted({mesh.group(r, axis) for r in range(mesh.world_size)})
        for ranks in every:
            group = dist.new_group(list(ranks))
            if rank in ranks:
                mine[axis] = GroupAsWorld(dist, group, ranks, siblings=every)
    size = parts.pp * parts.tp
    blocks = {"replica": size}
    if parts.hsdp:
        blocks["node"] = size * parts.per_node
        hsdp = mesh_of(parts)
        every = sorted({hsdp.group(r, "shard") for r in range(hsdp.world_size)})
        for ranks in every:
            group = dist.new_group(list(ranks))
            if rank in ranks:
                mine["shard"] = GroupAsWorld(dist, group, ranks, siblings=every)
    for name, size in blocks.items():
        for first in range(0, parts.world, size):
            ranks = tuple(range(first, first + size))
            group = dist.new_group(list(ranks))
            if rank in ranks:
                mine[name] = GroupAsWorld(dist, group, ranks)
    return Axes(coords, **mine)


def learner_block(pieces: dict, tp, block, x: torch.Tensor, heads: int) -> torch.Tensor:
    """lib.models.Block's forward on a TP shard, by notebook 04's parallel_attention and megatron_mlp (whose layout
    is sequence first: x is (b, s, h) here, so it is transposed around attention)."""
    sequence_first = block.ln1(x).transpose(0, 1).contiguous()
    attended = pieces["parallel_attention"](tp, sequence_first, block.qkv.weight, block.qkv.bias, block.proj.weight,
                                            block.proj.bias, heads)
    x = x + attended.transpose(0, 1)
    return x + pieces["megatron_mlp"](tp, block.ln2(x), block.fc1.weight, block.fc1.bias, block.fc2.weight,
                                      block.fc2.bias)


class PipelineStage(nn.Module):
    """A GPTStage as notebook 05's schedules call a stage, `stage(x)`: tokens in channel 0 of the first stage's
    input; the last stage's output √(cross-entropy) of the next micro-batch, whose MSE against 0 is the loss."""

    def __init__(self, shard: GPTStage, pieces: dict, tp, heads: int, marks: Optional[list] = None) -> None:
        super().__init__()
        self.shard, self.pieces, self.tp, self.heads, self.marks = shard, pieces, tp, heads, marks
        self.first, self.last = hasattr(shard, "tok"), hasattr(shard, "head")
        self.targets: list = []
        self.losses: list = []

    def begin_step(self, targets: list) -> None:
        self.targets, self.losses = targets, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.shard
        if self.first:
            x = s.tok(x[..., 0].long()) + s.pos.weight[: x.shape[1]]
        for block in s.blocks:
            x = learner_block(self.pieces, self.tp, block, x, self.heads)
        if self.last:
            loss = s.loss(x, self.targets[len(self.losses)])
            self.losses.append(loss.detach())
            x = loss.sqrt().reshape(1, 1)
        mark(self.marks, "forward", sum(p.grad.nbytes for p in s.parameters() if p.grad is not None))
        return x


def carrier(tokens: torch.Tensor, hidden: int) -> torch.Tensor:
    """(b, s) tokens as the (b, s, h) float tensor a schedule moves: the tokens in channel 0."""
    out = torch.zeros(*tokens.shape, hidden, dtype=torch.float64, device=tokens.device)
    out[..., 0] = tokens.to(out.dtype)
    return out


def pipelined_step(pieces: dict, axes: Axes, stage: PipelineStage, tokens, targets, parts: Parts,
                   again: bool = False) -> Optional[Any]:
    """Forward and backward of this DP rank's rows by the learner's 1F1B; on the last stage, the step's loss by
    their mean_loss over the DP group (None elsewhere). `again`: the step's second run (ZeRO-3's recompute)."""
    m = parts.micro_batches
    stage.begin_step(list(targets.chunk(m)))
    mark(axes.marks, "recompute" if again else "step")
    batch, zero = carrier(tokens, stage.shard.hidden), torch.zeros(m, 1, dtype=torch.float64, device=tokens.device)
    mark(axes.marks, "schedule")
    pieces["one_f_one_b"](axes.pp, stage, batch, zero, m)
    mark(axes.marks, "update")
    if not stage.last:
        return None
    counts = [t.numel() for t in stage.targets]
    return float(pieces["mean_loss"](axes.dp, stage.losses, counts))


def average(pieces: dict, axes: Axes, params: list, parts: Parts) -> list:
    """The DP average of every gradient by the learner's ring, in one flat bucket."""
    sizes = [p.numel() for p in params]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    flat = F.pad(flat, (0, -len(flat) % parts.dp))                  # the ring cuts the bucket into dp equal chunks
    flat = pieces["ring_all_reduce"](axes.dp, flat) / parts.dp
    return [g.view_as(p) for g, p in zip(flat[:sum(sizes)].split(sizes), params)]


ZERO_PIECES = {1: "zero1_train", 2: "zero2_train", 3: "zero3_train"}     # the learner's optimizer, by ZeRO stage


class ShardsWrong(ValueError):
    """The learner's hsdp_gradients returned shards the trainer cannot update: said with what they should be."""


def hsdp_average(pieces: dict, axes: Axes, named: list, parts: Parts) -> list:
    """This rank's shard of every gradient averaged over the DP axis, by the learner's hsdp_gradients: reduce-scatter
    inside the node, all-reduce of the shard across nodes. Shapes checked: the update below needs FSDP2's rows.
    `named`: the stage's (name, parameter) pairs."""
    params = [p for _, p in named]
    shards = pieces["hsdp_gradients"](axes.dp, [p.grad for p in params], parts.hsdp_nodes)
    d, s = axes.dp.get_rank(), parts.per_node
    if not isinstance(shards, (list, tuple)) or len(shards) != len(params) or \
            not all(isinstance(g, torch.Tensor) for g in shards):
        got = f"{len(shards)} values" if isinstance(shards, (list, tuple)) else type(shards).__name__
        raise ShardsWrong(f"your hsdp_gradients (notebook 10) returned {got} on DP rank {d}, where the trainer needs "
                          f"a list of {len(params)} tensors, this rank's shard of each gradient.")
    for (name, p), g in zip(named, shards):
        want = hsdp_shards(p.grad, s)[d % s]
        if g.shape != want.shape:
            ways = next((k for k in (parts.dp, parts.hsdp_nodes, *range(1, p.shape[0] + 1))
                         if k != s and g.shape == hsdp_shards(p.grad, k)[d % k].shape), None)
            cut = ("" if ways is None else f" (dp = {ways} ways: over the whole DP axis, every node's ranks)"
                   if ways == parts.dp else f" (n = {ways} ways: over the replicate group, one rank a node)"
                   if ways == parts.hsdp_nodes else f" ({ways} ways)")
            raise ShardsWrong(f"your hsdp_gradients (notebook 10) returned a shard of shape {tuple(g.shape)} for "
                              f"{name} {tuple(p.shape)} on DP rank {d}, where shard {d % s} of its rows cut s={s} ways "
                              f"inside the node has shape {tuple(want.shape)}: its rows are cut another way{cut}. "
                              f"Reduce-scatter over the shard group (the node's {s} DP ranks), then all-reduce the "
                              f"shard over the replicate group.")
    return list(shards)


def hsdp_update(axes: Axes, params: list, grads: list, moments: list, step: int, parts: Parts) -> None:
    """Adam on this rank's shard of each parameter (its master copy: `moments`' first entry), then the updated
    shards gathered over the node's shard group, back into the whole parameters."""
    s = parts.per_node
    for p, g, (w, m, v) in zip(params, grads, moments):
        with torch.no_grad():
            adam_update(w, g, m, v, step, parts.lr)
        rows, rest = -(-p.shape[0] // s), p[0].numel()                 # FSDP2's padded shard: c = ⌈rows / s⌉
        mine = F.pad(w.reshape(len(w), rest), (0, 0, 0, rows - len(w)))   # (c, rest)
        whole = torch.empty(s * rows, rest, dtype=p.dtype, device=p.device)
        axes.shard.all_gather_single(whole, mine)
        with torch.no_grad():
            p.copy_(whole[:p.shape[0]].view_as(p))


def hsdp_moments(params: list, axes: Axes, parts: Parts) -> list:
    """(this rank's shard of each weight, Adam's m and v for it), the shard index its place in the node."""
    i = axes.shard.get_rank()
    return [(w, torch.zeros_like(w), torch.zeros_like(w))
            for w in (hsdp_shards(p.detach(), parts.per_node)[i].clone() for p in params)]


class WholeStep(nn.Module):
    """The one layer notebook 03's zeroK_train trains: its forward runs one pipelined step of the stage on a working
    copy of the weights (x is the step's number) and returns √(1 + Σ (w - w₀)·g), g the gradient that step left on
    the copy and w₀ the weights' values now. Its MSE against 0 is 1 + Σ (w - w₀)·g, whose gradient is g: the learner's
    one backward hands each weight its gradient once (ZeRO-2's hooks fire once per parameter)."""

    def __init__(self, pieces: dict, axes: Axes, stage: PipelineStage, data: list, parts: Parts) -> None:
        super().__init__()
        self.stage, self.pieces, self.axes, self.data, self.parts = stage, pieces, axes, data, parts
        self.work = [PipelineStage(copy.deepcopy(stage.shard), pieces, stage.tp, stage.heads,  # a list: not a module
                                   axes.marks)]
        self.losses: dict[int, Any] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        step, work = int(x.reshape(-1)[0]), self.work[0]
        weights, copies = list(self.stage.parameters()), list(work.parameters())
        with torch.no_grad():
            for w, c in zip(weights, copies):
                c.copy_(w)
                c.grad = None
        with torch.enable_grad():                       # ZeRO-3 runs its forward under no_grad
            tokens, targets = self.data[step]
            self.losses[step] = pipelined_step(self.pieces, self.axes, work, tokens, targets, self.parts,
                                               again=step in self.losses)
        moved = sum(((w - w.detach()) * c.grad).sum() for w, c in zip(weights, copies))
        return (1 + moved).sqrt().reshape(x.shape)


def optimizer_steps(pieces: dict, axes: Axes, stage: PipelineStage, data: list, parts: Parts) -> tuple[list, list]:
    """The learner's zeroK_train over the DP group, each step one pipelined step: (the losses, the trained weights in
    the stage's order, as zeroK_train returns them)."""
    where = data[0][0].device
    whole = WholeStep(pieces, axes, stage, data, parts)
    steps = [(torch.full((1,), float(i), dtype=torch.float64, device=where),
              torch.zeros(1, dtype=torch.float64, device=where)) for i in range(len(data))]
    mark(axes.marks, "start")
    trained = pieces[ZERO_PIECES[parts.zero]](axes.dp, nn.Sequential(whole), steps, parts.lr)
    return [whole.losses[i] for i in range(len(data))], list(trained.values())


def train(dist, pieces: dict, shard: GPTStage, data: list, parts: Parts, resume: Optional[dict] = None) -> dict:
    """One rank of the composed trainer. Returns its losses (on the last stage), its trained parameters and (ZeRO-0)
    Adam's moments (HSDP: with the master copy of its shard); `resume` ({"step", "moments"} of an earlier call)
    continues a run where that call stopped."""
    axes = mesh_axes(dist, pieces, parts)
    d, where = axes.coords[0], lib.device()
    shard = shard.to(where)
    mine = [(tokens.chunk(parts.dp)[d].to(where), targets.chunk(parts.dp)[d].to(where)) for tokens, targets in data]
    stage = PipelineStage(shard, pieces, axes.tp, config().heads, axes.marks)
    params, flags = list(shard.parameters()), replicated(shard)
    losses: list = []
    first: dict = {}          # step 1's averaged gradient (HSDP: its shard), what the optimizer is handed (not ZeRO-k)
    if parts.zero:
        losses, trained = optimizer_steps(pieces, axes, stage, mine, parts)
        with torch.no_grad():
            for p, w in zip(params, trained):
                p.data = w.detach().reshape(p.shape).clone()
    elif parts.hsdp:
        mark(axes.marks, "start")
        sharded = (hsdp_moments(params, axes, parts) if resume is None else
                   [tuple(t.to(where) for t in kept) for kept in resume["moments"]])
        for step, (tokens, targets) in enumerate(mine, start=1 if resume is None else resume["step"] + 1):
            losses.append(pipelined_step(pieces, axes, stage, tokens, targets, parts))
            grads = hsdp_average(pieces, axes, list(shard.named_parameters()), parts)
            if step == 1:           # this rank's shard of step 1's averaged gradient, by parameter name
                first = {n: g.detach().clone() for (n, _), g in zip(shard.named_parameters(), grads)}
            if parts.clips:         # the node's shards make one whole model copy: its norm, each parameter once
                grads = list(pieces["clip_grad_norm"](axes.node, grads, flags, parts.max_norm, parts.tp))
            for p in params:
                p.grad = None
            hsdp_update(axes, params, grads, sharded, step, parts)
    else:
        mark(axes.marks, "start")
        moments = ([(torch.zeros_like(p), torch.zeros_like(p)) for p in params] if resume is None else
                   [(m.to(where), v.to(where)) for m, v in resume["moments"]])
        for step, (tokens, targets) in enumerate(mine, start=1 if resume is None else resume["step"] + 1):
            losses.append(pipelined_step(pieces, axes, stage, tokens, targets, parts))
            grads = average(pieces, axes, params, parts)
            if step == 1:
                first = {n: g.detach().clone() for (n, _), g in zip(shard.named_parameters(), grads)}
            if parts.clips:
                grads = list(pieces["clip_grad_norm"](axes.replica, grads, flags, parts.max_norm, parts.tp))
            with torch.no_grad():
                for p, g, (m, v) in zip(params, grads, moments):
                    adam_update(p, g, m, v, step, parts.lr)
                    p.grad = None
    mark(axes.marks, "end")
    return {"losses": None if losses[0] is None else losses, "first_grads": first or None, "marks": axes.marks,
            "params": {n: p.detach() for n, p in shard.named_parameters()},
            "moments": None if parts.zero else sharded if parts.hsdp else moments}


def where_each_runs(parts: Parts) -> Callable[[int, tuple], str]:
    """For lib.viz.mesh.mesh_figure: the learner's functions each rank runs, in three short lines."""
    def label(rank: int, coords: tuple) -> str:
        d, p, _ = coordinates(rank, parts)
        ends = "+ embed" if p == 0 else "+ head" if p == parts.pp - 1 else ""
        dp = (ZERO_PIECES[parts.zero] if parts.zero else f"hsdp {d % parts.per_node}" if parts.hsdp else
              "ring") + (", clip" if parts.clips else "")
        return f"stage {p} {ends}\nattention, mlp\n1F1B, {dp}"
    return label


# ---- reading the trained model ------------------------------------------------------------------------------------
def assemble(params: list[dict], parts: Parts):
    """One TinyGPT from the DP-rank-0 shards of a trained mesh (the inverse of parallel_gpt.shard_gpt)."""
    model = tiny_gpt(config(), parts.seed)
    per = model.cfg.layers // parts.pp
    with torch.no_grad():
        for p in range(parts.pp):
            shards = [params[p * parts.tp + t] for t in range(parts.tp)]
            for i in range(per):
                pre, block = f"blocks.{i}.", model.blocks[p * per + i]
                for name in ("qkv.weight", "qkv.bias"):        # q, k, v each cut by heads: join each, then stack
                    block.get_parameter(name).copy_(torch.cat([torch.cat([s[pre + name].chunk(3)[k] for s in shards])
                                                               for k in range(3)]))
                for name, dim in (("proj.weight", 1), ("fc1.weight", 0), ("fc1.bias", 0), ("fc2.weight", 1)):
                    block.get_parameter(name).copy_(torch.cat([s[pre + name] for s in shards], dim))
                for name, _ in block.named_parameters():
                    if not name.endswith(SHARDED):
                        block.get_parameter(name).copy_(shards[0][pre + name])
            for name, value in shards[0].items():
                if not name.startswith("blocks."):
                    model.get_parameter(name).copy_(value)
    return model


def sample(model, prompt: torch.Tensor, length: int, seed: int = 0, temperature: float = 0.8) -> torch.Tensor:
    """`length` tokens drawn after `prompt` from the model, each seeing at most the last cfg.seq tokens."""
    gen = torch.Generator().manual_seed(seed)
    tokens = prompt.clone()
    with torch.no_grad():
        for _ in range(length):
            logits = model(tokens[-model.cfg.seq:].unsqueeze(0))[0, -1] / temperature
            tokens = torch.cat([tokens, torch.multinomial(logits.softmax(-1), 1, generator=gen)])
    return tokens[len(prompt):]


def train_on_real_ranks(dist, pieces: dict, shards: list, data: list, parts: Parts,
                        resumes: Optional[list] = None) -> dict:
    """`train` on a real process: each rank takes its own stage (and where it resumes) from the lists."""
    rank = dist.get_rank()
    return train(dist, pieces, shards[rank], data, parts, None if resumes is None else resumes[rank])


def with_parameters(shard: GPTStage, params: dict) -> GPTStage:
    """A copy of `shard` holding `params` (a rank's trained parameters), to continue training from."""
    shard = copy.deepcopy(shard)
    shard.load_state_dict(params)
    return shard
