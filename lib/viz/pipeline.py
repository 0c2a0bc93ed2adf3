"""Pipeline schedules drawn without running a model: which stage does which micro-batch when.

`schedule_orders` lists each rank's work in order (GPipe, 1F1B, interleaved 1F1B, ZB-H1);
`play` times it: a piece of work starts once its rank is free and the work it depends on is done.
Communication is free here, as in the bubble formula; the simulator (lib.sim) charges for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from lib.formulas import bubble_fraction, zero_bubble_h1_bubble

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
LABELS = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B", "zb-h1": "ZB-H1 (zero bubble)"}
COLOURS = {"F": "#4C72B0", "B": "#55A868", "W": "#DD8452"}


class ScheduleError(ValueError):
    """A schedule that cannot run with these settings (too few micro-batches, an order that waits forever)."""


@dataclass(frozen=True)
class Work:
    """One piece of work: kind F (forward), B (backward, or input gradient only when W is separate),
    W (weight gradient), on the rank's `chunk` (its virtual stage) for micro-batch `mb`."""

    kind: str
    chunk: int
    mb: int


@dataclass(frozen=True)
class Slot:
    rank: int
    work: Work
    start: float
    end: float


def _stage(rank: int, chunk: int, p: int) -> int:
    """Virtual stages go round the ranks: chunk c of rank r is stage c·p + r (Megatron's layout)."""
    return chunk * p + rank


