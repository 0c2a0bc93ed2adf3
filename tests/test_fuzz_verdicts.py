"""The check never crashes (issue 48 §5): on every puzzle, an answer that runs the reference solution and then
returns its result mangled (None, an empty tensor, NaN, another dtype, the result nested, huge values, a scalar
where a tensor belongs and a tensor where a scalar does, a string, half a shard) gets a verdict in words.

Each puzzle meets a few manglings, drawn at seed 0 from its name, and every mangling meets many puzzles; the
whole sweep (every mangling on every puzzle) runs with `python -m tests.test_fuzz_verdicts`.
"""

from __future__ import annotations

import importlib
import inspect
import random
import sys
from typing import Any, Callable

import pytest
import torch

import puzzles
from lib.checker.puzzle import FAILING, PASSED, UNATTEMPTED

UNCHANGED = object()          # a mangling that does not apply to this result (a scalar has no half)
PER_PUZZLE = 3


def _tree(x: Any, tensor: Callable[[torch.Tensor], Any], number: Callable[[float], Any]) -> Any:
    """`x` with each tensor and each number replaced; a module's parameters replaced in place."""
    if isinstance(x, torch.nn.Module):
        with torch.no_grad():
            for p in x.parameters():
                made = tensor(p.detach())
                if isinstance(made, torch.Tensor) and made.shape == p.shape:
                    p.data = made
        return x
    if isinstance(x, torch.Tensor):
        return tensor(x)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return number(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_tree(v, tensor, number) for v in x) if type(x) in (list, tuple) else \
            [_tree(v, tensor, number) for v in x]
    if isinstance(x, dict):
        return {k: _tree(v, tensor, number) for k, v in x.items()}
    return x


def _floats(t: torch.Tensor, value: float) -> torch.Tensor:
    return torch.full_like(t, value) if t.is_floating_point() else t


def _half(t: torch.Tensor) -> torch.Tensor:
    """A shard: the first half of the flattened tensor, as a ZeRO-3 that skips its last gather returns."""
    return t.reshape(-1)[: t.numel() // 2].clone()


MANGLINGS: dict[str, Callable[[Any], Any]] = {
    "None": lambda out: None,
    "empty tensor": lambda out: torch.empty(0),
    "NaN": lambda out: _tree(out, lambda t: _floats(t, float("nan")), lambda x: float("nan")),
    "wrong dtype": lambda out: _tree(out, lambda t: t.to(torch.float16 if t.is_floating_point() else torch.float64),
                                     lambda x: int(x) if isinstance(x, float) else float(x) + 0.5),
    "nested": lambda out: [out, {"again": out}],
    "huge": lambda out: _tree(out, lambda t: _floats(t, 3e38) if t.is_floating_point() else t * 2**40,
                              lambda x: x * 1e300),
    "scalar for a tensor": lambda out: _tree(out, lambda t: 0.5, lambda x: x),
    "tensor for a scalar": lambda out: _tree(out, lambda t: t, lambda x: torch.tensor([x, x])),
    "string": lambda out: "oops",
    "half a shard": lambda out: _tree(out, _half, lambda x: x),
}


def _solution(puzzle) -> Callable:
    return getattr(importlib.import_module(f"solutions.{puzzle.module}"), puzzle.name)


def mangled(puzzle, how: str) -> Callable:
    """The reference solution of `puzzle`, its result mangled `how` (UNCHANGED where the mangling does not apply)."""
    solution, mangle = _solution(puzzle), MANGLINGS[how]

    def answer(*args, **kwargs):
        out = solution(*args, **kwargs)
        made = mangle(out)
        return out if made is UNCHANGED else made
    answer.__name__ = f"{puzzle.name}_{how.replace(' ', '_')}"
    return answer


VALUES = ("NaN", "wrong dtype", "huge")     # wrong values of the right kind: diagnoses replay the answer to read them
NEVER_RIGHT = ("None", "string", "nested", "empty tensor")    # no puzzle's result is one of these


def chosen(puzzle) -> list[str]:
    """The manglings a puzzle meets in CI, drawn from its name at seed 0: PER_PUZZLE of the wrong kinds of result,
    one of them wrong values instead where a wrong value's diagnosis is quick (not a training run, whose diagnosis
    replays it step by step: seconds each; the whole sweep covers those)."""
    rng = random.Random(f"{puzzle.name}:0")
    kinds = rng.sample(sorted(set(MANGLINGS) - set(VALUES)), PER_PUZZLE)
    training = "steps" in inspect.signature(puzzle.make_case).parameters
    return sorted(kinds if training else kinds[:-1] + [rng.choice(VALUES)])


def verdict(puzzle, how: str):
    """The check's outcome for the mangled answer: it must be one, never an exception."""
    outcome = puzzle.evaluate(mangled(puzzle, how), seed=0)
    assert outcome.status in (FAILING, PASSED, UNATTEMPTED) and isinstance(outcome.message, str)
    return outcome


CASES = [(p, how) for p in puzzles.ALL for how in chosen(p)]


@pytest.mark.parametrize("puzzle, how", CASES, ids=[f"{p.name}-{how}" for p, how in CASES])
def test_a_mangled_result_gets_a_verdict_in_words(puzzle, how):
    """A verdict, never an exception; a mangling that leaves the values right (a tensor for a scalar where the result
    holds none, a count as a float) may pass, one that no result can be must fail."""
    outcome = verdict(puzzle, how)
    assert outcome.status == FAILING or how not in NEVER_RIGHT, outcome.message


def test_every_mangling_meets_some_puzzle():
    assert {how for _, how in CASES} == set(MANGLINGS)


def test_a_zero3_that_returns_its_shards_without_the_last_gather_is_told_so():
    """The crash the issue found: a ZeRO-3 returning its shards, not the gathered parameters (ZeroDivisionError in
    lib.diagnose's shapes)."""
    zero3 = next(p for p in puzzles.ALL if p.name == "zero3_train")
    outcome = verdict(zero3, "half a shard")
    assert outcome.status == FAILING and "shape" in outcome.message, outcome.message


if __name__ == "__main__":                      # the whole sweep: every mangling on every puzzle
    import time
    crashed = []
    for p in puzzles.ALL:
        for how in MANGLINGS:
            start = time.perf_counter()
            try:
                status = verdict(p, how).status
                print(f"{p.name:32s} {how:22s} {status:8s} {time.perf_counter() - start:6.2f} s", flush=True)
            except BaseException as e:           # noqa: BLE001 - a sweep reports every crash
                crashed.append((p.name, how, f"{type(e).__name__}: {e}"[:300]))
                print(crashed[-1], flush=True)
    print(f"{len(crashed)} crashes")
    sys.exit(1 if crashed else 0)
