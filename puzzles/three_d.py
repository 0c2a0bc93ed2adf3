"""Notebook 06, 3D parallelism: the puzzles, their inputs, references and budgets.

Ranks sit on a (dp, pp, tp) mesh with TP innermost: rank = (d·pp + p)·tp + t, so a TP group is consecutive ranks
(one node) and PP and DP groups cross nodes. The composed steps are checked against single-device training in
float64, and their traffic per axis against the formulas of notebooks 02 (ring all-reduce), 04 (Megatron's f and g)
and 05 (one activation forward and one gradient back per micro-batch and boundary). A plan's memory per GPU is
a prediction: checked against the first stage of tiny GPTs built from lib.models and measured (lib.planner.measured),
then against lib.formulas' terms at real sizes, lib.planner's estimator and measurement out of reach. The plan search
is checked against lib.planner's brute force on randomised models and clusters, judged by what lib.planner.estimate
says of the plan returned; one case is drawn where ranking by HFU picks another plan.
"""

from __future__ import annotations

import copy
import functools
import random
from typing import Callable, Optional

import numpy
import torch
import torch.nn.functional as F

from lib.check import Budget, Case, Puzzle, flops_budgets, nothing_on_the_host
from lib.device import device
from lib.devices import device_mesh
from lib.diagnose import Mistake
from lib.errors import PuzzleError
from lib.formulas import activation_bytes_per_layer, first_stage_in_flight, model_state_breakdown
from lib.measure import WithoutPeers, counted_flops, counted_work, saved_activation_bytes
from lib.mesh_check import ArithmeticPuzzle, AxisBudget, MeshCase, MeshPuzzle
from lib.schedules import peak_in_flight, schedule_orders
from lib.models import GPTConfig
from lib.planner import Plan, estimate
from lib.sim import CostModel, per_rank
from lib.sim.cost import bus_factor
from lib.sim.mesh import answer_key_refused, coordinates
from lib.sim.traffic import MeshAxes
from lib.units import fmt_bytes, fmt_time

from puzzles.parallel_gpt import GPTStage, reference_loss, shard_gpt, tiny_gpt

NOTEBOOK = "06_3d_parallelism"
AXES = ("dp", "pp", "tp")
ITEM = 8                      # float64: every composed step is compared with the single-device one strictly
WORLD_OPS = frozenset({"all_reduce"})
DP_OPS = frozenset({"all_reduce", "reduce_scatter", "all_gather"})
PP_OPS = frozenset({"send", "recv"})


class GroupsWrong(PuzzleError):
    """The function returned something other than the groups asked for."""


def _shape_of(rng: random.Random, n: int, dims: int, at_least: tuple[int, ...] = (),
              real_axes: int = 0) -> tuple[int, ...]:
    """A random shape of `dims` sizes multiplying to n (at_least[i] a lower bound on size i, where given), with
    `real_axes` sizes above 1 where n has that many factors (a prime n has one)."""
    lows = tuple(at_least) + (1,) * (dims - len(at_least))
    shapes = [s for s in _factorisations(n, dims) if all(a >= b for a, b in zip(s, lows))]
    most = max(sum(a > 1 for a in s) for s in shapes)
    return rng.choice([s for s in shapes if sum(a > 1 for a in s) >= min(real_axes, most)])


