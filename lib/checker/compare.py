"""Stage 2 of a check, the comparison: each rank's result against the reference, the first difference in words."""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

import torch

from lib.checker.plain import Opaque

# Bound at import, before a learner's code runs (the grader's fingerprint covers these names): a check compares
# with these whatever math.isclose or torch.isclose become later; and only tensors of exactly these types, since
# a subclass of Tensor can answer any comparison itself (__torch_function__).
_isclose, _tensor_isclose = math.isclose, torch.isclose
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def first_difference(expected: Any, got: Any, rtol: float = 1e-5, atol: float = 1e-6,
                     where: str = "result") -> Optional[str]:
    """None when `got` matches `expected`; otherwise one sentence naming the place and the values.

    Walks tensors, numbers, lists, tuples, dicts and modules (by their named parameters).
    """
    if isinstance(expected, torch.nn.Module):
        if not isinstance(got, torch.nn.Module):
            return f"{where} should be the model (an nn.Module), got {kind_of(got)}"
        return _module_difference(expected, got, rtol, atol, where)
    if isinstance(expected, torch.Tensor):
        return _tensor_difference(expected, got, rtol, atol, where)
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"{where} should be a {type(expected).__name__} of {len(expected)} items, got {kind_of(got)}"
        if len(got) != len(expected):
            return f"{where} should hold {len(expected)} items, got {len(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            diff = first_difference(e, g, rtol, atol, f"{where}[{i}]")
            if diff:
                return diff
        return None
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"{where} should be a dict with keys {sorted(expected)}, got {kind_of(got)}"
        if set(got) != set(expected):
            missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
            return f"{where} keys differ: missing {missing}, unexpected {extra}"
        for k in expected:
            diff = first_difference(expected[k], got[k], rtol, atol, f"{where}[{k!r}]")
            if diff:
                return diff
        return None
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        if type(got) in PLAIN_TENSORS and got.numel() == 1:
            got = got.item()
        if isinstance(got, numbers.Real) and not isinstance(got, bool):
            got = got.item() if hasattr(got, "item") else got     # numpy's integers and floats count as numbers
        if not isinstance(got, (int, float)) or not _isclose(got, expected, rel_tol=rtol, abs_tol=atol):
            return f"{where}: expected {expected!r}, got {kind_of(got)}"
        return None
    if expected != got:
        return f"{where}: expected {expected!r}, got {got!r}"
    return None


def first_wrong_rank(expected: list, got: list, rtol: float, atol: float) -> Optional[tuple[int, str]]:
    """(the first rank whose result differs from its expected one, the difference in words), or None."""
    for rank, (want, have) in enumerate(zip(expected, got)):
        diff = first_difference(want, have, rtol, atol, where="the result")
        if diff:
            return rank, diff
    return None


def _module_difference(expected: torch.nn.Module, got: torch.nn.Module, rtol: float, atol: float,
                       where: str) -> Optional[str]:
    """Parameters by name, and their gradients wherever the reference has one."""
    want, have = dict(expected.named_parameters()), dict(got.named_parameters())
    diff = first_difference({k: v.detach() for k, v in want.items()}, {k: v.detach() for k, v in have.items()},
                            rtol, atol, where)
    if diff:
        return diff
    for name, p in want.items():
        if p.grad is None:
            continue
        if have[name].grad is None:
            return f"{where}: {name}.grad is None, expected a gradient (did backward run on this parameter?)"
        diff = _tensor_difference(p.grad, have[name].grad, rtol, atol, f"{where}: {name}.grad")
        if diff:
            return diff
    return None


def _tensor_difference(expected: torch.Tensor, got: Any, rtol: float, atol: float, where: str) -> Optional[str]:
    if not isinstance(got, torch.Tensor):
        return f"{where} should be a tensor of shape {tuple(expected.shape)}, got {kind_of(got)}"
    if type(got) not in PLAIN_TENSORS:
        return f"{where} should be a plain torch.Tensor, got a {type(got).__name__} (a subclass: compares as it likes)"
    if got.shape != expected.shape:
        return f"{where} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    if got.dtype != expected.dtype:
        return f"{where} has dtype {_dtype(got)}, expected {_dtype(expected)}"
    e, g = expected.detach().cpu(), got.detach().cpu()
    if e.is_floating_point():
        bad = ~_tensor_isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    else:
        bad = g != e
    if not bool(bad.any()):
        return None
    index = tuple(int(i) for i in bad.nonzero()[0])
    count, total = int(bad.sum()), bad.numel()
    at = f" at index {index}" if index else ""
    want, have = _digits(e[index].item(), g[index].item())
    return f"{where}{at}: expected {want}, got {have} ({count} of {total} values differ)"


def _digits(want: Any, have: Any) -> tuple[str, str]:
    """Enough significant digits for the two numbers to read differently."""
    for digits in (6, 9, 12, 17):
        a, b = f"{want:.{digits}g}", f"{have:.{digits}g}"
        if a != b:
            break
    return a, b


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def kind_of(x: Any) -> str:
    """What a value is, in a few words: a tensor's shape and dtype, else its type and repr."""
    if isinstance(x, Opaque):
        return f"an object of its own class {x.kind}"
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} {_dtype(x)}"
    if x is None:
        return "None (did the function forget to return?)"
    return f"{type(x).__name__} {x!r}"[:120]
