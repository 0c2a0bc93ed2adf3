"""How the simulated backend combines the ranks' values in a reduction, element by element, as the real backends do.

SUM, PRODUCT and AVG in float16 and bfloat16 round at every addition (NCCL's kernels and gloo's both add two
half-precision values at a time), folded in rank order; a real ring's order depends on the chunk, so the last bit of a
sum over 3 or more ranks may differ from a real run's. MIN and MAX fold in rank order with gloo's comparison
(`b < a ? b : a`): a NaN is kept only where rank 0 holds it, and MIN of 0.0 and -0.0 keeps the lower rank's zero.
Wider floats and integers sum in one pass, which agrees with any order to rounding.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as _td

ReduceOp = _td.ReduceOp
_HALF = (torch.float16, torch.bfloat16)


def _fold(tensors: list[torch.Tensor], step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    acc = tensors[0].detach().clone()
    for t in tensors[1:]:
        acc = step(acc, t.detach())
    return acc


def _sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    if tensors[0].dtype in _HALF:
        return _fold(tensors, torch.add)
    return torch.stack([t.detach() for t in tensors]).sum(0)


def _product(tensors: list[torch.Tensor]) -> torch.Tensor:
    if tensors[0].dtype in _HALF:
        return _fold(tensors, torch.mul)
    return torch.stack([t.detach() for t in tensors]).prod(0)


def _extreme(tensors: list[torch.Tensor], keep_other: Callable) -> torch.Tensor:
    if not tensors[0].is_floating_point():      # no NaN and no signed zero: one pass gives the same
        stacked = torch.stack([t.detach() for t in tensors])
        return stacked.amax(0) if keep_other is torch.gt else stacked.amin(0)
    return _fold(tensors, lambda acc, t: torch.where(keep_other(t, acc), t, acc))


def _average(tensors: list[torch.Tensor]) -> torch.Tensor:
    return _sum(tensors) / len(tensors)


REDUCERS: dict[object, Callable[[list[torch.Tensor]], torch.Tensor]] = {
    ReduceOp.SUM: _sum,
    ReduceOp.PRODUCT: _product,
    ReduceOp.MIN: lambda ts: _extreme(ts, torch.lt),
    ReduceOp.MAX: lambda ts: _extreme(ts, torch.gt),
    ReduceOp.AVG: _average,
}


def reduce_tensors(tensors: list[torch.Tensor], op) -> torch.Tensor:
    """The ranks' `tensors` (in rank order) combined by `op`, as the backend would."""
    return REDUCERS[op](tensors)
