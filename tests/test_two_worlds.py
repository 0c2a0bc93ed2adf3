"""Two worlds that agree: every program of tests/differential/programs.py on simulated ranks and on real gloo ranks.

Spawning is the expensive part, so the programs of one world size run one after another inside one launch, each
program's outcome (its result, or its exception's class and message) caught per program; programs that may crash or
hang gloo, or leave its connections unusable, run in launches of their own with a short timeout. An outcome is
the same when both worlds return equal values or both refuse; a DELIBERATE program passes when the simulator
refuses it with its listed words (or answers otherwise on purpose, where it has no words).
"""

from __future__ import annotations

import faulthandler
import inspect
import math
from collections import Counter
from functools import lru_cache

import pytest
import torch

import lib.sim
from lib.errors import LaunchError, RankFailed
from lib.real.launch import launch
from lib.sim.dist import SimDist
from lib.sim.objects import OBJECT_CALLS
from tests.differential import programs
from tests.differential.programs import ALONE, BATCH, DELIBERATE, PROGRAMS, SAME, SIM_ONLY, Program

ALONE_TIMEOUT = 3.0          # seconds for a launch of one program that may hang gloo (fork + init take 0.2 s)
# Half precisions round at every addition in both worlds, but a real ring adds in an order that depends on the chunk:
# two units in the last place of the result apart (lib.sim.reduction)
HALF_RTOL = {torch.float16: 2 * 2.0 ** -10, torch.bfloat16: 2 * 2.0 ** -7}
BY_NAME = {p.name: p for p in PROGRAMS}


def _error(exc: BaseException) -> tuple:
    return ("error", type(exc).__name__, str(exc)[:2000])


def _plain(value):
    """A result as plain data: tensors as (dtype, shape, values with NaN and the sign of zero kept)."""
    if isinstance(value, torch.Tensor):
        v = value.detach().cpu()
        return ("tensor", str(v.dtype), tuple(v.shape), v.clone())
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(x) for x in value) if not hasattr(value, "_fields") else tuple(map(_plain, value))
    if isinstance(value, dict):
        return {k: _plain(x) for k, x in value.items()}
    return value


def _run_many(dist, names: list[str]) -> list:
    """Inside each real rank: every program in turn, each outcome caught; a barrier between programs."""
    faulthandler.disable()      # a program that aborts gloo is an outcome, not a dump on the test's terminal
    outcomes = []
    for name in names:
        prog = BY_NAME[name]
        for _ in range(prog.runs):
            try:
                outcomes.append(("ok", _plain(prog.fn(dist))))
            except Exception as exc:               # the program's own refusal, kept as its outcome
                outcomes.append(_error(exc))
            dist.barrier()
    return outcomes


def _real_outcomes(names: list[str], world: int, timeout: float) -> dict[str, list]:
    """name -> [outcome of each run], an outcome being ("ok", [value per rank]) or ("error", class, message)."""
    try:
        per_rank = launch(_run_many, world, names, timeout=timeout, debug=False)
    except (RankFailed, LaunchError) as exc:
        return {name: [_error(exc)] * BY_NAME[name].runs for name in names}
    found, i = {}, 0
    for name in names:
        runs = []
        for _ in range(BY_NAME[name].runs):
            got = [per_rank[r][i] for r in range(world)]
            failed = next((g for g in got if g[0] == "error"), None)
            runs.append(failed or ("ok", [g[1] for g in got]))
            i += 1
        found[name] = runs
    return found


@lru_cache(maxsize=None)
def real_world() -> dict[str, list]:
    """Every program's outcomes on gloo: one launch per world size for BATCH ones, one per run for ALONE ones."""
    found: dict[str, list] = {}
    for world in sorted({p.world for p in PROGRAMS}):
        batch = [p.name for p in PROGRAMS if p.world == world and p.gloo == BATCH]
        got = _real_outcomes(batch, world, timeout=120.0)
        if any(o[0] == "error" and o[1] in ("RankFailed", "LaunchError") for runs in got.values() for o in runs):
            # one program broke the launch: run each alone, so that only the culprit shows a failure
            got = {}
            for name in batch:
                got.update(_real_outcomes([name], world, ALONE_TIMEOUT))
        found.update(got)
    for p in PROGRAMS:
        if p.gloo == ALONE:
            found[p.name] = [_real_outcomes([p.name], p.world, ALONE_TIMEOUT)[p.name][0] for _ in range(p.runs)]
    return found


def sim_outcome(p: Program) -> tuple:
    try:
        return ("ok", [_plain(r) for r in lib.sim.run(p.fn, p.world, timeout=10.0).results])
    except Exception as exc:
        return _error(exc)


