"""Puzzle(off_limits=...): while the learner's function runs, the listed calls raise OffLimits; before and after,
and in the check's own code, they work."""

import random
import re
import sys

import numpy
import pytest
import torch
from numpy._core import _multiarray_umath

import lib.formulas
from lib.check import Case, Puzzle
from lib.models import GPTConfig, TinyGPT
from lib.offlimits import MODULE_INIT, OffLimits, watching

ADVICE = "derive it from the configuration"


def _count_case(rng: random.Random, _world: int) -> Case:
    cfg = GPTConfig(vocab=rng.randint(16, 40), layers=rng.randint(1, 2))
    return Case(1, (cfg,), [sum(p.numel() for p in TinyGPT(cfg).parameters())], "a config")   # the check may build


PUZZLE = Puzzle("count", "test", _count_case, world_sizes=(1, 1), takes_dist=False, rtol=0, atol=0,
                off_limits={"building a module": MODULE_INIT, "lib.formulas": "lib.formulas"},
                off_limits_advice=ADVICE)


def by_building(cfg):
    return sum(p.numel() for p in TinyGPT(cfg).parameters())


def on_the_meta_device(cfg):
    with torch.device("meta"):
        return by_building(cfg)


def by_formula(cfg):
    return lib.formulas.model_state_bytes(1) * 0 + by_building(cfg)


def catching_the_refusal(cfg):
    try:
        return by_building(cfg)
    except OffLimits:
        import sys
        sys.setprofile(None)          # refused too
        return 0


SETPROFILE_SAVED_BEFORE_THE_CHECK = sys.setprofile


def switching_the_watch_off_and_on(cfg, setprofile=SETPROFILE_SAVED_BEFORE_THE_CHECK):
    """A setter saved before the check switches the watch off; without the watch's function it cannot restore it."""
    setprofile(None)
    return by_building(cfg)


@pytest.mark.parametrize("fn, words", [(by_building, "building a module (TinyGPT(...))"),
                                       (on_the_meta_device, "building a module (TinyGPT(...))"),
                                       (by_formula, "lib.formulas (model_state_bytes)"),
                                       (catching_the_refusal, "sys.setprofile"),
                                       (switching_the_watch_off_and_on, "switched off")])
def test_off_limits_calls_fail_the_check_and_name_the_call(fn, words, capsys):
    assert PUZZLE.check(fn, strict=False, show=False) is False
    out = capsys.readouterr().out
    assert words in out and ADVICE in out, out


def test_a_derived_answer_passes_and_the_library_works_again_afterwards(capsys):
    def derived(cfg):
        h = cfg.hidden
        return cfg.vocab * h + cfg.seq * h + cfg.layers * (12 * h * h + 13 * h) + 2 * h

    assert PUZZLE.check(derived, strict=False, show=False), capsys.readouterr().out
    assert by_building(GPTConfig()) > 0 and lib.formulas.model_state_bytes(1) == 16


def test_watching_a_function_by_code_and_a_module_by_name():
    with pytest.raises(OffLimits, match=r"lib.formulas \(model_state_bytes\)"):
        with watching({"lib.formulas": "lib.formulas"}, ADVICE):
            lib.formulas.model_state_bytes(1)
    with pytest.raises(TypeError, match="only functions"):                        # a number is no call
        with watching({"three": 3}, ADVICE):
            pass
    assert lib.formulas.model_state_bytes(1) == 16


UNRAVEL = {"numpy.unravel_index": numpy.unravel_index, "numpy.ravel_multi_index": numpy.ravel_multi_index,
           "the sum": sum}


@pytest.mark.parametrize("call, words", [
    (lambda: numpy.unravel_index(5, (2, 3)), "numpy.unravel_index (unravel_index)"),
    (lambda: numpy.ravel_multi_index((1, 2), (2, 3)), "numpy.ravel_multi_index (ravel_multi_index)"),
    (lambda: _multiarray_umath.unravel_index(5, (2, 3)), "numpy.unravel_index (unravel_index)"),   # no dispatcher
    (lambda: sum([1, 2]), "the sum (sum)")])
def test_c_functions_are_watched_directly_and_behind_numpys_dispatcher(call, words):
    """numpy's public functions are C functions behind a Python dispatcher: a call of either is seen; other C
    calls (a list's append, divmod) pass, and everything works again after the block."""
    with pytest.raises(OffLimits, match=re.escape(words)):
        with watching(UNRAVEL, ADVICE):
            [].append(divmod(5, 3))
            call()
    assert call() is not None
