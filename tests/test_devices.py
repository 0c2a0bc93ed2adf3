"""Real cells on any device: what a rank is handed follows lib.device(), meshes follow the backend, a GPU's
rounding is tolerated while every wrong answer still fails, older torch gets the new names, and impossible
requests are refused before any process starts. (The checks that need a GPU are in tests/test_gpu.py.)"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.distributed as td

import lib
import lib.real.torchrun
import puzzles
from lib.checker.puzzle import GPU_TOLERANCE
from lib.real.compat import NEWER_NAMES, supply_newer_names
from lib.real.backends import mesh_device_type, nccl_shortfall, to_device, where_it_runs
from lib.errors import LaunchError
from tests.test_content import BY_NAME, WRONG, _any_of

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = importlib.import_module("lib.real.launch")     # the module (lib.launch is the function)
META = torch.device("meta")     # a device other than the CPU, to see what moved


# ---- one mover for everything a case hands to a rank -----------------------------------------------
@dataclasses.dataclass(frozen=True)
class Held:
    grad: torch.Tensor
    pattern: dict
    note: str = "kept"


class Pair(NamedTuple):
    a: torch.Tensor
    b: int


def test_to_device_moves_tensors_inside_dataclasses_containers_and_modules():
    leaf = torch.randn(3, requires_grad=True)
    obj = {"held": Held(torch.randn(2), {"forward": [("all_reduce", 4)]}), "pair": Pair(torch.randn(1), 7),
           "list": [torch.randn(2), (leaf, "x")], "model": torch.nn.Linear(2, 2), "n": 3}
    moved = to_device(obj, META)
    assert moved["held"].grad.device == META and moved["held"].pattern == {"forward": [("all_reduce", 4)]}
    assert isinstance(moved["held"], Held) and moved["held"].note == "kept"
    assert isinstance(moved["pair"], Pair) and moved["pair"].a.device == META and moved["pair"].b == 7
    assert moved["list"][0].device == META and moved["list"][1][1] == "x"
    new_leaf = moved["list"][1][0]
    assert new_leaf.device == META and new_leaf.is_leaf and new_leaf.requires_grad   # .grad lands on the device
    assert all(p.device == META for p in moved["model"].parameters()) and moved["n"] == 3
    assert obj["held"].grad.device.type == "cpu"                                      # the original is untouched


class _Backend:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_backend(self, group=None) -> str:
        return self.name


@pytest.mark.parametrize("backend, kind", [("nccl", "cuda"), ("gloo", "cpu"), ("cpu:gloo,cuda:nccl", "cuda"),
                                           ("sim", "cpu")])
def test_a_mesh_takes_the_device_type_of_the_groups_backend(backend, kind):
    assert mesh_device_type(_Backend(backend)) == kind


def test_no_oracle_builds_a_cpu_mesh_by_hand():
    """A CPU mesh on an NCCL group fails ("No backend type associated with device type cpu"): every oracle's
    mesh comes from lib.real.backends.device_mesh, which follows the backend."""
    for module in puzzles.MODULES:
        source = Path(module.__file__).read_text()
        assert 'init_device_mesh("cpu"' not in source, f"{module.__name__}: use lib.real.backends.device_mesh(dist)"


# ---- tolerance that fits the device --------------------------------------------------------------
def test_real_tolerance_is_strict_on_the_cpu_and_admits_gpu_rounding():
    p = BY_NAME["checkpointed_step"]                          # float64, rtol 1e-10
    expected = p.make_case(random.Random("t"), 1).expected[0]
    assert p.real_tolerance(expected, torch.device("cpu")) == (p.rtol, p.atol)
    assert p.real_tolerance(expected, torch.device("cuda", 0)) == GPU_TOLERANCE[torch.float64]
    # the H100's 0.0677730295 against the CPU's 0.0677730285 (NOTES.md): rejected on the CPU, admitted on a GPU
    assert not torch.isclose(torch.tensor(0.0677730295, dtype=torch.float64), torch.tensor(0.0677730285,
                             dtype=torch.float64), rtol=p.rtol, atol=p.atol)
    rtol, atol = p.real_tolerance(expected, torch.device("cuda", 0))
    assert torch.isclose(torch.tensor(0.0677730295, dtype=torch.float64), torch.tensor(0.0677730285,
                         dtype=torch.float64), rtol=rtol, atol=atol)
    counts = BY_NAME["count_parameters"]                      # an integer is exact on any device
    assert counts.real_tolerance(1234, torch.device("cuda", 0)) == (0, 0)
    ring = BY_NAME["ring_all_reduce"]                         # float32: never below the puzzle's own tolerance
    assert ring.real_tolerance([torch.zeros(2)], torch.device("cuda", 0)) == (
        max(ring.rtol, GPU_TOLERANCE[torch.float32][0]), max(ring.atol, GPU_TOLERANCE[torch.float32][1]))


def _as_on_a_gpu(puzzle):
    """The puzzle judging with the tolerance a real run on a GPU uses, for its cases' dtype."""
    expected = puzzle.make_case(random.Random(f"{puzzle.name}:0"), puzzle.world_sizes[0]).expected
    gpu = copy.copy(puzzle)
    gpu.rtol, gpu.atol = puzzle.real_tolerance(expected, torch.device("cuda", 0))
    return gpu


