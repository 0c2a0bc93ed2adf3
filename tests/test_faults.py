"""A fault injected in the simulator and the same fault emulated on real processes (lib.faults): one program
that survives it gives the same results in both worlds."""

import pytest
import torch

import lib.sim
from lib.faults import run_with_fault
from lib.launch import launch


def _survive(dist):
    """All-reduce until a peer fails, then once more in a group of the survivors."""
    x, done = torch.ones(3), 0
    try:
        while done < 4:
            dist.all_reduce(x)
            done += 1
    except RuntimeError as e:
        survivors = dist.new_group([r for r in range(dist.get_world_size()) if r != e.rank])
        dist.all_reduce(x, group=survivors)
        return done, e.rank, x.tolist()
    return done, None, x.tolist()


@pytest.mark.slow
def test_the_emulated_fault_on_gloo_gives_what_the_simulator_gives():
    simulated = lib.sim.run(_survive, 3, faults={1: 2}).results
    real = launch(run_with_fault, 3, _survive, 1, 2)
    assert simulated == real == [(1, 1, [6.0] * 3), None, (1, 1, [6.0] * 3)]
