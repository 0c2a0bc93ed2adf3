"""lib.diagnose through the checker: each classic mistake is named, and anything else is located.

Tiny puzzles defined here: sum vectors over ranks (every rank returns the sum), all-gather chunks, give each
rank its chunk of the sum, and the gradient of a linear layer. Each wrong answer below makes one mistake.
"""

from __future__ import annotations

import random

import pytest
import torch

from lib.checker.puzzle import Case, Puzzle
from lib.diagnose import Mistake, diagnose, factors, hands_gradient
from lib.sim import per_rank
from lib.units import ordinal


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
    (_sum_case, garbage_in_the_second_half, "values no computation of these inputs should make (in ["),
    (_sum_case, zeros_in_the_second_half, "is 0 where data should be, in ["),
    (_scatter_case, next_ranks_chunk, "rank 0's result holds what rank 1 should return"),
    (_gather_case, gathered_backwards, "has the right values in the wrong places (chunk 0 holds what chunk 2 should"),
    (_linear_case, weight_holds_its_gradient, "weight holds what weight.grad should: a gradient where its parameter"),
    (_linear_case, gradient_five_times, "is 5× what it should be: off by a factor of 5 = k, the number of pieces"),
], ids=lambda v: getattr(v, "__name__", "")[:30])
def test_a_classic_mistake_is_named(make_case, fn, words, capsys):
    out = _failure(puzzle(make_case), fn, capsys)
    assert "Diagnosis: " in out and words in out, out


def half_written(dist, x):
    out = torch.empty_like(x)
    dist.all_reduce(x)
    out[: len(x) // 2] = x[: len(x) // 2]
    return out


def test_memory_torch_empty_left_is_called_uninitialised_and_where(capsys):
    out = _failure(puzzle(_sum_case), half_written, capsys)
    n = len(puzzle(_sum_case).cases(0)[0].expected[0])
    assert "that is uninitialised memory, what torch.empty returns" in out and f"in [{n // 2}:{n}]" in out, out


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


def test_a_quotient_is_followed_to_another_case_where_it_is_below_one():
    # The loss divided by p where m belongs: 2 = m / N = N at p = 2, m = 4; at p = 4, m = 2 the values are half, not
    # twice, what they should be, which is m / N there too, the same way up.
    found = factors.matching(2.0, {"N, the world size": 2, "m, the micro-batches": 4})
    assert [c.symbol for c in found] == ["N", "m / N"]
    there = {"N, the world size": 4, "m, the micro-batches": 2}
    assert [c.symbol for c in factors.consistent(found, 0.5, there, up=True)] == ["m / N"]
    assert factors.consistent(found, 2.0, there, up=True) == []
    words, advice = factors.said(2.0, {"N, the world size": 2, "m, the micro-batches": 4},
                                 resolve=lambda found, up: factors.consistent(found, 0.5, there, up))
    assert "2 = m / N" in words and advice == "Divided by N where m belongs?"


# ---- mistakes no catalogue lists, named from the case's structure -------------------------------------------
def _quantities_case(rng: random.Random, n: int) -> Case:
    """Every rank returns the sum; the case names m and v, v equal to N on its first world size only."""
    xs = _vectors(rng, n, 2 * n)
    return Case(n, (per_rank(xs),), [sum(xs)] * n, f"N={n}",
                factors={"m, the number of micro-batches": 4, "v, the virtual stages": 3})


def summed_over_m_times_v(dist, x):
    dist.all_reduce(x)
    return x / 12


def summed_over_v(dist, x):
    dist.all_reduce(x)
    return x / 3


def test_a_product_of_two_quantities_is_named_by_the_case_that_tells_them_apart(capsys):
    # on the first case (N = v = 3) 12 is N × m and m × v; the second (N = 4) says which
    out = _failure(puzzle(_quantities_case), summed_over_m_times_v, capsys)
    assert "off by a factor of 12 = m × v (m, the number of micro-batches; v, the virtual stages)." in out, out


def test_a_quantity_equal_to_another_is_named_by_the_case_that_tells_them_apart(capsys):
    out = _failure(puzzle(_quantities_case), summed_over_v, capsys)
    assert "off by a factor of 3 = v, the virtual stages. " in out and "N, the world size" not in out, out


def test_two_quantities_equal_on_every_case_are_both_named(capsys):
    p = Puzzle("diag", "00_test", _quantities_case, world_sizes=(3,), hints=["one"])
    out = _failure(p, summed_over_v, capsys)
    assert "= N, the world size = v, the virtual stages (equal on this case" in out, out


def test_a_share_left_out_is_not_called_silence(capsys):
    def without_rank_0(dist, x):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x)
        return sum(parts[1:])
    out = _failure(puzzle(_sum_case), without_rank_0, capsys)
    assert "rank 0's share was left out of the sum" in out and "never communicated" not in out, out


