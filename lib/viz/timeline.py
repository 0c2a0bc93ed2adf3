"""Per-rank timelines of a simulated run: a matplotlib figure and a Chrome / Perfetto trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

# One colour per kind of work, so a timeline reads at a glance.
COLOURS = {"compute": "#4C72B0", "send": "#DD8452", "recv": "#C44E52", "all_reduce": "#55A868",
           "all_gather": "#8172B3", "reduce_scatter": "#937860", "broadcast": "#DA8BC3",
           "reduce": "#8C8C8C", "all_to_all": "#CCB974", "barrier": "#64B5CD", "gather": "#1F77B4",
           "scatter": "#FF7F0E"}


def _scale(end: float) -> tuple[float, str]:
    for factor, unit in ((1.0, "s"), (1e3, "ms"), (1e6, "µs"), (1e9, "ns")):
        if end * factor >= 1:
            return factor, unit
    return 1e9, "ns"


def _lane(e, row: int) -> tuple[float, float]:
    """Compute on top; below it collectives, or sends over receives, which run at the same time."""
    if e.lane == "compute":
        return row + 0.52, 0.4
    if e.op == "send":
        return row + 0.29, 0.2
    if e.op == "recv":
        return row + 0.07, 0.2
    return row + 0.07, 0.42


# Colours for communication told apart by kind (see kind_of): the three axes of 3D parallelism first.
KIND_COLOURS = ("#55A868", "#DD8452", "#8172B3", "#C44E52", "#CCB974", "#64B5CD", "#937860")


def _colouring(events: Sequence, kind_of: Optional[Callable[[Any], str]]):
    """(label of each event, colour of a label): by op, or communication by the kind `kind_of` names. kind_of is
    asked once per rank, op, group and peer: a run repeats the same few communications hundreds of times."""
    if kind_of is None:
        return [e.op for e in events], COLOURS
    kinds: dict[tuple, str] = {}
    labels = [e.op if e.lane != "comm" else kinds.get((e.rank, e.op, e.group, e.peer)) or
              kinds.setdefault((e.rank, e.op, e.group, e.peer), kind_of(e)) for e in events]
    comm = sorted(set(kinds.values()))
    palette = {**COLOURS, **dict(zip(comm, KIND_COLOURS * (1 + len(comm) // len(KIND_COLOURS))))}
    return labels, palette


def draw_timeline(events: Sequence, world_size: int, title: str = "",
                  kind_of: Optional[Callable[[Any], str]] = None, ranks: Optional[Sequence[int]] = None):
    """One row per rank with a compute lane (top) and a communication lane (bottom).

    kind_of: names each communication's kind (its mesh axis, say: lib.sim.traffic.axis_labeller), which then
    colours it and names it in the legend instead of its op. ranks: the ranks to draw, in this order (all of them
    if None): a few rows of a run on hundreds of ranks."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba_array
    from matplotlib.patches import Patch

    from lib.viz import place_axes

    end = max((e.end for e in events), default=0.0)          # the whole run's, however few ranks are drawn
    shown = list(range(world_size)) if ranks is None else list(ranks)
    row_of = {r: len(shown) - 1 - i for i, r in enumerate(shown)}
    if ranks is not None:
        events = [e for e in events if e.rank in row_of]
    labels, palette = _colouring(events, kind_of)

    factor, unit = _scale(end)
    rows = len(shown)
    fig, ax = plt.subplots(figsize=(10, 0.55 * rows + 1.2))
    bars: dict[tuple, list] = {}             # the rectangles of each lane and colour, drawn in that order
    for e, label in zip(events, labels):
        y, height = _lane(e, row_of[e.rank])
        bars.setdefault((y, height, label), []).append(
            (e.start * factor, max((e.end - e.start) * factor, end * factor * 2e-3)))
    if bars:                                 # one collection of every rectangle: a run has thousands of events
        counts = [len(spans) for spans in bars.values()]
        x0, dx = np.concatenate([np.asarray(spans) for spans in bars.values()]).T
        y0, height = np.repeat([(y, h) for y, h, _ in bars], counts, axis=0).T
        x1, y1 = x0 + dx, y0 + height
        colours = np.repeat(to_rgba_array([palette.get(label, "#999999") for _, _, label in bars]), counts, axis=0)
        corners = np.stack([np.stack(c, axis=1) for c in ((x0, y0), (x0, y1), (x1, y1), (x1, y0))], axis=1)
        ax.add_collection(PolyCollection(corners, facecolors=colours, edgecolor="white", linewidth=0.3),
                          autolim=False)
    used = {label for _, _, label in bars}
    ax.set_yticks([row_of[r] + 0.5 for r in shown])
    ax.set_yticklabels([f"rank {r}" for r in shown])
    ax.set_ylim(0, rows)
    ax.set_xlim(0, end * factor * 1.01 or 1)
    ax.set_xlabel(f"simulated time ({unit})   each rank: compute above; communication below (sends over receives)")
    if title:
        ax.set_title(title, y=1.0)           # where matplotlib would put it, without measuring the ticks
    ax.legend(handles=[Patch(color=palette.get(k, "#999999"), label=k) for k in sorted(used)],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    place_axes(fig, ax, left=0.62 + 0.08 * len(str(max(shown, default=0))), bottom=0.59,        # "rank N", the x label
               top=(0.36 + 0.215 * title.count("\n")) if title else 0.15,               # the title's lines
               right=0.45 + 0.075 * max(map(len, used), default=0))                     # the legend's longest label
    plt.close(fig)          # returned, not shown twice in a notebook
    return fig


def chrome_trace(events: Iterable) -> dict:
    """The trace-event JSON format: one process per rank, one thread per lane, times in µs."""
    out = []
    for e in events:
        args = {"group": e.group, "bytes": e.bytes}
        if e.peer is not None:
            args["peer"] = e.peer
        out.append({"name": e.op, "cat": e.lane, "ph": "X", "pid": e.rank, "tid": 0 if e.lane == "compute" else 1,
                    "ts": e.start * 1e6, "dur": (e.end - e.start) * 1e6, "args": args})
    ranks = sorted({e.rank for e in events})
    for r in ranks:
        out.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}})
        for tid, lane in ((0, "compute"), (1, "communication")):
            out.append({"name": "thread_name", "ph": "M", "pid": r, "tid": tid, "args": {"name": lane}})
    return {"traceEvents": out, "displayTimeUnit": "ns"}


