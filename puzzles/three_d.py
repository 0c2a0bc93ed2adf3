"""Notebook 06, 3D parallelism: the puzzles, their inputs, references and budgets.

Ranks sit on a (dp, pp, tp) mesh with TP innermost: rank = (d·pp + p)·tp + t, so a TP group is consecutive ranks
(one node) and PP and DP groups cross nodes. The composed steps are checked against single-device training in
float64, and their traffic per axis against the formulas of notebooks 02 (ring all-reduce), 04 (Megatron's f and g)
and 05 (one activation forward and one gradient back per micro-batch and boundary). A plan's memory per GPU is
a prediction: checked against the first stage of tiny GPTs built from lib.models and measured (lib.planner.measured),
then against lib.analytic.formulas' terms at real sizes, lib.planner's estimator and measurement out of reach. The
plan search
is checked against lib.planner's brute force on randomised models and clusters, judged by what lib.planner.estimate
says of the plan returned; one case is drawn where ranking by HFU picks another plan.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import random
from typing import Callable, Optional

import numpy
import torch
import torch.nn.functional as F

from lib.checker.puzzle import Budget, Case, Puzzle, flops_budgets, nothing_on_the_host
from lib.checker.contract import in_flight_at_most
from lib.device import device
from lib.real.backends import device_mesh
from lib.diagnose import Mistake
from lib.errors import PuzzleError
from lib.notebook.warm_up import import_ahead
from lib.analytic.formulas import activation_bytes_per_layer, first_stage_in_flight, model_state_breakdown
from lib.checker.measure import WithoutPeers, counted_flops, counted_work, saved_activation_bytes
from lib.checker.mesh import ArithmeticPuzzle, AxisBudget, MeshCase, MeshPuzzle
from lib.analytic.schedules import peak_in_flight, schedule_orders
from lib.models import GPTConfig
from lib.planner import Plan, estimate
from lib.sim import CostModel, per_rank
from lib.sim.cost import bus_factor
from lib.sim.mesh import answer_key_refused, coordinates
from lib.sim.traffic import MeshAxes
from lib.checker.terms import Expr, Formula, Q, Term, formula, minimum, term
from lib.units import fmt_bytes, fmt_time

from puzzles.parallel_gpt import GPTStage, shard_gpt, tiny_gpt, tp_copy, tp_reduce
from puzzles.replicas import drifted

import_ahead("checkpoint", "explicit_gradient")   # plan_memory measures under checkpoint; a stage gets a gradient

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
    return Case(n, (shape,), [coordinates(r, shape) for r in range(n)], f"a mesh of shape {shape}",
                explain=functools.partial(_coordinates_explained, shape))


def _strides(shape: tuple[int, ...]) -> list[int]:
    """How many ranks apart two neighbours along each axis are: the product of the sizes after it."""
    return [math.prod(shape[i + 1:]) for i in range(len(shape))]


def _coordinates_explained(shape: tuple[int, ...], expected: list, got: list) -> Optional[str]:
    """What rule the learner's coordinates follow, read off every rank's answer: the right coordinates listed
    innermost first, a coordinate outside its axis's range (a division without its % size), or an axis read with
    another stride than the product of the sizes after it."""
    if not all(isinstance(g, (tuple, list)) and len(g) == len(shape) and all(isinstance(c, int) for c in g)
               for g in got):
        return None
    ranks = range(len(got))
    if all(tuple(g) == tuple(e)[::-1] for g, e in zip(got, expected)):
        if len(set(shape)) == 1:          # on a mesh of equal sides the two mistakes give the same coordinates
            return ("Diagnosis: every rank's coordinates are the right ones in reverse order. Either they are listed "
                    "innermost-first (divmod peels the last axis off first: reverse them), or the mesh was read "
                    "column-major, the first axis varying fastest (the last axis must vary fastest, as DeviceMesh "
                    "numbers ranks). On this mesh of equal sides the two look alike.")
        return ("Diagnosis: every rank's coordinates are the right ones listed innermost-first (the order reversed): "
                "divmod peels the last axis off first, so the coordinates it yields come out innermost first; "
                "reverse them to return the outermost axis first.")
    said = []
    for i, (size, stride) in enumerate(zip(shape, _strides(shape))):
        values = [g[i] for g in got]
        if values == [e[i] for e in expected]:
            continue
        outside = next((r for r in ranks if not 0 <= values[r] < size), None)
        if outside is not None:
            floor = f" = rank // {stride}, the modulo (% {size}) left out" if all(
                values[r] == r // stride for r in ranks) else ""
            said.append(f"axis {i}'s coordinate on rank {outside} is {values[outside]}{floor}: out of range for an "
                        f"axis of size {size}, whose coordinates are 0 to {size - 1}")
            continue
        other = next((s for s in range(1, len(got) + 1) if all(values[r] == r // s % size for r in ranks)), None)
        if other is not None:
            said.append(f"axis {i}'s coordinate is rank // {other} % {size}: a stride of {other} where neighbours "
                        f"along axis {i} are {_apart(stride)} (the product of the sizes after it)")
    return f"Diagnosis: {'; '.join(said[:2])}." if said else None


def _apart(stride: int) -> str:
    return f"{stride} rank{'s' * (stride != 1)} apart"


# The lesson is which axis varies fastest: a library's unravel does that arithmetic (numpy's are C functions behind a
# Python dispatcher, which lib.guard.offlimits watches).
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
    rank = dist.get_rank()
    if not isinstance(groups, dict) or set(groups) != set(AXES):
        raise GroupsWrong(f"process_groups should return a dict with keys 'dp', 'pp' and 'tp' (this rank's group "
                          f"along each axis), got {type(groups).__name__}"
                          + (f" with keys {sorted(groups)}" if isinstance(groups, dict) else "") + "."
                          + (_none_kept(rank, (dp, pp, tp), set(AXES) - set(groups)) if isinstance(groups, dict)
                             else ""))
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


AXIS_STRIDES = {"tp": "consecutive ranks", "pp": "ranks tp apart", "dp": "ranks pp·tp apart"}


def _none_kept(rank: int, shape: tuple[int, ...], missing: set[str]) -> str:
    """Why a rank may have no group along an axis, with the group it should have kept."""
    axes = MeshAxes(shape, AXES)
    said = [f"its {axis.upper()} group is {list(axes.group(rank, axis))}, {AXIS_STRIDES[axis]}" for axis in AXES
            if axis in missing]
    return (f" Rank {rank} kept no {' and no '.join(repr(a) for a in AXES if a in missing)} group: it never made one, "
            f"or it is in none of the groups it made along that axis (`if rank in ranks` never held). With rank = "
            f"(d·pp + p)·tp + t, {'; '.join(said)}.")


def _groups_explained(shape: tuple[int, ...], expected: list, got: list) -> Optional[str]:
    """Groups that are those of a mesh with its axes in another order (TP outermost, say): which order."""
    keys = [f"{axis} ranks" for axis in AXES]
    if not all(isinstance(g, dict) and all(isinstance(g.get(k), list) for k in keys) for g in got):
        return None
    for order in itertools.permutations(range(len(AXES))):
        if list(order) == list(range(len(AXES))):
            continue
        axes = MeshAxes(tuple(shape[i] for i in order), tuple(AXES[i] for i in order))
        if all(sorted(g[f"{a} ranks"]) == list(axes.group(r, a)) for r, g in enumerate(got) for a in AXES):
            real = [AXES[i] for i in order if shape[i] > 1]        # an axis of size 1 sits anywhere
            return (f"Diagnosis: every rank's groups are those of a mesh laid out ({' × '.join(real)}), "
                    f"{real[0].upper()} outermost and {real[-1].upper()} innermost: the order of the axes is wrong. "
                    "The course's mesh is (dp, pp, tp), rank = (d·pp + p)·tp + t: TP innermost (consecutive ranks, "
                    "one node), DP outermost.")
    return None


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
    return MeshCase(n, (dp, pp, tp), expected, f"a (dp, pp, tp) = {shape} mesh", axes=axes, axis_budgets=budgets,
                    explain=functools.partial(_groups_explained, shape))


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
DEGREES = {"dp": "dp, the data-parallel degree", "pp": "pp, the pipeline stages",
           "tp": "tp, the tensor-parallel degree", "m": "m, the number of micro-batches"}


def _degrees(**sizes: int) -> dict[str, int]:
    """A case's quantities that a wrong factor may equal, by the names the diagnosis says them with."""
    return {DEGREES[k]: v for k, v in sizes.items()}


