"""Puzzle(off_limits=...): while the learner's function runs, the listed calls raise OffLimits; before and after,
and in the check's own code, they work."""

import contextlib
import inspect
import random
import re
import sys

import numpy
import pytest
import torch
from numpy._core import _multiarray_umath

import lib.analytic.formulas
import lib.guard.offlimits
import lib.sim
from lib.checker.puzzle import Case, Puzzle
from lib.models import GPTConfig, TinyGPT
from lib.guard.offlimits import MODULE_INIT, OffLimits, watching

ADVICE = "derive it from the configuration"


def _count_case(rng: random.Random, _world: int) -> Case:
    cfg = GPTConfig(vocab=rng.randint(16, 40), layers=rng.randint(1, 2))
    return Case(1, (cfg,), [sum(p.numel() for p in TinyGPT(cfg).parameters())], "a config")   # the check may build


PUZZLE = Puzzle("count", "test", _count_case, world_sizes=(1, 1), takes_dist=False, rtol=0, atol=0,
                off_limits={"building a module": MODULE_INIT, "lib.analytic.formulas": "lib.analytic.formulas"},
                off_limits_advice=ADVICE)


def by_building(cfg):
    return sum(p.numel() for p in TinyGPT(cfg).parameters())


def on_the_meta_device(cfg):
    with torch.device("meta"):
        return by_building(cfg)


def by_formula(cfg):
    return lib.analytic.formulas.model_state_bytes(1) * 0 + by_building(cfg)


def catching_the_refusal(cfg):
    """Inside a simulated rank the refusal stops the run: there is nothing to catch."""
    try:
        return by_building(cfg)
    except BaseException:
        sys.setprofile(None)
        return sum(p.numel() for p in TinyGPT(cfg).parameters())


SETPROFILE_SAVED_BEFORE_THE_CHECK = sys.setprofile


def switching_the_watch_off_and_on(cfg, setprofile=SETPROFILE_SAVED_BEFORE_THE_CHECK):
    """A setter saved before the check switches the watch off: inside a simulated rank only the engine may."""
    setprofile(None)
    return by_building(cfg)


def switching_the_watch_off_and_back_on(cfg):
    """The watch's own original setter switches it off, and an ExitStack callback (Python's library calling the
    setter) back on with the watch's function, so that the check finds it in place at the end."""
    with contextlib.ExitStack() as stack:
        stack.callback(lib.guard.offlimits._SETPROFILE, lib.guard.offlimits._GETPROFILE())
        lib.guard.offlimits._SETPROFILE(None)
        return by_building(cfg)


def switching_it_off_through_the_library(cfg):
    """The saved setter called by Python's library (an ExitStack closing) instead of the learner's own line."""
    with contextlib.ExitStack() as stack:
        stack.callback(SETPROFILE_SAVED_BEFORE_THE_CHECK, None)
    return by_building(cfg)


_FORMULA_SOURCE = inspect.getsource(lib.analytic.formulas.model_state_bytes).replace("def model_state_bytes(",
                                                                                  "def mine(")
_FORMULAS = dict(vars(lib.analytic.formulas))


def by_a_copy_of_the_formula(cfg):
    """The refused function's source, exec'd under another name (its file is '<string>')."""
    namespace = dict(_FORMULAS)
    exec(_FORMULA_SOURCE, namespace)
    return namespace["mine"](1) * 0 + by_hand(cfg)


def by_hand(cfg):
    h = cfg.hidden
    return cfg.vocab * h + cfg.seq * h + cfg.layers * (12 * h * h + 13 * h) + 2 * h


@pytest.mark.parametrize("fn, words", [(by_building, "building a module (TinyGPT(...))"),
                                       (on_the_meta_device, "building a module (TinyGPT(...))"),
                                       (by_formula, "lib.analytic.formulas (model_state_bytes)"),
                                       (catching_the_refusal, "building a module (TinyGPT(...))"),
                                       (switching_the_watch_off_and_on, "reached sys.setprofile"),
                                       (switching_the_watch_off_and_back_on, "lib.guard.offlimits._SETPROFILE"),
                                       (switching_it_off_through_the_library, "reached sys.setprofile"),
                                       (by_a_copy_of_the_formula, "lib.analytic.formulas (mine)")])
def test_off_limits_calls_fail_the_check_and_name_the_call(fn, words, capsys):
    assert PUZZLE.check(fn, strict=False, show=False) is False
    out = capsys.readouterr().out
    assert words in out, out


def test_a_derived_answer_passes_and_the_library_works_again_afterwards(capsys):
    assert PUZZLE.check(by_hand, strict=False, show=False), capsys.readouterr().out
    assert by_building(GPTConfig()) > 0 and lib.analytic.formulas.model_state_bytes(1) == 16


