"""The simulator's two narrow measures, byte for byte: what a rank reads of its arguments (RankStats.argument_reads,
lib/sim/reads.py) and the largest tensor it made (RankStats.largest_tensor). Budgets of reshard_checkpoint and of
ring and Ulysses attention stand on them, so each rule they state is asserted here with its exact bytes."""

from __future__ import annotations

import pytest
import torch

import lib.sim

F64, F32 = 8, 4                    # bytes per element


def _x() -> torch.Tensor:
    """The first argument: 100 float64 (800 bytes)."""
    return torch.arange(100, dtype=torch.float64)


def _y() -> torch.Tensor:
    """The second: 50 float32 (200 bytes)."""
    return torch.ones(50)


def _reads(body, *args) -> tuple[int, ...]:
    """The bytes one rank running `body(*args)` read of each positional argument."""
    def program(dist, *a):
        body(*a)                   # nothing returned: only the body's ops are measured
    return lib.sim.run(program, 1, *args, read_arguments=True).stats[0].argument_reads


def _index() -> torch.Tensor:
    return torch.tensor([1, 5, 7])


def _first_five() -> torch.Tensor:
    mask = torch.zeros(100, dtype=torch.bool)
    mask[:5] = True
    return mask


READS = {
    # a view is free, whatever its kind
    "slice": (lambda x: x[10:20], 0),
    "views of views": (lambda x: x.view(10, 10)[2:4].t().narrow(0, 1, 1).reshape(-1), 0),
    # an op on a view reads the view's bytes, not its storage's
    "clone of a slice": (lambda x: x[10:20].clone(), 10 * F64),
    "arithmetic on a slice": (lambda x: x[10:20] + 1, 10 * F64),
    "reduction of the whole": (lambda x: x.sum(), 100 * F64),
    "strided slice": (lambda x: x[::4].contiguous(), 25 * F64),
    "cat of two slices": (lambda x: torch.cat([x[:3], x[50:55]]), 8 * F64),
    # picking ops read at most what they return (their index, made by the rank, is not an argument)
    "index with a tensor": (lambda x: x[_index()], 3 * F64),
    "index_select": (lambda x: x.index_select(0, _index()), 3 * F64),
    "gather": (lambda x: torch.gather(x, 0, _index()), 3 * F64),
    "masked_select": (lambda x: x.masked_select(_first_five()), 5 * F64),
    "boolean mask": (lambda x: x[_first_five()], 5 * F64),
    # ... and never more than the view they pick from, however often an element is picked
    "index repeating": (lambda x: x[:10][torch.zeros(40, dtype=torch.long)], 10 * F64),
    # shape-only ops look at the shape, dtype and device
    "empty_like": (lambda x: torch.empty_like(x), 0),
    "zeros_like": (lambda x: torch.zeros_like(x), 0),
    "new_zeros": (lambda x: x.new_zeros(7), 0),
    # a read around the dispatcher
    "tolist of a slice": (lambda x: x[:10].tolist(), 10 * F64),
    # what the rank made itself is its own: reading its clone again costs nothing more
    "a copy read again": (lambda x: x[:10].clone().sum() + x[:10].clone().mul(2).sum(), 20 * F64),
    "a tensor of its own": (lambda x: torch.ones(100, dtype=torch.float64).sum(), 0),
}


@pytest.mark.parametrize("body,expected", READS.values(), ids=READS.keys())
def test_argument_reads_of_one_argument(body, expected):
    assert _reads(body, _x()) == (expected,)


def test_reads_are_counted_per_positional_argument():
    def body(x, y, step):
        x[:5].sum(), y.sum(), y[:2].clone()
    assert _reads(body, _x(), _y(), 3) == (5 * F64, 52 * F32, 0)


def test_the_tensors_inside_an_argument_count_to_it():
    """A list of dicts of tensors (a checkpoint's files) is one argument: each file read adds to it."""
    files = [{"param": _x(), "step": 1}, {"param": _x(), "step": 1}]

    def body(files):
        torch.cat([files[0]["param"][:10], files[1]["param"][90:]])
    assert _reads(body, files) == (20 * F64,)


def test_reads_are_measured_only_when_asked():
    result = lib.sim.run(lambda dist, x: x.sum(), 2, _x())
    assert [s.argument_reads for s in result.stats] == [(), ()]


def test_each_rank_measures_its_own_reads():
    def program(dist, x):
        x[:10 * (dist.get_rank() + 1)].sum()
    result = lib.sim.run(program, 3, _x(), read_arguments=True)
    assert [s.argument_reads for s in result.stats] == [(80,), (160,), (240,)]


# ---- largest_tensor: the largest storage the rank's own ops allocated --------------------------------------------
def _largest(program, world: int = 1, *args) -> list[int]:
    return [s.largest_tensor for s in lib.sim.run(program, world, *args).stats]


def test_the_largest_storage_counts_even_after_it_is_freed():
    def program(dist):
        big = torch.empty(1000)
        del big
        torch.empty(10, 10).view(-1)[:5].clone()
    assert _largest(program) == [1000 * F32]


def test_the_arguments_copies_are_not_the_ranks_allocations():
    def program(dist, x):
        x[:50].view(5, 10).t()                        # views of an argument allocate nothing
        x[:3].clone()
    assert _largest(program, 1, torch.empty(10_000)) == [3 * F32]


def test_an_op_on_the_arguments_counts_its_output():
    assert _largest(lambda dist, x: torch.cat([x, x]), 1, _x()) == [200 * F64]


def test_a_resized_storage_counts_at_its_new_size():
    def grows_a_tensor(dist):
        torch.empty(10).resize_(1000)

    def grows_a_storage(dist):
        torch.empty(10).untyped_storage().resize_(6000)
    assert _largest(grows_a_tensor) == [1000 * F32]
    assert _largest(grows_a_storage) == [6000]


def test_each_rank_has_its_own_largest():
    def program(dist):
        torch.empty(100 * (dist.get_rank() + 1), dtype=torch.float64)
    assert _largest(program, 3) == [800, 1600, 2400]