MLP_KEYS = ("fc1_w", "fc1_b", "fc2_w", "fc2_b")
MLP_SPLIT = {"fc1_w": 0, "fc1_b": 0, "fc2_w": 1}     # Megatron's MLP: fc1 by rows, fc2 by columns; fc2_b whole


def mlp_forward(weights: dict, x: torch.Tensor, bias_times: int = 1) -> torch.Tensor:
    """The single-device MLP: fc2(gelu(fc1(x))). bias_times: fc2's bias counted that many times in the output, its
    gradient once (what adding it on every TP rank before g's all-reduce computes)."""
    out = F.linear(F.gelu(F.linear(x, weights["fc1_w"], weights["fc1_b"])), weights["fc2_w"], weights["fc2_b"])
    return out if bias_times == 1 else out + (bias_times - 1) * weights["fc2_b"].detach()


def mlp_shard(weights: dict, tp: int, t: int) -> dict:
    """TP rank t's shard of the MLP's weights."""
    return {k: (v.chunk(tp, MLP_SPLIT[k])[t] if k in MLP_SPLIT else v).clone() for k, v in weights.items()}


def train_mlp(weights: dict, batch: torch.Tensor, targets: torch.Tensor, steps: int, lr: float,
              bias_times: int = 1) -> dict:
    """The single-device reference: `steps` SGD steps on the whole batch, loss F.mse_loss."""
    params = {k: v.clone().requires_grad_() for k, v in weights.items()}
    for _ in range(steps):
        F.mse_loss(mlp_forward(params, batch, bias_times), targets).backward()
        with torch.no_grad():
            for p in params.values():
                p -= lr * p.grad
                p.grad = None
    return {k: v.detach() for k, v in params.items()}


def _tp_dp_case(rng: random.Random, n: int, steps: Optional[int] = None) -> MeshCase:
    dp, tp = _shape_of(rng, n, 2, at_least=(2, 2))
    h, rows, drawn, lr = tp * rng.choice([2, 4]), dp * rng.randint(1, 3), rng.randint(2, 3), 0.1
    steps = drawn if steps is None else steps          # the same draws, fewer steps: where a wrong run first leaves
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
    # and each step's average over dp, one division per element of the gradient shard: on a shard of one row the
    # element-wise work is a large part of the step (a flat bucket divided once costs the same divisions)
    _, average = counted_flops(lambda: [g / dp for g in mlp_shard(weights, tp, 0).values()])
    work = flops_budgets(share + steps * average, f"{steps} SGD steps of one shard (1/tp of the MLP's width, fc2_b "
                                                  f"whole) on {rows // dp} rows, {share:,.0f} FLOPs, and {steps} "
                                                  f"averages of its gradients over dp, {average:,.0f} each")
    return MeshCase(n, (weights, batch, targets, dp, tp, steps, lr), expected,
                    f"(dp, tp) = ({dp}, {tp}), h={h}, {rows} rows, {steps} SGD steps", budgets=work, axes=axes,
                    axis_budgets=budgets, factors=_degrees(dp=dp, tp=tp), steps=steps,
                    explain=functools.partial(_tp_dp_explain, weights=weights, axes=axes),
                    mistakes=(Mistake(_bias_counted_tp_times, BIAS_BEFORE_G),))


def _tp_dp_explain(expected: list, got: list, weights: dict, axes: MeshAxes) -> Optional[str]:
    """tp_dp_train's reading: one update applied to every shard (a reduction over the whole world), else which
    group the ranks still agree within (drifted)."""
    return _one_update_everywhere(got, weights, axes) or drifted(expected, got, groups=_groups_of(axes),
                                                                  why=TP_DP_DRIFT, rtol=1e-9, atol=1e-12)