def _grid_case(rng: random.Random, n: int) -> Case:
    """Rank r returns its own x; the expected layout is six experts, contiguous."""
    xs = _vectors(rng, n, 6)
    return Case(n, (per_rank([x.view(6, 1) for x in xs]),), [x.view(6, 1) for x in xs], f"N={n}",
                parts={"expert": (0, 6)})


def experts_dealt_round_robin(dist, x):
    return x.view(2, 3).t().reshape(6, 1).clone()      # expert i at position (i % 2) * 3 + i // 2


def test_right_values_in_wrong_places_are_said_part_by_part(capsys):
    out = _failure(puzzle(_grid_case), experts_dealt_round_robin, capsys)
    assert "expert 1 holds what expert 3 should" in out and "read the other way round" in out, out


def _softmax_case(rng: random.Random, n: int) -> Case:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    scores = torch.randn(4, 4, generator=g)
    mask = torch.ones(4, 4, dtype=torch.bool).triu(1)
    return Case(1, (scores,), [scores.masked_fill(mask, -torch.inf).softmax(-1)], "4 × 4 scores")


def masks_the_diagonal_too(dist, scores):
    return scores.masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(0), -torch.inf).softmax(-1)


def exp_without_the_max(dist, scores):
    e = torch.exp(1000 * scores).masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), 0)
    return e / e.sum(-1, keepdim=True)


def test_a_nan_from_a_row_masked_entirely_is_traced_to_it(capsys):
    out = _failure(Puzzle("diag", "00_test", _softmax_case, world_sizes=(1,)), masks_the_diagonal_too, capsys)
    assert "every score is -inf: a row masked entirely" in out and "uninitialised" not in out, out
    assert "masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(0)" in out       # the learner's own line


def test_an_overflow_is_traced_to_exp(capsys):
    out = _failure(Puzzle("diag", "00_test", _softmax_case, world_sizes=(1,)), exp_without_the_max, capsys)
    assert "exp overflowed to inf" in out and "uninitialised" not in out, out


def test_tiny_values_not_left_by_torch_empty_are_not_called_uninitialised(capsys):
    out = _failure(puzzle(_sum_case), garbage_in_the_second_half, capsys)
    assert "uninitialised" not in out and "not memory left unwritten" in out, out


def test_gradients_that_never_arrive_are_counted(capsys):
    def detached(dist, model, x):
        model(x.detach()).sum()       # the loss's graph is thrown away; only the bias is reached
        model.bias.sum().backward()
        return model
    out = _failure(puzzle(_linear_case), detached, capsys)
    assert "1 of 2 gradients are None (weight.grad)" in out, out


def _shard_case(rng: random.Random, n: int) -> Case:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    w, x = torch.randn(2 * n, 3, generator=g), torch.randn(5, 3, generator=g)
    return Case(n, (w, x), [x @ w.t()] * n, f"N={n}")


def multiplies_by_its_shard(dist, w, x):
    shard = w.reshape(-1).chunk(dist.get_world_size())[dist.get_rank()]
    return x @ shard.t()


def test_a_shard_where_the_whole_belongs_is_said_in_the_lessons_terms(capsys):
    out = _failure(puzzle(_shard_case), multiplies_by_its_shard, capsys)
    assert "An input of shape (6,) has 1/3 of the input's 18 elements (N = 3)" in out, out
    assert "Gather it first" in out, out


# ---- training runs: the first step that leaves the reference --------------------------------------------------
LR = 0.1


