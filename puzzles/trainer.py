"""Notebook 10, your own trainer: the seams only a composed trainer has (gradient clipping over every shard, the
loss averaged once over ranks and micro-batches, hybrid sharding as the DP axis), as puzzles; the composed trainer's
pieces are the learner's answers to notebooks 02 to 06 (puzzles.composed), checked by puzzles.trainer_check."""

from __future__ import annotations

import random

import functools
import itertools
import math
from typing import Optional

import torch
import torch.nn.functional as F

from lib.checker.mesh import AxisBudget, MeshCase, MeshPuzzle
from lib.checker.puzzle import Budget, Case, Puzzle
from lib.diagnose import Mistake
from lib.sim import per_rank
from lib.sim.cost import bus_factor
from lib.sim.traffic import MeshAxes
from lib.units import fmt_bytes

NOTEBOOK = "10_your_trainer"
PUZZLES: list[Puzzle] = []

# The learner's answers the trainer is made of: puzzle name -> its notebook.
PIECES = {"ring_all_reduce": "02_data_parallel", "zero1_train": "03_zero", "zero2_train": "03_zero",
          "zero3_train": "03_zero",
          "column_parallel_linear": "04_tensor_parallel", "row_parallel_linear": "04_tensor_parallel",
          "megatron_mlp": "04_tensor_parallel", "parallel_attention": "04_tensor_parallel",
          "one_f_one_b": "05_pipeline", "mesh_coordinates": "06_3d_parallelism",
          "plan_memory": "06_3d_parallelism", "reshard_checkpoint": "09_beyond_one_cluster"}
BUILDS_ON = sorted(set(PIECES.values()))        # the notebooks whose saved copies this one reads
SEAMS = ("clip_grad_norm", "mean_loss")          # this notebook's own puzzles, which the trainer also runs
HSDP_SEAM = "hsdp_gradients"                     # and the one it runs as its DP axis when the parts choose HSDP


def seams_of(hsdp: bool) -> tuple[str, ...]:
    """This notebook's puzzles a trainer runs: with HSDP as its DP axis, hsdp_gradients too."""
    return (*SEAMS, HSDP_SEAM) if hsdp else SEAMS


def seam_number(name: str) -> int:
    """A seam's puzzle number in this notebook."""
    return [p.name for p in PUZZLES].index(name) + 1


def _gen(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.randrange(2**31))


def _one_all_reduce(world: int, values: int, what: str) -> Budget:
    nbytes = values * 8
    return Budget("bytes_sent", bus_factor("all_reduce", world) * nbytes,
                  f"one all-reduce of {what} ({nbytes} B), 2(N-1)/N of it per rank",
                  hint="sum what every rank holds in one all-reduce: nothing else needs to travel.")


# ---- 1. clip_grad_norm ------------------------------------------------------------------------------------------
def _clipped(grads: list[list[torch.Tensor]], replicated: list[bool], max_norm: float, tp: int,
             count: int = 1) -> list[list[torch.Tensor]]:
    """Every rank's gradients scaled as one device's clip_grad_norm_ scales the whole model's: TP-replicated ones
    counted `count` times out of tp (1: once, the right norm)."""
    squares = sum(g.pow(2).sum() * (1 if not r else count if rank % tp == 0 else 0)
                  for rank, mine in enumerate(grads) for g, r in zip(mine, replicated))
    coef = max_norm / (squares.sqrt() + 1e-6)
    return [[g * coef if coef < 1 else g.clone() for g in mine] for mine in grads]


