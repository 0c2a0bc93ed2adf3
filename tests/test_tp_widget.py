"""Notebook 04's explorer: bytes per layer from the ring formula, times from lib.sim.cost."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lib.sim.cost import CostModel  # noqa: E402
from lib.viz.tensor_parallel import MODELS, tp_bytes_per_layer, tp_explorer, tp_layer_times  # noqa: E402


@pytest.fixture
def explorer():
    return tp_explorer()


def test_initial_state_matches_the_formula(explorer):
    c, s = explorer.controls, explorer.state
    h, seq, _, layers = MODELS[c["model"].value]
    t, b = c["t"].value, c["b"].value
    assert s.bytes_per_layer == pytest.approx(4 * 2 * (t - 1) / t * seq * b * h * 2)
    message = seq * b * h * 2
    cost = CostModel()
    assert s.times["nvlink"] == pytest.approx(4 * cost.collective_time("all_reduce", message, range(t)))
    assert "per layer" in s.readout and len(s.readout.splitlines()) == 4
    assert s.fig.number not in plt.get_fignums()


def test_infiniband_is_slower_by_the_bandwidth_ratio(explorer):
    s = explorer.state
    cost = CostModel()
    ratio = cost.intra_node_bandwidth / cost.inter_node_bandwidth
    # The latency terms are the same on both links; what is left scales with the bandwidths.
    t = explorer.controls["t"].value
    latency = 4 * 2 * (t - 1) * cost.latency
    assert (s.times["infiniband"] - latency) / (s.times["nvlink"] - latency) == pytest.approx(ratio)


def test_more_ranks_send_more_and_compute_less(explorer):
    s = explorer.state
    before = dict(s.times), s.bytes_per_layer
    explorer.controls["t"].value = 32
    assert s.bytes_per_layer > before[1]
    assert s.times["compute"] == pytest.approx(before[0]["compute"] / 4)
    assert "t = 32" in s.readout


def test_bigger_batch_scales_bytes_and_model_changes_readout(explorer):
    s = explorer.state
    b1 = s.bytes_per_layer
    explorer.controls["b"].value = 4
    assert s.bytes_per_layer == pytest.approx(4 * b1)
    explorer.controls["model"].value = "GPT-2 small (h 768, s 1024)"
    assert "GPT-2" in s.fig.axes[0].get_title()


def test_one_rank_sends_nothing():
    assert tp_bytes_per_layer(2048, 1, 12288, 1) == 0
    assert tp_layer_times(2048, 1, 12288, 1)["nvlink"] == 0