def _one_update_everywhere(got: list, weights: dict, axes: MeshAxes) -> Optional[str]:
    """Whether every rank moved its TP shard by the same amount, though TP peers hold different shards: their
    gradients were reduced together, over the whole world, where only the DP group holds the same shard."""
    tp = axes.shape[axes.names.index("tp")]
    start = [mlp_shard(weights, tp, coordinates(r, axes.shape)[axes.names.index("tp")]) for r in range(len(got))]
    if not all(isinstance(g, dict) and all(isinstance(g.get(k), torch.Tensor) for k in MLP_SPLIT) for g in got):
        return None
    try:
        moved = [{k: got[r][k].detach().double() - start[r][k] for k in MLP_SPLIT} for r in range(len(got))]
    except RuntimeError:                  # a shard of another shape
        return None
    if tp < 2 or not all(torch.allclose(m[k], moved[0][k], rtol=1e-9, atol=1e-12) and bool(m[k].abs().max() > 0)
                         for m in moved for k in MLP_SPLIT):
        return None
    return ("Diagnosis: every rank moved its shards of fc1 and fc2 by the same update, though TP peers hold "
            "different shards (different columns of the MLP): their gradients were reduced together, over the whole "
            "world. Average each gradient over the DP group only (the ranks holding the same shard), "
            "group=mesh['dp'].get_group().")


BIAS_BEFORE_G = ("fc2's bias added on every TP rank before g's all-reduce gives: the sum counts it tp times. Add it "
                 "once, to the reduced output, as Megatron-LM's RowParallelLinear.forward adds its bias after "
                 "reduce_from_tensor_model_parallel_region (megatron/core/tensor_parallel/layers.py at 000c4ac).")


def _bias_counted_tp_times(dist, weights, batch, targets, dp, tp, steps, lr) -> dict:
    """tp_dp_train's result where each TP rank adds fc2's bias before g's sum: the whole MLP trained with the bias
    counted tp times in its output (its gradient once), this rank's shard of it."""
    trained = train_mlp(weights, batch, targets, steps, lr, bias_times=tp)
    return mlp_shard(trained, tp, coordinates(dist.get_rank(), (dp, tp))[1])


def _groups_of(axes: MeshAxes) -> dict[str, list[tuple[int, ...]]]:
    """Every group along each axis of a mesh, by the name a message says it with ("TP group")."""
    return {f"{axis.upper()} group": sorted({axes.group(r, axis) for r in range(axes.world_size)})
            for axis in axes.names}


TP_DP_DRIFT = {
    "TP group": "The gradients were averaged over the TP group, whose ranks hold different shards; the ranks holding "
                "the same shard form the DP group, and only an average over it keeps them equal.",
    "DP group": "TP peers compute one output together: each must take the same rows of the batch (rows d, chosen by "
                "the DP coordinate, not the TP coordinate), and g's all-reduce must give each the whole output before "
                "the loss (without it each trains on its partial sum).",
    "": "Nothing kept the replicas equal: average every gradient over the DP group once per step."}


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
    "tp_dp_train", NOTEBOOK, _tp_dp_case, tools=(tp_copy, tp_reduce), world_sizes=(4, 6, 8), rtol=1e-9, atol=1e-12,
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
        model.loss(tokens, targets).backward()
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