def _clip_case(rng: random.Random, world: int, tp: int = 0, scale: float = 0.0) -> Case:
    """A model copy of `world` ranks, TP degree `tp`, clipped to `scale` × its norm (both drawn where 0)."""
    tp = tp if tp and world % tp == 0 else rng.choice([t for t in (1, 2, 4) if world % t == 0])
    gen = _gen(rng)
    shapes = [(rng.randint(2, 6), rng.randint(2, 6)) for _ in range(rng.randint(3, 5))]
    # One replicated gradient and one sharded at least: with every gradient replicated, each rank's own norm is the
    # whole one, and a clip that never all-reduces would pass.
    replicated = [True, False] + [rng.random() < 0.5 for _ in shapes[2:]]
    grads = [[None] * len(shapes) for _ in range(world)]
    for i, (shape, r) in enumerate(zip(shapes, replicated)):
        for rank in range(world):
            same_as = rank - rank % tp if r else rank   # a replicated gradient: the TP group's first rank's values
            grads[rank][i] = grads[same_as][i].clone() if same_as != rank else torch.randn(shape, generator=gen,
                                                                                          dtype=torch.float64)
    norm = float(sum(g.pow(2).sum() for rank, mine in enumerate(grads) for g, r in zip(mine, replicated)
                     if not r or rank % tp == 0).sqrt())
    max_norm = norm * (scale or rng.choice([0.25, 0.5, 2.0]))
    expected = _clipped(grads, replicated, max_norm, tp)
    return Case(world, (per_rank(grads), replicated, max_norm, tp), expected,
                f"{world} ranks of one model copy, tp={tp}, {len(shapes)} gradients, max_norm = "
                f"{max_norm / norm:.2f} × the norm", budgets=[_one_all_reduce(world, 1, "one sum of squares")],
                factors={"the norm of the whole gradient": norm,
                         **({"tp, the TP degree": tp} if tp > 1 else {})},
                mistakes=(Mistake(_clip_counting_every_copy, REPLICAS_COUNTED),),
                explain=functools.partial(_clip_explained, grads, replicated, max_norm, tp))


def _clip_explained(grads: list[list[torch.Tensor]], replicated: list[bool], max_norm: float, tp: int,
                    expected: list, results: list) -> Optional[str]:
    """The coefficient each rank applied, read from its results: one per gradient, one per rank, or one for all,
    whose norm tells how many times each TP group counted its replicated squares; None where nothing fits."""
    coefs = []
    for rank, (mine, got) in enumerate(zip(grads, results)):
        ratios = [(b.double() / a).reshape(-1) for a, b in zip(mine, got)]
        each = [float(r.mean()) for r in ratios]
        if not all(torch.allclose(r, torch.full_like(r, c), rtol=1e-9, atol=0) for r, c in zip(ratios, each)):
            return None
        if any(not math.isclose(c, each[0], rel_tol=1e-9) for c in each):
            return (f"Diagnosis: rank {rank} scaled its gradients by different coefficients "
                    f"({', '.join(f'{c:.4g}' for c in each)}): clipping scales every gradient by one coefficient, "
                    f"max_norm / (norm + 1e-6) of the whole model's norm.")
        coefs.append(each[0])
    if any(not math.isclose(c, coefs[0], rel_tol=1e-9) for c in coefs):
        rank = next(r for r, c in enumerate(coefs) if not math.isclose(c, coefs[0], rel_tol=1e-9))
        return (f"Diagnosis: rank 0 scaled its gradients by {coefs[0]:.4g} and rank {rank} by {coefs[rank]:.4g}: each "
                f"rank clipped by a norm of its own. Sum the squares over every rank of the model copy (one "
                f"all-reduce) so that every rank scales by the same coefficient.")
    sharded = sum(float(g.pow(2).sum()) for mine in grads for g, r in zip(mine, replicated) if not r)
    copies = [sum(float(g.pow(2).sum()) for g, r in zip(grads[first], replicated) if r)
              for first in range(0, len(grads), tp)]
    coef, norm = coefs[0], math.sqrt(sharded + sum(copies))
    due = max_norm / (norm + 1e-6)
    if math.isclose(coef, 1, rel_tol=1e-9):
        return (f"Diagnosis: you left the gradients unscaled, but the whole gradient's norm {norm:.6g} is above "
                f"max_norm {max_norm:.6g}: scale every gradient by max_norm / (norm + 1e-6) = {due:.4g}.")
    used = max_norm / coef - 1e-6
    if math.isclose(used, norm ** 2, rel_tol=1e-6):
        return (f"Diagnosis: you scaled by max_norm / {used:.6g}, the sum of the squares itself: the norm is its "
                f"square root, {norm:.6g}.")
    own = [math.sqrt(sum(float(g.pow(2).sum()) for g, r in zip(mine, replicated) if not r or rank % tp == 0))
           for rank, mine in enumerate(grads)]                 # each rank's own norm, its replicas counted as due
    if len(own) > 1 and math.isclose(used, sum(own), rel_tol=1e-7):
        return (f"Diagnosis: you scaled by max_norm / {used:.6g}, the sum of the ranks' own norms, where the whole "
                f"gradient's norm is {norm:.6g}: norms do not add. All-reduce the sum of squares, then take its "
                f"square root once.")
    if math.isclose(used, norm / math.sqrt(len(grads)), rel_tol=1e-6):
        return (f"Diagnosis: you scaled by max_norm / {used:.6g}, the whole gradient's norm {norm:.6g} over √N = "
                f"√{len(grads)}: your all-reduce averaged the squares (ReduceOp.AVG, or a / N after it), where the "
                f"norm adds them up.")
    if due >= 1:
        return (f"Diagnosis: you scaled every gradient by {coef:.4g}, but max_norm / (norm + 1e-6) = {due:.4g} is not "
                f"below 1: the gradients stay as they are then (torch's clip_grad_norm_ clamps the coefficient to 1).")
    for counts in itertools.product(range(tp + 1), repeat=len(copies)):
        if math.isclose(sharded + sum(k * q for k, q in zip(counts, copies)), used ** 2, rel_tol=1e-7):
            break
    else:
        return None
    if all(k == 1 for k in counts) or all(k == tp for k in counts) and tp > 1:
        return None            # the right count, or every TP rank counting them: the catalogued mistake says so
    said = ", ".join(f"{k} time{'s' * (k != 1)} in the TP group of ranks {g * tp}-{g * tp + tp - 1}"
                     for g, k in enumerate(counts))
    return (f"Diagnosis: you scaled by max_norm / {used:.6g}, the whole gradient's norm being {norm:.6g}: your norm "
            f"counts the TP-replicated gradients' squares {said}, where each TP group holds one copy to count once. "
            f"TP is innermost: the group's first rank is the one with rank % tp == 0.")


