"""Interactive explorers for the notebooks. Each returns an ipywidgets box that tests can drive:
`box.controls` maps names to widgets, `box.state` holds what was drawn last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from lib.sim.cost import CostModel
from lib.units import fmt_bytes, fmt_rate, fmt_time
from lib.viz.plots import (ALGORITHMS, LABELS, all_reduce_point, collective_cost_figure,
                           link_cost)

# Ranks offered by the N slider: powers of two and the 3·2^k between them (tree cost jumps at powers of two).
RANKS = sorted({2 ** k for k in range(1, 11)} | {3 * 2 ** k for k in range(0, 9)})


@dataclass
class ExplorerState:
    """The last redraw: the figure, the readout text, and per-algorithm (time s, bus bandwidth B/s)."""

    fig: Any = None
    readout: str = ""
    points: dict[str, tuple[float, float]] = field(default_factory=dict)


def slider_options(width: str = "480px", label_width: str = "110px") -> dict[str, Any]:
    """Keyword arguments shared by the explorers' sliders: redraw on release, aligned descriptions."""
    import ipywidgets as widgets

    return dict(continuous_update=False, style={"description_width": label_width},
                layout=widgets.Layout(width=width))


def live_box(rows: Sequence[Any], controls: dict[str, Any], state: Any, update: Callable[[], None]):
    """A VBox of `rows` above an Output showing `state.fig` (if any) and `state.readout`.

    `update()` refills the state; it runs now and synchronously on every control's value change.
    The box carries `.controls` and `.state` so that tests can drive it.
    """
    import ipywidgets as widgets
    from IPython.display import display

    out = widgets.Output()

    def redraw(_change=None) -> None:
        update()
        out.clear_output(wait=True)
        with out:
            if state.fig is not None:
                display(state.fig)
            print(state.readout)

    for w in controls.values():
        w.observe(redraw, names="value")
    redraw()
    box = widgets.VBox([*rows, out])
    box.controls, box.state = controls, state
    return box


def collective_cost_explorer(cost: Optional[CostModel] = None):
    """Algorithm, N, message size, bandwidth and latency controls over `collective_cost_figure`."""
    import ipywidgets as widgets

    cost = cost or CostModel()
    slider = slider_options()
    controls = {alg: widgets.Checkbox(value=True, description=LABELS[alg], indent=False,
                                      layout=widgets.Layout(width="150px")) for alg in ALGORITHMS}
    controls["N"] = widgets.SelectionSlider(options=RANKS, value=8, description="N (ranks)", **slider)
    controls["size"] = widgets.FloatLogSlider(value=1e8, base=10, min=3, max=10, step=0.1,
                                              readout_format=".2g", description="message (bytes)", **slider)
    controls["bandwidth"] = widgets.FloatLogSlider(value=cost.intra_node_bandwidth / 1e9, base=10, min=0, max=3,
                                                   step=0.05, readout_format=".3g", description="link (GB/s)",
                                                   **slider)
    controls["latency"] = widgets.FloatLogSlider(value=cost.latency * 1e6, base=10, min=-1, max=3, step=0.05,
                                                 readout_format=".3g", description="latency (µs)", **slider)
    state = ExplorerState()

    def update() -> None:
        algs = [a for a in ALGORITHMS if controls[a].value]
        n, size = controls["N"].value, controls["size"].value
        bw, lat = controls["bandwidth"].value * 1e9, controls["latency"].value * 1e-6
        model = link_cost(cost, bw, lat)
        state.points = {a: all_reduce_point(model, a, size, n) for a in algs}
        lines = [f"all-reduce of {fmt_bytes(size)} over {n} ranks, {fmt_rate(bw)} links, "
                 f"{fmt_time(lat)} per message:"]
        lines += [f"  {LABELS[a]:>16}: {fmt_time(t)}, bus bandwidth {fmt_rate(b)}"
                  for a, (t, b) in state.points.items()] or ["  (tick at least one algorithm)"]
        state.readout = "\n".join(lines)
        state.fig = collective_cost_figure(algs, n, (2**10, 2**33), cost=model, mark_nbytes=size)

    rows = [widgets.HBox([controls[a] for a in ALGORITHMS]),
            *(controls[k] for k in ("N", "size", "bandwidth", "latency"))]
    return live_box(rows, controls, state, update)
