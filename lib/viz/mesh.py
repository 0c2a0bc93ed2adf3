"""Pictures of a device mesh: every rank as a box at its coordinates, the last dimension innermost, boxes of one
group along a chosen axis sharing a colour, and the node each rank's GPU sits in (consecutive ranks, as
launchers number them)."""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

from lib.sim.mesh import coordinates

GROUP_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
                 "#CCB974", "#64B5CD", "#A1C9F4", "#FFB482")


def _group_index(coords: tuple[int, ...], dim: int, shape: Sequence[int]) -> int:
    """Which group along `dim` holds `coords`: its other coordinates, row-major."""
    index = 0
    for d, (c, size) in enumerate(zip(coords, shape)):
        if d != dim:
            index = index * size + c
    return index


def mesh_figure(shape: Sequence[int], names: Sequence[str], colour_by: Sequence[str] = (),
                label: Optional[Callable[[int, tuple[int, ...]], str]] = None, ranks_per_node: int = 8,
                title: str = ""):
    """One panel per axis in `colour_by` (one plain panel if none): rows are the outer coordinates, columns the
    innermost; each box says its rank, its node, its coordinates and `label(rank, coords)`."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from lib.viz.contrast import text_colour

    shape, names = tuple(shape), tuple(names)
    world = 1
    for s in shape:
        world *= s
    cols = shape[-1]
    rows = world // cols
    panels = list(colour_by) or [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(min(4.2 * len(panels), 14), 0.9 * rows + 1.0),
                             layout="constrained", squeeze=False)
    for ax, axis in zip(axes[0], panels):
        for rank in range(world):
            coords = coordinates(rank, shape)
            row, col = divmod(rank, cols)
            y = rows - 1 - row
            colour = "#EEEEEE"
            if axis is not None:
                colour = GROUP_COLOURS[_group_index(coords, names.index(axis), shape) % len(GROUP_COLOURS)]
            alpha = 0.85 if axis else 1.0
            ax.add_patch(Rectangle((col + 0.05, y + 0.08), 0.9, 0.84, facecolor=colour, edgecolor="white",
                                   alpha=alpha))
            text = f"rank {rank} (node {rank // ranks_per_node})\n" + " ".join(f"{n}{c}" for n, c in zip(names, coords))
            if label is not None:
                text += "\n" + label(rank, coords)
            ax.text(col + 0.5, y + 0.5, text, ha="center", va="center", fontsize="x-small",
                    color=text_colour(colour, alpha))
        ax.set_xlim(0, cols)
        ax.set_ylim(0, rows)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(f"{axis.upper()} groups: one colour each" if axis else "", fontsize="small")
    if title:
        fig.suptitle(title, fontsize="medium")
    plt.close(fig)
    return fig


def axis_traffic_figure(rows: Sequence[tuple[str, float, float, str, float]], title: str = ""):
    """A bar per mesh axis: the bytes its busiest rank sent along it in the run, and the mean over the ranks, each
    labelled with the link the axis's groups use and how long the busiest rank's bytes take on it. `rows`: one
    (axis, busiest bytes, mean bytes, link, seconds at that link's bandwidth) per axis, outermost first."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MultipleLocator

    from lib.units import fmt_bytes, fmt_time

    fig, ax = plt.subplots(figsize=(10, 0.7 * len(rows) + 1.3), layout="constrained")
    ys = list(range(len(rows)))[::-1]
    busiest = [r[1] for r in rows]
    ax.barh(ys, busiest, height=0.6, color=[GROUP_COLOURS[i % len(GROUP_COLOURS)] for i in range(len(rows))],
            label="the busiest rank")
    ax.scatter([r[2] for r in rows], ys, marker="|", s=400, color="black", zorder=3, label="the mean over ranks")
    right = max(busiest, default=0) or 1
    for y, (_, most, _, link, seconds) in zip(ys, rows):
        ax.text(most + right * 0.01, y, f"{fmt_bytes(most)}: {link}, {fmt_time(seconds)} at that speed", va="center",
                fontsize="small")
    ax.set_yticks(ys)
    ax.set_yticklabels([r[0] for r in rows])
    ax.set_xlim(0, right * 1.9)                 # room for the labels beside the longest bar
    ax.set_xlabel("bytes sent in the run")
    ax.xaxis.set_major_locator(MultipleLocator(2 ** math.floor(math.log2(right / 2)) if right > 2 else 1))
    ax.xaxis.set_major_formatter(lambda v, _pos: fmt_bytes(v) if v else "0")        # powers of 2: 256 KiB, not 195.31
    ax.legend(loc="lower right", fontsize="small", frameon=False)
    if title:
        ax.set_title(title, fontsize="medium")
    plt.close(fig)
    return fig


def axis_groups(shape: Sequence[int], names: Sequence[str], ranks_per_node: int) -> list[str]:
    """Per axis, rank 0's group and whether it stays inside one node (where the fast links are) or crosses nodes."""
    world = math.prod(shape)
    lines = []
    for dim, name in enumerate(names):
        group = [r for r in range(world) if all(c == 0 for i, c in enumerate(coordinates(r, shape)) if i != dim)]
        nodes = sorted({r // ranks_per_node for r in group})
        where = "inside node 0" if len(nodes) == 1 else f"across nodes {', '.join(map(str, nodes))}"
        lines.append(f"{name.upper()} group of rank 0: ranks {group}, {where}")
    return lines


class MeshState:
    """The last redraw of mesh_explorer: its figure and readout."""

    fig = None
    readout = ""


def mesh_explorer(shapes: Sequence[Sequence[int]], names: Sequence[str],
                  label_for: Callable[[tuple[int, ...], int], Callable[[int, tuple], str]], *,
                  stages: Sequence[int] = (0, 1), ranks_per_node: int = 4, colour_by: Sequence[str] = ()):
    """A mesh shape and a ZeRO stage to choose; redraws `mesh_figure` with `label_for(shape, stage)` on each rank and
    says which axis's groups stay inside a node."""
    import ipywidgets as widgets

    from lib.viz.widgets import live_box, slider_options

    shapes = [tuple(s) for s in shapes]
    controls = {"mesh": widgets.Dropdown(options=[(" × ".join(map(str, s)), s) for s in shapes], value=shapes[0],
                                         description=f"({', '.join(names)})", **slider_options()),
                "zero": widgets.Dropdown(options=list(stages), value=stages[0], description="ZeRO stage",
                                         **slider_options())}
    state = MeshState()

    def update() -> None:
        shape, stage = controls["mesh"].value, controls["zero"].value
        state.fig = mesh_figure(shape, names, colour_by=colour_by, label=label_for(shape, stage),
                                ranks_per_node=ranks_per_node,
                                title=f"({', '.join(names)}) = {shape}, {ranks_per_node} GPUs a node")
        state.readout = "\n".join(axis_groups(shape, names, ranks_per_node))

    return live_box(list(controls.values()), controls, state, update)