REPLICAS_COUNTED = ("a norm that counts each TP-replicated gradient (LayerNorms, the biases added after g, embeddings, "
                    "head) once per TP rank gives: every TP rank holds the same copy, so count it on one of them, as "
                    "Megatron-LM's get_main_grads_for_grad_norm does (param_is_not_tensor_parallel_duplicate).")


def _clip_counting_every_copy(dist, grads, replicated, max_norm, tp):
    squares = sum(g.pow(2).sum() for g in grads).reshape(1)
    dist.all_reduce(squares)
    coef = max_norm / (squares.sqrt() + 1e-6)
    return [g * coef if coef < 1 else g for g in grads]


clip_grad_norm = Puzzle(
    "clip_grad_norm", NOTEBOOK, _clip_case, world_sizes=(2, 4, 8),
    # A norm already small, then two TP groups of 2 (pp = 2) clipped: each group's replicated copy counted once, on
    # its own first rank (one group alone, tp = world, lets "on rank 0 only" pass).
    variants=({"scale": 2.0}, {"tp": 2, "scale": 0.5}),
    hints=["The norm is that of the whole model's gradient as one vector: the square root of the sum of every "
           "gradient's squares, each parameter counted once.",
           "A gradient flagged replicated is the same on every TP rank: add its squares on TP rank 0 only "
           "(dist.get_rank() % tp == 0; TP is innermost). Sum the squares over the ranks with one all_reduce.",
           "Scale every gradient by max_norm / (norm + 1e-6) when that is below 1, in place or not, and return them."],
    rtol=1e-9, atol=1e-12,
    describe="Clip every rank's gradients by the norm of the whole model's gradient, each parameter counted once.")
PUZZLES.append(clip_grad_norm)


