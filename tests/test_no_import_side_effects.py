"""Importing the course changes nothing outside it: `builtins.open`, `torch.save`, torch.distributed's names and every
attribute the simulator guards are torch's and Python's own until a run starts, and again once it has ended
(lib.guard.boundary); Python's audit hook, which cannot be removed, is added by the first run (lib.guard.around_run)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: this one has imported the course already. Prints one JSON line.
PROBE = r"""
import _thread, builtins, importlib, inspect, io, json, os, pkgutil, sys, threading, types
import torch, torch.autograd.graph, torch.serialization, torch.utils._python_dispatch as python_dispatch

OWNERS = [builtins, io, os, sys, inspect, threading.Thread, _thread, torch, torch._C, torch.serialization,
          torch.Tensor, torch.UntypedStorage, torch.TypedStorage, python_dispatch, torch.autograd.graph,
          torch.autograd.graph.saved_tensors_hooks]
NAMED = [(builtins, "open"), (io, "open"), (os, "open"), (sys, "_getframe"), (torch, "save"),
         (torch.serialization, "save"), (threading.Thread, "start"), (torch.Tensor, "numpy")]
ABSENT = object()


def snapshot():
    return {(id(owner), name): value for owner in OWNERS for name, value in list(vars(owner).items())}


def changed(before, attributes):
    now = snapshot()
    return [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name in attributes
            if now.get((id(owner), name), ABSENT) is not before.get((id(owner), name), ABSENT)]


import torch.distributed as td
NEWER = ("all_gather_single", "reduce_scatter_single")     # lib.real.compat supplies them in a real rank only
older_torch = {name: vars(td).pop(name) for name in NEWER if name in vars(td)}     # as torch 2.11 lacks them
before = snapshot()
imported = []
for package in ("lib", "puzzles", "tools"):
    imported.append(importlib.import_module(package).__name__)
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        imported.append(importlib.import_module(info.name).__name__)

from lib.guard import boundary
import lib.sim

attributes = NAMED + boundary.patched_attributes()
after_import = changed(before, attributes) + [f"torch.distributed.{name}" for name in NEWER if hasattr(td, name)]
vars(td).update(older_torch)
audit_hook_at_import = sys.modules["lib.guard.audit"]._installed if "lib.guard.audit" in sys.modules else False


def seen_in_a_rank(dist, x):
    return (getattr(torch.save, "_lib_sim_patch", False), getattr(torch.Tensor.numpy, "_lib_sim_patch", False),
            type(sys.modules["lib.sim.context"]).__name__)


during = lib.sim.run(seen_in_a_rank, 2, torch.ones(2)).results[0]
after_run = changed(before, attributes)
try:
    lib.sim.run(lambda dist, x: x.numpy(), 2, torch.ones(2))
    refused = False
except lib.sim.OutOfView:
    refused = True
after_refusal = changed(before, attributes)
engine_modules = sorted({type(m).__name__ for n, m in sys.modules.items() if n == "lib" or n.startswith("lib.")})
print(json.dumps({"audit_hook_at_import": audit_hook_at_import,
                  "audit_hook_after_run": sys.modules["lib.guard.audit"]._installed,
                  "imported": imported, "patched": len(attributes), "after_import": after_import, "during": during,
                  "after_run": after_run, "refused": refused, "after_refusal": after_refusal,
                  "engine_modules": engine_modules}))
"""


@pytest.mark.slow
def test_importing_the_course_and_running_it_leave_the_process_as_it_was():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"lib.sim.runtime", "puzzles.data_parallel", "tools.grade", "lib.real.launch"} <= set(seen["imported"])
    assert seen["patched"] > 40
    assert seen["after_import"] == [], "importing the course changed these"
    assert not seen["audit_hook_at_import"] and seen["audit_hook_after_run"], "the audit hook comes with the first run"
    assert seen["during"] == [True, True, "_EngineModule"], "a run guards them while it lasts"
    assert seen["after_run"] == [], "a run left these patched"
    assert seen["refused"] and seen["after_refusal"] == [], "a refused run left these patched"
    assert seen["engine_modules"] == ["module"]


def test_a_forged_record_of_the_guards_refuses_the_next_run_instead_of_running_unguarded():
    """The record of patches in place is the run's own state (tools.fingerprint counts it as present only): one
    rebound between runs so that nothing would be installed is refused, not trusted."""
    import lib.guard.boundary as boundary
    from lib.sim import run
    from lib.sim.errors import OutOfView
    real = boundary._INSTALLED.saved
    boundary._INSTALLED.saved = [(boundary, "_nothing", 0)]
    try:
        with pytest.raises(OutOfView, match="record of its guards was changed"):
            run(lambda dist: None, 2)
    finally:
        boundary._INSTALLED.saved = real
    assert run(lambda dist: dist.get_rank(), 2).results == [0, 1]
