"""Pictures drawn before a puzzle: tensors as boxes (split among ranks by colour), operations between them.

A picture says what each rank holds and what moves where, not the answer: shapes and names, no byte counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

# One colour per rank, shared by every picture of the course, so that "rank 2's slice" reads the same everywhere.
RANK_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")
WHOLE = "#B8B8B8"          # a tensor every rank holds whole
COMM = "#E8A33D"           # an operation that communicates
SAVED = "#B00020"          # the outline of a tensor autograd keeps for backward


@dataclass(frozen=True)
class Box:
    """A tensor. split: "" (whole on every rank), "rows" or "cols" (rank r holds the r-th slice, in its colour)."""

    label: str
    note: str = ""                 # under the box: its shape
    split: str = ""
    width: float = 1.0
    height: float = 1.0
    saved: bool = False            # outlined: autograd keeps it for backward
    colour: str = ""               # overrides the default fill of a whole tensor


@dataclass(frozen=True)
class Op:
    """An operation between two tensors; comm: it talks to other ranks (drawn in the communication colour)."""

    label: str
    note: str = ""
    comm: bool = False


Item = Union[Box, Op]
SLOT = 1.7                         # horizontal room per item


def _draw_box(ax, x: float, y: float, box: Box, ranks: int) -> None:
    from matplotlib.patches import Rectangle

    w, h = 1.2 * box.width, 0.9 * box.height
    left, bottom = x - w / 2, y - h / 2
    if box.split:
        for r in range(ranks):
            if box.split == "rows":
                part = Rectangle((left, bottom + h * (ranks - 1 - r) / ranks), w, h / ranks)
            else:
                part = Rectangle((left + w * r / ranks, bottom), w / ranks, h)
            part.set(facecolor=RANK_COLOURS[r % len(RANK_COLOURS)], edgecolor="white", linewidth=0.8)
            ax.add_patch(part)
    else:
        ax.add_patch(Rectangle((left, bottom), w, h, facecolor=box.colour or WHOLE, edgecolor="none"))
    ax.add_patch(Rectangle((left, bottom), w, h, fill=False, linewidth=2.2 if box.saved else 0.8,
                           edgecolor=SAVED if box.saved else "0.3", linestyle="-"))
    ax.text(x, y, box.label, ha="center", va="center", fontsize=8.5, color="black",
            bbox=dict(facecolor="white", edgecolor="none", alpha=0.75, pad=1))
    if box.note:
        ax.text(x, bottom - 0.12, box.note, ha="center", va="top", fontsize=7.5, color="0.25")


def _draw_op(ax, x: float, y: float, op: Op) -> None:
    from matplotlib.patches import Circle

    ax.add_patch(Circle((x, y), 0.34, facecolor=COMM if op.comm else "white", edgecolor="0.3", linewidth=1))
    ax.text(x, y, op.label, ha="center", va="center", fontsize=9 if len(op.label) < 5 else 7,
            fontweight="bold" if op.comm else "normal")
    if op.note:
        ax.text(x, y - 0.45, op.note, ha="center", va="top", fontsize=7, color="0.25")


def flow_figure(items: Sequence[Item], ranks: int = 4, title: str = "", per_row: int = 11,
                legend: Sequence[str] = ()):
    """Items left to right (wrapping after per_row), joined by arrows; a legend of the rank colours when a box
    is split, of saved tensors when one is, and any extra lines in `legend`."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = [items[i:i + per_row] for i in range(0, len(items), per_row)]
    width = SLOT * min(len(items), per_row)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.95 * width + 2.4), 1.9 * len(rows) + 0.7))
    for j, row in enumerate(rows):
        y = -2.1 * j
        for i, item in enumerate(row):
            x = SLOT * i
            (_draw_box(ax, x, y, item, ranks) if isinstance(item, Box) else _draw_op(ax, x, y, item))
            if i + 1 < len(row):
                ax.annotate("", (x + SLOT - 0.72, y), (x + 0.72, y),
                            arrowprops=dict(arrowstyle="->", color="0.35", linewidth=1))
        if j + 1 < len(rows):
            ax.annotate("", (0, y - 2.1 + 0.75), (SLOT * (len(row) - 1), y - 0.75),
                        arrowprops=dict(arrowstyle="->", color="0.6", linewidth=0.8, linestyle=":",
                                        connectionstyle="arc3,rad=0.05"))
    handles = []
    if any(isinstance(i, Box) and i.split for i in items):
        handles += [Patch(color=RANK_COLOURS[r % len(RANK_COLOURS)], label=f"rank {r}'s slice") for r in range(ranks)]
    if any(isinstance(i, Box) and not i.split and not i.colour for i in items):
        handles.append(Patch(color=WHOLE, label="whole, on every rank" if ranks > 1 else "a tensor"))
    if any(isinstance(i, Op) and i.comm for i in items):
        handles.append(Patch(color=COMM, label="communicates"))
    if any(isinstance(i, Box) and i.saved for i in items):
        handles.append(Patch(facecolor="white", edgecolor=SAVED, linewidth=2, label="kept for backward"))
    handles += [Patch(color="none", label=line) for line in legend]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    ax.set_xlim(-1.0, width - SLOT + 1.0)
    ax.set_ylim(-2.1 * (len(rows) - 1) - 1.25, 0.85)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    plt.close(fig)          # returned, not shown twice in a notebook
    return fig