# ---- 2. mean_loss -----------------------------------------------------------------------------------------------
def _loss_case(rng: random.Random, world: int) -> Case:
    gen = _gen(rng)
    m = rng.randint(2, 4)
    tokens = [[rng.choice([8, 16, 16, 32]) for _ in range(m)] for _ in range(world)]
    losses = [[torch.rand((), generator=gen, dtype=torch.float64) * 4 + 1 for _ in range(m)] for _ in range(world)]
    total = sum(loss * n for ls, ns in zip(losses, tokens) for loss, n in zip(ls, ns)) / sum(map(sum, tokens))
    return Case(world, (per_rank(losses), per_rank(tokens)), [total] * world,
                f"N={world} DP ranks, m={m} micro-batches of 8 to 32 tokens each",
                budgets=[_one_all_reduce(world, 2, "a loss sum and a token count")],
                factors={"m, the micro-batches": m,        # N, the world size: the DP ranks here, always named
                         "T, the step's tokens over every rank": sum(map(sum, tokens))},
                mistakes=(Mistake(_mean_of_means, MEAN_OF_MEANS),),
                explain=functools.partial(_loss_explained, losses, tokens))


def _loss_explained(losses: list[list[torch.Tensor]], tokens: list[list[int]], expected: list,
                    results: list) -> Optional[str]:
    """What a rank's result is made of: each rank's own token-weighted mean summed or averaged, or the step's
    token-weighted sum over this rank's tokens alone (or N times them); None where none fits."""
    weighted, world = float(sum(loss * n for ls, ns in zip(losses, tokens) for loss, n in zip(ls, ns))), len(tokens)
    for rank, got in enumerate(results):
        if math.isclose(float(got), float(expected[rank]), rel_tol=1e-9):
            continue
        means = [float(sum(loss * n for loss, n in zip(ls, ns))) / sum(ns) for ls, ns in zip(losses, tokens)]
        for value, said in ((sum(means), "sum"), (sum(means) / world, "mean")):
            if math.isclose(float(got), value, rel_tol=1e-9):
                return (f"Diagnosis: rank {rank} returned the {said} of each rank's own token-weighted mean: a rank's "
                        f"mean weighs only its own tokens, and ranks may hold different counts. All-reduce the "
                        f"weighted sum and the token count, then divide once.")
        unweighted, steps_tokens = float(sum(sum(ls) for ls in losses)), sum(map(sum, tokens))
        if math.isclose(float(got), unweighted / steps_tokens, rel_tol=1e-9):
            return (f"Diagnosis: rank {rank} divided the sum of the micro-batches' mean losses by the step's "
                    f"{steps_tokens} tokens: each loss is a mean over its micro-batch, so weigh it by its token count "
                    "(loss × tokens is that micro-batch's sum) before adding.")
        mine, used = sum(tokens[rank]), weighted / float(got)
        for times, said in ((1, f"rank {rank}'s own {mine} tokens"), (world, f"N = {world} × rank {rank}'s own "
                                                                                f"{mine} tokens")):
            if math.isclose(used, times * mine, rel_tol=1e-9):
                return (f"Diagnosis: rank {rank} divided the step's token-weighted loss sum by {said}, where the "
                        f"step's {sum(map(sum, tokens))} tokens over every rank belong: ranks may hold different "
                        f"token counts, so all-reduce the count together with the sum.")
        return None
    return None


MEAN_OF_MEANS = ("the mean of the micro-batches' means gives: a micro-batch of 8 tokens weighs as much as one "
                 "of 32. Weight each micro-batch's mean by its tokens, and divide once by all the tokens.")


def _mean_of_means(dist, losses, tokens):
    total = torch.stack(losses).mean().reshape(1)
    dist.all_reduce(total)
    return total[0] / dist.get_world_size()


mean_loss = Puzzle(
    "mean_loss", NOTEBOOK, _loss_case, world_sizes=(2, 3, 4, 8),
    hints=["The step's loss is the mean over every token of every micro-batch of every DP rank.",
           "Each micro-batch's loss is already a mean over its tokens: multiply it back by its token count, add, "
           "and all-reduce the sum together with the count (one tensor of two numbers).",
           "Return the sum divided by the count: the same 0-d tensor on every rank."],
    rtol=1e-9, atol=1e-12,
    describe="The mean loss per token over every rank and micro-batch, on every rank, by one all-reduce.")
