"""Pictures for notebook 09: one round of H steps of data parallelism, int8-compressed data parallelism and
DiLoCo across two datacenters, and an explorer of step time and tokens/s. Every number comes from
lib.analytic.cross_site.
"""

from __future__ import annotations

from types import SimpleNamespace

from lib.analytic.cross_site import INT8_RATIO, Workload, shard_bounds, step_times
from lib.sim.cost import CostModel
from lib.units import fmt_rate, fmt_time
from lib.viz.widgets import live_box, slider_options

COMPUTE, WAN = "#4C72B0", "#DD8452"


def round_figure(work: Workload, cost: CostModel, inner_steps: int):
    """H steps on one GPU under each scheme: compute (blue) and the wide-area all-reduce (orange), to scale."""
    import matplotlib.pyplot as plt

    compute = work.compute_time(cost)
    comm = work.all_reduce_time(cost)
    rows = {"data parallel": [comm] * inner_steps, "int8 data parallel": [comm / INT8_RATIO] * inner_steps,
            f"DiLoCo, H={inner_steps}": [0.0] * (inner_steps - 1) + [comm]}
    fig, ax = plt.subplots(figsize=(9, 2.4), layout="constrained")
    for y, comms in enumerate(rows.values()):
        t = 0.0
        for c in comms:
            ax.barh(y, compute, left=t, color=COMPUTE, edgecolor="white")
            t += compute
            if c:
                ax.barh(y, c, left=t, color=WAN, edgecolor="white")
                t += c
        ax.text(t, y, f"  {fmt_time(t)}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), list(rows))
    ax.invert_yaxis()
    ax.set_xlabel("time on one GPU")
    ax.set_xlim(0, 1.25 * max(sum(c) + inner_steps * compute for c in rows.values()))
    ax.set_title(f"{inner_steps} steps of a {work.params / 1e9:g}B model, {work.tokens} tokens per GPU and step:\n"
                 f"compute (blue) and all-reduce across {fmt_rate(cost.inter_site_bandwidth)}, "
                 f"{fmt_time(cost.inter_site_latency)} (orange)", fontsize=9)
    plt.close(fig)
    return fig


def cross_site_explorer(params: float = 1e9, bandwidth: float = 12.5e9, inner_steps: int = 100):
    """Model size, wide-area bandwidth and H: time per step and tokens/s per GPU of each scheme."""
    import ipywidgets as widgets

    opts = slider_options()
    controls = {
        "params": widgets.FloatLogSlider(value=params, base=10, min=8, max=11.5, step=0.1,
                                         description="parameters", **opts),
        "bandwidth": widgets.FloatLogSlider(value=bandwidth / 1e9, base=10, min=-1, max=2, step=0.1,
                                            description="WAN GB/s", **opts),
        "inner_steps": widgets.IntSlider(value=inner_steps, min=1, max=500, description="H", **opts),
    }
    state = SimpleNamespace(fig=None, readout="", times={})

    def update() -> None:
        cost = CostModel(inter_site_bandwidth=controls["bandwidth"].value * 1e9)
        work = Workload(params=controls["params"].value)
        h = controls["inner_steps"].value
        state.fig = round_figure(work, cost, min(h, 8))
        state.times = step_times(work, cost, h)
        state.readout = "\n".join(f"{name:>22}: {fmt_time(t)} per step, {work.tokens / t:,.0f} tokens/s per GPU"
                                  for name, t in state.times.items())
    return live_box(list(controls.values()), controls, state, update)


def compression_figure(n: int = 4):
    """The compressed all-reduce on `n` ranks: every rank's chunk j, quantised to int8, goes to rank j (left);
    rank j's int8 mean of chunk j goes back to everyone (right)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from lib.viz.contrast import text_colour

    colours = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")
    fig, axes = plt.subplots(1, 2, figsize=(9, 0.5 * n + 1.2), layout="constrained")
    for ax, (title, label) in zip(axes, (("1. all_to_all: chunk j of (grad + residual), as int8, to rank j",
                                          "q{rank}→{chunk}"),
                                         ("2. all_gather: rank j's int8 mean of chunk j, to everyone",
                                          "mean {chunk}"))):
        for rank in range(n):
            for chunk in range(n):
                colour, alpha = colours[chunk % len(colours)], 0.9 if label.startswith("q") or chunk == rank else 0.45
                ax.add_patch(Rectangle((chunk, rank), 0.92, 0.8, facecolor=colour, alpha=alpha))
                ax.text(chunk + 0.46, rank + 0.4, label.format(rank=rank, chunk=chunk), ha="center",
                        va="center", color=text_colour(colour, alpha), fontsize=8)
        ax.set(xlim=(0, n), ylim=(n, 0), xticks=[c + 0.46 for c in range(n)], xticklabels=range(n),
               yticks=[r + 0.4 for r in range(n)], yticklabels=[f"rank {r}" for r in range(n)], xlabel="chunk")
        ax.set_title(title, fontsize=9)
    plt.close(fig)
    return fig


def reshard_figure(total: int = 25, saved_on: int = 4, world: int = 3):
    """The flat training state cut for `saved_on` ranks (the files) and for `world` ranks (the new shards): each
    new shard reads the pieces of the files it overlaps."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from lib.viz.contrast import text_colour

    colours = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")
    fig, ax = plt.subplots(figsize=(9, 1.9), layout="constrained")
    for y, (n, name) in enumerate(((saved_on, "file"), (world, "rank"))):
        for r in range(n):
            lo, hi = shard_bounds(total, n, r)
            colour, alpha = colours[r % len(colours)], 0.9 if y == 0 else 0.6
            ax.add_patch(Rectangle((lo, y), hi - lo, 0.7, facecolor=colour, edgecolor="white", alpha=alpha))
            ax.text((lo + hi) / 2, y + 0.35, f"{name} {r}\n[{lo}, {hi})", ha="center", va="center", fontsize=8,
                    color=text_colour(colour, alpha))
    ax.set(xlim=(0, total), ylim=(1.8, -0.1), yticks=[0.35, 1.35],
           yticklabels=[f"saved by {saved_on} ranks", f"loaded on {world}"], xlabel="element of the flat state")
    ax.set_title("the same flat parameters and Adam moments, cut two ways", fontsize=9)
    plt.close(fig)
    return fig


def failure_figure(world: int = 4, dead: int = 2, every: int = 3, fails_after: int = 7, steps: int = 10):
    """Training steps per rank (blue), checkpoints every `every` steps (|), rank `dead` failing after `fails_after`
    steps (✗), and the survivors going back to the last checkpoint and doing its steps again (orange); steps are
    numbered from 0, as the puzzle's grads(step)."""
    import matplotlib.pyplot as plt

    from lib.viz.contrast import text_colour

    last = fails_after // every * every
    fig, ax = plt.subplots(figsize=(9, 0.45 * world + 1.3), layout="constrained")
    for rank in range(world):
        if rank == dead:
            ax.barh(rank, fails_after, color=COMPUTE, edgecolor="white")
            ax.text(fails_after + 0.1, rank, "✗ fails", va="center", color="#C44E52", fontsize=9)
            continue
        ax.barh(rank, fails_after, color=COMPUTE, edgecolor="white")
        ax.barh(rank, steps - last, left=fails_after, color=WAN, edgecolor="white")
        ax.text(fails_after + (steps - last) / 2, rank, f"steps {last}-{steps - 1}, from the checkpoint",
                ha="center", va="center", fontsize=8, color=text_colour(WAN))
    for c in range(every, steps + 1, every):
        ax.axvline(c if c <= fails_after else c + fails_after - last, color="black", linewidth=0.8,
                   linestyle=":" if c > fails_after else "-")
    ax.set_yticks(range(world), [f"rank {r}" for r in range(world)])
    ax.invert_yaxis()
    ax.set_xlabel("steps done, in time order (lines: checkpoints); steps count from 0, as grads(step) does")
    ax.set_title(f"rank {dead} fails after step {fails_after - 1}: the survivors regroup, reload the checkpoint taken "
                 f"after step {last - 1} and train on {world - 1} ranks", fontsize=9)
    plt.close(fig)
    return fig