def _factorisations(n: int, dims: int) -> list[tuple[int, ...]]:
    if dims == 1:
        return [(n,)]
    return [(d, *rest) for d in range(1, n + 1) if n % d == 0 for rest in _factorisations(n // d, dims - 1)]


def _gen(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.randrange(2**31))


def _ring(op: str, nbytes: float, n: int) -> float:
    """Bytes one rank sends in a ring collective over n ranks (notebook 02: 2(n-1)/n for an all-reduce)."""
    return bus_factor(op, n) * nbytes


# ---- 1. coordinates --------------------------------------------------------------------------------------------
def _coordinates_case(rng: random.Random, n: int) -> Case:
    dims = rng.randint(2, 4)
    # Two axes above 1 at least (the check's world sizes all allow it; the real cell's 2 ranks do not): with one,
    # every order of the axes gives the same coordinates (an answer with TP outermost passed on such draws).
    shape = _shape_of(rng, n, dims, real_axes=2)
    return Case(n, (shape,), [coordinates(r, shape) for r in range(n)], f"a mesh of shape {shape}")


# The lesson is which axis varies fastest: a library's unravel does that arithmetic (numpy's are C functions behind a
# Python dispatcher, which lib.offlimits watches).
UNRAVEL = {"torch.unravel_index": torch.unravel_index, "numpy.unravel_index": numpy.unravel_index,
           "numpy.ravel_multi_index": numpy.ravel_multi_index}
UNRAVEL_ADVICE = ("derive it: on a (dp, pp, tp) mesh rank = (d·PP + p)·TP + t, the last axis varying fastest, so peel "
                  "the axes off from the last with divmod")

mesh_coordinates = ArithmeticPuzzle(
    "mesh_coordinates", NOTEBOOK, _coordinates_case, world_sizes=(4, 6, 8, 12), rtol=0, atol=0,
    off_limits=UNRAVEL, off_limits_advice=UNRAVEL_ADVICE,
    hints=["The last dimension is innermost: ranks 0, 1, ..., shape[-1]-1 differ only in the last coordinate. So the "
           "last coordinate is rank % shape[-1], and rank // shape[-1] is the rank on the mesh of the other "
           "dimensions.",
           "Peel the dimensions off from the innermost: for size in reversed(shape): rank, c = divmod(rank, size); "
           "collect c, then reverse.",
           "Return a tuple of Python ints, outermost first: (d, p, t) for a (dp, pp, tp) mesh."],
    describe="This rank's coordinates on a mesh of any shape, the last dimension innermost.")


# ---- 2. process groups -------------------------------------------------------------------------------------
def _group_ranks(dist, group) -> list[int]:
    return list(range(dist.get_world_size())) if group is None else list(dist.get_process_group_ranks(group))


def use_groups(fn: Callable, dist, dp: int, pp: int, tp: int) -> dict:
    """Ask `fn` for this rank's groups, then use each: an all-reduce of the rank's number over TP and over DP, and
    a message from each pipeline stage to the next over PP. Returns what each group showed."""
    groups = fn(dist, dp, pp, tp)
    if not isinstance(groups, dict) or set(groups) != set(AXES):
        raise GroupsWrong(f"process_groups should return a dict with keys 'dp', 'pp' and 'tp' (this rank's group "
                          f"along each axis), got {type(groups).__name__}"
                          + (f" with keys {sorted(groups)}" if isinstance(groups, dict) else "") + ".")
    rank = dist.get_rank()
    out = {f"{axis} ranks": _group_ranks(dist, groups[axis]) for axis in AXES}
    for axis in AXES:
        if rank not in out[f"{axis} ranks"]:
            raise GroupsWrong(f"rank {rank}'s '{axis}' group holds ranks {out[f'{axis} ranks']}, not rank {rank}: "
                              f"each rank keeps, of all the {axis} groups every rank creates, the one it belongs to "
                              f"(`if rank in ranks: groups['{axis}'] = group`).")
    for axis in ("tp", "dp"):
        x = torch.tensor([float(rank)], dtype=torch.float64, device=device())
        dist.all_reduce(x, group=groups[axis])
        out[f"{axis} sum"] = x
    stages = out["pp ranks"]
    i, got = stages.index(rank), torch.tensor([-1.0], dtype=torch.float64, device=device())
    if i > 0:
        dist.recv(got, stages[i - 1])
    if i < len(stages) - 1:
        dist.send(torch.tensor([float(rank)], dtype=torch.float64, device=device()), stages[i + 1])
    out["pp message from"] = got
    return out


def _by_hand(fn: Callable, dist, dp: int, pp: int, tp: int) -> dict:
    with answer_key_refused("process_groups asks you to build every group yourself with dist.new_group, as "
                            "torch's DeviceMesh does inside"):
        return fn(dist, dp, pp, tp)


def _groups_used(fn: Callable, dist, dp: int, pp: int, tp: int) -> dict:
    """process_groups' harness: the learner builds the groups (by hand: device_mesh and lib.sim.mesh's groups are
    refused meanwhile); the check uses them (use_groups), in both worlds."""
    return use_groups(functools.partial(_by_hand, fn), dist, dp, pp, tp)


def _mesh_groups_oracle(dist, dp: int, pp: int, tp: int) -> dict:
    """torch's DeviceMesh asked for the same groups."""
    mesh = device_mesh(dist, (dp, pp, tp), AXES)
    return {axis: mesh.get_group(axis) for axis in AXES}


def _groups_case(rng: random.Random, n: int) -> MeshCase:
    shape = _shape_of(rng, n, 3, at_least=(2, 2, 2) if n in (8, 12) else ())   # every axis real on the larger
    axes = MeshAxes(shape, AXES)
    expected = []
    for r in range(n):
        groups = {a: list(axes.group(r, a)) for a in AXES}
        stages = groups["pp"]
        i = stages.index(r)
        expected.append({**{f"{a} ranks": groups[a] for a in AXES},
                         **{f"{a} sum": torch.tensor([float(sum(groups[a]))], dtype=torch.float64)
                            for a in ("tp", "dp")},
                         "pp message from": torch.tensor([float(stages[i - 1]) if i else -1.0], dtype=torch.float64)})
    dp, pp, tp = shape
    budgets = [
        AxisBudget("tp", _ring("all_reduce", ITEM, tp), f"one all-reduce of 8 bytes over tp={tp}: 2(tp-1)/tp × 8 B",
                   WORLD_OPS),
        AxisBudget("dp", _ring("all_reduce", ITEM, dp), f"one all-reduce of 8 bytes over dp={dp}", WORLD_OPS),
        AxisBudget("pp", [ITEM * (axes.group(r, "pp").index(r) < pp - 1) for r in range(n)],
                   "one 8-byte message to the next stage", PP_OPS)]
    return MeshCase(n, (dp, pp, tp), expected, f"a (dp, pp, tp) = {shape} mesh", axes=axes, axis_budgets=budgets)


process_groups = MeshPuzzle(
    "process_groups", NOTEBOOK, _groups_case, world_sizes=(4, 6, 8, 12), rtol=0, atol=0,
    hints=["Every rank must call dist.new_group for every group of every axis, members or not, in the same order: "
           "loop over all the TP groups, then all the PP groups, then all the DP groups, and keep the one this rank "
           "belongs to.",
           "A group along an axis: fix the other two coordinates, vary this one. With rank = (d·pp + p)·tp + t, the TP "
           "group of (d, p) is [(d·pp + p)·tp + t for t in range(tp)]; the DP group of (p, t) is "
           "[(d·pp + p)·tp + t for d in range(dp)].",
           "for d in range(dp): for p in range(pp): ranks = [...]; g = dist.new_group(ranks); if rank in ranks: "
           "groups['tp'] = g. Never guard the new_group call itself with `if rank in ranks`."],
    oracle=functools.partial(use_groups, _mesh_groups_oracle),
    oracle_name="torch's DeviceMesh (init_device_mesh, mesh.get_group(axis))", harness=_groups_used,
    describe="This rank's TP, PP and DP groups, every group created by every rank in the same order.")


# ---- 3. 2D: tensor parallel inside data parallel ----------------------------------------------------------------
MLP_KEYS = ("fc1_w", "fc1_b", "fc2_w", "fc2_b")
MLP_SPLIT = {"fc1_w": 0, "fc1_b": 0, "fc2_w": 1}     # Megatron's MLP: fc1 by rows, fc2 by columns; fc2_b whole


def mlp_forward(weights: dict, x: torch.Tensor) -> torch.Tensor:
    """The single-device MLP: fc2(gelu(fc1(x)))."""
    return F.linear(F.gelu(F.linear(x, weights["fc1_w"], weights["fc1_b"])), weights["fc2_w"], weights["fc2_b"])


def mlp_shard(weights: dict, tp: int, t: int) -> dict:
    """TP rank t's shard of the MLP's weights."""
    return {k: (v.chunk(tp, MLP_SPLIT[k])[t] if k in MLP_SPLIT else v).clone() for k, v in weights.items()}


def train_mlp(weights: dict, batch: torch.Tensor, targets: torch.Tensor, steps: int, lr: float) -> dict:
    """The single-device reference: `steps` SGD steps on the whole batch, loss F.mse_loss."""
    params = {k: v.clone().requires_grad_() for k, v in weights.items()}
    for _ in range(steps):
        F.mse_loss(mlp_forward(params, batch), targets).backward()
        with torch.no_grad():
            for p in params.values():
                p -= lr * p.grad
                p.grad = None
    return {k: v.detach() for k, v in params.items()}


def _tp_dp_case(rng: random.Random, n: int) -> MeshCase:
    dp, tp = _shape_of(rng, n, 2, at_least=(2, 2))
    h, rows, steps, lr = tp * rng.choice([2, 4]), dp * rng.randint(1, 3), rng.randint(2, 3), 0.1
    gen = _gen(rng)
    weights = {"fc1_w": torch.randn(4 * h, h, generator=gen, dtype=torch.float64) / h ** 0.5,
               "fc1_b": torch.randn(4 * h, generator=gen, dtype=torch.float64) * 0.1,
               "fc2_w": torch.randn(h, 4 * h, generator=gen, dtype=torch.float64) / (4 * h) ** 0.5,
               "fc2_b": torch.randn(h, generator=gen, dtype=torch.float64) * 0.1}
    batch = torch.randn(rows, h, generator=gen, dtype=torch.float64)
    targets = torch.randn(rows, h, generator=gen, dtype=torch.float64)
    trained = train_mlp(weights, batch, targets, steps, lr)
    axes = MeshAxes((dp, tp), ("dp", "tp"))
    expected = [mlp_shard(trained, tp, coordinates(r, (dp, tp))[1]) for r in range(n)]
    local = rows // dp * h * ITEM
    shard = sum(v.numel() for v in mlp_shard(weights, tp, 0).values()) * ITEM
    budgets = [
        AxisBudget("tp", steps * _ring("all_reduce", local, tp),
                   f"{steps} steps × g's all-reduce of this rank's output, {rows // dp} rows × h={h} in float64 "
                   f"({fmt_bytes(local)}), 2(tp-1)/tp of it; f's backward never runs, the batch needs no gradient",
                   WORLD_OPS, hint="a step needs one TP all-reduce, g's after fc2: fc1's input is the data, whose "
                                   "gradient nobody needs."),
        AxisBudget("dp", steps * _ring("all_reduce", shard, dp),
                   f"{steps} steps × one all-reduce of this rank's gradient shard ({fmt_bytes(shard)}) over dp={dp}",
                   DP_OPS, hint="average each gradient over the DP group once per step: TP ranks hold different "
                                "shards, so a TP rank's gradient never meets another TP rank's.")]
    # A rank's work: its shard trained on its rows (g's sum aside), about 1/(dp·tp) of the whole. The bytes alone let
    # a rank gather the batch (fewer bytes than a gradient shard) and train the whole MLP with no TP at all.
    _, share = counted_flops(lambda: train_mlp(mlp_shard(weights, tp, 0), batch.chunk(dp)[0], targets.chunk(dp)[0],
                                               steps, lr))
    work = flops_budgets(share, f"{steps} SGD steps of one shard (1/tp of the MLP's width, fc2_b whole) on "
                                f"{rows // dp} rows, {share:,.0f} FLOPs")
    return MeshCase(n, (weights, batch, targets, dp, tp, steps, lr), expected,
                    f"(dp, tp) = ({dp}, {tp}), h={h}, {rows} rows, {steps} SGD steps", budgets=work, axes=axes,
                    axis_budgets=budgets)


def fsdp_tp_mlp(dist, weights: dict, dp: int, tp: int, dtype: torch.dtype) -> tuple[torch.nn.Module, int, int]:
    """torchtitan's 2D, built once: the MLP of `weights` in `dtype`, DTensor tensor parallelism (ColwiseParallel
    fc1, RowwiseParallel fc2) on the mesh's "tp" dimension, FSDP2 (fully_shard) on its "dp" dimension. Returns the
    module and this rank's (dp, tp) coordinates. The puzzle's oracle and bench/'s row both train it."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    quiet()
    mesh = device_mesh(dist, (dp, tp), ("dp", "tp"))
    h = weights["fc2_b"].shape[0]
    model = torch.nn.Sequential(torch.nn.Linear(h, 4 * h), torch.nn.GELU(), torch.nn.Linear(4 * h, h))
    model = model.to(device=weights["fc2_b"].device, dtype=dtype)
    with torch.no_grad():
        for (w, b), layer in ((("fc1_w", "fc1_b"), model[0]), (("fc2_w", "fc2_b"), model[2])):
            layer.weight.copy_(weights[w])
            layer.bias.copy_(weights[b])
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    return model, mesh.get_local_rank("dp"), mesh.get_local_rank("tp")


def fsdp_tp_shards(model: torch.nn.Module, tp: int, t: int) -> dict:
    """This rank's TP shards of fsdp_tp_mlp's trained weights, as tp_dp_train returns them."""
    full = {"fc1_w": model[0].weight, "fc1_b": model[0].bias, "fc2_w": model[2].weight, "fc2_b": model[2].bias}
    return mlp_shard({k: v.full_tensor().detach() for k, v in full.items()}, tp, t)


def _fsdp_tp_oracle(dist, weights, batch, targets, dp, tp, steps, lr):
    """fsdp_tp_mlp in float64, trained with torch.optim.SGD on this rank's rows."""
    model, d, t = fsdp_tp_mlp(dist, weights, dp, tp, torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = batch.chunk(dp)[d], targets.chunk(dp)[d]
    for _ in range(steps):
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return fsdp_tp_shards(model, tp, t)


def quiet() -> None:
    """Silence what FSDP2 and DTensor say on every rank about this tiny model (a view returned, two all-gathers
    where one would do): notes for performance work, noise next to a real cell's one line."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


tp_dp_train = MeshPuzzle(
    "tp_dp_train", NOTEBOOK, _tp_dp_case, world_sizes=(4, 6, 8), rtol=1e-9, atol=1e-12,
    hints=["Make a 2-D mesh, mesh = device_mesh(dist, (dp, tp), ('dp', 'tp')): this rank's coordinates are "
           "mesh.get_local_rank('dp') and mesh.get_local_rank('tp'), its groups mesh['tp'].get_group() and "
           "mesh['dp'].get_group(). Take rows d of the batch (chunk(dp)[d]) and shard t of each weight "
           "(fc1 by rows, fc2 by columns, fc2_b whole), as leaf tensors that require a gradient.",
           "Forward as notebook 04's Megatron MLP, with g over the TP group: y = tp_reduce(dist, "
           "F.linear(F.gelu(F.linear(x, w1, b1)), w2), tp_group) + b2; loss = F.mse_loss(y, targets_d). (f before "
           "fc1 would cost nothing: its backward all-reduces x's gradient, and the batch needs none.)",
           "After backward, average every gradient over the DP group only (dist.all_reduce(g, op=dist.ReduceOp.AVG, "
           "group=dp_group)), then p -= lr * p.grad under torch.no_grad() and clear the gradient. Return the dict of "
           "this rank's trained shards, keys fc1_w, fc1_b, fc2_w, fc2_b."],
    oracle=_fsdp_tp_oracle, oracle_name="FSDP2 (fully_shard) + DTensor parallelize_module on a 2-D init_device_mesh",
    min_world_size=4, min_world_size_reason="both axes need at least 2 ranks",
    preload=("torch._dynamo", "torch.distributed.fsdp", "torch.distributed.tensor.parallel"),
    describe="Megatron's MLP, tensor-parallel over TP, inside data parallelism over DP; several SGD steps.")


# ---- 4. 3D: pipeline × tensor × data parallel on a tiny GPT ----------------------------------------------------------
def train_gpt(model, tokens: torch.Tensor, targets: torch.Tensor, steps: int, lr: float):
    """The single-device reference: `steps` SGD steps on the whole batch, mean cross-entropy (float64)."""
    model = copy.deepcopy(model)
    for _ in range(steps):
        reference_loss(model, tokens, targets).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
                p.grad = None
    return model


def stage_costs(stage: GPTStage, micro: torch.Tensor, targets: torch.Tensor, last: bool):
    """One micro-batch through one stage on one TP rank, measured in one pass: (the seconds of its forward and
    backward as a function of the cost model, their FLOPs, the bytes of activations it keeps until its backward,
    the peak of its forward and backward with the stage's weights and gradients)."""
    stage = copy.deepcopy(stage)
    kept: dict = {}

    def forward():
        x = micro.clone()
        if x.is_floating_point():
            x.requires_grad_()
        out = stage(WithoutPeers(), None, x)
        return stage.loss(out, targets) if last else out

    def work():
        kept["stash"] = saved_activation_bytes(lambda: kept.setdefault("out", forward()),
                                               exclude=[*stage.parameters(), targets])
        out = kept.pop("out")
        (out if last else out.sum()).backward()
    _, measured = counted_work(work)
    weights = sum(t.nbytes for t in stage.state_dict().values())      # allocated before the pass, held throughout
    return measured.seconds, measured.flops, kept["stash"], weights + measured.peak


def _scaled_cost(flops: float, tp_seconds: float, tp: int) -> CostModel:
    """H100 links and latency (lib.sim.cost's defaults), TP inside a node of `tp` GPUs, and compute slowed so that
    one micro-batch's TP all-reduces take the share of its compute they take in Llama 3 405B's training (`flops`
    and `tp_seconds`: one micro-batch on one stage, measured and priced at the default cost)."""
    from lib.planner import PUBLISHED_RUNS, step_time_breakdown

    llama = next(r for r in PUBLISHED_RUNS if r.name.startswith("Llama 3 405B, 16,384"))
    real = step_time_breakdown(llama.model, llama.cluster, llama.plan)
    return CostModel(flops_per_s=flops / (tp_seconds * real["compute"] / real["tp"]), ranks_per_node=tp)


SCALE_NOTE = ("compute slowed so that TP costs the share of it that it costs Llama 3 405B's training "
              "(lib.planner); H100 links and latency, TP in a node, PP and DP across nodes")


@functools.lru_cache(maxsize=64)
def _stage_measures(cfg: GPTConfig, micro: int, pp: int, tp: int) -> tuple[CostModel, float, tuple]:
    """The case's cost model, the slowest stage's seconds per micro-batch (compute and TP all-reduces), and per stage
    (activations kept per micro-batch, peak of one micro-batch's step), measured on TP rank 0's shards. They depend
    on the shapes alone, not on the weights' values: measured once per configuration (in a real run, by the parent
    before its ranks fork: MeshPuzzle.real)."""
    shards = shard_gpt(tiny_gpt(cfg, 0), pp, tp)
    act = micro * cfg.seq * cfg.hidden * ITEM
    tokens = torch.zeros(micro, cfg.seq, dtype=torch.long)
    measured = [stage_costs(shards[p][0], tokens if p == 0 else torch.zeros(micro, cfg.seq, cfg.hidden,
                                                                            dtype=torch.float64),
                            tokens, p == pp - 1) for p in range(pp)]
    # Time: each stage's compute per micro-batch as a rank's clock counts it, its TP all-reduces at the cluster's.
    tp_time = 4 * (cfg.layers // pp) * CostModel(ranks_per_node=tp).collective_time("all_reduce", act, list(range(tp)))
    cost = _scaled_cost(max(f for _, f, _, _ in measured), tp_time, tp)
    unit = max(seconds(cost) for seconds, _, _, _ in measured) + tp_time
    return cost, unit, tuple((stash, peak) for _, _, stash, peak in measured)


def _three_d_case(rng: random.Random, n: int) -> MeshCase:
    shape = (2, 2, 2) if n == 8 else (1, 2, 2)
    dp, pp, tp = shape
    heads = tp * rng.choice([1, 2])
    cfg = GPTConfig(vocab=rng.choice([32, 64]), seq=rng.choice([8, 16]), hidden=heads * rng.choice([8, 16]),
                    heads=heads, layers=pp, tied=False)
    micro, m, steps, lr = rng.randint(1, 2), pp + 1, 2, 0.1
    gen = _gen(rng)
    model = tiny_gpt(cfg, rng.randrange(2**31))
    tokens = torch.randint(cfg.vocab, (dp * m * micro, cfg.seq), generator=gen)
    targets = torch.randint(cfg.vocab, (dp * m * micro, cfg.seq), generator=gen)
    start, trained = shard_gpt(model, pp, tp), shard_gpt(train_gpt(model, tokens, targets, steps, lr), pp, tp)
    where = [coordinates(r, shape) for r in range(n)]
    axes = MeshAxes(shape, AXES)
    blocks, act = cfg.layers // pp, micro * cfg.seq * cfg.hidden * ITEM          # one micro-batch's (b, s, h)
    stage_bytes = [sum(p.numel() for p in start[p][t].parameters()) * ITEM for _, p, t in where]

    cost, unit, measured = _stage_measures(cfg, micro, pp, tp)
    hop = cost.p2p_time(act, 0, axes.group(0, "pp")[1])
    dp_ranks = axes.group(0, "dp")
    sync = max(sum(cost.collective_time("all_reduce", p.numel() * ITEM, dp_ranks) for p in start[q][0].parameters())
               for q in range(pp))
    step = (m + pp - 1) * unit + 2 * (pp - 1) * hop + sync
    # Memory: 1F1B keeps p-r micro-batches on stage r (notebook 05), each stash measured on the stage.
    in_flight = peak_in_flight(schedule_orders("1f1b", pp, m))
    inputs = tokens.nbytes * 2
    largest = [max(p.numel() for p in start[p][t].parameters()) * ITEM for _, p, t in where]
    memory = [inputs + measured[p][1] + in_flight[p] * measured[p][0] + largest[r] + 4 * act
              for r, (_, p, _) in enumerate(where)]
    stash0, step0 = measured[0]
    budgets = [
        ON_DEVICE,
        Budget("time", steps * step * (1 + TIME_SLACK),
               f"{steps} steps × ((m+p-1) = {m + pp - 1} × {fmt_time(unit)}, the slowest stage's forward, backward and "
               f"TP all-reduces for one micro-batch (1F1B's step, notebook 05), + 2(p-1) activation hops + one DP "
               f"all-reduce per parameter), + {TIME_SLACK:.0%}",
               hint="run 1F1B: stage r starts micro-batch j+1 while the next stage works on j (send with dist.isend), "
                    "not one micro-batch through every stage at a time."),
        Budget("peak_memory", memory,
               f"on rank 0: the tokens and targets ({fmt_bytes(inputs)}), one micro-batch's forward and backward "
               f"with the stage's weights and gradients ({fmt_bytes(step0)}), the activations of 1F1B's "
               f"{in_flight[0]} micro-batches in flight ({fmt_bytes(stash0)} each), one parameter's worth for the "
               f"update and 4 boundary tensors of {fmt_bytes(act)}",
               hint="1F1B: stage r runs p-r-1 forwards ahead, then one forward, one backward; free each micro-batch's "
                    "stash when its backward is done.")]
    axis_budgets = [
        AxisBudget("tp", steps * m * blocks * 4 * _ring("all_reduce", act, tp),
                   f"{steps} steps × m={m} micro-batches × {blocks} blocks × 4 all-reduces (g and g forward, f and f "
                   f"backward: notebook 04) of a micro-batch's activations ({fmt_bytes(act)}), 2(tp-1)/tp each",
                   WORLD_OPS, hint="the blocks' f and g all-reduce over the TP group, and nothing else does."),
        AxisBudget("pp", [steps * m * ((p < pp - 1) + (p > 0)) * act for _, p, _ in where],
                   f"{steps} steps × m={m} micro-batches × one activation forward and one gradient back per boundary "
                   f"({fmt_bytes(act)} each: notebook 05)", PP_OPS,
                   hint="send each micro-batch's output to the next stage once, and its input gradient back once."),
        AxisBudget("dp", [steps * _ring("all_reduce", b, dp) for b in stage_bytes],
                   f"{steps} steps × one all-reduce of this rank's gradients ({fmt_bytes(stage_bytes[0])} on rank 0) "
                   f"over dp={dp}, 2(dp-1)/dp of them (notebook 02)", DP_OPS,
                   hint="average the gradients over the DP group once per step, "
                        "after the last micro-batch's backward.")]
    stages = per_rank([start[p][t] for _, p, t in where])
    return MeshCase(n, (stages, tokens, targets, dp, pp, tp, m, steps, lr), [trained[p][t] for _, p, t in where],
                    f"(dp, pp, tp) = {shape}, {cfg.layers} layers, h={cfg.hidden}, {cfg.heads} heads, s={cfg.seq}, "
                    f"m={m} micro-batches of {micro}, {steps} SGD steps", budgets=budgets, cost=cost, axes=axes,
                    axis_budgets=axis_budgets, scale=SCALE_NOTE)


TIME_SLACK = 0.1
# The memory budget is 1F1B's stash on the device: activations parked in host memory (saved-tensor hooks that move
# them to lib.host()) would let GPipe's m micro-batches in flight pass it.
ON_DEVICE = nothing_on_the_host("1F1B bounds the activations each stage keeps on its device")


train_3d = MeshPuzzle(
    "train_3d", NOTEBOOK, _three_d_case, world_sizes=(8,), rtol=1e-9, atol=1e-12,
    hints=["mesh = device_mesh(dist, (dp, pp, tp), ('dp', 'pp', 'tp')) gives this rank's coordinates "
           "(mesh.get_local_rank('pp'), ...) and groups (mesh['tp'].get_group(), mesh['dp'].get_group()); the ranks "
           "of its pipeline are dist.get_process_group_ranks(mesh['pp'].get_group()): send to the next of them, "
           "receive from the previous.",
           "Take rows d of tokens and targets (chunk(dp)[d]), cut them into m micro-batches, and run your 1F1B of "
           "notebook 05 over them: forward(j) is stage(dist, tp_group, x) with x the tokens on the first stage and "
           "the received (b, s, h) float64 activations elsewhere (x.requires_grad_()); the last stage's loss is "
           "stage.loss(out, targets_j) / m.",
           "After the last backward of a step, average every gradient over the DP group (ReduceOp.AVG, "
           "group=dp_group), then p -= lr * p.grad and clear it. Repeat for `steps` steps; return the stage."],
    min_world_size=4, min_world_size_reason="a pipeline of 2 stages with 2 ranks on another axis",
    describe="One training step of a tiny GPT on a (dp, pp, tp) mesh: 1F1B over PP, Megatron TP inside each stage, "
             "gradients averaged over DP; several steps.")


# ---- 5. memory per GPU of a plan ---------------------------------------------------------------------------------
# A prediction: derived from lib.formulas (notebooks 01, 03 and 05) and the model's parameter counts, not looked up in
# lib.planner's estimator, which holds the answer, or in what calls it.
PLANNER_ANSWERS = {"lib.planner's estimator": "lib.planner.estimate",
                   "lib.planner's search": "lib.planner.search", "lib.planner's published runs": "lib.planner.runs",
                   "lib.planner's measurement": "lib.planner.measured", "lib.viz.planner": "lib.viz.planner"}
PLANNER_ADVICE = ("add the terms up yourself: lib.formulas' model_state_bytes (or model_state_breakdown), "
                  "activation_bytes_per_layer and first_stage_in_flight, with model.layer_params, "
                  "model.embedding_params and model.head_params")
GATHERED = 3                  # ZeRO-3's extra blocks of 16-bit states: two gathered weights, one block's gradients


def _first_stage_bytes(model, plan: Plan, *, blocks: str = "stage", zero3_blocks: bool = True, in_flight: str = "1f1b",
                      sharding: str = "zero", recompute: str = "plan", sequence_parallel: str = "plan") -> float:
    """Notebook 06's statement of a first-stage GPU's bytes, with knobs for the classic mistakes (PLAN_MISTAKES).
    Left alone it is lib.planner.memory_breakdown's sum: the case builder holds the two together."""
    counted = model.layers if blocks == "all" else model.layers // plan.pp
    ends = model.embedding_params + (model.head_params if plan.pp == 1 else 0)
    params = (counted * model.layer_params + ends) / plan.tp
    stage = {"zero": plan.zero, "always": 3, "never": 0}[sharding]   # "always": every state over dp, whatever ZeRO
    states = sum(model_state_breakdown(params, dp=plan.dp, zero_stage=stage).values())
    extra = GATHERED * 2 * model.layer_params / plan.tp if zero3_blocks and plan.zero == 3 else 0.0
    sp = {"plan": plan.sequence_parallel, "never": False, "always": True}[sequence_parallel]
    kept = activation_bytes_per_layer(model.seq, plan.micro_batch, model.hidden, model.heads, t=plan.tp,
                                      sequence_parallel=sp,
                                      recompute=plan.recompute if recompute == "plan" else recompute)
    micro_batches = {"1f1b": first_stage_in_flight(plan.pp, plan.micro_batches), "one": 1,
                     "all": plan.micro_batches}[in_flight]
    return states + extra + counted * kept * micro_batches


def _plan_mistake(message: str, **knobs) -> Mistake:
    def mistaken(model, plan):
        return _first_stage_bytes(model, plan, **knobs)
    return Mistake(mistaken, message)


PLAN_MISTAKES = [
    _plan_mistake("leaving out ZeRO-3's extras gives: with zero=3 a GPU also holds the gathered 16-bit weights of "
                  "two blocks (the one computing, the one prefetched) and one block's 16-bit gradients until they are "
                  "reduce-scattered.", zero3_blocks=False),
    _plan_mistake("counting all the model's layers gives: a GPU of the first stage holds layers / pp blocks (and their "
                  "activations), not the whole model.", blocks="all"),
    _plan_mistake("keeping one micro-batch's activations gives: under 1F1B the first stage holds min(pp, m) "
                  "micro-batches in flight at its peak (first_stage_in_flight, notebook 05).", in_flight="one"),
    _plan_mistake("keeping all m micro-batches' activations gives: that is GPipe; 1F1B's first stage holds min(pp, m) "
                  "(first_stage_in_flight, notebook 05).", in_flight="all"),
    _plan_mistake("dividing every model state by dp whatever the ZeRO stage gives: ZeRO-0 keeps whole copies on each "
                  "data-parallel rank, ZeRO-1 shards the optimizer's 12 bytes, ZeRO-2 the gradients too, only ZeRO-3 "
                  "the weights (notebook 03).", sharding="always"),
    _plan_mistake("ignoring ZeRO gives: each data-parallel rank keeps whole copies of its 16 bytes a parameter only "
                  "with zero=0; ZeRO-1 shards the optimizer's 12 over dp, ZeRO-2 the gradients' 2 too, ZeRO-3 the "
                  "weights' 2 too (model_state_bytes, notebook 03).", sharding="never"),
    _plan_mistake("ignoring recomputation gives: the activations are those of recompute='none'; selective drops "
                  "the 5as/(ht) attention term, full keeps only each block's input (Korthikanti et al. 2022).",
                  recompute="none"),
    _plan_mistake("ignoring sequence parallelism gives: with it, the layer norms' and dropouts' 10sbh that tensor "
                  "parallelism leaves whole on every TP rank are split along the sequence too, sbh(34/t + 5as/(ht)) "
                  "(Korthikanti et al. 2022).", sequence_parallel="never"),
    _plan_mistake("dividing every activation by tp gives: without sequence parallelism the layer norms' and dropouts' "
                  "10sbh stay whole on every TP rank, sbh(10 + 24/t + 5as/(ht)) (Korthikanti et al. 2022); only "
                  "sequence parallelism splits them too.", sequence_parallel="always"),
]


def _micro_batches(rng: random.Random, stages: int, more: bool) -> int:
    """m: at most pp (1F1B holds m) or more than pp (it holds pp); at least 2 so that one micro-batch is wrong."""
    return stages + rng.randint(1, 8) if more else rng.randint(2, max(2, stages))


def _measured_memory_case(rng: random.Random, _world: int, pp: tuple, zero: tuple, recompute: tuple,
                          more_micro_batches: bool) -> Case:
    """A tiny GPT whose first stage is built and measured (lib.planner.measured): its parameters counted in
    lib.models' bf16 modules, its activations as autograd keeps them under the plan's recomputation, the
    micro-batches in flight as 1F1B plays; one GPU of a stage (tp = 1), lib.models' block having no TP."""
    from lib.planner import Model
    from lib.planner.measured import measured_first_stage

    stages, heads = rng.choice(pp), rng.choice([2, 4])
    model = Model(layers=stages * rng.randint(1, 2), hidden=heads * rng.choice([8, 16]), heads=heads,
                  seq=rng.choice([8, 16, 32]), vocab=rng.choice([32, 64]), tied=rng.random() < 0.5)
    dp, micro_batch, m = rng.choice([2, 4]), rng.choice([1, 2]), _micro_batches(rng, stages, more_micro_batches)
    plan = Plan(pp=stages, dp=dp, global_batch=dp * micro_batch * m, micro_batch=micro_batch, zero=rng.choice(zero),
                recompute=rng.choice(recompute))
    stage = measured_first_stage(model, plan, seed=rng.randrange(2**31))
    return Case(1, (model, plan), [sum(stage.memory.values())],
                f"a tiny GPT of {model.layers} layers, hidden {model.hidden}, {heads} heads, s={model.seq}, vocab "
                f"{model.vocab}, {'tied' if model.tied else 'untied'}; {plan}, m={plan.micro_batches}; its first stage "
                f"measured: {stage.params:,} parameters in its modules, {fmt_bytes(stage.saved_per_micro_batch)} kept "
                f"by autograd per micro-batch in its bf16 blocks (LayerNorm's {fmt_bytes(stage.norm_statistics)} of "
                f"statistics left out), {stage.in_flight} micro-batches in flight under 1F1B")


def _planner_model(rng: random.Random, layers: int):
    """A random GPT or Llama-style shape of `layers` blocks, up to GPT-3's width: real sizes, no named model."""
    from lib.planner import Model

    heads = rng.choice([8, 16, 24, 32, 40, 48, 64, 96])
    llama = rng.random() < 0.5
    return Model(layers=layers, hidden=heads * rng.choice([64, 128]), heads=heads,
                 seq=rng.choice([1024, 2048, 4096, 8192]),
                 vocab=rng.choice([32000, 50257, 51200, 128256]) + rng.randrange(0, 1024, 64),
                 kv_heads=rng.choice([h for h in (1, 2, 4, 8, heads) if heads % h == 0]) if llama else None,
                 block="llama" if llama else "gpt", tied=rng.random() < 0.5)


def _memory_case(rng: random.Random, world: int, pp: tuple = (1,), zero: tuple = (0, 1, 2, 3),
                 recompute: tuple = ("none", "selective", "full"), more_micro_batches: bool = False,
                 sequence_parallel: Optional[bool] = None, measured: bool = False) -> Case:
    if measured:
        return _measured_memory_case(rng, world, pp, zero, recompute, more_micro_batches)
    from lib.planner import Cluster, H100_80GB, check, memory_breakdown

    stages = rng.choice(pp)
    model = _planner_model(rng, layers=stages * rng.randint(1 if stages > 1 else 2, 96 // stages))
    # With sequence_parallel given, tensor parallelism is real (tp > 1), so that its terms are the lesson.
    tp = rng.choice([t for t in (1, 2, 4, 8) if model.heads % t == 0 and (sequence_parallel is None or t > 1)])
    sp = tp > 1 and rng.random() < 0.5 if sequence_parallel is None else sequence_parallel
    dp, micro_batch = rng.choice([2, 4, 8, 16, 64]), rng.choice([1, 2, 4])
    m = _micro_batches(rng, stages, more_micro_batches)
    plan = Plan(tp=tp, pp=stages, dp=dp, global_batch=dp * micro_batch * m, micro_batch=micro_batch,
                zero=rng.choice(zero), recompute=rng.choice(recompute), sequence_parallel=sp)
    check(model, Cluster(gpu=H100_80GB, gpus=plan.gpus), plan)
    expected = sum(memory_breakdown(model, plan).values())
    assert abs(_first_stage_bytes(model, plan) - expected) <= 1e-12 * expected, "the statement and lib.planner differ"
    kv = f" ({model.kv_heads} key/value heads)" if model.kv_heads else ""
    return Case(1, (model, plan), [expected],
                f"a {model.block} of {model.layers} layers, hidden {model.hidden}, {model.heads} heads{kv}, "
                f"s={model.seq}, vocab {model.vocab}, {'tied' if model.tied else 'untied'}; {plan}, global batch "
                f"{plan.global_batch} (m={plan.micro_batches})")


plan_memory = Puzzle(
    "plan_memory", NOTEBOOK, _memory_case, world_sizes=(1,) * 5, takes_dist=False, rtol=1e-9, atol=0,
    off_limits=PLANNER_ANSWERS, off_limits_advice=PLANNER_ADVICE, real_cell=False, mistakes=PLAN_MISTAKES,
    # Each seed, two tiny GPTs measured: a pipeline holding pp micro-batches, with ZeRO-1 or 3, without or with
    # selective recomputation; one holding m, ZeRO-0 or 2, full recomputation. Then three at real sizes, against
    # the formulas: ZeRO-3 on a pipeline, sequence parallel, no recomputation; pp=1 (the head on the first stage),
    # TP without sequence parallelism, ZeRO-1 or 2, selective; ZeRO-0, full, more micro-batches than stages.
    variants=[{"measured": True, "pp": (2, 4), "zero": (1, 3), "recompute": ("none", "selective"),
               "more_micro_batches": True},
              {"measured": True, "pp": (2, 4), "zero": (0, 2), "recompute": ("full",)},
              {"pp": (2, 4, 8), "zero": (3,), "recompute": ("none",), "sequence_parallel": True},
              {"pp": (1,), "zero": (1, 2), "recompute": ("selective",), "sequence_parallel": False},
              {"pp": (2, 4), "zero": (0,), "recompute": ("full",), "more_micro_batches": True}],
    hints=["Three terms. The first stage's parameters: layers // pp blocks of model.layer_params, the embedding "
           "(model.embedding_params) and, when pp = 1, the head (model.head_params); all of it over tp. Their model "
           "states: model_state_bytes(params, dp=plan.dp, zero_stage=plan.zero), 16 bytes a parameter before ZeRO.",
           "With zero=3, add 3 × 2 × model.layer_params / tp bytes: two blocks' gathered 16-bit weights and one "
           "block's 16-bit gradients. Activations: (layers // pp) × activation_bytes_per_layer(model.seq, "
           "plan.micro_batch, model.hidden, model.heads, t=plan.tp, sequence_parallel=..., recompute=...).",
           "Multiply the activations by the micro-batches in flight on the first stage under 1F1B: "
           "first_stage_in_flight(plan.pp, plan.micro_batches), min(pp, m)."],
    describe="Peak bytes on a GPU of the first pipeline stage of a plan, as lib.planner's memory model counts them "
             "and a built stage measures them.")


# ---- 6. choosing a plan ------------------------------------------------------------------------------------------
class PlanWrong(PuzzleError):
    """choose_plan returned something that is not a plan of the space asked for."""


def plan_summary(fn: Callable, dist, model, cluster, global_batch: int) -> dict:
    """Run the learner's search, then judge its plan with the course's estimator: does it fit, how fast is it."""
    plan = fn(model, cluster, global_batch)
    if not isinstance(plan, Plan):
        raise PlanWrong(f"choose_plan should return a lib.planner.Plan, got {type(plan).__name__}.")
    if plan.virtual_stages != 1 or plan.cp != 1 or plan.sequence_parallel or plan.embedding_as_layer:
        raise PlanWrong(f"{plan}: the space is tp, pp, dp, zero, micro_batch and recompute; leave the other fields "
                        "of Plan at their defaults (virtual_stages=1, cp=1, no sequence parallelism).")
    e = estimate(model, cluster, plan)            # PlanError, saying why, for a plan that does not split
    return {"fits": e.fits, "tokens per second": e.tokens_per_second}


RANKED_BY_HFU = ("ranking the plans by HFU gives: HFU counts the FLOPs of recomputation, which train nothing, so a "
                 "plan that recomputes every forward can have the highest HFU and still train fewer tokens per second. "
                 "Rank by tokens per second (for one model and batch, the same order as MFU).")


RECOMPUTE_PAYS = 1e-3         # the highest-HFU plan trains at least this much slower than the fastest, relatively


def _plan_case(rng: random.Random, n: int, long: bool = False, short: bool = False) -> Case:
    from lib.planner import A100_80GB, H100_80GB, Cluster, Model, PlanError
    from lib.planner.search import fitting_plans, top

    mistakes: tuple = ()
    while True:                                   # a model, cluster and batch where some plan fits
        if short:                                 # 1K tokens, 15B to 52B parameters: recomputing all hides DP
            heads = rng.choice([40, 48, 64])
            model = Model(layers=rng.choice([48, 64]), hidden=heads * 128, heads=heads, seq=1024,
                          vocab=rng.choice([32000, 50304]))
            cluster = Cluster(gpu=rng.choice([A100_80GB, H100_80GB]), gpus=rng.choice([16, 32]), gpus_per_node=8)
            batch = rng.choice([16, 32])
        else:
            heads = rng.choice([48, 64] if long else [32, 40, 48, 64])     # 3B to 40B parameters: memory decides
            model = Model(layers=rng.choice([40, 48] if long else [24, 32, 40, 48]), hidden=heads * 128, heads=heads,
                          seq=8192 if long else rng.choice([4096, 8192]), vocab=rng.choice([32000, 50304]))
            cluster = Cluster(gpu=A100_80GB if long else rng.choice([A100_80GB, H100_80GB]),
                              gpus=8 if long else rng.choice([8, 16]), gpus_per_node=8)
            batch = rng.choice([32, 64])
        try:
            fitting = fitting_plans(model, cluster, batch, virtual_stages=[1])
        except PlanError:
            continue
        best = top(fitting)
        if not short:
            break
        # The short case keeps a draw where the plan of highest HFU is not the fastest: ranking by it then fails.
        by_hfu = top(fitting, "hfu")
        if by_hfu.tokens_per_second < (1 - RECOMPUTE_PAYS) * best.tokens_per_second:
            # Named as the case's own mistake: lib.planner's search, which it needs, is refused inside the check.
            mistakes = (Mistake(lambda model, cluster, global_batch, plan=by_hfu.plan: plan, RANKED_BY_HFU),)
            break
    expected = {"fits": True, "tokens per second": best.tokens_per_second}
    return Case(n, (model, cluster, batch), [expected],
                f"{model.layers} layers, hidden {model.hidden}, {heads} heads, s={model.seq} on "
                f"{cluster.gpus} × {cluster.gpu.name}, batch {batch}"
                + (": here the plan of highest HFU is not the fastest" if short else ""), mistakes=mistakes)


choose_plan = Puzzle(
    "choose_plan", NOTEBOOK, _plan_case, world_sizes=(1, 1, 1), takes_dist=False, rtol=1e-9, atol=0,
    # 8K tokens on 8 A100s, where activations decide what fits; 1K tokens, where HFU and throughput disagree
    variants=[{"long": True}, {"short": True}],
    hints=["Loop over every tp dividing cluster.gpus_per_node, every pp dividing model.layers, dp = cluster.gpus "
           "// (tp·pp) (skip when it does not fill the cluster or divide the batch), every zero in 0..3, every "
           "micro_batch dividing global_batch // dp and every recompute in ('none', 'selective', 'full').",
           "Build Plan(tp=..., pp=..., dp=..., global_batch=..., micro_batch=..., zero=..., recompute=...); "
           "estimate() raises PlanError for one that does not split (skip it). Keep the plans with e.fits.",
           "Among those, return the plan with the highest e.tokens_per_second (for one model and cluster, the highest "
           "MFU: the same model FLOPs per token). Not HFU: it counts recomputed FLOPs, which train nothing."],
    harness=plan_summary, describe="The fastest plan that fits, by brute force with the course's estimator.")
PUZZLES = [mesh_coordinates, process_groups, tp_dp_train, train_3d, plan_memory, choose_plan]