PUZZLES.append(mean_loss)


# ---- 3. hsdp_gradients ------------------------------------------------------------------------------------------
HSDP_AXES = ("replicate", "shard")       # FSDP2's HSDP mesh: (replicate across nodes, shard inside a node)


def hsdp_shards(grad: torch.Tensor, s: int) -> list[torch.Tensor]:
    """A gradient's s shards as FSDP2 cuts a parameter (_chunk_with_empty): torch.chunk along dim 0, empty shards
    (0 rows) where chunk gives fewer than s."""
    chunks = list(torch.chunk(grad, s))
    return chunks + [grad[:0]] * (s - len(chunks))


def _hsdp_case(rng: random.Random, world: int, per_node: Optional[int] = None) -> MeshCase:
    """`nodes` nodes of s ranks each (nodes != s where the world allows, so that a wrong factor names one of them;
    s = per_node where given); gradients whose first dimension s rarely divides, one of them longer than s rows and
    never a multiple of s (a shard padded for the reduce-scatter on every case: an answer keeping the padding passed
    one seed in 30) whose rows have 2 columns or more (a cut of the flattened elements passed where every gradient
    was 1-D), and from s = 3 on its torch.chunk sizes are not torch.tensor_split's (a cut by tensor_split passed
    wherever s = 2)."""
    pairs = [(r, world // r) for r in range(2, world) if world % r == 0] or [(1, world)]   # a prime world: one node
    nodes, s = ((world // per_node, per_node) if per_node else
                rng.choice([p for p in pairs if p[0] != p[1]] or pairs))
    gen = _gen(rng)
    first = rng.choice([r for r in range(s + 1, 3 * s) if r % s and (s < 3 or r % s != s - 1)])
    shapes = [(first, rng.randint(2, 4))]           # rows of 2 or more: a cut of the flattened elements shows
    shapes += [(rng.randint(1, 3 * s),) + ((rng.randint(1, 4),) if rng.random() < 0.7 else ())
               for _ in range(rng.randint(1, 3))]
    grads = [[torch.randn(shape, generator=gen, dtype=torch.float64) for shape in shapes] for _ in range(world)]
    mean = [sum(g[j] for g in grads) / world for j in range(len(shapes))]
    expected = [[hsdp_shards(m, s)[rank % s] for m in mean] for rank in range(world)]
    shard = sum(math.ceil(shape[0] / s) * math.prod(shape[1:]) for shape in shapes) * 8     # padded, float64
    whole = sum(math.prod(shape) for shape in shapes) * 8
    axes = MeshAxes((nodes, s), HSDP_AXES)
    budgets = [
        AxisBudget("shard", bus_factor("reduce_scatter", s) * s * shard,
                   f"one reduce-scatter inside the node of the padded gradient (s={s} shards of {fmt_bytes(shard)}): "
                   f"(s-1)/s of its {fmt_bytes(s * shard)}",
                   hint="reduce-scatter the whole padded gradient inside the node once; nothing else travels there."),
        AxisBudget("replicate", bus_factor("all_reduce", nodes) * shard,
                   f"one all-reduce across {nodes} nodes of this rank's shard ({fmt_bytes(shard)}, 1/s of the "
                   f"padded gradient), 2(n-1)/n of it",
                   hint="across nodes only the shard travels, reduce-scattered inside the node first, then "
                        "all-reduced once over the replicate group: a ring all-reduce moves 2(n-1)/n of it, where "
                        "passing the whole shard around the n nodes moves n-1 shards.")]
    return MeshCase(world, (per_rank(grads), nodes), expected,
                    f"{nodes} nodes × {s} ranks, {len(shapes)} gradients of {fmt_bytes(whole)} on each rank",
                    axes=axes, axis_budgets=budgets, factors={"n, the nodes": nodes, "s, the ranks per node": s},
                    explain=functools.partial(_hsdp_explained, nodes, s, grads),
                    within="across nodes a rank talks only to the ranks with its shard index (its replicate group), "
                           "inside a node only to its node (its shard group)")


def _same_values(mine: list, want: list) -> bool:
    return len(mine) == len(want) and all(a.shape == b.shape and torch.allclose(a.double(), b, rtol=1e-9, atol=1e-12)
                                          for a, b in zip(mine, want))


def _hsdp_explained(nodes: int, s: int, grads: list[list[torch.Tensor]], expected: list,
                    results: list) -> Optional[str]:
    """Where each rank's shards came from: their shapes (rows cut n ways, the padding kept, another shard index, the
    elements cut instead of the rows), then their values (averaged over one group only, or sliced from the gradients
    laid end to end); None when nothing fits."""
    shapes = [tuple(g.shape) for g in grads[0]]
    rows = [shape[0] for shape in shapes]
    for rank, mine in enumerate(results):
        for j, (t, shape) in enumerate(zip(mine, shapes)):
            if tuple(t.shape[1:]) != shape[1:]:
                return (f"Diagnosis: rank {rank} returned gradient {j}'s shard with shape {tuple(t.shape)}, for a "
                        f"gradient of shape {shape}: a shard is rows of the gradient with every other dimension "
                        f"whole (torch.chunk along dim 0), so cut its rows, not its flattened elements.")
    got = [[tuple(t.shape)[0] for t in mine] for mine in results]
    want = [[len(hsdp_shards(torch.empty(d), s)[r % s]) for d in rows] for r in range(len(results))]
    if got != want:
        if got == [[len(hsdp_shards(torch.empty(d), nodes)[r // s]) for d in rows] for r in range(len(results))]:
            return (f"Diagnosis: your shards are each gradient cut {nodes} ways, one per node: the reduce-scatter ran "
                    f"over the replicate group. It belongs inside the node, over the shard group of its s={s} ranks; "
                    f"only the all-reduce of the shard crosses the nodes.")
        c = [math.ceil(d / s) for d in rows]
        if all(g == c for g in got):
            return (f"Diagnosis: every rank returned c = ⌈rows / s⌉ rows of each gradient ({c}), the padding "
                    f"included: drop the rows past the gradient's end (shard i holds rows i·c up to min((i+1)·c, "
                    f"rows); FSDP2 keeps each shard's own size beside its padded one).")
        rank = next(r for r in range(len(got)) if got[r] != want[r])
        if got == [[len(torch.empty(d).tensor_split(s)[r % s]) for d in rows] for r in range(len(results))]:
            return (f"Diagnosis: rank {rank} returned {got[rank]} rows where its shard holds {want[rank]}: your shards "
                    f"have torch.tensor_split's sizes (⌊d / s⌋ or one more each), where FSDP2's are torch.chunk's: "
                    f"c = ⌈d / s⌉ rows each until the gradient's rows run out, as the reduce-scatter's padded "
                    f"blocks of c rows lie.")
        return (f"Diagnosis: rank {rank} returned {got[rank]} rows where its shard holds {want[rank]}: its shard index "
                f"is its place inside its node, rank % s = {rank % s} (mesh.get_local_rank('shard')), and shard i of "
                f"a gradient of d rows holds rows i·c up to min((i+1)·c, d), c = ⌈d / s⌉.")
    world = len(results)

    def shards_of_the_mean(ranks: list[int], i: int) -> list[torch.Tensor]:
        return [hsdp_shards(sum(grads[r][j] for r in ranks) / len(ranks), s)[i] for j in range(len(shapes))]

    for rank, mine in enumerate(results):
        if _same_values(mine, expected[rank]):
            continue
        node, i = divmod(rank, s)
        if _same_values(mine, shards_of_the_mean(list(range(node * s, node * s + s)), i)):
            return (f"Diagnosis: rank {rank}'s shards are the mean over its own node's s={s} ranks only: the "
                    f"gradients of the other {nodes - 1} node(s) never reached them. All-reduce the shard over the "
                    f"replicate group (the ranks of every node with shard index i) after the reduce-scatter.")
        if _same_values(mine, shards_of_the_mean(list(range(i, world, s)), i)):
            return (f"Diagnosis: rank {rank}'s shards are the mean over its replicate group ({nodes} ranks, one per "
                    f"node) only: the other ranks of its node never contributed. Reduce-scatter over the shard group "
                    f"(the s={s} ranks of the node) first.")
        mean = [sum(g[j] for g in grads) / world for j in range(len(shapes))]
        end_to_end = torch.cat([F.pad(m.reshape(m.shape[0], -1), (0, 0, 0, math.ceil(m.shape[0] / s) * s
                                                                   - m.shape[0])).reshape(-1) for m in mean])
        piece = end_to_end.reshape(s, -1)[i].split([math.ceil(d / s) * math.prod(shape[1:])
                                                    for d, shape in zip(rows, shapes)])
        if _same_values(mine, [p.reshape(-1, *shape[1:])[:len(w)] for p, shape, w in zip(piece, shapes, mine)]):
            return (f"Diagnosis: rank {rank}'s shards are its 1/s slice of the padded gradients laid end to end, one "
                    f"gradient after the other: a reduce-scatter hands rank i the i-th 1/s of the flat buffer, so "
                    f"lay it out shard by shard, row block i of every gradient together in slice i.")
        return None
    return None


class _GradientsAsWeights(torch.nn.Module):
    """A module whose parameters' gradients are the given tensors: loss = Σ p · g, so ∂loss/∂p = g."""

    def __init__(self, grads: list[torch.Tensor]) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros_like(g)) for g in grads])

    def forward(self, grads: list[torch.Tensor]) -> torch.Tensor:
        return sum((p * g).sum() for p, g in zip(self.weights, grads))


def _fsdp2_hsdp(dist, grads: list[torch.Tensor], nodes: int) -> list[torch.Tensor]:
    """PyTorch's own HSDP: fully_shard on a 2-D (replicate, shard) mesh, one backward whose gradients are `grads`;
    each parameter's gradient shard (its local DTensor) is this rank's answer."""
    from torch.distributed.fsdp import fully_shard

    from lib.real.backends import device_mesh
    from puzzles.three_d import quiet

    quiet()
    model = _GradientsAsWeights(grads)
    fully_shard(model, mesh=device_mesh(dist, (nodes, dist.get_world_size() // nodes), HSDP_AXES))
    model(grads).backward()
    return [p.grad.to_local() for p in model.weights]


hsdp_gradients = MeshPuzzle(
    "hsdp_gradients", NOTEBOOK, _hsdp_case, world_sizes=(6, 8), min_world_size=4,
    variants=({"per_node": 3},),                # 2 nodes of 3 on every check: chunk's sizes apart from tensor_split's
    min_world_size_reason="HSDP both shards and replicates on 2 nodes of 2 ranks or more",
    hints=["mesh = device_mesh(dist, (nodes, dist.get_world_size() // nodes), ('replicate', 'shard')): "
           "mesh['shard'].get_group() is this rank's node, mesh['replicate'].get_group() the ranks of other nodes "
           "holding the same shard; i = mesh.get_local_rank('shard').",
           "Pad each gradient to a multiple of s rows (F.pad on its flattened rows), flatten, and lay the padded "
           "gradients out shard by shard: row block k of every gradient together, then k+1. One "
           "dist.reduce_scatter_single(out, flat, op=dist.ReduceOp.AVG, group=shard_group) leaves shard i averaged "
           "over the node.",
           "dist.all_reduce(out, op=dist.ReduceOp.AVG, group=replicate_group) averages it over the nodes too; then "
           "cut `out` back into each gradient's shard i, dropping the padding rows."],
    rtol=1e-9, atol=1e-12, oracle=_fsdp2_hsdp,
    oracle_name="FSDP2 (fully_shard on a 2-D (replicate, shard) DeviceMesh)",
    preload=("torch._dynamo", "torch.distributed.fsdp"),
    describe="HSDP: reduce-scatter the gradients inside each node, all-reduce the shard across nodes; "
             "return this rank's shard of the mean gradient.")
PUZZLES.append(hsdp_gradients)
