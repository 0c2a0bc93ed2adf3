"""The collective cost explorer redraws from lib.sim.cost, and the static figures show what they claim."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lib.sim.cost import CostModel  # noqa: E402
from lib.viz.plots import bytes_per_rank_figure, collective_cost_figure  # noqa: E402
from lib.viz.widgets import collective_cost_explorer  # noqa: E402


def lines_by_label(ax) -> dict:
    return {line.get_label(): line for line in ax.get_lines()}


@pytest.fixture
def explorer():
    return collective_cost_explorer()


def test_initial_readout_matches_cost_model(explorer):
    c, s = explorer.controls, explorer.state
    assert c["N"].value == 8 and c["bandwidth"].value == pytest.approx(CostModel().intra_node_bandwidth / 1e9)
    size = c["size"].value
    assert s.points["ring"][0] == pytest.approx(CostModel().all_reduce_time("ring", size, range(8)))
    lines = s.readout.splitlines()
    assert "8 ranks" in lines[0] and len(lines) == 4
    assert [ln.split(":")[0].strip() for ln in lines[1:]] == ["parameter server", "ring", "tree"]
    time_axis, bus_axis = s.fig.axes
    assert len(time_axis.get_lines()) == 3 + 1          # three algorithms and the chosen size
    assert s.fig.number not in plt.get_fignums()         # closed, so a notebook shows it once


def test_more_ranks_redraws_and_costs_more(explorer):
    s = explorer.state
    fig8, readout8, points8 = s.fig, s.readout, dict(s.points)
    explorer.controls["N"].value = 64
    assert s.fig is not fig8 and "N = 64" in s.fig.get_suptitle()
    assert s.readout != readout8 and "64 ranks" in s.readout
    assert s.points["ring"][0] > points8["ring"][0]      # 2(N-1) latency steps instead of 14
    # Every non-root rank's message crosses the server's link: time grows as N-1.
    assert s.points["parameter_server"][0] / points8["parameter_server"][0] == pytest.approx(63 / 7)
    assert s.points["parameter_server"][1] < points8["parameter_server"][1] / 7


def test_faster_links_shrink_time(explorer):
    s = explorer.state
    before = dict(s.points)
    explorer.controls["bandwidth"].value = 900.0
    assert all(s.points[a][0] < before[a][0] for a in before)
    assert s.points["ring"][0] < 0.6 * before["ring"][0]  # 100 MB at N = 8 is bandwidth-bound
    assert "900 GB/s" in s.readout


def test_latency_dominates_small_messages(explorer):
    s = explorer.state
    explorer.controls["size"].value = 1e3
    before = s.points["ring"][0]
    explorer.controls["latency"].value = 50.0
    assert s.points["ring"][0] == pytest.approx(10 * before, rel=0.01)


def test_unticked_algorithm_disappears(explorer):
    explorer.controls["tree"].value = False
    s = explorer.state
    assert set(s.points) == {"parameter_server", "ring"} and "tree" not in s.readout
    assert "tree" not in lines_by_label(s.fig.axes[0])


def test_ring_bus_bandwidth_reaches_the_link():
    fig = collective_cost_figure(world_size=8, nbytes_range=(1e3, 1e10))
    lines = lines_by_label(fig.axes[1])
    link = CostModel().intra_node_bandwidth / 1e9
    ring = lines["ring"].get_ydata()[-1]
    ps = lines["parameter server"].get_ydata()[-1]
    assert ring == pytest.approx(link, rel=0.05)
    assert ps < link / 4                                  # about link / N: rank 0's link carries it all
    assert lines["ring"].get_ydata()[0] < 0.01 * link     # small messages are latency-bound


def test_bandwidth_and_latency_override_cost():
    fig = collective_cost_figure(("ring",), world_size=4, bandwidth=10e9, latency=1e-6)
    (link_line,) = [ln for ln in fig.axes[1].get_lines() if ln.get_label().startswith("link")]
    assert link_line.get_ydata()[0] == pytest.approx(10.0)
    assert fig.axes[0].get_lines()[0].get_ydata()[0] == pytest.approx(     # the axis starts at 1 KiB
        CostModel(latency=1e-6, intra_node_bandwidth=10e9).all_reduce_time("ring", 2**10, range(4)))


def test_bytes_per_rank_bars():
    n, size = 8, 4 * 2**20
    results = {"parameter server": [(n - 1) * size] + [size] * (n - 1), "ring": [2 * (n - 1) / n * size] * n}
    fig = bytes_per_rank_figure(results, title="bytes sent")
    (ax,) = fig.axes
    bars = ax.patches
    assert len(bars) == 2 * n
    heights = [b.get_height() for b in bars]
    assert heights[0] == pytest.approx((n - 1) * heights[1])    # the server sends N-1 times a worker's
    assert "MiB" in ax.get_ylabel() and heights[0] == pytest.approx((n - 1) * 4)     # 28 MiB
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(results)
    assert fig.number not in plt.get_fignums()


def test_the_mesh_explorer_redraws_each_choice_and_says_where_each_axis_runs():
    from lib.viz.mesh import mesh_explorer

    asked = []

    def label_for(shape, zero):
        asked.append((shape, zero))
        return lambda rank, coords: f"zero {zero}"
    box = mesh_explorer([(2, 2, 2), (2, 1, 4)], ("dp", "pp", "tp"), label_for, ranks_per_node=4)
    assert "TP group of rank 0: ranks [0, 1], inside node 0" in box.state.readout
    assert "DP group of rank 0: ranks [0, 4], across nodes 0, 1" in box.state.readout
    box.controls["mesh"].value = (2, 1, 4)
    box.controls["zero"].value = 1
    assert "TP group of rank 0: ranks [0, 1, 2, 3], inside node 0" in box.state.readout
    assert asked[-1] == ((2, 1, 4), 1) and box.state.fig is not None