def _three_d_case(rng: random.Random, n: int, steps: Optional[int] = None,
                  shape: Optional[tuple[int, int, int]] = None) -> MeshCase:
    """The check's cases on (2, 2, 2) and (1, 2, 2); with `shape`, one on that mesh (train_3d.at_scale: a cluster's
    proportions), with one head of 4 per TP rank and one sequence per micro-batch, the smallest this case allows."""
    if shape is not None and math.prod(shape) != n:
        raise ValueError(f"a (dp, pp, tp) mesh of {shape} has {math.prod(shape)} ranks, not {n}")
    at_scale = shape is not None
    shape = shape or ((2, 2, 2) if n == 8 else (1, 2, 2))
    dp, pp, tp = shape
    if at_scale:
        heads, vocab, micro = tp, 32, 1
        hidden = 4 * heads
    else:
        heads = tp * rng.choice([1, 2])
        vocab, hidden, micro = rng.choice([32, 64]), heads * rng.choice([8, 16]), rng.randint(1, 2)
    # A micro-batch's stash (about micro · s / h times the stage's gradients) at least 1.5 times those gradients: the
    # memory budget allows a flattened copy of them for the DP average, and GPipe's one more micro-batch in flight
    # on stage 0 must still break it.
    seq = next(s for s in (8, 16, 32, 64, 128) if micro * s >= STASH_OVER_GRADIENTS * hidden)
    cfg = GPTConfig(vocab=vocab, seq=seq, hidden=hidden, heads=heads, layers=pp, tied=False)
    m, lr = pp + 1, 0.1
    steps = 2 if steps is None else steps             # fewer steps: where a wrong run first leaves the reference
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
    # The update may hold one copy of the stage's gradients besides them: the DP all-reduce of every gradient
    # flattened into one buffer, as DDP's buckets do (one parameter's worth rejected that right answer on 1 seed in 10).
    inputs = tokens.nbytes * 2
    memory = [inputs + measured[p][1] + in_flight[p] * measured[p][0] + stage_bytes[r] + 4 * act
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
               f"{in_flight[0]} micro-batches in flight ({fmt_bytes(stash0)} each), a flattened copy of the stage's "
               f"gradients for the DP average ({fmt_bytes(stage_bytes[0])}) and 4 boundary tensors of "
               f"{fmt_bytes(act)}",
               hint="1F1B: stage r runs p-r-1 forwards ahead, then one forward, one backward; free each micro-batch's "
                    "stash when its backward is done.")]
    axis_budgets = [
        AxisBudget("tp", steps * m * blocks * 4 * _ring("all_reduce", act, tp),
                   f"{steps} steps × m={m} micro-batches × {blocks} blocks × 4 all-reduces (g and g forward, f and f "
                   f"backward: notebook 04) of a micro-batch's activations ({fmt_bytes(act)}), 2(tp-1)/tp each",
                   WORLD_OPS, hint="the blocks' f and g all-reduce over the TP group, and nothing else does.",
                   multiples=((dp, steps * m * blocks * 4,
                               f"dp = {dp}, in as many all-reduces as the budget's: each carried dp times a "
                               "micro-batch's activations, so the micro-batches were cut from the whole batch, where "
                               "each DP replica cuts its own rows (tokens.chunk(dp)[d], then .chunk(m))"),)),
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
    pipelines = [axes.group(r, "pp") for r in range(n)]           # each rank's pipeline, stage by stage
    one_f_one_b = in_flight_at_most(
        [min(m, pp - p) for _, p, _ in where],
        [line[line.index(r) + 1] if line.index(r) + 1 < len(line) else None for r, line in enumerate(pipelines)],
        "1F1B keeps p - r micro-batches in flight on stage r (p - r - 1 warm-up forwards, then one forward and one "
        "backward in turn: notebook 05)",
        hint="stage r runs p - r - 1 forwards before its first backward, no more: each one more keeps another "
             "micro-batch's activations alive.")
    return MeshCase(n, (stages, tokens, targets, dp, pp, tp, m, steps, lr), [trained[p][t] for _, p, t in where],
                    f"(dp, pp, tp) = {shape}, {cfg.layers} layers, h={cfg.hidden}, {cfg.heads} heads, s={cfg.seq}, "
                    f"m={m} micro-batches of {micro}, {steps} SGD step{'s' * (steps != 1)}", budgets=budgets,
                    cost=cost, axes=axes, axis_budgets=axis_budgets, scale=SCALE_NOTE,
                    factors=_degrees(dp=dp, pp=pp, tp=tp, m=m), steps=steps, contracts=[one_f_one_b])


TIME_SLACK = 0.1
STASH_OVER_GRADIENTS = 1.5
# The memory budget is 1F1B's stash on the device: activations parked in host memory (saved-tensor hooks that move
# them to lib.host()) would let GPipe's m micro-batches in flight pass it.
ON_DEVICE = nothing_on_the_host("1F1B bounds the activations each stage keeps on its device")


train_3d = MeshPuzzle(
    "train_3d", NOTEBOOK, _three_d_case, tools=(tp_copy, tp_reduce), world_sizes=(8,), rtol=1e-9, atol=1e-12,
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
# A prediction: derived from lib.analytic.formulas (notebooks 01, 03 and 05) and the model's parameter counts, not
# looked up in
# lib.planner's estimator, which holds the answer, or in what calls it.
PLANNER_ANSWERS = {"lib.planner's estimator": "lib.planner.estimate",
                   "lib.planner's search": "lib.planner.search", "lib.planner's published runs": "lib.planner.runs",
                   "lib.planner's measurement": "lib.planner.measured", "lib.viz.planner": "lib.viz.planner"}
PLANNER_ADVICE = ("add the terms up yourself: lib.analytic.formulas' model_state_bytes (or model_state_breakdown), "
                  "activation_bytes_per_layer and first_stage_in_flight, with model.layer_params, "
                  "model.embedding_params and model.head_params")
GATHERED = 3                  # ZeRO-3's extra blocks of 16-bit states: two gathered weights, one block's gradients


def _first_stage_bytes(model, plan: Plan, *, blocks: str = "stage", zero3_blocks: bool = True, in_flight: str = "1f1b",
                      sharding: str = "zero", recompute: str = "plan", sequence_parallel: str = "plan",
                      head: str = "pp = 1", ends_over_tp: bool = True) -> float:
    """Notebook 06's statement of a first-stage GPU's bytes, with knobs for the classic mistakes (PLAN_MISTAKES).
    Left alone it is lib.planner.memory_breakdown's sum: the case builder holds the two together."""
    counted = model.layers if blocks == "all" else model.layers // plan.pp
    ends = model.embedding_params + (model.head_params if plan.pp == 1 or head == "always" else 0)
    params = counted * model.layer_params / plan.tp + ends / (plan.tp if ends_over_tp else 1)
    stage = {"zero": plan.zero, "always": 3, "never": 0}[sharding]   # "always": every state over dp, whatever ZeRO
    states = sum(model_state_breakdown(params, dp=plan.dp, zero_stage=stage).values())
    extra = GATHERED * 2 * model.layer_params / plan.tp if zero3_blocks and plan.zero == 3 else 0.0
    sp = {"plan": plan.sequence_parallel, "never": False, "always": True}[sequence_parallel]
    kept = activation_bytes_per_layer(model.seq, plan.micro_batch, model.hidden, model.heads, t=plan.tp,
                                      sequence_parallel=sp,
                                      recompute=plan.recompute if recompute == "plan" else recompute)
    micro_batches = {"1f1b": first_stage_in_flight(plan.pp, plan.micro_batches), "one": 1,
                     "all": plan.micro_batches, "stages": plan.pp}[in_flight]
    return states + extra + counted * kept * micro_batches


def memory_formula(model, plan: Plan, measured: Optional[float] = None) -> Formula:
    """_first_stage_bytes as named terms (lib.checker.terms), for a wrong prediction to be named by the term it is off
    by.
    `measured`: one micro-batch's activations in the stage's blocks as measured, for the tiny GPTs built."""
    def q(symbol: str, number: float, meaning: str) -> Q:       # a fresh node: a quantity may be left out of one term
        return Q(symbol, number, meaning)

    def degree(axis: str) -> Q:
        return q(axis, getattr(plan, axis), DEGREES[axis].split(", ", 1)[1])

    def blocks() -> Expr:
        return q("L", model.layers, "the layers") // degree("pp")

    layer = q("P", model.layer_params, "a block's parameters")
    params = term("the first stage's blocks (layers // pp × a block's parameters)", blocks() * layer) \
        + term("the embedding's parameters", model.embedding_params)
    if plan.pp == 1:
        params = params + term("the output head's parameters (pp = 1)", model.head_params)
    params = params / degree("tp")

    def sharded(name: str, per_parameter: int, from_stage: int) -> Term:
        return term(f"{name} ({per_parameter} B a parameter)",
                    per_parameter / (degree("dp") if plan.zero >= from_stage else 1))
    # The parameters appear once, times the bytes each state keeps of one: a quantity left out of them (tp) is left
    # out of every state at once, as a learner leaves it out, and named so.
    states = term("the model states", params * (
        sharded("the 16-bit weights", 2, 3) + sharded("the 16-bit gradients", 2, 2)
        + sharded("Adam's fp32 master weights", 4, 1) + sharded("Adam's momentum", 4, 1)
        + sharded("Adam's variance", 4, 1)))
    if plan.zero == 3:
        def block() -> Expr:
            return 2 * q("P", model.layer_params, "a block's parameters") / degree("tp")
        states = states + term("ZeRO-3's two gathered blocks of 16-bit weights (computing, prefetched)", 2 * block()) \
            + term("ZeRO-3's one block of 16-bit gradients (until reduce-scattered)", block())
    in_flight = minimum(degree("pp"), q("m", plan.micro_batches, "the micro-batches"))
    if measured is not None:
        kept = term("one micro-batch's activations in the stage's blocks (measured)", measured)
    else:
        kept = blocks() * _layer_terms(model, plan)
    return formula(states + term("the activations (blocks × a block's × min(pp, m) micro-batches in flight)",
                                 kept * in_flight), "B")


def _layer_terms(model, plan: Plan) -> Expr:
    """One block's activations per micro-batch, Korthikanti et al. 2022 (Table 2), term by term: what
    lib.analytic.formulas.activation_bytes_per_layer sums."""
    sbh = Q("s", model.seq, "the sequence length") * Q("b", plan.micro_batch, "the micro-batch") \
        * Q("h", model.hidden, "the hidden size")
    t = Q("tp", plan.tp, "the tensor-parallel degree")
    sp = plan.sequence_parallel
    if plan.recompute == "full":
        return term("each block's input (2sbh" + ("/t, sharded along the sequence)" if sp else ")"),
                    2 * sbh / (t if sp else 1))
    kept = term("the linear layers' inputs and the MLP's (24sbh/t)", 24 * sbh / t) \
        + term("the norms', dropouts' and residuals' 10sbh" + (" (over t: sequence parallel)" if sp else ""),
               10 * sbh / (t if sp else 1))
    if plan.recompute == "none":
        kept = kept + term("the attention scores (5as²b/t)", 5 * Q("a", model.heads, "the heads")
                           * Q("s", model.seq, "the sequence length") * sbh / (Q("h", model.hidden, "the hidden size")
                                                                              * t))
    return kept


def _formulas(model, plan: Plan, expected: float, measured: Optional[float] = None) -> dict:
    """{"": the formula of the answer}, checked against the answer the case expects."""
    found = memory_formula(model, plan, measured)
    assert abs(found.value - expected) <= 1e-12 * expected, (found.value, expected)
    return {"": found}


def _plan_mistake(message: str, **knobs) -> Mistake:
    def mistaken(model, plan):
        return _first_stage_bytes(model, plan, **knobs)
    return Mistake(mistaken, message)


def _plan_mistakes_alike(message: str, one: dict, other: dict) -> Mistake:
    """Two mistakes that give the same number on this case, as near as the diagnosis tells results apart (only then;
    NaN, which matches nothing, otherwise)."""
    def mistaken(model, plan):
        a, b = _first_stage_bytes(model, plan, **one), _first_stage_bytes(model, plan, **other)
        return a if math.isclose(a, b, rel_tol=1e-4) else float("nan")     # as close as the diagnosis tells apart
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
    _plan_mistake("keeping pp micro-batches' activations gives: with fewer micro-batches than stages the first stage "
                  "holds all m of them, min(pp, m) (first_stage_in_flight, notebook 05).", in_flight="stages"),
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
    # Newer readings last: where one coincides with an older one on a case, the older one is said.
    _plan_mistakes_alike("counting the output head on the first stage, or dividing only the blocks by tp (the "
                         "embedding left whole), gives: the two give the same number here, to 1 part in 10⁴, where "
                         "the head is about the embedding's size and tp = 2. With pp > 1 the head sits on the last "
                         "stage; and tensor parallelism splits the embedding over the vocabulary too. A case with "
                         "tp > 2 or pp = 1 tells them apart.", {"head": "always"}, {"ends_over_tp": False}),
    _plan_mistake("counting the output head on the first stage gives: with pp > 1 the head sits on the last stage, "
                  "so the first stage counts it only when pp = 1 (model.head_params, then over tp like the rest).",
                  head="always"),
    _plan_mistake("dividing only the blocks by tp gives: tensor parallelism splits the embedding (and the head, "
                  "when pp = 1) over the vocabulary too, so all of the first stage's parameters are over tp.",
                  ends_over_tp=False),
]


def _micro_batches(rng: random.Random, stages: int, more: bool) -> int:
    """m: fewer than pp (1F1B holds m, not pp) or more than pp (it holds pp); at least 2 so that one micro-batch is
    wrong. With pp of 1 or 2 and not more, 2 to 4."""
    if more:
        return stages + rng.randint(1, 8)
    return rng.randint(2, stages - 1) if stages > 2 else rng.randint(2, 4)


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
    expected = sum(stage.memory.values())
    return Case(1, (model, plan), [expected],
                f"a tiny GPT of {model.layers} layers, hidden {model.hidden}, {heads} heads, s={model.seq}, vocab "
                f"{model.vocab}, {'tied' if model.tied else 'untied'}; {plan}, m={plan.micro_batches}; its first stage "
                f"measured: {stage.params:,} parameters in its modules, {fmt_bytes(stage.saved_per_micro_batch)} kept "
                f"by autograd per micro-batch in its bf16 blocks (LayerNorm's {fmt_bytes(stage.norm_statistics)} of "
                f"statistics left out), {stage.in_flight} micro-batches in flight under 1F1B",
                formulas=_formulas(model, plan, expected, stage.saved_per_micro_batch))


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
                f"{plan.global_batch} (m={plan.micro_batches})", formulas=_formulas(model, plan, expected))