def test_a_prediction_stepping_a_torch_optimizer_is_not_refused_as_a_profiler(capsys):
    # torch.optim's step enters torch.autograd.profiler.record_function, which in torch 2.13 calls into
    # torch.profiler: the profilers are refused by their profile classes, not by their modules.
    import puzzles.memory
    from solutions.memory import training_state_bytes

    def derived_beside_an_adam_step(config):
        p = torch.nn.Parameter(torch.zeros(3))
        p.grad = torch.ones(3)
        torch.optim.Adam([p]).step()
        return training_state_bytes(config)
    assert puzzles.memory.training_state_bytes.check(derived_beside_an_adam_step, strict=False, show=False), \
        capsys.readouterr().out


def test_watching_a_function_by_code_and_a_module_by_name():
    with pytest.raises(OffLimits, match=r"lib.analytic.formulas \(model_state_bytes\)"):
        with watching({"lib.analytic.formulas": "lib.analytic.formulas"}, ADVICE):
            lib.analytic.formulas.model_state_bytes(1)
    with pytest.raises(TypeError, match="only functions"):                        # a number is no call
        with watching({"three": 3}, ADVICE):
            pass
    assert lib.analytic.formulas.model_state_bytes(1) == 16


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


def test_a_refused_function_puts_the_helpers_of_its_module_it_calls_out_of_reach_too():
    """torch.unravel_index's work is done by torch.functional._unravel_index: both are refused."""
    with pytest.raises(OffLimits, match=re.escape("torch.unravel_index (_unravel_index)")):
        with watching({"torch.unravel_index": torch.unravel_index}, ADVICE):
            torch.functional._unravel_index(torch.tensor(5), (2, 3))


# ---- answer keys: what computes a puzzle's expected answer, found in its case builder ------------------------------
def _doubled(x):
    """The answer key: the builder's reference for the expected result."""
    return _twice(x)


def _twice(x):
    """A helper of the answer key, found through it."""
    return 2 * x


def _plus_zero(x):
    """A tool handed to the learner (the puzzle's `tools`): the builder uses it, and so may they."""
    return x + 0


def _key_case(rng: random.Random, world: int) -> Case:
    xs = [torch.randn(3, generator=torch.Generator().manual_seed(rng.randrange(99)), dtype=torch.float64)
          for _ in range(world)]
    return Case(world, (lib.sim.per_rank(xs),), [_plus_zero(_doubled(x)) for x in xs], f"N={world}")


KEYED = Puzzle("doubled", "test", _key_case, world_sizes=(2, 3), rtol=0, atol=0, tools=(_plus_zero,))


def by_the_key(dist, x):
    return _doubled(x)


def by_the_keys_helper(dist, x):
    return _twice(x)


def by_the_keys_copy(dist, x):
    """The key's source, exec'd under another name inside the rank."""
    namespace = {"_twice": lambda y: y + y}
    exec(inspect.getsource(_DOUBLED_SOURCE_OF).replace("def _doubled(", "def mine("), namespace)
    return namespace["mine"](x)


_DOUBLED_SOURCE_OF = _doubled


def by_hand_with_the_tool(dist, x):
    return _plus_zero(x + x)


@pytest.mark.parametrize("fn, words", [(by_the_key, "called tests.test_offlimits._doubled"),
                                       (by_the_keys_helper, "called tests.test_offlimits._twice"),
                                       (by_the_keys_copy, "ran a copy of tests.test_offlimits._doubled")])
def test_answer_keys_are_refused_to_the_ranks_own_code(fn, words, capsys):
    assert KEYED.check(fn, strict=False, show=False) is False
    out = capsys.readouterr().out
    assert words in out and "computes the expected answer of a puzzle's check" in out, out


def test_answer_keys_work_for_the_check_the_tools_for_the_learner_and_both_outside_a_rank(capsys):
    assert KEYED.check(by_hand_with_the_tool, strict=False, show=False), capsys.readouterr().out
    assert torch.equal(_doubled(torch.ones(2)), torch.full((2,), 2.0))          # guarded, the same function
    assert str(inspect.signature(_doubled)) == "(x)" and "A helper" in inspect.getsource(_twice)


def test_formulas_are_answer_keys_but_the_tools_a_notebook_hands_out(capsys):
    """Every formula of lib.analytic.formulas answers some prediction; those notebook 06 hands its learners are
    tools."""
    assert KEYED.check(by_hand_with_the_tool, strict=False, show=False)
    with pytest.raises(lib.sim.OutOfView, match=r"called lib\.analytic\.formulas\.expert_capacity"):
        lib.sim.run(lambda dist: lib.analytic.formulas.expert_capacity(8, 4, 1.0), 1)
    assert lib.sim.run(lambda dist: lib.analytic.formulas.model_state_bytes(1), 1).results == [16]
    assert lib.analytic.formulas.expert_capacity(8, 4, 1.0) == 2