@pytest.mark.parametrize("name,fn,reason", [w[:3] for w in WRONG], ids=[w[1].__name__ for w in WRONG])
def test_gpu_tolerance_still_fails_every_wrong_answer(name, fn, reason, capsys):
    gpu = _as_on_a_gpu(BY_NAME[name])
    assert gpu.check(fn, strict=False, show=False) is False
    out = capsys.readouterr().out
    assert out.startswith(f"✗ {name} failed on ") and any(r in out for r in _any_of(reason)), out


# ---- torch older than the names the course teaches --------------------------------------------------
def _new_names_only(dist, n):
    """What zero1_train and the sequence-parallel MLP call: the torch 2.13 names."""
    out = torch.empty(n * dist.get_world_size())
    dist.all_gather_single(out, torch.full((n,), float(dist.get_rank())))
    shard = torch.empty(n)
    dist.reduce_scatter_single(shard, torch.ones(n * dist.get_world_size()))
    return out.tolist(), shard.tolist(), [getattr(dist, new).__name__ for new in NEWER_NAMES]


def test_an_older_torch_gets_the_new_names_in_each_real_rank(monkeypatch):
    """torch 2.11 has no all_gather_single / reduce_scatter_single: each real rank supplies them (lib.real.launch),
    and the launching process is left as it was."""
    for new in NEWER_NAMES:
        monkeypatch.delattr(td, new)
    results = lib.launch(_new_names_only, 2, 3)
    assert results[1] == ([0.0] * 3 + [1.0] * 3, [2.0] * 3, list(NEWER_NAMES.values()))
    assert not any(hasattr(td, new) for new in NEWER_NAMES)
    assert sorted(supply_newer_names()) == sorted(NEWER_NAMES)
    assert supply_newer_names() == []                         # a name torch has is never replaced


