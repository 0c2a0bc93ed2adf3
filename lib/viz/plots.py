"""Static figures for the lessons: what a collective costs, and who sends the bytes.

Every number drawn here comes from `lib.sim.cost`; this module only asks and plots.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from lib.sim.cost import CostModel, bus_factor
from lib.units import byte_unit, fmt_bytes, fmt_rate, fmt_time

ALGORITHMS = ("parameter_server", "ring", "tree")
COLOURS = {"parameter_server": "#C44E52", "ring": "#4C72B0", "tree": "#55A868"}
LABELS = {"parameter_server": "parameter server", "ring": "ring", "tree": "tree"}


def link_cost(cost: Optional[CostModel] = None, bandwidth: Optional[float] = None,
              latency: Optional[float] = None) -> CostModel:
    """`cost` with every link set to `bandwidth` (bytes/s) and `latency` (s) where they are given."""
    cost = cost or CostModel()
    if bandwidth is not None:
        cost = cost.with_(intra_node_bandwidth=bandwidth, inter_node_bandwidth=bandwidth)
    if latency is not None:
        cost = cost.with_(latency=latency)
    return cost


def all_reduce_point(cost: CostModel, algorithm: str, nbytes: float, world_size: int) -> tuple[float, float]:
    """(time in s, bus bandwidth in bytes/s) of one all-reduce: busbw = size / time × 2(N-1)/N (nccl-tests)."""
    t = cost.all_reduce_time(algorithm, nbytes, range(world_size))
    return t, (nbytes / t * bus_factor("all_reduce", world_size) if t > 0 else 0.0)


def fmt_size(nbytes: float, _pos=None) -> str:
    """A message size on an axis: binary units without trailing zeros (1 KiB, 32 MiB)."""
    unit, size = byte_unit(nbytes)
    return f"{nbytes / size:.3g} {unit}"


def collective_cost_figure(algorithms: Sequence[str] = ALGORITHMS, world_size: int = 8,
                           nbytes_range: tuple[float, float] = (2**10, 2**30), bandwidth: Optional[float] = None,
                           latency: Optional[float] = None, cost: Optional[CostModel] = None,
                           mark_nbytes: Optional[float] = None):
    """All-reduce time (left) and achieved bus bandwidth (right) against message size, per algorithm.

    bandwidth (bytes/s) and latency (s) override `cost`'s links; mark_nbytes draws a vertical line there.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    cost = link_cost(cost, bandwidth, latency)
    link = cost.bandwidth(range(world_size))
    sizes = np.logspace(np.log10(nbytes_range[0]), np.log10(nbytes_range[1]), 200)
    ticks = [2.0 ** k for k in range(0, 61, 5) if nbytes_range[0] <= 2.0 ** k <= nbytes_range[1]]   # 1 KiB, 32 KiB...
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")   # laid out when drawn
    for alg in algorithms:
        points = [all_reduce_point(cost, alg, s, world_size) for s in sizes]
        style = dict(color=COLOURS.get(alg), label=LABELS.get(alg, alg), linewidth=2)
        ax_t.loglog(sizes, [t for t, _ in points], **style)
        ax_b.loglog(sizes, [b / 1e9 for _, b in points], **style)
    ax_b.axhline(link / 1e9, color="0.3", linestyle="--", linewidth=1,
                 label=f"link bandwidth ({fmt_rate(link)})")
    for ax in (ax_t, ax_b):
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(fmt_size))
        ax.set_xlabel("message size")
        ax.grid(True, which="major", alpha=0.3)
        if mark_nbytes is not None:
            ax.axvline(mark_nbytes, color="0.5", linewidth=1, linestyle=":")
    ax_t.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: fmt_time(y).replace(".00", "")))
    ax_t.set_ylabel("all-reduce time")
    ax_t.set_title("time: latency-bound left, bandwidth-bound right")
    ax_b.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:g}"))
    ax_b.set_ylabel("bus bandwidth (GB/s)")
    ax_b.set_title("bus bandwidth = size / time × 2(N-1)/N")
    ax_b.set_ylim(top=link / 1e9 * 2)
    ax_t.legend(loc="upper left", frameon=False)
    ax_b.legend(loc="lower right", frameon=False, fontsize="small")
    fig.suptitle(f"All-reduce over N = {world_size} ranks, {fmt_time(cost.latency)} per message, "
                 f"{fmt_rate(link)} links")
    plt.close(fig)          # returned, not shown twice in a notebook
    return fig


def bytes_per_rank_figure(results: dict[str, list[float]], title: str = ""):
    """Grouped bars of bytes sent by each rank, one colour per named algorithm."""
    import matplotlib.pyplot as plt

    n = max((len(v) for v in results.values()), default=0)
    peak = max((max(v, default=0.0) for v in results.values()), default=0.0)
    unit, scale = byte_unit(peak)
    width = 0.8 / max(len(results), 1)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * n * max(len(results), 1) + 2), 3.6), layout="constrained")
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, sent) in enumerate(results.items()):
        colour = COLOURS.get(name.replace(" ", "_"), palette[i % len(palette)])
        x = np.arange(len(sent)) + (i - (len(results) - 1) / 2) * width
        ax.bar(x, np.asarray(sent, dtype=float) / scale, width, label=name, color=colour)
    ax.set_xticks(range(n))
    ax.set_xticklabels([f"rank {r}" for r in range(n)])
    ax.set_ylabel(f"bytes sent ({unit})")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(frameon=False)
    if title:
        ax.set_title(title)
    plt.close(fig)
    return fig


def memory_over_time_figure(runs: dict, rank: int = 0, title: str = ""):
    """Live device memory of one rank through each run, with each run's peak marked: what grows in
    forward, what backward frees, what the step keeps. The x axis is the sequence of allocations and
    frees, so the shape reads the same whether compute or host transfers dominate the clock."""
    import matplotlib.pyplot as plt

    from lib.viz import place_axes
    from lib.viz.contrast import darkened

    fig, ax = plt.subplots(figsize=(9, 3.6))
    top = max(result.stats[rank].peak_memory for result in runs.values())
    unit, scale = byte_unit(top)
    for label, result in runs.items():
        samples = result.stats[rank].memory
        progress = [i / max(len(samples) - 1, 1) for i in range(len(samples))]
        line, = ax.step(progress, [b / scale for _, b in samples], where="post", label=label)
        peak = result.stats[rank].peak_memory / scale
        ax.axhline(peak, color=line.get_color(), linestyle=":", linewidth=1)
        ax.annotate(f"peak {fmt_bytes(result.stats[rank].peak_memory)}", (1.0, peak), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize="small", color=darkened(line.get_color()))
    ax.set_xlabel("progress through the run (each allocation or free is one step)")
    ax.set_ylabel(f"live memory ({unit})")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", frameon=False)
    if title:
        ax.set_title(title, y=1.0)           # where matplotlib would put it, without measuring the ticks
    peaks = max(len(f"peak {fmt_bytes(r.stats[rank].peak_memory)}") for r in runs.values())
    place_axes(fig, ax, left=0.7, bottom=0.48, top=0.26 + 0.2 * title.count("\n"), right=0.15 + 0.065 * peaks)
    plt.close(fig)
    return fig
