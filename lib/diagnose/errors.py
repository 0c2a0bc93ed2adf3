"""An error raised inside torch, said in the lesson's terms: which op failed on what shapes, and what that means for
the case (a rank's shard where the whole tensor belongs, a graph cut before backward, a saved tensor changed in
place by a collective).

The replay's tracer (lib.diagnose.origins) keeps the op each rank called last and its inputs' shapes; the case's
own tensors say what those shapes are: a tensor with 1/N of a parameter's elements is that parameter's shard.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from lib.diagnose.leaves import given, mine
from lib.diagnose.origins import replay

# Errors whose cause does not depend on shapes: (words in torch's message, what it means in this course).
_MEANINGS = (
    ("does not require grad and does not have a grad_fn",
     "backward was called on a value cut off from the graph: a .detach(), a torch.no_grad() block, or a tensor that "
     "came through dist (communication carries values, not gradients: an autograd.Function must carry them)"),
    ("backward through the graph a second time",
     "backward ran twice through the same graph: each forward's graph is freed by its backward (recompute the "
     "forward, or keep what the second backward needs)"),
    ("modified by an inplace operation",
     "a tensor autograd saved for backward was changed in place afterwards (a collective writes into its tensor: "
     "communicate a clone, or communicate after backward)"),
    ("Expected all tensors to be on the same device",
     "an op mixed tensors on two devices: put every tensor you make on lib.device() (or the inputs' .device)"),
)


def explain(fn: Callable, case, error: BaseException) -> Optional[str]:
    """A sentence for the error a rank raised inside torch, or None when there is nothing to add."""
    message = str(getattr(error, "exception", None) or error)
    for words, meaning in _MEANINGS:
        if words in message:
            return f"What it means: {meaning}."
    if not _about_shapes(message):
        return None
    rank = getattr(error, "rank", 0)
    _, tracers, _ = replay(fn, case)
    tracer = tracers.get(rank)
    if tracer is None or tracer.last is None:
        return None
    op, shapes, line = tracer.last
    said = f"What it means: {op} failed on inputs of shapes {', '.join(map(str, shapes))}"
    said += f" at {line}" if line else ""
    shard = _shard(shapes, case, rank)
    if shard:
        return f"{said}. {shard}"
    return said + "."


def _about_shapes(message: str) -> bool:
    words = ("must be a matrix", "shapes cannot be multiplied", "size mismatch", "must match the size",
             "is invalid for input of size", "expected", "dimension", "Dimension out of range", "mat1 and mat2")
    return any(w in message for w in words)


def _shard(shapes: list[tuple[int, ...]], case, rank: int) -> Optional[str]:
    """Which input is a 1/N part of one of the case's tensors (a parameter's shard where the whole belongs)."""
    world = case.world_size
    if world < 2:
        return None
    whole = {key or "the input": t for key, t in given(mine(case.args, rank)).items() if t.dim() >= 1}
    for shape in shapes:
        n = int(torch.Size(shape).numel())
        for key, t in whole.items():
            if n and n < t.numel() and n == math.ceil(t.numel() / world):
                return (f"An input of shape {shape} has 1/N of {key}'s {t.numel()} elements (N = {world}): a rank's "
                        f"shard reached an op that needs the whole {tuple(t.shape)} tensor. Gather it first "
                        "(all-gather the shards into the full tensor, as ZeRO-3 and FSDP do before each layer's "
                        "forward and backward), and use the gathered one.")
    return None
