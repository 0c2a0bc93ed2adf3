"""A result as named numbers: every tensor, number, parameter and gradient it holds, by a name a learner reads.

Every part of the diagnosis walks results the same way: a leaf's key is how Python would index it ("['w']",
"[2]", or a module's parameter name, "0.weight" and "0.weight.grad"), and `name` turns a key into words, the
puzzle's own where it names its outputs ("the router logits' gradient" rather than result[2]).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional, Sequence

import torch

from lib.sim import PerRank


def leaves(value: Any, key: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(key, tensor) for every number in a result: tensors, numbers, containers, a module's parameters and
    gradients (named `weight` and `weight.grad`)."""
    if isinstance(value, torch.nn.Module):
        for name, p in value.named_parameters():
            yield f"{key}{name}", p.detach()
            if p.grad is not None:
                yield f"{key}{name}.grad", p.grad.detach()
    elif isinstance(value, torch.Tensor):
        yield key, value.detach()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield key, torch.tensor(float(value), dtype=torch.float64)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from leaves(v, f"{key}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, f"{key}[{k!r}]")


def holes(expected: Any, got: Any, key: str = "") -> Iterator[str]:
    """Keys where `expected` holds a tensor and `got` holds None: a gradient that never arrived, an entry never
    filled. A module's parameter without .grad where the reference's has one counts."""
    if isinstance(expected, torch.nn.Module) and isinstance(got, torch.nn.Module):
        have = dict(got.named_parameters())
        for name, p in expected.named_parameters():
            if p.grad is not None and name in have and have[name].grad is None:
                yield f"{key}{name}.grad"
    elif isinstance(expected, torch.Tensor) and got is None:
        yield key
    elif isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        for i, (e, g) in enumerate(zip(expected, got)):
            yield from holes(e, g, f"{key}[{i}]")
    elif isinstance(expected, dict) and isinstance(got, dict):
        for k, e in expected.items():
            if k in got:
                yield from holes(e, got[k], f"{key}[{k!r}]")


def plain(key: str) -> str:
    """A key without Python's brackets and quotes, for matching a result's entry with an argument's parameter:
    "['0.weight']" and "0.weight" are the same parameter."""
    if key.startswith("[") and key.endswith("]") and key.count("[") == 1:
        return key[1:-1].strip("'\"")
    return key


def name(key: str, outputs: Optional[Mapping[str, str]] = None) -> str:
    """How a learner reads a leaf: the puzzle's name for it where it gives one, else Python's index."""
    outputs = outputs or {}
    if key in outputs:
        return outputs[key]
    grad = key.endswith(".grad") and key[:-len(".grad")] in outputs
    if grad:
        return f"the gradient of {outputs[key[:-len('.grad')]]}"
    return f"the result{key}" if not key or key.startswith("[") else key


def on_rank(rank: int, world: int, key: str, outputs: Optional[Mapping[str, str]] = None) -> str:
    """"rank 2's result['w']" (or the puzzle's name for it); without the rank on a single device."""
    said = name(key, outputs)
    if world == 1:
        return said
    for article in ("the ", "your "):            # "rank 0's your experts" reads "rank 0's experts"
        if said.startswith(article):
            return f"rank {rank}'s {said[len(article):]}"
    return f"rank {rank}'s {said}"


def mine(args: tuple, rank: int) -> tuple:
    return tuple(a.values[rank] if isinstance(a, PerRank) else a for a in args)


def given(args: tuple) -> dict[str, torch.Tensor]:
    """A rank's inputs named as its result would name them: a model's parameters by name, a tensor by ""."""
    named: dict[str, torch.Tensor] = {}
    for a in args:
        for key, t in leaves(a):
            named.setdefault(key, t)
    return named


def arguments(args: tuple, names: Sequence[str] = ()) -> list[tuple[str, torch.Tensor]]:
    """Every tensor a rank was handed, named as the learner knows it: a model's parameter by name, a positional
    argument by the learner's own parameter name where known, else by its place ("argument 3")."""
    out = []
    for i, a in enumerate(args):
        called = names[i] if i < len(names) else f"argument {i + 1}"
        for key, t in leaves(a):
            out.append((f"{called}{key}" if key.startswith("[") else plain(key) if key else called, t))
    return out


def f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().to(torch.float64)


def lined_up_from_the_end(met: str = "") -> str:
    """Why a tensor missing its last dimension met a longer one's wrong sizes (`met`: those sizes, said), and the fix:
    said alike for the error torch raised and for the wrong shape a broadcast made."""
    return ("torch lines shapes up from the last dimension, so the first one's sizes met the second's last ones"
            f"{met}, not its first. Add the missing dimension (t.unsqueeze(-1), or t[..., None]) so that each row's "
            "value meets its row.")


def close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> bool:
    return a.shape == b.shape and bool(torch.isclose(f64(b), f64(a), rtol=rtol, atol=atol, equal_nan=True).all())


def differing(expected: Any, got: Any, rtol: float, atol: float) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(key, expected, got) for every leaf that differs, where both sides have it with the same shape."""
    have = dict(leaves(got))
    out = []
    for key, e in leaves(expected):
        g = have.get(key)
        if isinstance(g, torch.Tensor) and g.shape == e.shape and not close(e, g, rtol, atol):
            out.append((key, e, g))
    return out


def first(mask: torch.Tensor) -> tuple:
    return tuple(int(i) for i in mask.nonzero()[0]) if mask.dim() else ()


def at(index: tuple) -> str:
    return f" at index {index}" if index else ""


def span(mask: torch.Tensor) -> str:
    """The smallest slice holding every True of `mask`, as Python would write it."""
    if mask.dim() == 0:
        return "the whole value"
    idx = mask.nonzero()
    lo, hi = idx.min(0).values.tolist(), idx.max(0).values.tolist()
    if all(a == 0 and b == n - 1 for a, b, n in zip(lo, hi, mask.shape)):
        return "all over"
    return "in [" + ", ".join(f"{a}:{b + 1}" if b > a else f"{a}" for a, b in zip(lo, hi)) + "]"


def listing(items: Sequence[str], most: int = 4) -> str:
    """"a, b and c" (and "... and 5 more" past `most`)."""
    items = list(items)
    if len(items) > most:
        return ", ".join(items[:most]) + f" and {len(items) - most} more"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
