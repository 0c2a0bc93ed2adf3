"""One-time costs a learner's first check would otherwise pay, moved into the notebook's setup cell.

Torch imports some of its own modules on first use, a second or more of CPU each: torch._dynamo when the first
optimizer is built (torch.optim's constructors are wrapped to keep torch.compile out) and sympy with the first
backward given an explicit gradient. A puzzle module whose checks meet them imports them ahead, with the notebook's
setup cell, so that a learner's first check takes as long as the next one.

Matplotlib does the same with a kernel's first figure (its font cache and fonts loaded, the Agg renderer and the PNG
encoder imported, about 0.8 s): `draw_ahead` draws and renders a throwaway figure in a notebook kernel, so that the
pictures after the first check cost what they cost after any other.
"""

from __future__ import annotations

import importlib

MODULES = {"optimizer": "torch._dynamo",
           "explicit_gradient": "torch.fx.experimental.symbolic_shapes"}


def import_ahead(*uses: str) -> None:
    """Import now what torch would import on the first of these `uses` (keys of MODULES)."""
    for use in uses:
        importlib.import_module(MODULES[use])


def draw_ahead() -> None:
    """Draw and render a figure with the artists a check's pictures use (bars, steps, lines, a legend, a title,
    tick labels), in both layout engines, both as a notebook displays a figure (PNG, tight bounding box) and as a
    check displays its pictures (lib.viz.png.Picture, whose glyph cache keeps the labels' glyphs). Nothing is shown."""
    import matplotlib
    import matplotlib.pyplot as plt
    from IPython.core.pylabtools import print_figure
    from IPython.display import display  # noqa: F401  (imported for the first check's pictures)
    from matplotlib.patches import Patch

    from lib.viz import RENDER_RC
    from lib.viz.png import Picture

    for layout in ("constrained", None):
        fig, ax = plt.subplots(figsize=(3, 2), layout=layout)
        ax.broken_barh([(0.0, 1.0), (1.5, 0.5)], (0.1, 0.4), facecolors="#4C72B0", edgecolor="white", linewidth=0.3)
        line, = ax.step([0.0, 0.5, 1.0], [0.0, 1.0, 0.5], where="post", label="memory")
        ax.axhline(1.0, color=line.get_color(), linestyle=":", linewidth=1)
        ax.annotate("peak 1 KiB", (1.0, 1.0), xytext=(4, 0), textcoords="offset points", fontsize="small")
        ax.set_yticks([0.5])
        ax.set_yticklabels(["rank 0"])
        ax.set_xlabel("simulated time (µs)")
        ax.set_title("first figure\nof this kernel")
        ax.legend(handles=[Patch(color="#4C72B0", label="compute"), line], loc="upper left",
                  bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
        if layout is None:
            fig.tight_layout()
        plt.close(fig)
        with matplotlib.rc_context(RENDER_RC):
            print_figure(fig, "png", bbox_inches="tight")
        Picture(fig)._repr_png_()
