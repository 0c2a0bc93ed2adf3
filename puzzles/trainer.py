"""Notebook 10, your own trainer: the seams only a composed trainer has (gradient clipping over every shard, the
loss averaged once over ranks and micro-batches), as puzzles; the composed trainer's pieces are the learner's answers
to notebooks 02 to 06 (puzzles.composed), checked by puzzles.trainer_check."""

from __future__ import annotations

import random

import torch

from lib.checker.puzzle import Budget, Case, Puzzle
from lib.diagnose import Mistake
from lib.sim import per_rank
from lib.sim.cost import bus_factor

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
                mistakes=(Mistake(_clip_counting_every_copy, REPLICAS_COUNTED),))


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
    variants=({"tp": 2, "scale": 0.5}, {"scale": 2.0}),       # replicas that count, and a norm already small
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
                factors={"N, the DP ranks": world, "m, the micro-batches": m},
                mistakes=(Mistake(_mean_of_means, MEAN_OF_MEANS),))


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