def save_chrome_trace(events: Iterable, path) -> None:
    Path(path).write_text(json.dumps(chrome_trace(events)))


def scale_note(cost=None) -> str:
    """The hardware a scaled timeline stands for, said in its title."""
    from lib.sim.cost import CostModel
    from lib.units import fmt_rate, fmt_time

    cost = cost or CostModel()
    return (f"H100 node: {cost.flops_per_s / 1e12:.0f} TFLOP/s, NVLink {fmt_rate(cost.intra_node_bandwidth)}, "
            f"{fmt_time(cost.latency)} per message")


def at_scale(bytes_factor: float, flops_factor: float, cost=None):
    """`cost` (an H100 node by default) slowed so that a toy case's timeline has a real run's proportions: every
    byte moved (links, PCIe, memory) takes as long as `bytes_factor` bytes, every FLOP as `flops_factor` FLOPs;
    latency stays what it is. For timelines drawn after a check, never for its budgets."""
    from lib.sim.cost import CostModel

    cost = cost or CostModel()
    return cost.with_(flops_per_s=cost.flops_per_s / flops_factor, host_flops_per_s=cost.host_flops / flops_factor,
                      intra_node_bandwidth=cost.intra_node_bandwidth / bytes_factor,
                      inter_node_bandwidth=cost.inter_node_bandwidth / bytes_factor,
                      inter_site_bandwidth=cost.inter_site_bandwidth / bytes_factor,
                      memory_bandwidth=cost.memory_bandwidth / bytes_factor,
                      host_memory_bandwidth=cost.host_bandwidth / bytes_factor,
                      pcie_bandwidth=cost.pcie_bandwidth / bytes_factor)


def training_scale(case, params: float = 1.3e9, tokens: int = 4096, cost=None):
    """A training step's timeline at GPT-3 1.3B's scale, for a case whose arguments start with the model and each
    rank's batches: the toy model's bytes stand for `params` bf16 parameters and its compute for
    6 · params · tokens per rank and step, so that compute and communication take their real proportions.
    `cost`: the cluster scaled (an H100 node by default)."""
    model, batches = case.args[0], case.args[1].values[0]
    first = next(model.parameters())
    psi, samples = sum(p.numel() for p in model.parameters()), batches[0][0].shape[0]
    return (at_scale(params * 2 / (psi * first.element_size()), params * tokens / (psi * samples), cost),
            f"drawn as if the {psi:,}-parameter model were GPT-3 {params / 1e9:g}B in bf16 with {tokens} tokens "
            f"per rank and step\n{scale_note()}")
