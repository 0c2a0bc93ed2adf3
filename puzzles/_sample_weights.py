"""Which samples a model's gradients hold: the learner's gradients as a weighted sum of the reference's per-sample
gradients (least squares), said micro-batch by micro-batch.

Shared by notebook 01's gradient accumulation and notebook 05's pipeline schedules, whose results are the gradients
of a mean over a batch cut into equal micro-batches. In the reference every sample counts once (weight 1): a
micro-batch missing (its backward never added, or zeroed or overwritten after it), one counted twice, and
micro-batches that are not the batch's m pieces all show as other weights. Every sample at one other weight is a
factor, which lib.diagnose names: nothing is said here then.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from lib.diagnose.leaves import f64

FIT = 1e-7           # a fit's residual, relative to the learner's gradients: float64 reorders sums, nothing more


def flat(grads: Sequence[Optional[torch.Tensor]]) -> Optional[torch.Tensor]:
    """The gradients as one float64 vector; None if one is missing (lib.diagnose names a None gradient)."""
    if not grads or any(not isinstance(g, torch.Tensor) for g in grads):
        return None
    return torch.cat([f64(g).reshape(-1) for g in grads])


def module_grads(module) -> Optional[torch.Tensor]:
    """A returned module's parameter gradients as one vector, or None (not a module, or a gradient missing)."""
    if not isinstance(module, torch.nn.Module):
        return None
    return flat([p.grad for p in module.parameters()])


def vjp(fn: Callable[[], torch.Tensor], params: Sequence[torch.Tensor], grad: Optional[torch.Tensor] = None
        ) -> torch.Tensor:
    """The gradients of fn()'s output (with `grad` flowing into it) with respect to `params`, as one vector."""
    out = fn()
    got = torch.autograd.grad(out, list(params), grad, allow_unused=True)
    return torch.cat([f64(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(got, params)])


def fit(basis: torch.Tensor, got: torch.Tensor) -> Optional[torch.Tensor]:
    """Weights w with w @ basis == got (basis: one row per candidate), or None when no weighted sum of them is it."""
    scale = float(got.norm())
    if scale == 0 or basis.shape[0] >= basis.shape[1]:
        return None
    w = torch.linalg.lstsq(basis.T, got.reshape(-1, 1)).solution.reshape(-1)
    return w if float((w @ basis - got).norm()) <= FIT * scale else None


def _near(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def _ranges(ids: Sequence[int], unit: str) -> str:
    """[0, 1, 2, 5] as 'micro-batches 0-2 and 5'."""
    runs, start = [], None
    for i, j in zip(ids, [*ids[1:], None]):
        start = i if start is None else start
        if j != i + 1:
            runs.append(f"{start}" if start == i else f"{start}-{i}")
            start = None
    plural = len(ids) > 1
    words = runs[0] if len(runs) == 1 else ", ".join(runs[:-1]) + f" and {runs[-1]}"
    return f"{unit}{'es' if plural and unit.endswith('h') else 's' if plural else ''} {words}"


def said(weights: torch.Tensor, groups: int, unit: str = "row", group: str = "micro-batch") -> Optional[str]:
    """What the weights (one per sample, in the batch's order; the batch cut into `groups` equal micro-batches) say
    about the gradients; None when every sample counts the same."""
    w = [0.0 if _near(float(v), 0) else float(v) for v in weights]
    if all(_near(v, w[0]) for v in w):
        return None
    size = len(w) // groups
    per_group = [w[g * size:(g + 1) * size] for g in range(groups)]
    return (_prefix(w, groups, unit) or
            (_by_group([part[0] for part in per_group], group)
             if groups > 1 and all(all(_near(v, part[0]) for v in part) for part in per_group) else None)
            or _by_sample(w, unit))


def _prefix(w: list[float], groups: int, unit: str) -> Optional[str]:
    """The first samples only, all at one weight: micro-batches smaller than the batch's m pieces."""
    used = [i for i, v in enumerate(w) if v != 0]
    if not used or used != list(range(len(used))) or len(used) % groups or not all(_near(w[i], w[0]) for i in used):
        return None
    piece, whole = len(used) // groups, len(w) // groups
    text = (f"the gradients hold the first {len(used)} {unit}s of the batch's {len(w)} only, each at {w[0]:.4g} "
            f"(expected: every {unit} at 1): the {groups} micro-batches hold {piece} {unit}s each, where the batch's "
            f"{groups} pieces hold {whole}")
    if piece == groups:
        text += ": pieces of m rows (tensor.split(m)) where m pieces belong (tensor.chunk(m))"
    return text + "."


def _by_group(w: list[float], group: str) -> str:
    missing = [g for g, v in enumerate(w) if _near(v, 0)]
    once = [g for g, v in enumerate(w) if _near(v, 1)]
    if missing and len(missing) + len(once) == len(w):
        several = len(missing) > 1
        if once == [len(w) - 1]:
            return (f"the gradients hold only the last {group}'s share: {_ranges(missing, group)} "
                    f"{'are' if several else 'is'} gone. Backward adds into .grad by itself; zeroing or replacing "
                    ".grad between micro-batches keeps only the last one.")
        return (f"the gradients lack {_ranges(missing, group)}: {'their' if several else 'its'} share was never "
                "added (a backward or a weight-gradient step that never ran, or .grad zeroed or replaced after it). "
                "Every micro-batch's gradient must be added once.")
    counted = ", ".join(f"{group} {g} at {v:.4g}" for g, v in enumerate(w))
    return (f"the {group}es count unequally in the gradients ({counted}; each should count once, its loss divided "
            "by the number of micro-batches).")


def _by_sample(w: list[float], unit: str) -> str:
    runs, start = [], 0
    for i in range(1, len(w) + 1):
        if i == len(w) or not _near(w[i], w[start]):
            runs.append((start, i - 1, w[start]))
            start = i
    counted = ", ".join(f"{unit}s {a}-{b} at {v:.4g}" if a != b else f"{unit} {a} at {v:.4g}" for a, b, v in runs)
    return f"the gradients hold the batch's {unit}s unequally ({counted}; each should count once)."
