"""Pipeline schedules drawn: the timeline of lib.analytic.schedules' model, and a widget to explore it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from lib.analytic.formulas import bubble_fraction, zero_bubble_h1_bubble
from lib.analytic.schedules import (LABELS, SCHEDULES, ScheduleError, Slot, bubble_of, peak_in_flight, play,
                                    schedule_orders)

COLOURS = {"F": "#4C72B0", "B": "#55A868", "W": "#DD8452"}

def schedule_figure(slots: list[Slot], p: int, title: str = "", v: int = 1):
    """One row per rank; F, B (and W) boxes labelled with their micro-batch, chunks in lighter shades."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    from lib.viz.contrast import text_colour

    end = max(s.end for s in slots)
    fig, ax = plt.subplots(figsize=(11, 0.5 * p + 1.3))
    def shaded(kind: str, chunk: int) -> tuple:             # chunk 0 in the kind's colour, later chunks lighter
        shade = 0.45 * chunk / max(v - 1, 1)
        return tuple(c + (1 - c) * shade for c in to_rgb(COLOURS[kind]))

    for s in slots:
        colour = shaded(s.step.kind, s.step.chunk)
        y = p - 1 - s.rank
        ax.broken_barh([(s.start, s.end - s.start)], (y + 0.1, 0.8), facecolors=colour, edgecolor="white",
                       linewidth=0.6)
        if (s.end - s.start) / end > 0.012:
            ax.text((s.start + s.end) / 2, y + 0.5, str(s.step.mb), ha="center", va="center", fontsize=7,
                    color=text_colour(colour))
    ax.set_yticks([p - 1 - r + 0.5 for r in range(p)])
    ax.set_yticklabels([f"rank {r}" for r in range(p)])
    ax.set_ylim(0, p)
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel("time (units of one micro-batch's forward through one rank's layers); white: the bubble")
    kinds = sorted({s.step.kind for s in slots}, key="FBW".index)
    names = {"F": "forward", "B": "backward" if "W" not in kinds else "input gradient", "W": "weight gradient"}
    chunks = range(v) if v > 1 else [0]
    ax.legend(handles=[Patch(color=shaded(k, c), label=names[k] + (f", chunk {c}" if v > 1 else ""))
                       for k in kinds for c in chunks], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    plt.close(fig)
    return fig


@dataclass
class ScheduleState:
    """The last redraw: figure, readout, and the numbers behind them (None when the settings are refused)."""

    fig: Any = None
    readout: str = ""
    bubble: Optional[float] = None
    formula: Optional[float] = None
    step_time: Optional[float] = None
    in_flight: list[int] = field(default_factory=list)


def draw_schedule(name: str, p: int, m: int, v: int = 1, ratio: float = 2.0) -> ScheduleState:
    """Time one schedule with backward `ratio` times the forward (ZB-H1: input and weight gradient half each),
    and say how its bubble compares with the paper's formula."""
    state = ScheduleState()
    try:
        orders = schedule_orders(name, p, m, v)
    except ScheduleError as e:
        state.readout = f"✗ {e}"
        return state
    slots = play(orders, v, 1.0, ratio)
    state.bubble, state.in_flight = bubble_of(slots), peak_in_flight(orders)
    if name == "zb-h1":
        state.formula = zero_bubble_h1_bubble(p, m, 1.0, ratio / 2, ratio / 2)
        formula = "(p-1)(t_F+t_B-t_W) / (m(t_F+t_B+t_W)), Qi et al."
    else:
        state.formula, formula = bubble_fraction(p, m, v), "(p-1)/(v·m)"
    state.step_time = max(s.end for s in slots)
    label = LABELS[name] + (f", v={v}" if name == "interleaved" else "")
    state.fig = schedule_figure(slots, p,
                                f"{label}: p={p} stages, m={m} micro-batches, backward = {ratio:g} × forward", v)
    lines = [f"bubble: {state.bubble:.3f} of the ideal time (measured on this timeline); "
             f"formula {formula} = {state.formula:.3f}"
             + ("" if abs(state.bubble - state.formula) < 1e-9 else "  ← the formula does not describe this schedule"
                + ("  (its W, half the backward, is longer than a forward)" if name == "zb-h1" else ""))]
    lines.append(f"share of the step spent idle: {state.bubble / (1 + state.bubble):.1%}")
    held = "between forward and weight gradient" if name == "zb-h1" else "at the peak"
    lines.append(f"micro-batches of activations held {held}, per rank: "
                 + ", ".join(map(str, state.in_flight)) + (f" (chunks of 1/{v} of the rank's layers)" if v > 1 else ""))
    state.readout = "\n".join(lines)
    return state


def schedule_explorer(name: str = "1f1b", p: int = 4, m: int = 8, v: int = 2, ratio: float = 2.0):
    """Schedule, p, m, v and backward/forward cost controls over `draw_schedule`."""
    import ipywidgets as widgets

    from lib.viz.widgets import live_box, slider_options

    slider = slider_options()
    controls = {
        "schedule": widgets.Dropdown(options=[(LABELS[s], s) for s in SCHEDULES], value=name, description="schedule",
                                     style={"description_width": "110px"}),
        "p": widgets.IntSlider(value=p, min=2, max=8, description="p (stages)", **slider),
        "m": widgets.IntSlider(value=m, min=1, max=32, description="m (micro-batches)", **slider),
        "v": widgets.IntSlider(value=v, min=1, max=4, description="v (interleaved)", **slider),
        "ratio": widgets.FloatSlider(value=ratio, min=0.5, max=4.0, step=0.25, description="backward / forward",
                                     **slider),
    }
    state = ScheduleState()

    def update() -> None:
        sched = controls["schedule"].value
        new = draw_schedule(sched, controls["p"].value, controls["m"].value,
                            controls["v"].value if sched == "interleaved" else 1, controls["ratio"].value)
        state.__dict__.update(new.__dict__)

    return live_box(list(controls.values()), controls, state, update)
