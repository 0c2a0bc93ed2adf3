"""lib.diagnose through the checker: each classic mistake is named, and anything else is located.

Tiny puzzles defined here: sum vectors over ranks (every rank returns the sum), all-gather chunks, give each
rank its chunk of the sum, and the gradient of a linear layer. Each wrong answer below makes one mistake.
"""

from __future__ import annotations

import random

import pytest
import torch

from lib.check import Case, Puzzle
from lib.diagnose import Mistake, diagnose
from lib.sim import per_rank


def _vectors(rng: random.Random, n: int, length: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    return [torch.randn(length, generator=g) for _ in range(n)]


def _sum_case(rng: random.Random, n: int) -> Case:
    xs = _vectors(rng, n, 2 * n * rng.randint(1, 3))
    return Case(n, (per_rank(xs),), [sum(xs)] * n, f"N={n}")


def _scatter_case(rng: random.Random, n: int) -> Case:
    xs = _vectors(rng, n, n * rng.randint(1, 3))
    return Case(n, (per_rank(xs),), list(sum(xs).chunk(n)), f"N={n}")


def _gather_case(rng: random.Random, n: int) -> Case:
    xs = _vectors(rng, n, rng.randint(1, 3))
    return Case(n, (per_rank(xs),), [torch.cat(xs)] * n, f"N={n}")


def _linear_case(rng: random.Random, n: int) -> Case:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    model, x = torch.nn.Linear(3, 2), torch.randn(4, 3, generator=g)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    expected = torch.nn.Linear(3, 2)
    expected.load_state_dict(model.state_dict())
    expected(x).sum().backward()
    return Case(n, (model, x), [expected] * n, f"N={n}", factors={"k, the number of pieces": 5})


def puzzle(make_case, **kwargs) -> Puzzle:
    return Puzzle("diag", "00_test", make_case, world_sizes=(3, 4), hints=["one", "two", "three"], **kwargs)


def summed(dist, x):
    dist.all_reduce(x)
    return x


def alone(dist, x):
    return x


def averaged(dist, x):
    dist.all_reduce(x)
    return x / dist.get_world_size()


def summed_twice(dist, x):
    dist.all_reduce(x)
    return x * 2


def garbage_in_the_second_half(dist, x):
    dist.all_reduce(x)
    x[len(x) // 2:] = 4.5786e-41          # what torch.empty hands out, made deterministic
    return x


def zeros_in_the_second_half(dist, x):
    dist.all_reduce(x)
    x[len(x) // 2:] = 0
    return x


def next_ranks_chunk(dist, x):
    dist.all_reduce(x)
    return x.chunk(dist.get_world_size())[(dist.get_rank() + 1) % dist.get_world_size()].clone()


def gathered_backwards(dist, x):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    return torch.cat(parts[::-1])


def weight_holds_its_gradient(dist, model, x):
    model(x).sum().backward()
    with torch.no_grad():
        model.weight.copy_(model.weight.grad)
    return model


def gradient_five_times(dist, model, x):
    (5 * model(x).sum()).backward()
    return model


def noise(dist, x):
    dist.all_reduce(x)
    return x + torch.linspace(0.1, 0.3, len(x))


def _failure(p: Puzzle, fn, capsys) -> str:
    assert p.check(fn, strict=False, show=False, seed=0) is False
    return capsys.readouterr().out


@pytest.mark.parametrize("make_case,fn,words", [
    (_sum_case, averaged, "is 1/3 of what it should be: off by a factor of 3 = N, the world size"),
    (_sum_case, summed_twice, "is 2× what it should be: a constant factor"),
    (_sum_case, alone, "is unchanged from what rank 0 was given"),
    (_sum_case, garbage_in_the_second_half, "holds 4.5786e-41 at index"),
    (_sum_case, zeros_in_the_second_half, "is 0 where data should be, in ["),
    (_scatter_case, next_ranks_chunk, "rank 0's result holds what rank 1 should return"),
    (_gather_case, gathered_backwards, "has the right chunks in the wrong places (chunk 0 holds chunk 2"),
    (_linear_case, weight_holds_its_gradient, "weight holds what weight.grad should: a gradient where its parameter"),
    (_linear_case, gradient_five_times, "is 5× what it should be: off by a factor of 5 = k, the number of pieces"),
], ids=lambda v: getattr(v, "__name__", "")[:30])
def test_a_classic_mistake_is_named(make_case, fn, words, capsys):
    out = _failure(puzzle(make_case), fn, capsys)
    assert "Diagnosis: " in out and words in out, out


def test_garbage_says_uninitialised_and_where(capsys):
    out = _failure(puzzle(_sum_case), garbage_in_the_second_half, capsys)
    assert "uninitialised memory, what torch.empty returns" in out
    case = puzzle(_sum_case).cases(0)[0]
    n = len(case.expected[0])
    assert f"in [{n // 2}:{n}]" in out


def test_a_registered_mistake_is_named_with_its_message(capsys):
    message = "a rank that keeps its own vector returns: nothing was exchanged."
    out = _failure(puzzle(_sum_case, mistakes=[Mistake(alone, message)]), alone, capsys)
    assert f"Diagnosis: your result is exactly what {message}" in out


def test_a_mistake_run_alone_is_each_rank_as_a_world_of_one(capsys):
    out = _failure(puzzle(_sum_case, mistakes=[Mistake(summed, "no communication gives.", alone=True)]),
                   alone, capsys)
    assert "your result is exactly what no communication gives." in out


def test_a_mistake_that_does_not_match_is_not_named(capsys):
    out = _failure(puzzle(_sum_case, mistakes=[Mistake(averaged, "averaging gives.")]), alone, capsys)
    assert "averaging gives" not in out and "unchanged from what rank 0 was given" in out


def test_otherwise_the_message_says_where(capsys):
    out = _failure(puzzle(_sum_case), noise, capsys)
    assert "Diagnosis" not in out
    assert "Where: wrong on every rank. On rank 0: the result (" in out and "values, all over)" in out


def test_diagnose_names_tensors_by_parameter_and_rank():
    expected = [{"a": torch.ones(4), "b": torch.ones(2, 3)}] * 2
    got = [{"a": torch.ones(4), "b": torch.ones(2, 3)}, {"a": torch.ones(4), "b": torch.ones(2, 3)}]
    got[1]["b"][1, 1:] = torch.tensor([5.0, 7.0])
    text = diagnose(expected, got, (), rtol=1e-5, atol=1e-6)
    assert text == "Where: wrong on rank 1. On rank 1: the result['b'] (2 of 6 values, in [1, 1:3])."


def test_a_single_device_result_is_described_without_ranks():
    assert diagnose([torch.ones(8)], [torch.ones(8) * 4], (), factors={"k, the micro-batches": 4}) == (
        "Diagnosis: every value of the result is 4× what it should be: off by a factor of 4 = k, the micro-batches. "
        "A sum where a mean belongs: did you divide by k?")
    assert diagnose([{"w": torch.ones(2, 4)}], [{"w": torch.tensor([[1.0, 1, 1, 1], [1, 1, 2, 3]])}], ()) == (
        "Where: the result['w'] (2 of 8 values, in [1, 2:4]).")
    assert diagnose([2560], [2496], ()) == ""      # one number: the first difference already says it all
