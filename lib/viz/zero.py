"""The ZeRO stage explorer: memory per device and communication per step, from lib.analytic.formulas only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lib.analytic.formulas import ZERO_STAGES, model_state_breakdown
from lib.sim.cost import bus_factor
from lib.units import byte_unit, fmt_bytes
from lib.viz.widgets import RANKS, live_box, slider_options

PARTS = ("weights", "gradients", "optimizer")
COLOURS = {"weights": "#4C72B0", "gradients": "#55A868", "optimizer": "#C44E52"}


def traffic_per_step(n_params: float, dp: int, stage: int) -> float:
    """Bytes each rank sends per step with 16-bit gradients and weights (ZeRO section VII):
    2(N-1)/N·2Ψ for DP and stages 1-2, 1.5× that for stage 3."""
    gathers = 2 if stage == 3 else 1
    return 2 * n_params * (bus_factor("reduce_scatter", dp) + gathers * bus_factor("all_gather", dp))


@dataclass
class ZeroState:
    fig: Any = None
    readout: str = ""
    memory: dict[int, float] = field(default_factory=dict)
    traffic: dict[int, float] = field(default_factory=dict)


def zero_figure(n_params: float, dp: int, stage: int, k: float = 12):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    unit, scale = byte_unit(model_state_breakdown(n_params, dp, 0, k)["optimizer"])
    for s in ZERO_STAGES:
        parts, bottom = model_state_breakdown(n_params, dp, s, k), 0.0
        for part in PARTS:
            ax.bar(s, parts[part] / scale, bottom=bottom, color=COLOURS[part], label=part if s == 0 else None,
                   edgecolor="black" if s == stage else "none", linewidth=2)
            bottom += parts[part] / scale
    ax.set_xticks(list(ZERO_STAGES), ["DP", "stage 1", "stage 2", "stage 3"])
    ax.set_ylabel(f"{unit} per device")
    ax.set_title(f"{n_params / 1e9:.3g}B parameters, N_d = {dp}")
    ax.legend(frameon=False)
    plt.close(fig)
    return fig


def zero_explorer(n_params: float = 7.5e9, dp: int = 64, stage: int = 3):
    """Parameters, data-parallel degree and ZeRO stage: per-device model states and bytes sent per step."""
    import ipywidgets as widgets

    slider = slider_options()
    controls = {"params": widgets.FloatLogSlider(value=n_params, base=10, min=8, max=12, step=0.05,
                                                 readout_format=".3g", description="parameters", **slider),
                "dp": widgets.SelectionSlider(options=[1] + RANKS, value=dp, description="N_d (DP ranks)", **slider),
                "stage": widgets.Dropdown(options=[("DP (no ZeRO)", 0), ("stage 1", 1), ("stage 2", 2),
                                                   ("stage 3", 3)], value=stage, description="stage")}
    state = ZeroState()

    def update() -> None:
        n, d, s = controls["params"].value, controls["dp"].value, controls["stage"].value
        state.memory = {st: sum(model_state_breakdown(n, d, st).values()) for st in ZERO_STAGES}
        state.traffic = {st: traffic_per_step(n, d, st) for st in ZERO_STAGES}
        state.fig = zero_figure(n, d, s)
        state.readout = (f"stage {s}: {fmt_bytes(state.memory[s])} of model states per device "
                         f"(DP: {fmt_bytes(state.memory[0])}); sends {fmt_bytes(state.traffic[s])} per step "
                         f"({state.traffic[s] / max(state.traffic[0], 1e-30):.2g}× data parallelism)")

    return live_box(list(controls.values()), controls, state, update)


# ---- the picture before each ZeRO puzzle: what each rank holds ---------------------------------------------
HOLDS = ("weights", "gradients", "optimizer")
# The puzzles train in float64 and keep no master copy; mixed precision would add an fp32 copy of the weights here.
HOLD_LABELS = {"weights": "weights", "gradients": "gradients", "optimizer": "Adam m, v"}


def zero_ranks_figure(stage: int, ranks: int = 4, offload: bool = False, prefetch: bool = False):
    """Each rank's weights, gradients and optimizer state at a ZeRO stage, cut into N shards (one colour per
    owner): a filled shard lives on the rank through the step, a dashed one only for a moment, an empty one never."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from lib.viz.diagram import RANK_COLOURS

    sharded = {"weights": stage >= 3, "gradients": stage >= 2, "optimizer": stage >= 1}
    passing = {"weights": "all-gathered one layer\nat a time, then freed"
                          + (";\nthe next one prefetched" if prefetch else ""),
               "gradients": "whole only while\nbackward makes them"}
    fig, ax = plt.subplots(figsize=(2.5 * ranks + 2.4, 2.6))
    for r in range(ranks):
        x0 = r * 2.5
        ax.text(x0 + 1, 3.25, f"rank {r}", ha="center", fontsize=9, fontweight="bold")
        for row, part in enumerate(HOLDS):
            y = 2.2 - row * 1.0
            host = offload and part == "optimizer"
            for s in range(ranks):
                held = s == r or not sharded[part]
                transient = s != r and sharded[part] and part in passing
                ax.add_patch(Rectangle((x0 + 2 * s / ranks, y), 2 / ranks, 0.6,
                                       facecolor=RANK_COLOURS[s % len(RANK_COLOURS)] if held else "white",
                                       alpha=1.0 if held else 1.0, edgecolor="0.3" if held or transient else "0.85",
                                       linestyle="--" if transient else "-", linewidth=0.8,
                                       hatch="////" if host and held else None))
            if host:
                ax.text(x0 + 1, y - 0.12, "in host memory", ha="center", va="top", fontsize=7, color="0.3")
    for row, part in enumerate(HOLDS):
        ax.text(-0.15, 2.5 - row * 1.0, HOLD_LABELS[part], ha="right", va="center", fontsize=8.5)
        if sharded[part] and part in passing:
            ax.text(ranks * 2.5 - 0.3, 2.5 - row * 1.0, passing[part], ha="left", va="center", fontsize=7.5,
                    color="0.3")
    name = {0: "data parallelism", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}[stage]
    name += " + offload" if offload else ""
    ax.set_title(f"{name}: what each of N = {ranks} ranks holds (colour: the shard's owner; "
                 "dashed: only for a moment; empty: never)", fontsize=9.5)
    ax.set_xlim(-1.6, ranks * 2.5 + 1.8)
    ax.set_ylim(-0.1, 3.5)
    ax.axis("off")
    fig.tight_layout()
    plt.close(fig)
    return fig