def schedule_orders(name: str, p: int, m: int, v: int = 1) -> list[list[Work]]:
    """Each rank's work in the order it runs it."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; one of {', '.join(SCHEDULES)}")
    if p < 1 or m < 1 or v < 1:
        raise ScheduleError(f"p, m and v must be at least 1, got p={p}, m={m}, v={v}")
    if name != "interleaved" and v != 1:
        raise ScheduleError(f"{LABELS[name]} has one stage per rank: v must be 1, got {v}")
    if name in ("1f1b", "zb-h1") and m < p:
        raise ScheduleError(f"{LABELS[name]} needs at least as many micro-batches as stages: m={m} < p={p}")
    if name == "interleaved" and m % p:
        raise ScheduleError(f"interleaved 1F1B sends micro-batches round the ranks in groups of p: "
                            f"m={m} must be a multiple of p={p}")
    orders = []
    for r in range(p):
        if name == "gpipe":
            order = [Work("F", 0, j) for j in range(m)] + [Work("B", 0, j) for j in range(m)]
        elif name == "interleaved":
            order = _interleaved(r, p, m, v)
        elif name == "zb-h1":
            order = _zero_bubble_h1(r, p, m)
        else:
            warm = p - r - 1                     # warm-up: forwards before the first backward
            order = [Work("F", 0, j) for j in range(warm)]
            for i in range(m - warm):             # steady state: one forward, one backward
                order += [Work("F", 0, warm + i), Work("B", 0, i)]
            order += [Work("B", 0, j) for j in range(m - warm, m)]   # cool-down
        orders.append(order)
    return orders


def _interleaved(r: int, p: int, m: int, v: int) -> list[Work]:
    """Megatron-LM's interleaved order: micro-batches in groups of p, each group through every chunk."""
    total = m * v

    def unit(k: int, forward: bool) -> Work:
        group, mb = k // (p * v), (k // (p * v)) * p + k % p
        chunk = (k // p) % v
        return Work("F", chunk, mb) if forward else Work("B", v - 1 - chunk, mb)

    warm = min((p - r - 1) * 2 + (v - 1) * p, total)
    order = [unit(k, True) for k in range(warm)]
    for i in range(total - warm):
        order += [unit(warm + i, True), unit(i, False)]
    order += [unit(k, False) for k in range(total - warm, total)]
    return order


def _zero_bubble_h1(r: int, p: int, m: int) -> list[Work]:
    """ZB-H1 (Qi et al. 2024, section 2.1): 1F1B's order of forwards and input gradients B, each rank keeping
    at most r weight gradients W waiting; the waiting W fill the cool-down, where 1F1B's ranks sit idle.

    Every rank then holds at most p micro-batches between F and W, 1F1B's peak (on its first stage); it is
    the order of torch.distributed.pipelining.ScheduleInterleavedZeroBubble with one stage per rank."""
    warm = p - r - 1
    forwards = iter(range(m))
    order = [Work("F", 0, next(forwards)) for _ in range(warm)]
    waiting: list[int] = []
    for j in range(m):
        if j + warm < m:
            order.append(Work("F", 0, next(forwards)))
        order.append(Work("B", 0, j))
        waiting.append(j)
        if len(waiting) > r:
            order.append(Work("W", 0, waiting.pop(0)))
    return order + [Work("W", 0, j) for j in waiting]


def play(orders: list[list[Work]], v: int = 1, t_f: float = 1.0, t_b: float = 2.0,
         t_w: Optional[float] = None) -> list[Slot]:
    """Time the orders: per chunk, F takes t_f/v and the whole backward t_b/v. In an order with W work the
    backward is split: W (the weight gradient) takes t_w/v, half the backward when t_w is None, and B the rest."""
    p = len(orders)
    stages = p * v
    split = any(w.kind == "W" for order in orders for w in order)
    t_w = (t_b / 2 if t_w is None else t_w) if split else 0.0
    cost = {"F": t_f / v, "B": (t_b - t_w) / v, "W": t_w / v}
    done: dict[tuple[str, int, int], float] = {}
    free, nxt, slots = [0.0] * p, [0] * p, []

    def needs(r: int, w: Work) -> list[tuple[str, int, int]]:
        s = _stage(r, w.chunk, p)
        if w.kind == "F":
            return [("F", s - 1, w.mb)] if s > 0 else []
        if w.kind == "B":
            return [("F", s, w.mb)] + ([("B", s + 1, w.mb)] if s < stages - 1 else [])
        return [("B", s, w.mb)]

    while any(nxt[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while nxt[r] < len(orders[r]):
                w = orders[r][nxt[r]]
                deps = needs(r, w)
                if any(d not in done for d in deps):
                    break
                start = max([free[r]] + [done[d] for d in deps])
                end = start + cost[w.kind]
                done[(w.kind, _stage(r, w.chunk, p), w.mb)] = free[r] = end
                slots.append(Slot(r, w, start, end))
                nxt[r] += 1
                moved = True
        if not moved:
            stuck = ", ".join(f"rank {r} waits to run {orders[r][nxt[r]]}" for r in range(p) if nxt[r] < len(orders[r]))
            raise ScheduleError(f"the order waits forever: {stuck}")
    return slots


def bubble_of(slots: list[Slot]) -> float:
    """Bubble time over ideal time: (step time - busiest rank's work) / that work."""
    end = max(s.end for s in slots)
    busy = max(sum(s.end - s.start for s in slots if s.rank == r) for r in {s.rank for s in slots})
    return (end - busy) / busy


def peak_in_flight(orders: list[list[Work]]) -> list[int]:
    """Per rank, the most micro-batches whose forward has run and whose backward has not (with a split
    backward: whose W has not): the activations the rank must keep, in units of one chunk's activations."""
    peaks = []
    for order in orders:
        last = "W" if any(w.kind == "W" for w in order) else "B"
        live = peak = 0
        for w in order:
            live += (w.kind == "F") - (w.kind == last)
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def schedule_figure(slots: list[Slot], p: int, title: str = "", v: int = 1):
    """One row per rank; F, B (and W) boxes labelled with their micro-batch, chunks in lighter shades."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    end = max(s.end for s in slots)
    fig, ax = plt.subplots(figsize=(11, 0.5 * p + 1.3))
    for s in slots:
        base = to_rgb(COLOURS[s.work.kind])
        shade = 0.45 * s.work.chunk / max(v - 1, 1)
        colour = tuple(c + (1 - c) * shade for c in base)
        y = p - 1 - s.rank
        ax.broken_barh([(s.start, s.end - s.start)], (y + 0.1, 0.8), facecolors=colour, edgecolor="white",
                       linewidth=0.6)
        if (s.end - s.start) / end > 0.012:
            ax.text((s.start + s.end) / 2, y + 0.5, str(s.work.mb), ha="center", va="center", fontsize=7,
                    color="white")
    ax.set_yticks([p - 1 - r + 0.5 for r in range(p)])
    ax.set_yticklabels([f"rank {r}" for r in range(p)])
    ax.set_ylim(0, p)
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel("time (units of one micro-batch's forward through one rank's layers); white: the bubble")
    kinds = sorted({s.work.kind for s in slots}, key="FBW".index)
    names = {"F": "forward", "B": "backward" if "W" not in kinds else "input gradient", "W": "weight gradient"}
    ax.legend(handles=[Patch(color=COLOURS[k], label=names[k]) for k in kinds], loc="upper left",
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
    state.fig = schedule_figure(slots, p, f"{label}: p={p} stages, m={m} micro-batches, backward = {ratio:g} × forward", v)
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