def _train_case(rng: random.Random, n: int, steps=None, adam: bool = False) -> Case:
    """Linear regression on N ranks' batches; the reference trains on the whole batch. Drawn for three steps
    whatever `steps` asks, so that fewer steps replay the same run."""
    drawn = 3
    steps = drawn if steps is None else steps
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    w = torch.randn(3, generator=g, dtype=torch.float64)
    xs = torch.randn(n, drawn, 4, 3, generator=g, dtype=torch.float64)[:, :steps]
    ys = torch.randn(n, drawn, 4, generator=g, dtype=torch.float64)[:, :steps]
    ref = w.clone().requires_grad_()
    opt = torch.optim.Adam([ref], lr=LR) if adam else torch.optim.SGD([ref], lr=LR)
    for t in range(steps):
        opt.zero_grad()
        ((xs[:, t] @ ref - ys[:, t]) ** 2).mean().backward()
        opt.step()
    return Case(n, (w, per_rank(list(xs)), per_rank(list(ys))), [ref.detach()] * n, f"N={n}, {steps} steps",
                steps=steps)


@hands_gradient("grad")
def adam(w: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int) -> None:
    m.mul_(0.9).add_(grad, alpha=0.1)
    v.mul_(0.999).addcmul_(grad, grad, value=0.001)
    w.sub_(LR * (m / (1 - 0.9 ** t)) / ((v / (1 - 0.999 ** t)).sqrt() + 1e-8))


def _trainer(divide: bool = True, zero: bool = True, use_adam: bool = False):
    def train(dist, w, xs, ys):
        w = w.clone().requires_grad_()
        m, v = torch.zeros_like(w), torch.zeros_like(w)
        for t in range(len(xs)):
            ((xs[t] @ w - ys[t]) ** 2).mean().backward()
            grad = w.grad.clone()
            dist.all_reduce(grad)
            if divide:
                grad /= dist.get_world_size()
            with torch.no_grad():
                adam(w, grad, m, v, t + 1) if use_adam else w.sub_(LR * grad)
            if zero:
                w.grad = None
        return w.detach()
    return train


def test_a_training_run_is_named_by_its_first_update(capsys):
    out = _failure(puzzle(_train_case), _trainer(divide=False), capsys)
    assert "leaves the reference at its first step" in out, out
    assert "At step 1, every update of rank 0's result is 3× what it should be: off by a factor of 3 = N" in out, out


def test_a_training_run_wrong_from_its_second_step_points_at_what_carries(capsys):
    out = _failure(puzzle(_train_case), _trainer(zero=False), capsys)
    assert "first leaves the reference at step 2 of 3 (step 1 is right)" in out, out
    assert "gradients not zeroed between steps" in out, out


def test_a_scale_adam_hides_is_found_in_what_the_ranks_hand_it(capsys):
    import functools
    p = Puzzle("diag", "00_test", functools.partial(_train_case, adam=True), world_sizes=(3, 4),
               hints=["one"], rtol=1e-13, atol=1e-13)
    out = _failure(p, _trainer(divide=False, use_adam=True), capsys)
    assert "The gradients your ranks hand the optimizer at step 1 are 3× what it should be" in out, out


# ---- which ranks' shares, offsets, sizes, approximations ----------------------------------------------------
def test_a_sum_that_stopped_early_names_the_shares_it_holds(capsys):
    def two_ranks_only(dist, x):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x)
        return parts[0] + parts[1]
    out = _failure(puzzle(_sum_case), two_ranks_only, capsys)
    assert "rank 2's share was left out of the sum" in out, out


def test_a_chunk_that_adds_what_it_should_copy_is_named_chunk_by_chunk():
    """An all-gather phase that adds rank 0's chunk to the sum it received: only the last chunk is wrong."""
    case = _sum_case(random.Random(0), 3)
    xs = case.args[0].values
    got = [sum(xs).clone() for _ in range(3)]
    n = len(got[0]) // 3
    for g in got:
        g[2 * n:] += xs[0][2 * n:]
    text = diagnose(case.expected, got, case.args)
    assert "chunk 2 of rank 0's result holds the sum of ranks 0, 1, 2's shares only, with rank 0's counted twice" \
        in text, text


def _bias_case(rng: random.Random, n: int) -> Case:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    x, w, b = torch.randn(5, 3, generator=g), torch.randn(4, 3, generator=g), torch.randn(4, generator=g)
    return Case(n, (x, w, b), [x @ w.t() + b] * n, f"N={n}")


def test_a_bias_left_out_or_added_on_every_rank_is_named(capsys):
    out = _failure(puzzle(_bias_case), lambda dist, x, w, b: x @ w.t(), capsys)
    assert "rank 0's result lacks b: it was never added" in out, out

    def bias_on_every_rank(dist, x, w, b):
        y = x @ w.t() / dist.get_world_size() + b
        dist.all_reduce(y)
        return y
    out = _failure(puzzle(_bias_case), bias_on_every_rank, capsys)
    assert "added N times (N = 3): each rank added it before the sum" in out, out


