"""The ZeRO stage explorer: memory per device and communication per step, from lib.formulas only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lib.formulas import ZERO_STAGES, model_state_breakdown
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
