"""The second catalogue (tests/mistakes): every realistic first attempt fails, and those marked named are named.

The share of attempts whose message names the mistake is a measurement, reported per notebook by
`python -m bench.mistakes`; here each attempt marked `named_yet` is held to it on seed 0, where it was measured, so
the share cannot slip. Failing is held on a fresh seed each run: a wrong answer never passes, whatever the cases drawn.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import puzzles
import tests.mistakes
from lib.checker.puzzle import fresh_seed

BY_NAME = {p.name: p for p in puzzles.ALL}
ATTEMPTS = [a for name in sorted(m.name for m in pkgutil.iter_modules(tests.mistakes.__path__))
            for a in importlib.import_module(f"tests.mistakes.{name}").MISTAKES]


def test_every_attempt_is_of_a_puzzle_and_unique():
    assert all(a.puzzle in BY_NAME for a in ATTEMPTS), [a.puzzle for a in ATTEMPTS if a.puzzle not in BY_NAME]
    names = [(a.puzzle, a.fn.__name__) for a in ATTEMPTS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("attempt", ATTEMPTS, ids=[f"{a.puzzle}-{a.fn.__name__}" for a in ATTEMPTS])
def test_attempt_fails_and_is_named(attempt, capsys):
    puzzle = BY_NAME[attempt.puzzle]
    seed = fresh_seed()
    assert puzzle.check(attempt.fn, strict=False, show=False, seed=seed) is False, f"passed on seed {seed}"
    out = capsys.readouterr().out
    assert out.startswith(f"✗ {attempt.puzzle} failed on "), out
    if attempt.named_yet and not attempt.names_it(out) and seed != 0:
        puzzle.check(attempt.fn, strict=False, show=False, seed=0)
        out = capsys.readouterr().out
    if attempt.named_yet:
        assert attempt.names_it(out), out
