"""Notebook 03, ZeRO and FSDP: the puzzles, their inputs, references and budgets.

Sharding convention (the notebook states it): a parameter of n elements is flattened and padded with
zeros to N·ceil(n/N) elements; rank r keeps elements [r·c, (r+1)·c) with c = ceil(n/N). Every budget
is computed from the padded sizes of that convention and from lib.analytic.formulas, never copied from a run.
"""

from __future__ import annotations

import copy
import functools
import math
import random
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from lib.checker.puzzle import Budget, Case, Contract, Floor, Puzzle, flops_budgets, nothing_on_the_host
from lib.checker.contract import peak_memory_between
from lib.real.backends import device_mesh
from lib.diagnose import hands_gradient
from lib.notebook.warm_up import import_ahead
from lib.analytic.formulas import model_state_bytes
from lib.checker.measure import counted_flops, counted_time, once_per_shape, saved_activation_bytes
from lib.models import mlp, sharded_batches
from lib.sim import CostModel, SimResult, per_rank
from lib.sim.cost import bus_factor
from lib.units import fmt_bytes, fmt_time
from lib.viz.timeline import training_scale
from puzzles._offload import HOST_STEP, host_step_floor

import_ahead("optimizer", "explicit_gradient")      # every check builds Adam; ZeRO-3 back-propagates a gradient

NOTEBOOK = "03_zero"
SIZES = (6, 20, 20, 20, 20, 20, 20, 20, 3)    # 8 Linear layers; 400, 20 and 3 leave remainders at N = 2, 3, 4
WIDTHS = (16, 20)                             # the hidden width each case draws (256 and 400 leave them at N = 3)


def _sizes(rng: random.Random, deep: bool = False) -> tuple[int, ...]:
    """SIZES with a hidden width drawn for the case (an answer may not assume the model's shapes); deep: DEEP hidden
    layers of a DEEP_WIDTHS width."""
    width = rng.choice(DEEP_WIDTHS if deep else WIDTHS)
    return (SIZES[0], *[width] * (DEEP if deep else len(SIZES) - 2), SIZES[-1])
STEPS = 2
LOCAL = 4                                     # samples per rank per step
LR = 1e-2
ITEM = 8                                      # bytes per float64 element
# lib.analytic.formulas counts 2-byte weights and gradients and K bytes of optimizer state per parameter. Everything
# here is float64: weights 8 + gradients 8 bytes, and the optimizer keeps m and v (16) plus, in stages 1 and 2,
# its own copy of its shard of the weights (8, the paper's fp32 master copy): 4 × model_state_bytes(Ψ, N, stage, k).
# In stage 3 the shard *is* the parameter, so K = 4.
SCALE, K = 4, {1: 6, 2: 6, 3: 4}


