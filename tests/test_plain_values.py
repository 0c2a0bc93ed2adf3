"""A check judges plain values, and meters that keep their own rules (issue 45 §2).

A result whose class is a subclass of float, int, dict, list, tuple, Tensor or nn.Module is copied into exact plain
types before anything compares it: each liar here claims the expected value through its own methods (__eq__,
__float__, __iter__, named_parameters) while holding another, and is judged by what it holds. A run whose meters
break their invariants (memory or work below zero, a clock going back, a message's bytes unequal at its two ends) is
refused, naming the meter and the rank.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

import lib.sim.runtime
from lib.checker.puzzle import FAILING, PASSED, Case, Puzzle
from lib.sim import per_rank
from solutions.data_parallel import ring_all_reduce as ring

WEIGHT = [[1.0, 2.0], [3.0, 4.0]]


def _model() -> torch.nn.Linear:
    layer = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(WEIGHT))
    return layer


def _doubled() -> torch.nn.Linear:
    layer = _model()
    with torch.no_grad():
        layer.weight.mul_(2)
    return layer


# What each puzzle expects, built by its case (the model: the argument's weight doubled).
EXPECTED = {"a_float": lambda: 2.5, "an_int": lambda: 7, "a_dict": lambda: {"a": torch.ones(3)},
            "a_list": lambda: [torch.ones(2), torch.zeros(2)], "a_tuple": lambda: (torch.ones(2), 3),
            "a_tensor": lambda: torch.ones(4), "a_model": _doubled}


def _puzzle(name: str) -> Puzzle:
    def make_case(rng: random.Random, n: int) -> Case:
        return Case(1, (_model(),), [EXPECTED[name]()], "one rank")
    return Puzzle(name, "00_test", make_case, world_sizes=(1,), takes_dist=False, real_cell=False)


# ---- liars: each claims the expected value and holds another -------------------------------------------------------
class LyingFloat(float):
    def __eq__(self, other):
        return True

    __hash__ = float.__hash__

    def __float__(self):
        return 2.5


class LyingInt(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__

    def __int__(self):
        return 7

    __index__ = __int__


class LyingDict(dict):
    def __getitem__(self, key):
        return torch.ones(3)

    def items(self):
        return iter([("a", torch.ones(3))])

    def __eq__(self, other):
        return True

    __hash__ = None


class LyingList(list):
    def __iter__(self):
        return iter([torch.ones(2), torch.zeros(2)])

    def __getitem__(self, i):
        return [torch.ones(2), torch.zeros(2)][i]

    def __eq__(self, other):
        return True

    __hash__ = None


class LyingTuple(tuple):
    def __iter__(self):
        return iter([torch.ones(2), 3])

    def __getitem__(self, i):
        return (torch.ones(2), 3)[i]

    def __eq__(self, other):
        return True

    __hash__ = tuple.__hash__


class LyingTensor(torch.Tensor):
    def __eq__(self, other):
        return torch.ones(4, dtype=torch.bool)

    __hash__ = torch.Tensor.__hash__

    def tolist(self):
        return [1.0] * 4


class LyingLinear(torch.nn.Linear):
    """Holds the argument's weight untrained, and names a doubled copy as its parameter."""

    def named_parameters(self, *args, **kwargs):
        return iter([("weight", torch.nn.Parameter(self.weight.detach() * 2))])

    def parameters(self, *args, **kwargs):
        return iter([p for _, p in self.named_parameters()])


def lying_linear(model):
    liar = LyingLinear(2, 2, bias=False)
    with torch.no_grad():
        liar.weight.copy_(model.weight)
    return liar


def instance_that_lies(model):
    model.named_parameters = lambda *a, **k: iter([("weight", torch.nn.Parameter(model.weight.detach() * 2))])
    return model


LIARS = [("a_float", lambda model: LyingFloat(9.0)), ("an_int", lambda model: LyingInt(3)),
         ("a_dict", lambda model: LyingDict({"a": torch.zeros(3)})),
         ("a_list", lambda model: LyingList([torch.zeros(2), torch.zeros(2)])),
         ("a_tuple", lambda model: LyingTuple((torch.zeros(2), 4))),
         ("a_tensor", lambda model: torch.zeros(4).as_subclass(LyingTensor)),
         ("a_model", lying_linear), ("a_model", instance_that_lies)]

HONEST = [("a_float", lambda model: LyingFloat(2.5)), ("an_int", lambda model: LyingInt(7)),
          ("a_dict", lambda model: LyingDict({"a": torch.ones(3)})),
          ("a_list", lambda model: LyingList([torch.ones(2), torch.zeros(2)])),
          ("a_tuple", lambda model: LyingTuple((torch.ones(2), 3))),
          ("a_tensor", lambda model: torch.ones(4).as_subclass(LyingTensor))]


