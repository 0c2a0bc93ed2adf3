"""Every puzzle against its reference solution, its stub, and a catalogue of wrong answers."""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest
import torch

import puzzles
import tests.cheats
import tests.wrong
from lib.checker.puzzle import CheckFailed, NotSolved, fresh_seed

SOLVED = [(p, getattr(importlib.import_module(f"solutions.{p.module}"), p.name)) for p in puzzles.ALL]
IDS = [p.name for p, _ in SOLVED]


def test_every_puzzle_has_a_solution_of_the_same_name():
    assert len(puzzles.ALL) == len({p.name for p in puzzles.ALL}), "puzzle names must be unique"
    for p, fn in SOLVED:
        assert fn.__name__ == p.name


@pytest.mark.parametrize("puzzle,solution", SOLVED, ids=IDS)
def test_solution_passes_in_simulation(puzzle, solution):
    for seed in (0, 1):
        assert puzzle.check(solution, strict=True, seed=seed, show=False)


@pytest.mark.slow
def test_a_ring_all_reduce_may_gather_the_other_way_round():
    """Each phase of a ring all-reduce is a ring of its own: a reduce-scatter to the right, then an all-gather to
    the left, is right (the ring contract judges each step's direction, not the run's)."""
    from puzzles.data_parallel import ring_all_reduce
    from solutions.data_parallel import ring_reduce_scatter

    def all_gather_leftward(dist, chunk):
        rank, world = dist.get_rank(), dist.get_world_size()
        parts = torch.empty(world * chunk.numel(), dtype=chunk.dtype, device=chunk.device).chunk(world)
        parts[rank].copy_(chunk)
        for step in range(world - 1):
            send = dist.isend(parts[(rank + step) % world], (rank - 1) % world)
            dist.recv(parts[(rank + step + 1) % world], (rank + 1) % world)
            send.wait()
        return torch.cat(parts)

    def ring_all_reduce_gathering_leftward(dist, x):
        n = x.numel()
        padded = torch.nn.functional.pad(x, (0, -n % dist.get_world_size()))
        return all_gather_leftward(dist, ring_reduce_scatter(dist, padded))[:n]
    assert ring_all_reduce.check(ring_all_reduce_gathering_leftward, strict=True, seed=fresh_seed(), show=False)


@pytest.mark.parametrize("puzzle,solution", SOLVED, ids=IDS)
def test_solution_passes_on_real_gloo_ranks(puzzle, solution, capsys):
    assert puzzle.real(solution, strict=True)
    n = puzzle.real_world_size
    assert f"✓ real run on {n} process{'es' if n > 1 else ''}" in capsys.readouterr().out


def test_data_parallel_answers_that_let_their_gradients_go_pass_on_real_ranks():
    """The statement compares the parameters, so PyTorch's DDP, which the real run also compares with, lets its
    gradients go as the reference does: a loop that ends with zero_grad(set_to_none=True) is right on real ranks too."""
    from puzzles.data_parallel import data_parallel_train
    from tests.test_other_right_answers import ddp_zero_grad_after_the_update

    assert data_parallel_train.real(ddp_zero_grad_after_the_update, world_size=2, strict=True)


def _stub(dist, *args):
    raise NotImplementedError


@pytest.mark.parametrize("puzzle", puzzles.ALL, ids=[p.name for p in puzzles.ALL])
def test_stub_is_reported_not_solved(puzzle, capsys):
    assert puzzle.check(_stub, strict=False, show=False) is False
    assert "not solved yet" in capsys.readouterr().out
    with pytest.raises(NotSolved):
        puzzle.check(_stub, strict=True, show=False)


@pytest.mark.slow
def test_stub_real_run_is_reported_not_solved(capsys):
    multi_rank = next(p for p in puzzles.ALL if p.real_world_size > 1)
    assert multi_rank.real(_stub, world_size=2, strict=False) is False
    assert "not solved yet" in capsys.readouterr().out


def test_single_device_lesson_refuses_several_processes(capsys):
    single = next(p for p in puzzles.ALL if p.real_world_size == 1)
    assert single.real(_stub, world_size=4, strict=False) is False
    assert "single-device lesson: run it with world_size=1" in capsys.readouterr().out


# ---- the catalogue of wrong answers: each must fail, with the reason in the message ------------
# An entry is (puzzle name, wrong function, reason) or (..., reason, diagnosis): the reason is words the failure
# must contain, the diagnosis words that name the mistake (lib.diagnose); either may be a tuple of alternatives.
def _catalogue(package, attribute: str) -> list[tuple]:
    return [w for name in sorted(m.name for m in pkgutil.iter_modules(package.__path__)) if name != "common"
            for w in getattr(importlib.import_module(f"{package.__name__}.{name}"), attribute)]


WRONG = _catalogue(tests.wrong, "WRONG")
CHEATS = _catalogue(tests.cheats, "CHEATS")
BY_NAME = {p.name: p for p in puzzles.ALL}
CATALOGUE = [(w[0], w[1], w[2], w[3] if len(w) > 3 else None) for w in WRONG]


def _any_of(words) -> tuple:
    return words if isinstance(words, tuple) else (words,)


@pytest.mark.parametrize("name,fn,reason,diagnosis", CATALOGUE, ids=[f"{w[0]}-{w[1].__name__}" for w in CATALOGUE])
def test_wrong_answer_fails_with_reason_diagnosis_and_its_own_hint(name, fn, reason, diagnosis, capsys):
    puzzle = BY_NAME[name]
    seed = fresh_seed()
    assert puzzle.check(fn, strict=False, show=False, seed=seed) is False
    out = capsys.readouterr().out
    assert out.startswith(f"✗ {name} failed on "), out
    assert any(r in out for r in _any_of(reason)), out     # a wrong answer may break either budget
    if diagnosis is not None:
        assert "Diagnosis: " in out and any(d in out for d in _any_of(diagnosis)), out
    # One hint: the puzzle's own (a tier, a budget's, a contract's), or, where the run stopped on an error the
    # simulator or the checker raised (a deadlock, a refusal), that error's own hint, which says what happened.
    hints = [line[len("Hint: "):] for line in out.splitlines() if line.startswith("Hint: ")]
    assert len(hints) == 1, out
    cases = puzzle.cases(seed)
    own = (set(puzzle.hints)
           | {b.hint for c in cases for b in (*c.budgets, *c.contracts, *getattr(c, "axis_budgets", ())) if b.hint})
    stopped = re.match(r"✗ \S+ failed on [^\n]*?: (rank \d+ raised |[A-Z]\w+: )", out)
    if own and not stopped:
        assert any(hints[0].startswith(h) for h in own), out
    with pytest.raises(CheckFailed):
        puzzle.check(fn, strict=True, show=False)


# ---- the catalogue of cheats (tests/cheats): right numbers without the lesson's algorithm, or work hidden from
# the simulator; each must be rejected by a message that names what it did.
@pytest.mark.parametrize("name,fn,reason", CHEATS, ids=[f"{c[0]}-{c[1].__name__}" for c in CHEATS])
def test_cheat_is_rejected_naming_what_it_did(name, fn, reason, capsys):
    puzzle = BY_NAME[name]
    assert puzzle.check(fn, strict=False, show=False) is False
    out = capsys.readouterr().out
    assert out.startswith(f"✗ {name} failed on "), out
    assert any(r in out for r in _any_of(reason)), out