def test_a_result_with_1_over_n_of_the_elements_is_a_shard_where_the_whole_belongs(capsys):
    def reduce_scattered(dist, x):
        dist.all_reduce(x)
        return x.chunk(dist.get_world_size())[dist.get_rank()].clone()
    out = _failure(puzzle(_sum_case), reduce_scattered, capsys)
    assert "has 1/3 of the elements it should" in out and "a rank's part where the whole tensor belongs" in out, out


def test_a_hair_of_difference_everywhere_is_called_an_approximation(capsys):
    def tanh_gelu(dist, x):
        dist.all_reduce(x)
        return x * (1 + 1e-4)
    out = _failure(puzzle(_sum_case), tanh_gelu, capsys)
    assert "the right computation with a different approximation" in out, out


def test_the_parts_of_a_sum_never_summed_are_named():
    p = Puzzle("diag", "00_test", _sum_case, world_sizes=(3,), hints=["one"])
    text = diagnose(p.cases(0)[0].expected, [x.clone() for x in p.cases(0)[0].args[0].values], p.cases(0)[0].args)
    assert "unchanged from what rank 0 was given" in text, text
    case = p.cases(0)[0]
    xs = case.args[0].values
    got = [xs[0] + xs[1], xs[2].clone(), torch.zeros_like(xs[0])]
    text = diagnose(case.expected, got, (per_rank([torch.zeros_like(x) for x in xs]),))
    assert "the ranks' result add up to the expected one" in text, text


def _two_parts_case(rng: random.Random, n: int) -> Case:
    """A prediction of 10x + 10y + 1, whose two parts are the same size where k = 3 (x = y = 3), not where k = 5."""
    from lib.checker.terms import Q, formula, term

    k = rng.choice([3, 5])
    x, y = Q("x", k, "the first"), Q("y", 4 if k == 5 else 3, "the second")
    total = term("the x part", 10 * x) + term("the y part", 10 * y) + term("one", 1)
    return Case(1, (k,), [total.value], f"k={k}", formulas={"": formula(total, "B")})


def _without_y(k):
    return 10 * k + 1


def _failure_where_the_parts_are_alike(p: Puzzle, fn, capsys) -> str:
    for seed in range(20):       # a seed whose first case draws k = 3 (x = y: the two terms are the same size)
        if p.cases(seed)[0].args[0] == 3 and any(c.args[0] == 5 for c in p.cases(seed)):
            assert p.check(fn, strict=False, show=False, seed=seed) is False
            return capsys.readouterr().out
    raise AssertionError("no seed draws k = 3 first and k = 5 after")


def test_an_equal_sized_term_is_told_apart_by_the_other_cases(capsys):
    p = Puzzle("diag", "00_test", _two_parts_case, world_sizes=(1, 1, 1), takes_dist=False, rtol=0, atol=0)
    out = _failure_where_the_parts_are_alike(p, _without_y, capsys)
    assert "30 B short: it is what the formula gives with the y part left out." in out, out


def test_a_quantity_left_out_of_a_term_is_followed_to_a_case_where_it_is_nowhere_else():
    # Where tp is in the activations too, its mistake is said 'tp left out of the model states'; a case whose
    # activations have no tp (full recomputation) must still give that mistake's number, not have no place for it.
    from lib.checker.terms import Q, formula, term, value_with

    there = formula(term("the model states", 16 * Q("P", 100, "the parameters") / Q("tp", 2, "the TP degree"))
                    + term("the activations", 50), "B")
    assert value_with(there, "tp left out of the model states") == 1650
    assert value_with(there, "tp left out of the activations") is None


def test_a_catalogued_mistake_that_the_other_cases_contradict_gives_way(capsys):
    # Leaving out the x part gives 31 where k = 3, as the learner's answer does; where k = 5 it gives 41, the learner
    # 51: the formula's reading, which fits both, is said instead.
    x_left_out = Mistake(lambda k: 10 * (4 if k == 5 else 3) + 1, "leaving out the x part gives.")
    p = Puzzle("diag", "00_test", _two_parts_case, world_sizes=(1, 1, 1), takes_dist=False, rtol=0, atol=0,
               mistakes=[x_left_out])
    out = _failure_where_the_parts_are_alike(p, _without_y, capsys)
    assert "the y part left out" in out and "leaving out the x part" not in out, out
    # Where the other cases bear it out, the mistake is said first, as before.
    out = _failure_where_the_parts_are_alike(p, x_left_out.fn, capsys)
    assert "exactly what leaving out the x part gives." in out, out