@pytest.mark.slow
def test_importing_lib_supplies_no_names_in_a_fresh_interpreter():
    """The fresh interpreter of an older torch: `import lib` (torchrun's entry too) leaves torch.distributed as it is,
    as nothing changes the process at import; the names are supplied where real ranks start."""
    code = ("import torch.distributed as d\n"
            + "".join(f"del d.{new}\n" for new in NEWER_NAMES)
            + "import lib, lib.real.torchrun\n"
            + "".join(f"assert not hasattr(d, '{new}'), '{new}'\n" for new in NEWER_NAMES)
            + "from lib.real.compat import supply_newer_names\n"
            + f"assert sorted(supply_newer_names()) == {sorted(NEWER_NAMES)!r}\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr


# aten ops of torch 2.13 that torch 2.11 lacks: torch 2.11.0+cu130's registered ops, read on an H200 on 2026-11-27
# (bench/results/gpu-check-nvidia-h200.md). The simulator's FLOP table named one of them, and `import lib` failed there.
OPS_NEWER_THAN_2_11 = ("_flash_attention_forward_no_dropout_inplace", "_foreach_clone", "_foreach_mm",
                       "_philox_key_fold_in", "_philox_key_split", "_philox_normal", "_philox_normal_",
                       "_philox_uniform", "_philox_uniform_", "_upsample_lanczos2d_aa",
                       "_upsample_lanczos2d_aa_backward")


@pytest.mark.slow
def test_the_course_imports_and_checks_on_the_ops_of_torch_2_11():
    """A fresh interpreter whose torch lacks what 2.11 lacks (ops and names): lib and the puzzles import, and
    reference solutions pass their simulated checks."""
    code = ("import sys, torch, torch._ops, torch.distributed as d\n"
            "gone, lookup = set(sys.argv[1:]), torch._ops._OpNamespace.__getattr__\n"
            "def lacking(self, name):                            # to the course: torch 2.13's own code uses them\n"
            "    outside = not sys._getframe(1).f_globals.get('__name__', '').startswith('torch')\n"
            "    if self.name == 'aten' and name in gone and outside:\n"
            "        raise AttributeError(name)\n"
            "    return lookup(self, name)\n"
            "torch._ops._OpNamespace.__getattr__ = lacking\n"
            "for name in gone:                                   # looked up already, while torch imported\n"
            "    torch.ops.aten.__dict__.pop(name, None)\n"
            "assert not hasattr(torch.ops.aten, '_foreach_mm')\n"
            + "".join(f"del d.{new}\n" for new in NEWER_NAMES)
            + "import importlib, puzzles\n"
            "for p in puzzles.ALL:\n"
            "    if p.name in ('megatron_mlp', 'ring_attention', 'moe_layer_backward', 'diloco_train'):\n"
            "        fn = getattr(importlib.import_module('solutions.' + p.module), p.name)\n"
            "        assert p.evaluate(fn, 0).ok, p.name\n")
    done = subprocess.run([sys.executable, "-c", code, *OPS_NEWER_THAN_2_11], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_a_reference_solution_runs_on_the_older_names(monkeypatch, capsys):
    for new in NEWER_NAMES:
        monkeypatch.delattr(td, new)
    supply_newer_names()
    solution = importlib.import_module("solutions.zero").zero1_train
    assert BY_NAME["zero1_train"].real(solution, world_size=2, strict=True)


# ---- refused before any process starts ------------------------------------------------------------
@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr(LAUNCH, "_fork_ranks", refuse)
    monkeypatch.setattr(LAUNCH, "_spawn_ranks", refuse)


@pytest.mark.parametrize("name", [p.name for p in puzzles.ALL if p.module == "pipeline"])
def test_a_pipeline_of_one_stage_is_refused_with_the_fix(name, no_launch, capsys):
    puzzle = BY_NAME[name]
    assert puzzle.min_world_size == 2
    assert puzzle.real(lambda *a: None, world_size=1, strict=False) is False
    out = capsys.readouterr().out
    assert f"{name} needs at least 2 ranks" in out and "no neighbour" in out and "world_size=2 or more" in out
    assert where_it_runs(2) in out


@pytest.mark.parametrize("gpus, words", [
    (0, "no GPU that torch can use"),
    (1, "this machine has 1 GPU, and NCCL needs one GPU per rank (two ranks on one GPU fail with 'Duplicate GPU "
        "detected')"),
])
def test_nccl_with_more_ranks_than_gpus_is_refused_with_the_fix(gpus, words, monkeypatch, no_launch):
    monkeypatch.setattr(LAUNCH, "visible_gpus", lambda: gpus)
    with pytest.raises(LaunchError) as refused:
        lib.launch(_new_names_only, 4, 1, backend="nccl")
    text = str(refused.value)
    assert words in text and "world_size=4 runs on gloo: pass backend='gloo'" in text
    assert ("ask for world_size=1 or less to run on NCCL" in text) == (gpus == 1)


def test_the_default_backend_never_puts_two_ranks_on_one_gpu(monkeypatch):
    monkeypatch.setattr(LAUNCH, "visible_gpus", lambda: 1)
    assert LAUNCH._pick_backend(1, None) == "nccl"
    assert LAUNCH._pick_backend(2, None) == "gloo"
    assert nccl_shortfall(2, 2) is None and nccl_shortfall(3, 2)
    assert where_it_runs(4, gpus=1) == "on this machine (1 GPU) world_size=4 runs on gloo on the CPU"
    assert where_it_runs(2, gpus=8).endswith("runs on NCCL, one GPU per rank")


def test_a_real_cell_reports_an_impossible_nccl_request(monkeypatch, no_launch, capsys):
    monkeypatch.setattr(LAUNCH, "visible_gpus", lambda: 1)
    solution = importlib.import_module("solutions.data_parallel").ring_all_reduce
    assert BY_NAME["ring_all_reduce"].real(solution, world_size=4, backend="nccl", strict=False) is False
    assert "✗ real run of ring_all_reduce failed: LaunchError: NCCL cannot run 4 ranks here" in capsys.readouterr().out


def test_torchrun_refuses_more_ranks_per_node_than_gpus(monkeypatch):
    monkeypatch.setattr(lib.real.torchrun, "visible_gpus", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match=r"torchrun started 2 ranks on this node, but this machine has 1 GPU.*"
                                         r"--nproc-per-node 1 or less"):
        lib.real.torchrun.main(["tests.test_launch:torchrun_target"])


@pytest.mark.parametrize("dtype, loss_dtype", [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                               (torch.bfloat16, torch.float32)])
def test_the_tiny_gpts_loss_is_computed_in_fp32_at_least_and_never_below_the_model(dtype, loss_dtype):
    """A float64 model's cross-entropy in float32 made its gradients differ between a GPU and the CPU by fp32's
    rounding (7.5e-11 on a gradient of 6e-8), which Adam near its eps made a failed real check on an H200."""
    from lib.models import GPTConfig, TinyGPT
    torch.manual_seed(0)
    cfg = GPTConfig(vocab=16, seq=8, hidden=16, heads=2, layers=1)
    model = TinyGPT(cfg).to(dtype)
    tokens = torch.randint(0, cfg.vocab, (2, cfg.seq))
    assert model.loss(tokens, tokens).dtype == loss_dtype
