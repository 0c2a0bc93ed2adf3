"""The ZeRO stage explorer redraws from lib.analytic.formulas when a control changes."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from lib.analytic.formulas import model_state_bytes  # noqa: E402
from lib.viz.zero import traffic_per_step, zero_explorer  # noqa: E402


def test_readout_is_the_papers_example():
    box = zero_explorer()
    assert box.state.memory[0] == pytest.approx(model_state_bytes(7.5e9))
    assert box.state.memory[3] == pytest.approx(model_state_bytes(7.5e9, 64, 3))
    assert "1.75 GiB" in box.state.readout           # the paper's 1.9GB (decimal) for ZeRO-3 over 64 GPUs


def test_changing_stage_and_dp_redraws():
    box = zero_explorer()
    fig, readout = box.state.fig, box.state.readout
    box.controls["stage"].value = 1
    assert box.state.fig is not fig and box.state.readout != readout
    assert "1× data parallelism" in box.state.readout
    box.controls["dp"].value = 8
    assert box.state.memory[1] == pytest.approx(model_state_bytes(7.5e9, 8, 1))


def test_stage_three_sends_one_and_a_half_times():
    assert traffic_per_step(1e9, 8, 3) == pytest.approx(1.5 * traffic_per_step(1e9, 8, 0))
    assert traffic_per_step(1e9, 8, 1) == pytest.approx(traffic_per_step(1e9, 8, 2))