def test_errors_inside_torch_said_in_the_lessons_terms():
    """The translations that read torch's message alone (the shape ones replay the learner's function)."""
    from lib.diagnose.torch_errors import _freed, _viewed, _whole_meets_shard
    assert "padded to split evenly" in _viewed("shape '[3]' is invalid for input of size 4", 2)
    assert "shard viewed as the whole" in _viewed("shape '[4, 2]' is invalid for input of size 4", 2)
    assert "freed after use" in _freed([(0,), (4, 4)])
    assert "a whole tensor meets a rank's shard" in _whole_meets_shard([(96,), (48,)], 2)


def test_a_division_by_a_python_zero_is_named(capsys):
    def bias_correction_from_step_0(dist, x):
        dist.all_reduce(x)
        return x.div(1 - 0.9 ** 0)       # Adam's bias correction at t = 0: a Python 0
    out = _failure(puzzle(_sum_case), bias_correction_from_step_0, capsys)
    assert "a division by zero" in out, out


def test_values_computed_from_memory_read_before_it_was_written_are_named(capsys):
    def reads_the_buffer_before_the_receive(dist, x):
        got = torch.empty_like(x)
        early = got * 2 + x                      # read before anything arrived: what torch.empty left there
        work = dist.irecv(got, (dist.get_rank() - 1) % dist.get_world_size())   # (read before its wait(): refused)
        send = dist.isend(x, (dist.get_rank() + 1) % dist.get_world_size())
        work.wait()
        send.wait()
        return early
    out = _failure(puzzle(_sum_case), reads_the_buffer_before_the_receive, capsys)
    assert "from memory nothing wrote: torch.empty's leftovers read before anything was written" in out, out


def test_coordinates_in_the_reverse_order_are_read_entry_by_entry():
    text = diagnose([(0, 1, 2)], [(2, 1, 0)], ())
    assert "entry 0 holds what entry 2 should" in text and "innermost-first" in text, text


def test_a_prediction_rounded_down_is_named():
    from lib.checker.terms import Q, ceil, explain, formula
    steps = formula(ceil(Q("t", 11, "the time") / Q("s", 4, "a step's time")), "steps")
    assert explain(steps, 2) == ("your answer is 1 step short: it is what the formula gives with rounded down "
                                 "where it must round up (floor for ceil).")


def test_a_prediction_made_with_a_quantitys_other_value_is_named():
    from lib.checker.terms import Q, explain, formula
    size = formula(Q("P", 1000, "the parameters") * Q("4 B", 4, "a float32's bytes", alternatives=((2, "bf16's 2 B"),)),
                   "B")
    assert "with bf16's 2 B where 4 B (a float32's bytes) belongs" in explain(size, 2000)
    assert explain(size, 3500) is None


def test_a_result_the_harness_cannot_unpack_is_said_as_the_answers_not_the_checks():
    """A harness puzzle unpacks what the learner returned in its own code: the error is read as the answer's shape."""
    import puzzles.beyond as B
    import puzzles.moe as M
    for puzzle in (M.router_losses, B.reshard_checkpoint):
        message = puzzle.evaluate(lambda *args: None, seed=1).message
        assert "the check failed to use what it returned" in message, message


# ---- errors raised inside torch, said in the case's terms ------------------------------------------------------
def _sum_of_rows(dist, x):
    """Each row scaled by a weight per row: (n,) against (n, 2) lines up n with 2 (unsqueeze(-1) forgotten)."""
    rows = x.reshape(-1, 2)
    return (rows.sum(-1) * rows).sum()


def _whole_against_a_piece(dist, x):
    """A rank's piece of x against the whole x: the piece was cut, the other side not."""
    return x.chunk(5)[0] * x


def _none_sent(dist, x):
    dist.all_reduce(x)
    dist.broadcast(x.grad, 0)
    return x


def _reads_a_key_never_stored(dist, x):
    stash = {}
    for j in range(2):
        stash[j + 1] = x * j                    # stored one off
    return stash[0]