# ---- the one tool the learner is given: Adam's update, as torch.optim.Adam computes it ---------------
@hands_gradient("grad")          # a failed check compares the gradients it is handed with the reference's
def adam_update(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int,
                lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
    """One Adam step in place on `param`, `m`, `v` (any shard of them; step counts from 1)."""
    b1, b2 = betas
    m.mul_(b1).add_(grad, alpha=1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    denom = (v.sqrt() / math.sqrt(1 - b2 ** step)).add_(eps)
    param.addcdiv_(m, denom, value=-lr / (1 - b1 ** step))


# ---- inputs and the single-device reference ------------------------------------------------------------
def full_parameters(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def train_single(model, batches, lr: float) -> dict[str, torch.Tensor]:
    """The single-device reference: torch.optim.Adam on the whole batch, mean squared error."""
    model = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in batches:
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return full_parameters(model)


def ddp_adam_train(dist, model, batches, lr):
    """Data parallelism with Adam, for comparison: every rank keeps everything (ZeRO's baseline)."""
    world = dist.get_world_size()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in batches:
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
    return full_parameters(model)


# ---- the sizes every budget is made of ---------------------------------------------------------------
def padded(n: int, world: int) -> int:
    """Elements of a parameter of n elements once padded to a multiple of the world size."""
    return world * math.ceil(n / world)


def _layers(model):
    return [m for m in model if any(True for _ in m.parameters())]


class _Sizes:
    """Padded parameter sizes of `model` on `world` ranks, and the measured activations of one step."""

    def __init__(self, model, world: int, shard: tuple) -> None:
        params = list(model.parameters())
        self.world = world
        self.steps = len(shard)                                                    # one batch per step
        self.psi = sum(padded(p.numel(), world) for p in params)                  # Ψ, padded
        self.layer = max(sum(padded(p.numel(), world) for p in m.parameters()) for m in _layers(model)) * ITEM
        self.shard = max(padded(p.numel(), world) // world for p in params) * ITEM
        self.inputs = sum(t.nbytes for x, y in shard for t in (x, y))
        x, y = self.first_batch = shard[0]
        saved = _saved_bytes(model, x, y)
        widest = max(x.shape[0] * m.out_features for m in _layers(model)) * ITEM
        self.act = saved + 2 * widest                 # what autograd saves, and the gradient flowing back

    def states(self, stage: int) -> float:
        return SCALE * model_state_bytes(self.psi, self.world, stage, k=K[stage])

    def traffic(self, all_gathers: int, reduce_scatters: int) -> float:
        n = self.world
        return (all_gathers * bus_factor("all_gather", n) + reduce_scatters * bus_factor("reduce_scatter", n)) \
            * ITEM * self.psi


@once_per_shape
def _saved_bytes(model, x: torch.Tensor, y: torch.Tensor) -> int:
    """What autograd saves for one step's forward and loss on (x, y): a function of the shapes, measured once."""
    probe = copy.deepcopy(model)
    return saved_activation_bytes(lambda: F.mse_loss(probe(x), y), exclude=list(probe.parameters()))


def _bytes_budget(s: _Sizes, per_step: int, final_gather: bool, what: str) -> Budget:
    total = s.steps * s.traffic(per_step - 1, 1) + (s.traffic(1, 0) if final_gather else 0)
    dp = s.steps * s.traffic(1, 1)
    end = " + one all-gather at the end to return the full parameters" if final_gather else ""
    return Budget("bytes_sent", total,
                  f"{s.steps} steps × {per_step} × (N-1)/N × {fmt_bytes(ITEM * s.psi)} of padded parameters: "
                  f"{what}{end}; data parallelism's all-reduce sends {fmt_bytes(dp)}",
                  hint="reduce-scatter each gradient and all-gather each parameter once per use; an all-reduce "
                       "sends twice what a reduce-scatter does.")


def _gradient_traffic(s: _Sizes) -> list[Budget]:
    """ZeRO-1 and 2's traffic, as a ceiling and a floor: each rank trains on its own shard of the batch, so the
    gradients travel (a reduce-scatter), then the updated parameters (an all-gather); moving the data instead is
    another algorithm."""
    total = s.steps * s.traffic(1, 1)
    per_step = "a reduce-scatter of the gradients and an all-gather of the parameters per step"
    return [_bytes_budget(s, 2, False, per_step),
            Floor("bytes_sent", total, f"{s.steps} steps × a reduce-scatter of the gradients and an all-gather of the "
                                       f"parameters, (N-1)/N × {fmt_bytes(ITEM * s.psi)} each",
                  hint="each rank computes the gradients of its own samples; reduce-scatter them, all-gather the "
                       "updated parameters: the gradients travel, not the data.")]


def _regather_floor(s: _Sizes) -> Budget:
    """ZeRO-3 gathers a layer again for its backward: a run that sends no more than ZeRO-2 (one all-gather and one
    reduce-scatter per step) kept the full parameters, whatever its peak. Half a regather is the floor, room for
    a layer kept between forward and backward (FSDP does so for the last one)."""
    return Floor("bytes_sent", s.steps * s.traffic(1.5, 1) + s.traffic(1, 0),
                 f"{s.steps} steps × (N-1)/N × {fmt_bytes(ITEM * s.psi)} × (1 all-gather for forward, half of one "
                 "for backward and a reduce-scatter) + the final gather; ZeRO-2, which keeps the parameters, sends "
                 f"{fmt_bytes(s.steps * s.traffic(1, 1))}",
                 hint="free each layer's full parameters after its forward and gather them again for its backward; "
                      "keeping them between the two is ZeRO-2.")


def _training_memory(s: _Sizes, stage: int, layers_at_once: int, label: str,
                     states: float | None = None, formula: str = "") -> tuple[float, str]:
    """(bytes, why): what a rank of this stage holds while training, at most."""
    states = s.states(stage) if states is None else states
    formula = formula or f"4 × model_state_bytes(Ψ={s.psi}, N={s.world}, stage {stage}, K={K[stage]})"
    work = layers_at_once * s.layer + 3 * s.shard
    why = (f"{label}: {formula} = {fmt_bytes(states)} "
           f"+ the batches {fmt_bytes(s.inputs)} + one step's activations {fmt_bytes(s.act)} + "
           f"{layers_at_once} layers' worth in flight and shard temporaries {fmt_bytes(work)}")
    return states + s.inputs + s.act + work, why


def _memory_budget(s: _Sizes, stage: int, layers_at_once: int, label: str, hint: str,
                   states: float | None = None, formula: str = "") -> Budget:
    limit, why = _training_memory(s, stage, layers_at_once, label, states, formula)
    if stage == 3:
        # The full parameters are handed in (held while their shards and the optimizer state are made) and come back
        # at the end to be returned, beside the optimizer state (nothing asks to drop it first): training is judged
        # apart (_while_training).
        start = ITEM * s.psi + s.states(3) + s.inputs + 3 * s.shard
        final = start + 2 * s.layer
        if max(start, final) > limit:
            why += (f"; here the start or the end is larger: the full parameters handed in with the sharded state "
                    f"({fmt_bytes(start)}), or gathered to be returned beside it, with the batches and two layers' "
                    f"buffers ({fmt_bytes(final)})")
            limit = max(start, final)
    return Budget("peak_memory", limit, why, hint=hint)


ON_DEVICE = nothing_on_the_host("ZeRO shards the training state across the ranks' devices")
# ZeRO-3's deep cases: DEEP hidden layers of a DEEP_WIDTHS width, whose parameters outweigh a step's activations
# (which grow with the width, the parameters with its square). Every layer gathered at once is then well over what a
# rank needs in flight (a layer, the next one, a gradient and its padded copy); with 6 layers of 16 or 20, all of
# them fitted in the budget's allowance.
DEEP, DEEP_WIDTHS = 12, (40, 44)              # 1600 and 1936 leave remainders at N = 3


# What opens and closes ZeRO-3's training phase, in order of preference (lib.checker.contract.peak_memory_between):
# parameters gathered (by all-gathers, all-to-alls, all-reduces of zeros around a shard or messages from each shard's
# owner, whichever a rank calls first: a gather by another collective while training stays judged where the final
# gather is an all-gather; else by broadcasts from each shard's owner, which a DDP-style broadcast of the weights
# before training must not open), gradients reduced (reduce-scattered, else reduced to their owner, else all-reduced
# and cut: its bytes are over).
GATHERS = (("all_gather", "all_to_all", "all_reduce", "recv"), "broadcast")
REDUCES = ("reduce_scatter", "reduce", "all_reduce")


def _while_training(s: _Sizes, layers_at_once: int, label: str, hint: str) -> Contract:
    """ZeRO-3's memory from its first gather of parameters to its last reduction of gradients (GATHERS, REDUCES:
    all-gathers and reduce-scatters, or what a rank uses instead): the full parameters handed in and the
    final gather of every parameter (to return them) may hold them all, training may not. A peak over the whole run
    is set by those, and gathering every layer ahead during the steps held no more."""
    limit, why = _training_memory(s, 3, layers_at_once, label)

    def in_layers(over: float) -> str:
        """The bytes over the budget in gathered layers: a prefetch running further ahead than it needs."""
        layers = over / s.layer
        if layers < 1:
            return ""
        return (f" by {fmt_bytes(over)}, {layers:.1f} layers' worth of gathered parameters: more layers gathered at "
                f"once than the budget's {layers_at_once} layers' worth in flight allow (prefetch one layer ahead, "
                "and free each after its use)")
    return peak_memory_between(GATHERS, REDUCES, limit, "while training",
                                  f"while training, a ZeRO-3 rank holds {why}; only the final gather holds every "
                                  "parameter", hint=hint, excess=in_layers)


_TRAINING_FLOPS: dict[tuple, float] = {}       # (layer widths, samples per step, steps) -> FLOPs of train_single


def _reference(model, batches) -> tuple[dict, float]:
    """train_single's result, and its FLOPs: they depend on the shapes alone, so they are counted (a tracked run,
    the first time a check meets these shapes) once per shape, and remembered."""
    shape = (tuple(layer.in_features for layer in _layers(model)) + (SIZES[-1],), batches[0][0].shape[0], len(batches))
    if shape in _TRAINING_FLOPS:
        return train_single(model, batches, LR), _TRAINING_FLOPS[shape]
    expected, flops = counted_flops(lambda: train_single(model, batches, LR))
    _TRAINING_FLOPS[shape] = flops
    return expected, flops


def _case(rng: random.Random, world: int, budgets, cost=None, host: bool = False, model=None,
          what: str = "", steps: Optional[int] = None, contracts=lambda s: []) -> Case:
    """`host`: the lesson puts state in host memory (its budgets say how much); otherwise none may go there.
    `model`: one the caller drew from `rng` first (to fit the cost model to it). `steps`: fewer steps of the same
    batches (every draw is the same), to find the step a wrong run goes astray. `contracts(sizes)`: the case's rules
    on the run."""
    model = mlp(_sizes(rng), seed=rng.randrange(2**31)) if model is None else model
    steps = steps or STEPS
    shards, full = sharded_batches(rng.randrange(2**31), SIZES, world, LOCAL, steps)
    s = _Sizes(model, world, shards[0])
    expected, flops = _reference(model, full)
    work = flops_budgets(flops / world, f"1/N of single-device training's {flops:,.0f} FLOPs (forward, backward and "
                                        "Adam on the whole batch)", over=FLOPS_OVER)
    return Case(world, (model, per_rank(shards), LR), [expected] * world,
                f"N={world}, {steps} Adam steps, {len(_layers(model))} layers" + (
                    f", {what}" if what else f", {LOCAL} samples per rank, {s.psi} padded parameters"),
                budgets=([] if host else [ON_DEVICE]) + budgets(s, model) + work, cost=cost, steps=steps,
                contracts=contracts(s), explain=_strided_reading(world, steps))


def _strided(t: torch.Tensor, world: int) -> torch.Tensor:
    """`t` with its padded flat elements put as a strided shard leaves them: shard r held p[r::N], and gathered as
    block r, so position r·c + j holds element r + j·N."""
    n, c = t.numel(), math.ceil(t.numel() / world)
    flat = F.pad(t.detach().double().reshape(-1), (0, world * c - n))
    return flat.view(c, world).t().reshape(-1)[:n].view_as(t)


def _strided_reading(world: int, steps: int) -> Callable:
    """The ZeRO cases' explain: parameters that come back with their elements in a strided shard's order, to within
    what Adam's steps move them (about lr each): shards cut as p[r::N] where the collectives hand out and collect
    contiguous blocks."""
    moved = 3 * LR * steps

    def explain(expected: list, got: list) -> Optional[str]:
        want, have = expected[0], got[0]
        if world < 2 or not isinstance(want, dict) or not isinstance(have, dict):
            return None
        shuffled = False
        for name, e in want.items():
            g = have.get(name)
            if not isinstance(g, torch.Tensor) or g.shape != e.shape or not g.is_floating_point():
                return None
            order = _strided(e, world)
            if float((g.double() - order).abs().max()) > moved:
                return None
            shuffled |= float((order - e.double()).abs().max()) > 2 * moved
        if not shuffled:
            return None
        return ("Diagnosis: every parameter comes back with its elements reordered (to within what Adam's steps "
                "move them): position r·c + j holds the element at r + j·N. Your shard was strided, p[r::N], where "
                "reduce_scatter_single hands each rank a contiguous block of the padded flat tensor and "
                "all_gather_single puts block r back at r·c: keep the slice [r·c:(r+1)·c].")
    return explain


def _params_of(model) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[n] = full.detach().clone()
    return out


def _fsdp_oracle(reshard_after_forward: bool):
    def oracle(dist, model, batches, lr):
        from torch.distributed.fsdp import fully_shard

        mesh = device_mesh(dist)
        for layer in _layers(model):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        for x, y in batches:
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        return _params_of(model)
    return oracle


def _zero_redundancy_oracle(dist, model, batches, lr):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    world = dist.get_world_size()
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
    for x, y in batches:
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
    return _params_of(model)


SHARD_HINT = ("shard each parameter flat, padded to a multiple of N: c = ceil(n/N); rank r keeps "
              "F.pad(p.reshape(-1), (0, N*c - n))[r*c:(r+1)*c]. Every element must live on some rank.")
RTOL, ATOL = 1e-7, 1e-10
FLOPS_OVER = 0.75     # over 1/N of the reference's FLOPs: ZeRO-3's gathers and copies cost 40% more
WORLDS = (2, 3, 4)
# Every puzzle after ZeRO-1 runs N = 2 and 3: N = 3 leaves a remainder in most parameters (256 and 400 elements at a
# width of 16 or 20), N = 2 in the output layer's 3-element bias, as N = 4 would, whose run costs twice N = 2's
# (zero1_train keeps N = 4, whose ring is the longest).
FEWER_WORLDS = (2, 3)


# ---- 1. ZeRO-1 ------------------------------------------------------------------------------------------
ZERO1_LABEL = "stage 1, (8+8)Ψ + 24Ψ/N"


def _zero1_case(rng: random.Random, world: int, steps: Optional[int] = None) -> Case:
    return _case(rng, world, lambda s, m: [
        _memory_budget(s, 1, 2, ZERO1_LABEL,
                       "keep Adam's m and v for your shard only (c elements per parameter), not for the whole model."),
        *_gradient_traffic(s)], steps=steps, contracts=lambda s: [_no_flat_gradient_copy(s)])


def _no_flat_gradient_copy(s: _Sizes) -> Contract:
    """A flat buffer of every gradient, reduce-scattered at once, copied beside p.grad (torch.cat, then a padded
    copy): the full gradients exist two or three times over at that moment, which stage 1's memory does not hold.
    Said where the run both breaks the memory budget and reduce-scatters the whole model in one call, the evidence
    that the excess is that copy rather than optimizer state kept whole."""
    limit, why = _training_memory(s, 1, 2, ZERO1_LABEL)
    whole = 0.9 * s.traffic(0, 1)                      # one reduce-scatter's bytes for every padded parameter

    def broken(result: SimResult) -> Optional[str]:
        for st in result.stats:
            flat = any(e.rank == st.rank and e.op == "reduce_scatter" and e.bytes >= whole for e in result.trace)
            if flat and st.peak_memory > limit * (1 + 1e-9):
                over = st.peak_memory - limit
                return (f"rank {st.rank}'s peak memory is {fmt_bytes(st.peak_memory)}, over the budget of "
                        f"{fmt_bytes(limit)} by {fmt_bytes(over)}, {over / (ITEM * s.psi):.1f}× the model's "
                        f"gradients ({fmt_bytes(ITEM * s.psi)}), and it reduce-scattered every gradient in one "
                        "call: a flat copy of the whole model's gradients (torch.cat, then a padded buffer) made "
                        f"beside p.grad, so that the full gradients existed more than once ({why})")
        return None
    return Contract("a flat gradient buffer is the gradients themselves, not a copy of them", broken,
                    hint="reduce-scatter each parameter's padded gradient in turn (a copy of one parameter at a "
                         "time), or make the flat buffer first and let each p.grad be a view into it.")


zero1_train = Puzzle(
    "zero1_train", NOTEBOOK, _zero1_case, tools=(adam_update,), world_sizes=WORLDS,
    hints=["Every rank computes all gradients as in data parallelism, but keeps Adam's m and v only for its "
           "shard of each parameter, updates only that shard, then the ranks exchange the updated shards. "
           + SHARD_HINT,
           "Per parameter: pad the gradient, dist.reduce_scatter_single(g_shard, padded_grad) (then divide by N: "
           "the sum of the ranks' gradients); adam_update(p_shard, g_shard, m, v, step, lr); "
           "dist.all_gather_single(padded_param, p_shard); copy padded_param[:n] back into p.",
           "You need only your shard of the averaged gradient: a reduce-scatter gives exactly that, and sends half "
           "of what an all-reduce does. With the all-gather of the parameters, a step sends what data parallelism "
           "sends."],
    oracle=_zero_redundancy_oracle, oracle_name="torch.distributed.optim.ZeroRedundancyOptimizer",
    rtol=RTOL, atol=ATOL, real_scale=training_scale,
    describe="Data-parallel Adam whose optimizer state is sharded across the ranks (ZeRO stage 1).")


# ---- 2. ZeRO-2 ------------------------------------------------------------------------------------------
def _zero2_case(rng: random.Random, world: int, steps: Optional[int] = None) -> Case:
    return _case(rng, world, lambda s, m: [
        _memory_budget(s, 2, 2, "stage 2, 8Ψ + (8+24)Ψ/N",
                       "reduce-scatter each gradient from a hook as soon as backward produces it, keep the shard, "
                       "and drop the full gradient (p.grad = None)."),
        *_gradient_traffic(s)], steps=steps, contracts=lambda s: [_reduced_during_backward()])


OVERLAPPED = 0.25    # of a step's compute before its first reduce-scatter: the least that must run among them


def _reduced_during_backward() -> Contract:
    """ZeRO-2 reduce-scatters each gradient as backward produces it, so the full gradients never exist at once.
    ZeRO-1's order (backward to the end, then every reduce-scatter) meets stage 2's peak on some cases, as the
    activations freed make room for the gradients kept: the order tells them apart on every case. A step is what
    runs up to its all-gathers of the updated parameters; its backward's compute after its first reduce-scatter
    is at least OVERLAPPED of what came before it (the forward, and the last layer's backward)."""

    def broken(result: SimResult) -> Optional[str]:
        for rank in range(result.world_size):
            before = between = pending = 0.0
            seen = step = 0
            for e in sorted((e for e in result.trace if e.rank == rank), key=lambda e: (e.start, e.end)):
                if e.op == "all_gather":
                    if seen and between < OVERLAPPED * before:
                        return (f"rank {rank} began reduce-scattering step {step + 1}'s gradients after its "
                                f"backward was over ({fmt_time(between)} of compute among its reduce-scatters, "
                                f"{fmt_time(before)} before them): every full gradient was held at once, ZeRO-1's "
                                "order")
                    step += bool(seen)
                    before = between = pending = 0.0
                    seen = 0
                elif e.op == "reduce_scatter":
                    seen += 1
                    between, pending = between + pending, 0.0         # the update after the last one is not counted
                elif e.op == "compute":
                    if seen:
                        pending += e.end - e.start
                    else:
                        before += e.end - e.start
        return None
    return Contract("ZeRO-2 reduce-scatters each gradient during backward, as soon as it is ready", broken,
                    hint="register_post_accumulate_grad_hook on each parameter: reduce-scatter p.grad in the hook and "
                         "free it (p.grad = None), so that backward never holds every gradient.")


zero2_train = Puzzle(
    "zero2_train", NOTEBOOK, _zero2_case, tools=(adam_update,), world_sizes=FEWER_WORLDS,
    hints=["Like zero1_train, but the full gradients must never all exist at once: reduce-scatter each one during "
           "backward, as soon as it is ready, and free it.",
           "p.register_post_accumulate_grad_hook(hook) calls hook(p) when p.grad is final. In the hook: pad p.grad, "
           "reduce-scatter into a shard buffer of c elements, then p.grad = None.",
           "Keep the shard buffers (one per parameter) for the step; after backward: divide by N, adam_update each "
           "shard, all-gather each parameter. Remove the hooks before returning."],
    oracle=_fsdp_oracle(reshard_after_forward=False), oracle_name="fully_shard(reshard_after_forward=False)",
    rtol=RTOL, atol=ATOL, real_scale=training_scale,
    describe="ZeRO stage 2: optimizer state and gradients sharded; gradients reduce-scattered during backward.")


# ---- 3. ZeRO-3 / FSDP -----------------------------------------------------------------------------------
ZERO3_HINT = ("all-gather a layer's parameters just before you use it, and free them right after "
              "(p.data = torch.empty(0, dtype=p.dtype)), in forward and again in backward.")


def _zero3_case(rng: random.Random, world: int, deep: bool = False, steps: Optional[int] = None) -> Case:
    """deep: DEEP hidden layers (see DEEP)."""
    model = mlp(_sizes(rng, deep), seed=rng.randrange(2**31))
    return _case(rng, world, lambda s, m: [
        _regather_floor(s),
        _memory_budget(s, 3, 5, "stage 3, (8+8+16)Ψ/N", ZERO3_HINT),
        _bytes_budget(s, 3, True, "all-gathers for forward and for backward and a reduce-scatter per step")],
        model=model, steps=steps, contracts=lambda s: [_while_training(s, 5, "stage 3, (8+8+16)Ψ/N", ZERO3_HINT)])


zero3_train = Puzzle(
    "zero3_train", NOTEBOOK, _zero3_case, tools=(adam_update,), world_sizes=FEWER_WORLDS,
    variants=[{"deep": True}],
    hints=["First cut your shards and free the full parameters (p.data = torch.empty(0, dtype=p.dtype)). Then per "
           "step: forward layer by layer under torch.no_grad(), gathering each layer just before it runs and "
           "freeing it after; keep each layer's input. " + SHARD_HINT,
           "Backward layer by layer, last first: gather the layer again, recompute out = layer(inp.requires_grad_()), "
           "out.backward(grad_out), grad_out = inp.grad; reduce-scatter each p.grad into its shard, free p.grad and "
           "the gathered parameter. The loss's gradient: h.requires_grad_(); F.mse_loss(h, y).backward(); h.grad.",
           "Gather: buf = torch.empty(N*c, dtype=...); dist.all_gather_single(buf, shard); "
           "p.data = buf[:n].view(shape). "
           "After the steps, gather every parameter once more and return {name: full tensor}."],
    oracle=_fsdp_oracle(reshard_after_forward=True), oracle_name="torch.distributed.fsdp.fully_shard",
    rtol=RTOL, atol=ATOL, real_scale=training_scale,
    describe="ZeRO stage 3 (FSDP): parameters sharded too, each layer gathered just before use and freed after.")


# ---- 4. FSDP with prefetching ----------------------------------------------------------------------------
OVERLAP = 0.5      # the share of what prefetching can hide that the budget asks to hide (bookkeeping copies vary)


def _step_times(s: _Sizes, model, cost: CostModel) -> tuple[float, float, float]:
    """Per step: serial time (gathers, the measured compute, reduce-scatters one after another), the part
    prefetching can hide, and the final all-gather."""
    ranks = range(s.world)
    layers = list(model)
    ag = [sum(cost.collective_time("all_gather", ITEM * padded(p.numel(), s.world), ranks) for p in layer.parameters())
          for layer in layers]
    rs = [sum(cost.collective_time("reduce_scatter", ITEM * padded(p.numel(), s.world), ranks)
              for p in layer.parameters()) for layer in layers]
    fwd, bwd, rest = _compute_times(model, *s.first_batch, s.world, cost)
    serial = 2 * sum(ag) + sum(fwd) + sum(bwd) + rest + sum(rs)
    idx = [i for i, layer in enumerate(layers) if list(layer.parameters())]
    hide = sum(min(ag[b], fwd[a]) for a, b in zip(idx, idx[1:]))              # forward: gather the next layer
    hide += sum(min(ag[a], bwd[b]) for a, b in zip(idx, idx[1:]))             # backward: gather the previous one
    return serial, hide, sum(ag)


@once_per_shape
def _compute_times(model, x: torch.Tensor, y: torch.Tensor, world: int,
                   cost: CostModel) -> tuple[tuple[float, ...], tuple[float, ...], float]:
    """Measured as a simulated rank's clock counts them: each layer's forward, each layer's backward (its
    forward recomputed, then its gradients), and the rest of a step (loss, Adam on this rank's shards), for a
    batch (x, y) on each of `world` ranks. Shapes alone set them: measured once per model shape and world."""
    probe = copy.deepcopy(model)
    fwd, bwd, inputs, h = [], [], [], x
    with torch.no_grad():
        for layer in probe:
            inputs.append(h)
            h, t = counted_time(lambda layer=layer, h=h: layer(h), cost)
            fwd.append(t)
    h.requires_grad_()
    grad, t_loss = counted_time(lambda: torch.autograd.grad(F.mse_loss(h, y), h)[0], cost)
    for layer, inp in reversed(list(zip(probe, inputs))):
        inp = inp.detach().requires_grad_()
        grad, t = counted_time(lambda layer=layer, inp=inp, grad=grad: _backward_through(layer, inp, grad), cost)
        bwd.insert(0, t)
    shards = [torch.zeros(padded(p.numel(), world) // world, dtype=p.dtype) for p in probe.parameters()]
    for shard in shards:
        shard.grad = torch.ones_like(shard)
    adam = torch.optim.Adam(shards, lr=LR)
    _, t_adam = counted_time(adam.step, cost)
    return tuple(fwd), tuple(bwd), t_loss + t_adam


def _backward_through(layer, inp, grad):
    layer(inp).backward(grad)
    return inp.grad


PREFETCH_HINT = "prefetch one layer ahead, not all of them; free each layer after use."


def _prefetch_case(rng: random.Random, world: int, deep: bool = False, steps: Optional[int] = None) -> Case:
    """deep: DEEP hidden layers (see DEEP)."""
    model = mlp(_sizes(rng, deep), seed=rng.randrange(2**31))
    biggest = max(_layers(model), key=lambda m: m.weight.numel())
    flops = 2 * LOCAL * biggest.in_features * biggest.out_features
    cost = CostModel(flops_per_s=1e9, latency=1e-8)
    gathered = ITEM * sum(padded(p.numel(), world) for p in biggest.parameters())
    # A link on which gathering the largest layer takes as long as computing its forward.
    cost = cost.with_(intra_node_bandwidth=bus_factor("all_gather", world) * gathered / cost.compute_time(flops))

    def budgets(s, m):
        serial, hide, final = _step_times(s, m, cost)
        limit = s.steps * (serial - OVERLAP * hide) + final
        why = (f"{s.steps} steps × (gathers, compute and reduce-scatters one after another = "
               f"{serial * 1e6:.1f} µs, minus {OVERLAP:.0%} of the {hide * 1e6:.1f} µs of gathers that can run "
               "under the neighbouring layer's compute) + the final gather")
        return [_regather_floor(s),
                Budget("time", limit, why,
                       hint="issue the next layer's all-gather with async_op=True before computing the current "
                            "layer, and .wait() on it only when you reach that layer (in backward: the previous one)."),
                _memory_budget(s, 3, 6, PREFETCHED, PREFETCH_HINT),
                _bytes_budget(s, 3, True, "all-gathers for forward and for backward and a reduce-scatter per step")]

    return _case(rng, world, budgets, cost, model=model, what="gathering a layer takes as long as computing it",
                 steps=steps, contracts=lambda s: [_while_training(s, 6, PREFETCHED, PREFETCH_HINT)])


PREFETCHED = "stage 3, (8+8+16)Ψ/N, with one more layer prefetched"


fsdp_prefetch_train = Puzzle(
    "fsdp_prefetch_train", NOTEBOOK, _prefetch_case, tools=(adam_update,), world_sizes=FEWER_WORLDS,
    variants=[{"deep": True}],
    hints=["Same algorithm as zero3_train. While layer i computes, the network is idle: start layer i+1's "
           "all-gather before computing layer i (in backward, layer i-1's before recomputing layer i).",
           "work = dist.all_gather_single(buf, shard, async_op=True) returns at once. Keep (buf, work) for the next "
           "layer; when you reach it, work.wait() and point p.data at buf.",
           "Prefetch only one layer ahead: gathering all of them at once would break the memory budget."],
    oracle=_fsdp_oracle(reshard_after_forward=True), oracle_name="torch.distributed.fsdp.fully_shard",
    rtol=RTOL, atol=ATOL,
    describe="ZeRO-3 whose next layer's all-gather overlaps the current layer's compute.")


# ---- 5. ZeRO-Offload ---------------------------------------------------------------------------------------
OFFLOAD_LABEL, OFFLOAD_HINT = "device memory keeps the weights only", (
    "keep m, v, the shard's gradients and its master parameters in host memory (device=lib.host()); send the device "
    "only updated shards.")


def _offload_training(s: _Sizes) -> tuple[float, str]:
    """(bytes, why): what a ZeRO-Offload rank's device holds while training: the weights, not their state."""
    return _training_memory(s, 2, 2, OFFLOAD_LABEL, states=SCALE * 2 * s.psi, formula="the float64 weights, 4 × 2Ψ")


def _offload_device(s: _Sizes) -> Budget:
    """The device's peak over the whole run: training's, or at the end the weights and a copy of them returned
    (`{n: p.detach().clone()}`, as ordinary code returns parameters); training itself is judged on its own
    (_offload_while_training), so that the room for the returned copy is no room for state kept on the device."""
    limit, why = _offload_training(s)
    end = 2 * ITEM * s.psi + s.inputs + 3 * s.shard
    if end > limit:
        why += (f"; after training, the weights and a copy of them returned, the batches and shard temporaries "
                f"({fmt_bytes(end)})")
    return Budget("peak_memory", max(limit, end), why, hint=OFFLOAD_HINT)


def _offload_while_training(s: _Sizes) -> Contract:
    """ZeRO-Offload's device memory from its first reduce-scatter of gradients to its last all-gather of updated
    shards: the weights, a step's activations and what is in flight, never the optimizer's state or its gradients."""
    limit, why = _offload_training(s)
    return peak_memory_between("reduce_scatter", "all_gather", limit, "while training",
                               f"while training, {why}", hint=OFFLOAD_HINT)


SHARDS_LEFT = 0.75    # of a rank's gradient shards (8Ψ/N): held on the device at the step, they were never offloaded


def _gradients_offloaded(s: _Sizes) -> Contract:
    """Between a step's last reduce-scatter and its first all-gather Adam runs: the device then holds the weights and
    the batches, the gradient shards having gone to the host as they were reduced. Shards kept on the device for the
    step (and handed to Adam there) show as most of 8Ψ/N more."""
    base, shards = ITEM * s.psi + s.inputs, ITEM * s.psi / s.world

    def broken(result: SimResult) -> Optional[str]:
        for st in result.stats:
            calls = sorted((e for e in result.trace if e.rank == st.rank and e.op in ("reduce_scatter", "all_gather")),
                           key=lambda e: e.end)
            for step, (a, b) in enumerate(((a, b) for a, b in zip(calls, calls[1:])
                                           if a.op == "reduce_scatter" and b.op == "all_gather"), start=1):
                held = max((h for t, h in st.memory if a.end <= t <= b.start), default=0)
                if held > base + SHARDS_LEFT * shards:
                    return (f"rank {st.rank}'s device held {fmt_bytes(held)} at step {step}'s update (between its "
                            f"last reduce-scatter and its first all-gather), {fmt_bytes(held - base)} over the "
                            f"weights and the batches ({fmt_bytes(base)}): {(held - base) / shards:.1f}× its gradient "
                            f"shards ({fmt_bytes(shards)}), which stayed in device memory for Adam's step")
        return None
    return Contract("ZeRO-Offload sends each gradient shard to host memory as soon as it is reduced, and Adam reads "
                    "it there", broken,
                    hint="in the hook, after the reduce-scatter: grads[i] = shard.to(lib.host()), so that adam_update "
                         "gets host tensors only.")


def _offload_case(rng: random.Random, world: int, steps: Optional[int] = None) -> Case:
    def budgets(s, m):
        device = _offload_device(s)
        host = SCALE * model_state_bytes(s.psi, s.world, 3, k=K[3])
        return [device,
                Budget("host_peak_memory", host + 3 * s.shard,
                       f"the shard's parameters, gradients, m and v, (8+8+16)Ψ/N = {fmt_bytes(host)}, "
                       f"+ Adam's temporaries on one shard",
                       hint="keep one copy of each shard on the host; free per-step temporaries."),
                _host_step(s),
                *_gradient_traffic(s)]
    model = mlp(_sizes(rng), seed=rng.randrange(2**31))          # the draw _case would make, kept for the contract
    return _case(rng, world, budgets, host=True, model=model, steps=steps,
                 contracts=lambda s: [_adam_on_the_host(s, model), _reduced_during_backward(),
                                      _gradients_offloaded(s), _offload_while_training(s)])


@functools.lru_cache(maxsize=16)
def _adam_flops(elements: int) -> float:
    """adam_update's FLOPs on a shard of `elements` float64s, as a rank counts them (elementwise: by size alone)."""
    p, g, m, v = (torch.ones(elements, dtype=torch.float64) for _ in range(4))
    return counted_flops(lambda: adam_update(p, g, m, v, 1, LR))[1]


def _host_step(s: _Sizes) -> Budget:
    """ZeRO-Offload moves the optimizer's step to the host, not only its state (puzzles/_offload.py)."""
    return host_step_floor(s.steps * _adam_flops(s.psi // s.world),
                           f"{s.steps} steps × Adam on this rank's {s.psi // s.world} shard elements",
                           hint="run adam_update on the host shards themselves (device=lib.host()); carrying m and v "
                                "to the device to update them there leaves the device's memory and compute doing the "
                                "host's work.")


@once_per_shape
def _step_flops(model, x: torch.Tensor, y: torch.Tensor) -> float:
    """One step's forward and backward on a rank's batch (x, y), as a rank counts them: what the device computes."""
    probe = copy.deepcopy(model)
    return counted_flops(lambda: F.mse_loss(probe(x), y).backward())[1]


def _adam_on_the_host(s: _Sizes, model) -> Contract:
    """The device computes forward and backward, the host Adam's step: a floor on the host's FLOPs alone is met by
    busywork there while the step runs on the device. Beside its forward and backward, the device may touch every
    parameter twice a step (padding its gradient, copying the gathered weights in) and compute half of Adam's step."""
    own, adam = s.steps * _step_flops(model, *s.first_batch), s.steps * _adam_flops(s.psi // s.world)
    limit = own + s.steps * 2 * s.psi + HOST_STEP * adam

    def broken(result) -> Optional[str]:
        for st in result.stats:
            device = st.flops - st.host_flops
            if device > limit * (1 + 1e-9):
                return (f"rank {st.rank} computed {device:,.0f} FLOPs on the device, {device - own:,.0f} more than "
                        f"its {s.steps} steps' forward and backward ({own:,.0f}), where Adam's {adam:,.0f} on its "
                        "shards belong to the host: Adam's step on the device, whatever the host computes beside it")
        return None
    return Contract("ZeRO-Offload runs Adam's step on the host, where its state lives; the device computes forward "
                    "and backward", broken,
                    hint="run adam_update on the host shards themselves (device=lib.host()); work the host does "
                         "beside a step taken on the device is not the step.")


zero_offload_train = Puzzle(
    "zero_offload_train", NOTEBOOK, _offload_case, tools=(adam_update,), world_sizes=FEWER_WORLDS,
    hints=["ZeRO-2 with the optimizer on the host: the device keeps the weights and computes forward and "
           "backward; each rank's shard of the gradients goes to host memory, where Adam runs.",
           "Per parameter, once: a host shard of the parameter, m and v "
           "(torch.zeros(c, dtype=..., device=lib.host())). "
           "In the gradient hook: reduce-scatter on the device, then g_host = shard.to(lib.host()).",
           "After backward: adam_update on the host shards; bring the updated shard back with .to(lib.device()) "
           "and all-gather it into the parameter."],
    oracle=_zero_redundancy_oracle, oracle_name="torch.distributed.optim.ZeroRedundancyOptimizer",
    rtol=RTOL, atol=ATOL,
    describe="ZeRO-Offload: gradients reduce-scattered, optimizer state and step in host memory.")


PUZZLES = [zero1_train, zero2_train, zero3_train, fsdp_prefetch_train, zero_offload_train]
