"""A fault injected in the simulator and the same fault emulated on real processes (lib.faults): one program
that survives it gives the same results in both worlds."""

import pytest
import torch

import lib.sim
from lib.faults import run_with_fault
from lib.launch import launch
from tests.test_sim_runtime import _all_reduce_until_a_peer_dies


@pytest.mark.slow
def test_the_emulated_fault_on_gloo_gives_what_the_simulator_gives():
    simulated = lib.sim.run(_all_reduce_until_a_peer_dies, 3, faults={1: 2}).results
    real = launch(run_with_fault, 3, _all_reduce_until_a_peer_dies, 1, 2)
    assert real[1] is None and simulated[1] is None
    for rank in (0, 2):
        (done, dead, message, x), (sim_done, sim_dead, sim_message, sim_x) = real[rank], simulated[rank]
        assert (done, dead) == (sim_done, sim_dead) == (1, 1)
        assert torch.equal(x, sim_x) and torch.equal(x, torch.full((4,), 6.0))
        for said in (message, sim_message):
            assert said.startswith(f"rank {rank}'s all_reduce") and "needs rank 1, which died at its communication " \
                "call #2" in said