plan_memory = Puzzle(
    "plan_memory", NOTEBOOK, _memory_case, world_sizes=(1,) * 5, takes_dist=False, rtol=1e-9, atol=0,
    off_limits=PLANNER_ANSWERS, off_limits_advice=PLANNER_ADVICE, real_cell=False, mistakes=PLAN_MISTAKES,
    # Each seed, two tiny GPTs measured: a pipeline holding pp micro-batches, with ZeRO-1 or 3, without or with
    # selective recomputation; one holding m < pp, ZeRO-0 or 2, full recomputation. Then three at real sizes, against
    # the formulas: ZeRO-3 on a pipeline holding m < pp, sequence parallel, no recomputation; pp=1 (the head on the
    # first stage), TP without sequence parallelism, ZeRO-1 or 2, selective; ZeRO-0, full, more micro-batches than
    # stages. The cases holding m < pp have pp of 4 or 8: counting pp in flight passed the seeds drawing m = pp there.
    variants=[{"measured": True, "pp": (2, 4), "zero": (1, 3), "recompute": ("none", "selective"),
               "more_micro_batches": True},
              {"measured": True, "pp": (4,), "zero": (0, 2), "recompute": ("full",)},
              {"pp": (4, 8), "zero": (3,), "recompute": ("none",), "sequence_parallel": True},
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
    return Judged(plan, {"fits": e.fits, "tokens per second": e.tokens_per_second})


class Judged(dict):
    """What plan_summary compares (whether the plan fits, its tokens per second), with the plan itself beside it for
    the diagnosis (an attribute, not an entry: two plans may tie)."""

    def __init__(self, plan: Plan, judged: dict) -> None:
        super().__init__(judged)
        self.plan = plan


SEARCHED = ("micro_batch", "recompute", "zero")        # besides the layout (tp, pp, dp), which changes as one
STEP_PARTS = {"compute": "compute (recomputation included)", "memory_bound": "memory-bound element-wise work",
              "tp": "TP all-reduces", "cp": "CP messages", "pp": "pipeline messages",
              "bubble": "the pipeline bubble ((pp-1)/m of the stage's time: fewer micro-batches, more bubble)",
              "dp": "DP traffic that backward could not hide"}


def _whole_replica_batches_only(model, cluster, plan: Plan, tokens_per_second: float, fastest: Plan) -> bool:
    """Whether `plan` runs each replica's batch as one micro-batch, as the fastest does not, and trains as fast as
    the best plan that does: what a search never splitting the replica batch finds."""
    from lib.planner.search import fitting_plans, top

    if not _whole_batch(plan) or fastest.micro_batch == plan.micro_batch:
        return False
    whole = [f for f in fitting_plans(model, cluster, plan.global_batch, virtual_stages=[1]) if _whole_batch(f.plan)]
    return bool(whole) and abs(top(whole).tokens_per_second - tokens_per_second) <= 1e-9 * tokens_per_second


def _plan_too_big(model, cluster, plan: Plan, fastest: Plan) -> Optional[str]:
    """A plan returned that does not fit: the search kept plans whatever their memory."""
    from lib.planner import PlanError

    try:
        mine, best = estimate(model, cluster, plan), estimate(model, cluster, fastest)
    except PlanError:
        return None
    faster = (" It is faster than the fastest plan that fits, which is why a search ranking every plan by speed picks "
              "it." if mine.tokens_per_second > best.tokens_per_second else "")
    return (f"Diagnosis: the plan you returned, {plan}, does not fit: it needs {mine.memory / 1e9:.1f} GB a GPU, over "
            f"the {cluster.gpu.name}'s {cluster.gpu.memory / 1e9:.0f} GB (estimate(...).fits is False).{faster} Keep "
            "only the plans whose estimate fits (e.fits), then take the fastest of those.")


def _slower_plan(model, cluster, fastest: Plan, expected: list, got: list) -> Optional[str]:
    """A plan that fits but is slower than the fastest: which of its settings differ, where its step loses the time,
    and what each setting of the fastest plan, taken alone, would make of it."""
    import dataclasses

    from lib.planner import PlanError

    plan = getattr(got[0], "plan", None)
    if not isinstance(plan, Plan):
        return None
    if not got[0].get("fits"):
        return _plan_too_big(model, cluster, plan, fastest)
    mine, best = estimate(model, cluster, plan), estimate(model, cluster, fastest)
    changes = [{f: getattr(fastest, f)} for f in SEARCHED if getattr(plan, f) != getattr(fastest, f)]
    layout = {f: getattr(fastest, f) for f in ("tp", "pp", "dp")}
    if any(getattr(plan, f) != v for f, v in layout.items()):
        changes.insert(0, layout)
    differ = ", ".join(", ".join(f"{f}={v!r}" for f, v in c.items()) + " (yours " +
                       ", ".join(f"{getattr(plan, f)!r}" for f in c) + ")" for c in changes)
    lost = sorted(((mine.breakdown.time[k] - best.breakdown.time.get(k, 0.0), k) for k in mine.breakdown.time),
                  reverse=True)
    where = " and ".join(f"{STEP_PARTS.get(k, k)} (+{fmt_time(dt)})" for dt, k in lost[:2] if dt > 0)
    alone = []
    for change in changes:
        try:
            e = estimate(model, cluster, dataclasses.replace(plan, **change))
        except PlanError:
            continue
        said = ", ".join(f"{f}={v!r}" for f, v in change.items())
        alone.append(f"with {said} alone, {e.tokens_per_second:,.0f}" + ("" if e.fits else " (but it does not fit)"))
    if _whole_replica_batches_only(model, cluster, plan, mine.tokens_per_second, fastest):
        whole = plan.global_batch // plan.dp
        differ += (f". Your micro_batch is the whole replica batch (global_batch // dp = {whole}): one micro-batch a "
                   "step, which leaves a pipeline nothing to overlap and holds every sequence's activations at once; "
                   "search every micro_batch dividing global_batch // dp")
    return (f"Diagnosis: a faster plan fits. Yours, {plan}, trains {mine.tokens_per_second:,.0f} tokens/s; the fastest "
            f"that fits, {fastest}, trains {best.tokens_per_second:,.0f}. They differ in {differ}. "
            + (f"Your step takes {fmt_time(mine.step_time - best.step_time)} longer, most of it in {where}. "
               if where else "")
            + (f"Your plan would train: {'; '.join(alone)}." if alone else ""))


RANKED_BY_HFU = ("ranking the plans by HFU gives: HFU counts the FLOPs of recomputation, which train nothing, so a "
                 "plan that recomputes every forward can have the highest HFU and still train fewer tokens per second. "
                 "Rank by tokens per second (for one model and batch, the same order as MFU).")


RECOMPUTE_PAYS = 1e-3         # the highest-HFU plan trains at least this much slower than the fastest, relatively
PLAN_RTOL = 1e-9              # choose_plan's tolerance on tokens per second: a plan slower by more fails
# A search over part of the space: one field left at its simplest value, and what the best plan so found is called.
# (the field's simplest value, the search that fixes it, what to search instead)
PART_OF_THE_SPACE = {
    "micro_batch": (1, "fixing the micro-batch at 1", "every micro_batch dividing global_batch // dp (micro-batches "
                                                      "of several sequences can run the GPU's matmuls faster)"),
    "tp": (1, "leaving tensor parallelism out (tp = 1)", "every tp dividing cluster.gpus_per_node"),
    "pp": (1, "leaving pipeline parallelism out (pp = 1)", "every pp dividing model.layers"),
    "zero": (0, "leaving ZeRO out (zero = 0)", "zero in 0, 1, 2 and 3"),
    "recompute": ("none", "leaving recomputation out", "recompute in 'none', 'selective' and 'full'"),
}


def _part_costs(fitting, looks_at: Callable[[Plan], bool], margin: float = 0.0) -> bool:
    """Whether a search that looks only at the plans `looks_at` keeps finds none that fits, or only plans slower than
    the fastest by more than `margin` (relatively)."""
    from lib.planner.search import top

    kept = [f for f in fitting if looks_at(f.plan)]
    return not kept or top(kept).tokens_per_second < (1 - margin) * top(fitting).tokens_per_second


WHOLE_BATCH = ("never splitting the replica batch (micro_batch = global_batch // dp)",
               "micro_batch among the divisors of global_batch // dp, not only the whole of it")
NEVER_FULL = ("leaving full recomputation out (recompute in 'none' and 'selective' only)",
              "recompute in 'none', 'selective' and 'full' (where activations decide, only 'full' may fit)")


def _whole_batch(plan: Plan) -> bool:
    """Whether `plan` runs each replica's batch as one micro-batch."""
    return plan.micro_batch == plan.global_batch // plan.dp


def _never_full(plan: Plan) -> bool:
    return plan.recompute != "full"


def _partial_searches() -> list[tuple[str, Callable[[Plan], bool], str]]:
    """Each search of part of the space: (its name, whether it looks at a plan, what to search instead): the
    replica batch never split (WHOLE_BATCH), full recomputation never tried (NEVER_FULL), or one field held at its
    simplest value (PART_OF_THE_SPACE)."""
    return [(WHOLE_BATCH[0], _whole_batch, WHOLE_BATCH[1]),
            (NEVER_FULL[0], _never_full, NEVER_FULL[1]),
            *((search, lambda p, f=field, v=value: getattr(p, f) == v, instead)
              for field, (value, search, instead) in PART_OF_THE_SPACE.items())]


def _searches_of_part_of_the_space(fitting, fastest: float) -> tuple:
    """Mistakes naming each search that fixes one field (or never splits the replica batch) and so finds a slower
    plan than the fastest; searches that find the same plan are named together."""
    from lib.planner.search import top

    by_plan: dict = {}
    for search, looks_at, instead in _partial_searches():
        kept = [f for f in fitting if looks_at(f.plan)]
        best = top(kept) if kept else None
        if best is not None and best.tokens_per_second < (1 - PLAN_RTOL) * fastest:     # slower as the check sees it
            by_plan.setdefault(repr(best.plan), (best.plan, []))[1].append((search, instead))
    return tuple(Mistake(lambda model, cluster, global_batch, plan=plan: plan,
                         f"{', or '.join(s for s, _ in found)}, gives: search {'; and '.join(i for _, i in found)}.")
                 for plan, found in by_plan.values())


# The pipelined case's draws, (heads, layers, seq, vocab, gpus, batch) of H100s, where the fastest plan is a pipeline:
# the 13 of the 64 in heads {80, 96} × layers {48, 64} × seq {2K, 4K} × vocab {32000, 50304} × gpus {16, 32} × batch
# {16, 32} (drawing from all 64 and searching until one suits took 5 searches a case on average, 20 at worst).
# tests/test_planner.py searches the 64 again: this list must be exactly the draws that suit.
PIPELINED_DRAWS = (
    (80, 48, 2048, 32000, 16, 16), (80, 48, 2048, 32000, 16, 32), (80, 48, 2048, 50304, 16, 16),
    (80, 48, 2048, 50304, 16, 32), (80, 64, 4096, 32000, 32, 16), (80, 64, 4096, 32000, 32, 32),
    (80, 64, 4096, 50304, 32, 16), (80, 64, 4096, 50304, 32, 32), (96, 48, 4096, 32000, 32, 16),
    (96, 48, 4096, 32000, 32, 32), (96, 48, 4096, 50304, 32, 16), (96, 48, 4096, 50304, 32, 32),
    (96, 64, 2048, 32000, 32, 32))


def leaving_out_costs(fitting, field: str) -> bool:
    """Whether, among the plans that fit, the best with `field` at its simplest value (PART_OF_THE_SPACE) is slower
    than the best, or there is none."""
    return _part_costs(fitting, lambda p: getattr(p, field) == PART_OF_THE_SPACE[field][0], RECOMPUTE_PAYS)


def _plan_case(rng: random.Random, n: int, long: bool = False, short: bool = False, batched: bool = False,
               pipelined: bool = False) -> Case:
    """long: 8K tokens on 8 A100s, where activations decide what fits (drawn again until only full recomputation
    fits, or is fastest: a search leaving 'full' out passed 2 seeds of 3), and heads that tp = 8 does not divide (a
    search that does not skip what estimate refuses fails there); short: 1K tokens, where HFU and throughput
    disagree; batched: 512 tokens on 8 H100s, where a micro-batch of one is slower than the best; pipelined: 50B to
    80B parameters on 16 or 32 H100s, where the fastest plan is a pipeline. (A search fixing the micro-batch at 1, or
    leaving pipelines out, passed every seed whose cases did not draw such a model.) Otherwise 4K or 8K tokens, 3B
    to 40B parameters."""
    from lib.planner import A100_80GB, H100_80GB, Cluster, Model, PlanError
    from lib.planner.search import fitting_plans, top

    mistakes: tuple = ()
    while True:                                   # a model, cluster and batch where some plan fits
        if pipelined:                             # 50B to 80B parameters, 2K or 4K tokens: a pipeline is fastest
            heads, layers, seq, vocab, gpus, batch = rng.choice(PIPELINED_DRAWS)
            model = Model(layers=layers, hidden=heads * 128, heads=heads, seq=seq, vocab=vocab)
            cluster = Cluster(gpu=H100_80GB, gpus=gpus, gpus_per_node=8)
        elif batched:                             # 512 tokens, 2B to 6B parameters: the micro-batch matters
            heads = rng.choice([24, 32])
            model = Model(layers=rng.choice([24, 32]), hidden=heads * 128, heads=heads, seq=512,
                          vocab=rng.choice([32000, 50304]))
            cluster = Cluster(gpu=H100_80GB, gpus=8, gpus_per_node=8)
            batch = rng.choice([32, 64])
        elif short:                               # 1K tokens, 15B to 52B parameters: recomputing all hides DP
            heads = rng.choice([40, 48, 64])
            model = Model(layers=rng.choice([48, 64]), hidden=heads * 128, heads=heads, seq=1024,
                          vocab=rng.choice([32000, 50304]))
            cluster = Cluster(gpu=rng.choice([A100_80GB, H100_80GB]), gpus=rng.choice([16, 32]), gpus_per_node=8)
            batch = rng.choice([16, 32])
        else:
            # 3B to 40B parameters: memory decides. The long case's heads do not split over a whole node (8 does not
            # divide them), so that estimate raises PlanError for tp = 8 and a search must skip such plans.
            heads = rng.choice([36, 44, 52] if long else [32, 40, 48, 64])
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
        if long and not _part_costs(fitting, _never_full, RECOMPUTE_PAYS):    # activations decide: 'full' must fit
            continue
        if batched or pipelined:                  # keep the draw where the field left out makes a slower plan
            if leaving_out_costs(fitting, "micro_batch" if batched else "pp"):
                break
            continue
        if not short:
            break
        # The short case keeps a draw where the plan of highest HFU is not the fastest: ranking by it then fails.
        by_hfu = top(fitting, "hfu")
        if by_hfu.tokens_per_second < (1 - RECOMPUTE_PAYS) * best.tokens_per_second:
            # Named as the case's own mistake: lib.planner's search, which it needs, is refused inside the check.
            mistakes = (Mistake(lambda model, cluster, global_batch, plan=by_hfu.plan: plan, RANKED_BY_HFU),)
            break
    expected = {"fits": True, "tokens per second": best.tokens_per_second}
    mistakes += _searches_of_part_of_the_space(fitting, best.tokens_per_second)
    return Case(n, (model, cluster, batch), [expected],
                f"{model.layers} layers, hidden {model.hidden}, {heads} heads, s={model.seq} on "
                f"{cluster.gpus} × {cluster.gpu.name}, batch {batch}"
                + (": here the plan of highest HFU is not the fastest" if short else "")
                + (": here a micro-batch of one sequence is not the fastest" if batched else "")
                + (": here the fastest plan is a pipeline" if pipelined else ""), mistakes=mistakes,
                explain=functools.partial(_slower_plan, model, cluster, best.plan),
                explain_error=functools.partial(_plan_escaped, model, cluster, batch))


def _plan_escaped(model, cluster, batch: int, error: BaseException) -> Optional[str]:
    """estimate()'s PlanError let out of the search: a plan the model cannot split is one to skip, not an end; or a
    search that kept no plan (max() of nothing), where some fit: which part of the space it searched has none."""
    raised = getattr(error, "exception", None) or error
    if isinstance(raised, ValueError) and "empty" in str(raised):
        return _kept_nothing(model, cluster, batch)
    if isinstance(raised, PlanWrong) and str(raised).endswith("got NoneType."):
        return _kept_nothing(model, cluster, batch, "returned None")
    if type(raised).__name__ != "PlanError":
        return None
    return ("What it means: your search let estimate()'s PlanError out, so one plan this model cannot split ended "
            "the whole search. Some plans of the space do not split a given model (here a tp that does not divide "
            "its heads): call estimate inside try/except PlanError, skip that plan and go on to the next.")


def _kept_nothing(model, cluster, batch: int, how: str = "kept no plan on this case (a max() or min() over "
                                                          "nothing)") -> Optional[str]:
    """What a search that found no plan looked at, where plans fit: every part of the space with none that fits."""
    from lib.planner.search import fitting_plans

    fitting = fitting_plans(model, cluster, batch, virtual_stages=[1])
    if not fitting:
        return None
    empty = [search for search, looks_at, _ in _partial_searches() if not any(looks_at(f.plan) for f in fitting)]
    said = (f" None of them is in the part of the space a search {', or a search '.join(empty)} looks at, so such "
            "a search finds nothing here." if empty else "")
    return (f"What it means: your search {how}, where {len(fitting)} plans fit.{said} Search the whole space the "
            "hints list, and keep every plan whose estimate fits.")


choose_plan = Puzzle(
    "choose_plan", NOTEBOOK, _plan_case, world_sizes=(1, 1, 1, 1), takes_dist=False, rtol=PLAN_RTOL, atol=0,
    variants=[{"long": True}, {"short": True}, {"batched": True}, {"pipelined": True}],
    hints=["Loop over every tp dividing cluster.gpus_per_node, every pp dividing model.layers, dp = cluster.gpus "
           "// (tp·pp) (skip when it does not fill the cluster or divide the batch), every zero in 0..3, every "
           "micro_batch dividing global_batch // dp and every recompute in ('none', 'selective', 'full').",
           "Build Plan(tp=..., pp=..., dp=..., global_batch=..., micro_batch=..., zero=..., recompute=...); "
           "estimate() raises PlanError for one that does not split (skip it). Keep the plans with e.fits.",
           "Among those, return the plan with the highest e.tokens_per_second (for one model and cluster, the highest "
           "MFU: the same model FLOPs per token). Not HFU: it counts recomputed FLOPs, which train nothing."],
    harness=plan_summary, outputs={"['fits']": "whether your plan fits in a GPU's memory",
                                   "['tokens per second']": "your plan's tokens per second"},
    describe="The fastest plan that fits, by brute force with the course's estimator.")
PUZZLES = [mesh_coordinates, process_groups, tp_dp_train, train_3d, plan_memory, choose_plan]
