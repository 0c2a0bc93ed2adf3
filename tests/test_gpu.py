"""The instructors' pre-flight check (./course gpu-check): what it plans on any machine, its report on this one,
and, on a machine with a CUDA GPU, the sweep itself: every reference solution through its real cell on NCCL."""

from __future__ import annotations

import pytest
import torch

import puzzles
from tests.test_content import BY_NAME
from tools.gpu_check import _outcome, main, plan, sweep

NO_CUDA = "no CUDA GPU here: the NCCL sweep runs on a GPU machine (./course gpu-check, or pytest -m gpu there)"


@pytest.mark.parametrize("gpus, single, multi, pipeline", [
    (0, [("gloo", 1)], [("gloo", 4)], [("gloo", 4)]),
    (1, [("nccl", 1)], [("nccl", 1)], [("gloo", 4)]),     # a pipeline's 2 stages cannot share the GPU
    (2, [("nccl", 1)], [("nccl", 1), ("nccl", 2)], [("nccl", 2)]),
    (16, [("nccl", 1)], [("nccl", 1), ("nccl", 8)], [("nccl", 8)]),
])
def test_each_puzzle_runs_where_its_real_cell_can(gpus, single, multi, pipeline):
    assert plan(BY_NAME["checkpointed_step"], gpus) == single
    assert plan(BY_NAME["zero3_train"], gpus) == multi
    assert plan(BY_NAME["gpipe"], gpus) == pipeline


@pytest.mark.slow
def test_the_report_on_this_machine(tmp_path, capsys):
    code = main(["--only", "count_parameters", "ring_all_reduce", "--out", str(tmp_path / "gpu-check.md")])
    out = capsys.readouterr().out
    assert code == 0, out
    table = (tmp_path / "gpu-check.md").read_text()
    assert "| puzzle | backend | world size | | seconds |" in table and f"torch {torch.__version__}" in table
    backend = "nccl" if torch.cuda.device_count() else "gloo"
    assert f"| count_parameters | {backend} | 1 | ✓ |" in table and "2 of 2 runs passed" in table
    assert table in out


@pytest.mark.slow
def test_puzzles_run_side_by_side_give_the_same_table_in_course_order():
    chosen = [BY_NAME[name] for name in ("count_parameters", "ring_all_reduce", "checkpointed_step")]
    runs = sweep(chosen, gpus=0, jobs=2)
    assert [(r.puzzle, r.backend, r.world_size, r.ok) for r in runs] == [
        ("count_parameters", "gloo", 1, True), ("ring_all_reduce", "gloo", 4, True),
        ("checkpointed_step", "gloo", 1, True)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_every_reference_solution_passes_its_real_cell_on_the_gpus():
    runs = sweep(puzzles.ALL)
    failed = [f"{r.puzzle} ({r.backend}, {r.world_size}): {r.problem}" for r in runs if not r.ok]
    assert not failed, "\n".join(failed)
    assert {r.puzzle for r in runs if r.backend == "nccl" and r.world_size == 1} == {
        p.name for p in puzzles.ALL if p.min_world_size == 1}


def test_a_worker_that_dies_fails_its_run_with_why_instead_of_the_sweep():
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool
    died = Future()
    died.set_exception(BrokenProcessPool("A process in the process pool was terminated abruptly"))
    run = _outcome(died, "gpipe", "nccl", 2)
    assert (run.puzzle, run.backend, run.world_size, run.ok) == ("gpipe", "nccl", 2, False)
    assert "worker process running it failed: BrokenProcessPool: A process in the process pool" in run.problem