def same_values(a, b) -> bool:
    if isinstance(a, tuple) and len(a) == 4 and a[0] == "tensor":
        if not (isinstance(b, tuple) and len(b) == 4 and b[:3] == a[:3]):
            return False
        x, y = a[3], b[3]
        if x.dtype.is_floating_point or x.dtype.is_complex:
            if x.dtype.is_floating_point and not torch.equal(torch.signbit(x), torch.signbit(y)):
                return False
            return torch.allclose(x.to(torch.complex128 if x.dtype.is_complex else torch.float64),
                                  y.to(torch.complex128 if y.dtype.is_complex else torch.float64),
                                  rtol=HALF_RTOL.get(x.dtype, 1e-5), atol=1e-6, equal_nan=True)
        return torch.equal(x, y)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def verdict(p: Program, sim: tuple, real_runs: list) -> str:
    """'same', 'deliberate', or 'gap: why'."""
    if p.label == DELIBERATE:
        if p.words:
            if sim[0] != "error":
                return f"gap: the simulator accepted it (it should refuse with {p.words})"
            missing = [w for w in p.words if w not in sim[2]]
            return f"gap: the simulator's message lacks {missing}: {sim[2][:300]}" if missing else "deliberate"
        return "deliberate"
    for real in real_runs:
        if (sim[0] == "error") != (real[0] == "error"):
            side = "gloo" if real[0] == "error" else "the simulator"
            said = real if real[0] == "error" else sim
            return f"gap: only {side} refused it ({said[1]}: {said[2][:300]})"
        if sim[0] == "ok" and not same_values(sim[1], real[1]):
            return f"gap: different results\n  simulator: {sim[1]}\n  gloo:      {real[1]}"
    return "same"


def test_enough_programs_of_every_kind():
    assert len(PROGRAMS) >= 100
    assert len(BY_NAME) == len(PROGRAMS), "two programs share a name"
    kinds = Counter(p.label for p in PROGRAMS)
    assert kinds[SAME] > kinds[DELIBERATE] > 10
    assert all(p.gloo in (BATCH, ALONE, SIM_ONLY) for p in PROGRAMS)


def test_every_call_of_the_simulated_dist_is_in_a_program():
    source = inspect.getsource(programs)
    calls = [n for n, v in vars(SimDist).items() if callable(v) and not n.startswith("_")]
    assert len(calls) > 30
    assert not [n for n in calls if f"dist.{n}" not in source]


def test_two_worlds_agree():
    """One test for every program, so that one worker of a parallel run makes the real launches (a test per program
    would have each worker launch them all again)."""
    real = real_world()
    gaps = [f"{p.name}: {said}" for p in PROGRAMS
            if (said := verdict(p, sim_outcome(p), real.get(p.name, []))).startswith("gap")]
    assert not gaps, "\n".join(gaps)


# ---- no message shows the simulator's insides ------------------------------------------------------

ENGINE_NAMES = ("SimDist", "RankComm", "Communicator", "Runtime", "RankState", "_GroupNamespace", "_Namespace",
                "ObjectCollectives", "'Group'", "lib.sim")
PUBLIC_PATHS = ["dist.all_reduce_everything", "dist.init_process_group", "dist.destroy_process_group",
                "dist.new_subgroups", "dist.all_gather_coalesced", "dist.send_object_list", "dist.DeviceMesh",
                "dist.group.foo", "dist.GroupMember.foo", "dist.group.WORLD.foo", "group.foo", "group.size_of",
                "work.foo", "p2p.foo", "dist.ReduceOp.FOO"]


def _reach(dist, path: str):
    work = dist.all_reduce(torch.ones(1), async_op=True)
    work.wait()
    group = dist.new_group([0, 1])                   # noqa: F841  (reached through `path`)
    p2p = dist.P2POp(dist.isend, torch.ones(1), 1)   # noqa: F841
    return eval(path)


@pytest.mark.parametrize("path", PUBLIC_PATHS)
def test_unknown_attributes_say_what_to_use_not_the_engines_names(path):
    with pytest.raises(RankFailed) as caught:
        lib.sim.run(_reach, 2, path)
    said = str(caught.value)
    assert "AttributeError" in said
    assert not [name for name in ENGINE_NAMES if name in said], said


@pytest.mark.parametrize("name", OBJECT_CALLS)
def test_object_calls_take_torchs_arguments(name):
    """A learner may pass any argument torch.distributed takes, by name or position, in the same order."""
    real = list(inspect.signature(getattr(torch.distributed, name)).parameters)
    assert list(inspect.signature(getattr(SimDist, name)).parameters)[1:] == real


if __name__ == "__main__":       # python -m tests.test_two_worlds: the counts, and every gap in full
    found = real_world()
    tally = Counter()
    for prog in PROGRAMS:
        v = verdict(prog, sim_outcome(prog), found.get(prog.name, []))
        tally[v.split(":")[0]] += 1
        if v != "same":
            print(f"{prog.name}: {v}")
    print(dict(tally), "of", len(PROGRAMS))