@pytest.mark.parametrize("name, answer", LIARS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(LIARS)])
def test_a_subclass_that_claims_the_answer_is_judged_by_the_value_it_holds(name, answer):
    outcome = _puzzle(name).evaluate(answer, seed=0)
    assert outcome.status == FAILING, outcome.message
    assert "rank 0: the result" in outcome.message, outcome.message


@pytest.mark.parametrize("name, answer", HONEST, ids=[f"{n}-{i}" for i, (n, _) in enumerate(HONEST)])
def test_a_subclass_holding_the_right_value_passes_as_that_value(name, answer):
    outcome = _puzzle(name).evaluate(answer, seed=0)
    assert outcome.status == PASSED, outcome.message


def test_the_model_is_read_as_its_state_and_a_right_one_passes():
    def doubles(model):
        with torch.no_grad():
            model.weight.mul_(2)
        return model
    assert _puzzle("a_model").evaluate(doubles, seed=0).status == PASSED


def test_an_object_of_an_unknown_class_equals_nothing():
    class Anything:
        def __eq__(self, other):
            return True
    outcome = _puzzle("a_float").evaluate(lambda model: Anything(), seed=0)
    assert outcome.status == FAILING, outcome.message
    assert "expected 2.5, got an object of its own class Anything" in outcome.message, outcome.message


# ---- meters that keep their own rules -------------------------------------------------------------------------------
def _sum_case(rng: random.Random, n: int) -> Case:
    xs = [torch.full((4,), float(r)) for r in range(n)]
    return Case(n, (per_rank(xs),), [sum(xs)] * n, f"N={n}")


def _stat(result, rank, **changes):
    result.stats[rank] = dataclasses.replace(result.stats[rank], **changes)


def _event(result, pick, **changes):
    i = next(i for i, e in enumerate(result.trace) if pick(e))
    result.trace[i] = dataclasses.replace(result.trace[i], **changes)


BREAKS = [
    ("negative peak", lambda r: _stat(r, 1, peak_memory=-54 * 1024), "rank 1's peak memory reads -54.00 KiB"),
    ("negative host peak", lambda r: _stat(r, 0, host_peak_memory=-8), "rank 0's peak host memory reads -8 B"),
    ("negative flops", lambda r: _stat(r, 1, flops=-3.0), "rank 1's FLOPs reads -3"),
    ("negative bytes", lambda r: _stat(r, 0, bytes_sent=-16.0), "rank 0's bytes sent reads -16 B"),
    ("negative live memory", lambda r: _stat(r, 1, memory=[(0.0, 0), (1e-6, -4)]), "rank 1's memory reads -4 B"),
    ("memory back in time", lambda r: _stat(r, 0, memory=[(0.0, 0), (2e-6, 16), (1e-6, 0)]),
     "rank 0's memory timeline goes back in time"),
    ("clock back in an op", lambda r: _event(r, lambda e: e.rank == 1 and e.op == "send", end=-1.0),
     "rank 1's clock went back in its send"),
    ("clock before its last op", lambda r: _stat(r, 0, clock=0.0), "rank 0's clock reads 0 s at its return"),
    ("bytes lost", lambda r: _stat(r, 1, bytes_received=r.stats[1].bytes_received - 4),
     "rank 1 16 B / 12 B"),
    ("message bytes unequal", lambda r: _event(r, lambda e: e.op == "recv" and e.rank == 1, bytes=1.0),
     "and rank 1 received 1 B of that message"),
]


@pytest.mark.parametrize("what, breaks, words", BREAKS, ids=[b[0] for b in BREAKS])
def test_a_run_whose_meters_break_their_rules_is_refused_naming_the_meter_and_the_rank(what, breaks, words,
                                                                                        monkeypatch):
    measured = lib.sim.runtime.Runtime.result

    def broken(self):
        result = measured(self)
        breaks(result)
        return result
    puzzle = Puzzle("ring_sum", "00_test", _sum_case, world_sizes=(2,))
    assert puzzle.evaluate(ring, seed=0).status == PASSED
    monkeypatch.setattr(lib.sim.runtime.Runtime, "result", broken)
    outcome = puzzle.evaluate(ring, seed=0)
    assert outcome.status == FAILING and "MeterBroken" in outcome.message and words in outcome.message, \
        outcome.message


def test_a_real_run_judges_the_plain_value_too(capsys):
    """A real cell's rank compares in its own process: with the same plain copy (a list whose __iter__ lies)."""
    lying = _puzzle("a_list").real(lambda model: LyingList([torch.zeros(2), torch.zeros(2)]), world_size=1, seed=0,
                                   strict=False)
    assert lying is False and "the result[0]" in capsys.readouterr().out
    assert _puzzle("a_list").real(lambda model: LyingList([torch.ones(2), torch.zeros(2)]), world_size=1, seed=0,
                                  strict=False) is True
