"""Results copied into exact plain types before anything compares, diagnoses or prints them: a subclass of float,
dict, list, Tensor or nn.Module answers comparisons with its own methods, in the checker's thread, where it could
read the comparing frame and return the expected value. Read through the base types' own slots, never the value's."""

from __future__ import annotations

from typing import Any, Iterator

import torch

# A value of the course's own class (a harness's Gradients, the grader's ReceivedModule) is kept, or read through its
# class's own methods.
_COURSE = ("lib", "puzzles", "solutions", "tools")
_TRUSTED = ("builtins", "torch", "numpy", *_COURSE)    # where a kept object's class may come from


class Opaque:
    """A value of a kind no check expects (an object of the learner's own class): equal to nothing, shown by its
    class's name only, so that none of its methods runs in the checker."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"an object of its own class {self.kind}"


class PlainModule(torch.nn.Module):
    """A module read as its state: its named parameters (plain tensors, with plain copies of their gradients), which
    is all a check compares of a module."""

    def __init__(self, kind: str, named: list[tuple[str, torch.Tensor, Any]]) -> None:
        super().__init__()
        self.kind = kind
        self._named = []
        for name, data, grad in named:
            self._named.append((name, _parameter(data, grad)))

    def named_parameters(self, *args, **kwargs) -> Iterator[tuple[str, torch.nn.Parameter]]:
        return iter(self._named)

    def parameters(self, *args, **kwargs) -> Iterator[torch.nn.Parameter]:
        return iter(p for _, p in self._named)


def as_plain(x: Any, depth: int = 0) -> Any:
    """`x` as exact plain types (tensor, bool, int, float, str, None, list, tuple, dict, PlainModule), read through the
    base types' own methods; a value of the course's own classes is kept, one of an unknown class becomes an Opaque."""
    kind = type(x)
    if kind in (bool, int, float, str, complex, type(None)) or depth > 50:
        return x
    if isinstance(x, torch.Tensor):
        return _plain_tensor(x)
    if isinstance(x, torch.nn.Module):
        return PlainModule(kind.__name__, [(name, _plain_tensor(p), _grad(p)) for name, p in _parameters(x)])
    if kind.__module__.split(".")[0] in _COURSE:
        return x
    if isinstance(x, int) and not isinstance(x, bool):
        return int.__int__(x)
    if isinstance(x, float):
        return float.__float__(x)
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, dict):
        return {as_plain(k, depth + 1): as_plain(v, depth + 1) for k, v in dict.items(x)}
    if isinstance(x, list):
        return [as_plain(v, depth + 1) for v in list.__iter__(x)]
    if isinstance(x, tuple):
        return tuple(as_plain(v, depth + 1) for v in tuple.__iter__(x))
    if kind.__module__.split(".")[0] in _TRUSTED:
        return x
    return Opaque(kind.__name__)


def _parameter(data: Any, grad: Any) -> Any:
    """A Parameter holding `data` with `grad` as its gradient, as the learner's module held them, even where the two
    disagree in shape or dtype (a .data replaced after backward): the gradient set first, the data after it."""
    if not isinstance(data, torch.Tensor):
        return data
    p = torch.nn.Parameter(data, requires_grad=data.requires_grad)
    if not isinstance(grad, torch.Tensor):
        return p
    try:
        p.grad = grad
    except RuntimeError:
        p = torch.nn.Parameter(torch.empty_like(grad), requires_grad=data.requires_grad)
        p.grad = grad
        p.data = data
    return p


def _plain_tensor(t: torch.Tensor) -> Any:
    """A tensor of exactly torch.Tensor's class (or a Parameter) holding `t`'s values: itself when it is one already."""
    if type(t) in (torch.Tensor, torch.nn.Parameter):
        return t
    with torch._C.DisableTorchFunctionSubclass():        # the values it holds, whatever its class says
        data = torch.Tensor.detach(t)
        if type(data) is not torch.Tensor:              # a subclass that dispatches its own ops: not a tensor's values
            return Opaque(type(t).__name__)
        return torch.Tensor.clone(data)


def _grad(p: torch.Tensor) -> Any:
    grad = torch.Tensor.grad.__get__(p) if isinstance(p, torch.Tensor) else None
    return None if grad is None else _plain_tensor(grad)


def _parameters(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """named_parameters() as nn.Module's own walk gives them (pre-order, each parameter and module once), read from
    the modules' dictionaries rather than through methods a subclass or an instance may replace; a course's class
    that keeps its parameters its own way (the grader's ReceivedModule) is asked through its class's method."""
    kind = type(module)
    if kind.__module__.split(".")[0] in _COURSE and kind.named_parameters is not torch.nn.Module.named_parameters:
        return list(kind.named_parameters(module))
    found: list[tuple[str, torch.Tensor]] = []
    seen_modules, seen_params = set(), set()

    def walk(m: Any, prefix: str) -> None:
        if id(m) in seen_modules:
            return
        seen_modules.add(id(m))
        state = object.__getattribute__(m, "__dict__")
        for name, p in dict.items(state.get("_parameters") or {}):
            if p is not None and id(p) not in seen_params:
                seen_params.add(id(p))
                found.append((prefix + name, p))
        for name, sub in dict.items(state.get("_modules") or {}):
            if sub is not None:
                walk(sub, f"{prefix}{name}.")
    walk(module, "")
    return found