def _joins_a_part_never_set(dist, x):
    parts = [None] * 2
    for j in range(1, 2):                       # the first part's loop ran no time
        parts[j] = x
    return torch.cat(parts)


@pytest.mark.parametrize("fn,words", [
    (_reads_a_key_never_stored, "a dict was read at the key 0, which it does not hold: a key misspelt or one off"),
    (_joins_a_part_never_set, "a None stands where a tensor belongs"),
    (_sum_of_rows, "Add the missing dimension (t.unsqueeze(-1)"),
    (_whole_against_a_piece, "= k × "),
    (_none_sent, "a .grad backward never reached"),
])
def test_an_error_inside_torch_is_said_in_the_cases_terms(fn, words, capsys):
    def case(rng, n):
        xs = _vectors(rng, n, 10 * rng.randint(1, 2))
        return Case(n, (per_rank(xs),), [sum(xs)] * n, f"N={n}", factors={"k, the number of pieces": 5})
    out = _failure(puzzle(case), fn, capsys)
    assert words in out, out


def test_a_deadlock_is_read_in_the_cases_words_for_its_messages(capsys):
    """Two ranks each receive before they send: the case calls what flows up 'an activation' and what flows down 'a
    gradient', and the message says which each waits for and which one its peer owes it."""
    def case(rng, n):
        xs = _vectors(rng, n, 4)
        return Case(n, (per_rank(xs),), [sum(xs)] * n, f"N={n}",
                    messages=lambda src, dst, nth: f"{ordinal(nth)} {'activation' if src < dst else 'gradient'}")

    def receives_first(dist, x):
        rank, n = dist.get_rank(), dist.get_world_size()
        if rank < n - 1:
            dist.send(x.clone(), rank + 1)
            dist.recv(torch.empty_like(x), rank + 1)
        if rank > 0:
            dist.recv(torch.empty_like(x), rank - 1)
            dist.recv(torch.empty_like(x), rank - 1)
        return x
    out = _failure(puzzle(case), receives_first, capsys)
    assert "rank 1 waits for the 1st gradient from rank 2 before it has sent rank 2 the 2nd activation" in out, out


def test_a_case_with_messages_that_are_not_a_function_is_refused():
    from lib.checker.puzzle import SpecError
    with pytest.raises(SpecError, match="messages="):
        Case(1, (), [None], "one", messages="activation")


def test_an_error_from_the_second_step_on_says_what_carries_between_steps(capsys):
    """A training run that raises at step 2 only: what one step leaves for the next is named, with the step."""
    def frees_the_gradient_it_zeroes_next_step(dist, w, xs, ys):
        w = w.clone().requires_grad_()
        for t in range(len(xs)):
            if t > 0:
                w.grad.zero_()                   # the gradient was freed at the end of the step before
            ((xs[t] @ w - ys[t]) ** 2).mean().backward()
            dist.all_reduce(w.grad)
            with torch.no_grad():
                w -= LR * w.grad / dist.get_world_size()
            w.grad = None
        return w.detach()
    p = Puzzle("diag", "00_test", _train_case, world_sizes=(3, 4), hints=["one"], rtol=1e-13, atol=1e-13)
    out = _failure(p, frees_the_gradient_it_zeroes_next_step, capsys)
    assert "the error comes at step 2: what one step leaves for the next is at fault" in out, out


def test_a_result_made_from_leftover_memory_is_said_so_before_the_cases_own_reading(capsys):
    """torch.empty's leftovers are whatever the allocator hands out (a block freed a step before, NaN): a case's
    reading of their values would name a cause that changes from run to run, so memory read before anything wrote
    it is said instead, found by replays that fill empties with NaN and with a marker."""
    def case(rng, n):
        xs = _vectors(rng, n, 4)
        return Case(n, (per_rank(xs),), [sum(xs)] * n, f"N={n}",
                    explain=lambda expected, got: "Diagnosis: a reading of the values themselves.")

    def sums_into_leftovers(dist, x):
        total = torch.empty_like(x)              # never zeroed: the sum starts from whatever the memory held
        total += x + 1                           # and is wrong whatever it held (zeros, a stale block)
        dist.all_reduce(total)
        return total
    out = _failure(puzzle(case), sums_into_leftovers, capsys)
    assert "from memory nothing wrote" in out, out
    assert "a reading of the values themselves" not in out, out
