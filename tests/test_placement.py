"""Without a GPU, a tensor that a GPU run would leave on the CPU is caught (lib.real.left_on_cpu.watch): on small
programs, on the mistakes the GPU machine found, and on every reference solution's real path."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

import lib
import lib.checker.puzzle
import lib.real.backends
import puzzles.tensor_parallel as TP
from lib.errors import RankFailed
from lib.real.left_on_cpu import MixedDevices, watch
from tests.test_content import BY_NAME, SOLVED, IDS


def _device(*shape):
    return torch.randn(*shape, device=lib.device())


PROGRAMS = {   # name: (program, flagged?)
    "a factory given no device": (lambda: _device(3) + torch.randn(3), True),
    "a module built without a device": (lambda: torch.nn.Linear(3, 3)(_device(2, 3)), True),
    "a tensor in host memory": (lambda: _device(3) * torch.ones(3, device=lib.host()), True),
    "a result copied with .cpu()": (lambda: _device(3).cpu() + _device(3), True),
    "a gradient left on the host": (lambda: (_device(3).requires_grad_() * 2).backward(torch.ones(3)), True),
    "a moved tensor": (lambda: _device(3) + torch.randn(3).to(lib.device()), False),
    "device=x.device": (lambda: _device(3) + torch.zeros(3, device=_device(1).device), False),
    ".to(x.device)": (lambda: _device(3) + torch.randn(3).to(_device(1).device), False),
    "a moved module": (lambda: torch.nn.Linear(3, 3).to(lib.device())(_device(2, 3)), False),
    "a CPU scalar": (lambda: _device(3) * torch.tensor(2.0), False),
    "a deep copy": (lambda: importlib.import_module("copy").deepcopy(_device(3)) + _device(3), False),
    "host arithmetic": (lambda: torch.randn(3) + torch.ones(3, device=lib.host()), False),
}


def _run_programs(dist):
    verdicts = {}
    with watch():
        for name, (program, _) in PROGRAMS.items():
            try:
                program()
                verdicts[name] = False
            except MixedDevices:
                verdicts[name] = True
    return verdicts


def test_the_watch_flags_exactly_the_ops_a_gpu_would_refuse():
    verdicts = lib.launch(_run_programs, 1)[0]
    assert verdicts == {name: flagged for name, (_, flagged) in PROGRAMS.items()}


def test_outside_the_watch_nothing_changes():
    assert lib.device() == torch.device("cpu")
    with watch():
        assert lib.device() == torch.device("cpu", 0) and lib.host() == torch.device("cpu", 1)
        with pytest.raises(MixedDevices, match=r"add was given tensors a GPU run holds in different places: "
                                               r"\(3,\) on the device, \(3,\) on the host"):
            _device(3) + torch.randn(3)
    assert lib.device() == torch.device("cpu")
    torch.randn(3, device=torch.device("cpu", 0)) + torch.randn(3)


def _watched(dist, puzzle, fn, seed):
    with watch():
        return puzzle._judge_in_group(fn, dist, seed)


def _watched_world(puzzle) -> int:
    return 1 if max(puzzle.world_sizes) == 1 else max(2, puzzle.min_world_size)


@pytest.mark.slow
@pytest.mark.parametrize("puzzle,solution", SOLVED, ids=IDS)
def test_reference_solution_real_path_keeps_every_tensor_on_its_device(puzzle, solution):
    """Case, wrapper, reference solution and oracle, as a real cell runs them, with every tensor watched."""
    verdicts = lib.launch(_watched, _watched_world(puzzle), puzzle, solution, 0, timeout=180)
    assert [problem for problem, *_ in verdicts] == [None] * len(verdicts)


def _mover_that_skips_dataclasses(obj, where=None):
    """The mover before issue 19: containers and tensors, but a dataclass (TP's Upstream) stayed where it was."""
    if dataclasses.is_dataclass(obj):
        return obj
    if isinstance(obj, (list, tuple, dict)):
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        moved = {k: _mover_that_skips_dataclasses(v, where) for k, v in items}
        return moved if isinstance(obj, dict) else type(obj)(moved.values())
    return lib.real.backends.to_device(obj, where)


def _linear_built_on_the_cpu(dist, w, bias, w_dim, bias_sharded):
    """The oracle's layer before issue 19: built without a device, relying on the mesh to move it."""
    full_w = TP._gather_full(dist, w, w_dim)
    layer = torch.nn.Linear(full_w.shape[1], full_w.shape[0], bias=bias is not None, dtype=full_w.dtype)
    with torch.no_grad():
        layer.weight.copy_(full_w)
        if bias is not None:
            layer.bias.copy_(TP._gather_full(dist, bias, 0) if bias_sharded else bias.detach())
    return layer


@pytest.mark.slow
@pytest.mark.parametrize("where, stand_in, then, words", [
    (lib.checker.puzzle, "to_device", _mover_that_skips_dataclasses,
     'backward was given a gradient on the host for an output on the device. On a GPU this fails \\("invalid '
     'gradient at index 0 - expected device cuda:0 but got cpu'),
    (TP, "_linear", _linear_built_on_the_cpu,
     r"addmm was given tensors a GPU run holds in different places: .* on the device, .* on the host"),
])
def test_the_watch_catches_the_real_path_mistakes_the_gpu_found(where, stand_in, then, words, monkeypatch):
    """The upstream gradient left on the CPU (TP wrapper), an oracle's module left on the CPU: the forked
    ranks inherit the old code, and the watch stops them where a GPU would have."""
    monkeypatch.setattr(where, stand_in, then)
    solution = {p.name: fn for p, fn in SOLVED}["row_parallel_linear"]
    with pytest.raises(RankFailed, match="MixedDevices: " + words):
        lib.launch(_watched, 2, BY_NAME["row_parallel_linear"], solution, 0, timeout=180)
