"""One-time costs a learner's first check would otherwise pay, paid while the learner writes the answer.

Torch imports some of its own modules on first use, a second or more of CPU each: torch._dynamo when the first
optimizer is built (torch.optim's constructors are wrapped to keep torch.compile out) or torch.utils.checkpoint first
runs, and sympy with the first backward given an explicit gradient. A puzzle module whose checks meet them names them
with `import_ahead`.
Matplotlib does the same with a kernel's first figure (its font cache and fonts loaded, the Agg renderer and the
PNG encoder imported): `draw_ahead` draws and renders a throwaway figure.

In a notebook kernel (`in_kernel`, from lib.checker.puzzle) none of this delays the notebook's first answer, the first
check
cell's, which with the shipped stub is "not solved yet" and needs none of it. When the cell that gave the first
answer has finished, a thread imports torch's modules while the learner reads and writes, then the kernel draws the
throwaway figure when it is next idle, on its own thread (matplotlib keeps its fonts per
thread): the first check of an answer takes as long as the next one. Once warm, the kernel's objects so far are
frozen out of the garbage collector's full collections (gc.freeze). Every cell waits for the warm-up to finish before
it runs, and every fork for the imports: nothing the learner runs shares the process with the thread (imports and
forks do not mix with a second thread). A check that comes before any answer (a notebook run whole
with its answers in) pays the warm-up itself, as the setup cell used to. Outside a kernel (tests, scripts),
`import_ahead` imports at once.
"""

from __future__ import annotations

import gc
import importlib
import os
import threading
from typing import Optional

MODULES = {"optimizer": "torch._dynamo",
           "checkpoint": "torch._dynamo",               # torch.utils.checkpoint's first call imports it too (2.6 s)
           "explicit_gradient": "torch.fx.experimental.symbolic_shapes"}


class _WarmUp:
    """The kernel's warm-up: what to import, the thread that imports it once, and the throwaway figure."""

    def __init__(self) -> None:
        self.in_kernel = False
        self.uses: list[str] = []
        self.answered = False                       # a check has answered in the cell now running
        self.thread: Optional[threading.Thread] = None
        self.drawn = False
        self.when_idle = None                       # runs a function on the kernel's thread when it is idle

    def import_all(self) -> None:
        try:
            for use in self.uses:
                importlib.import_module(MODULES[use])
        except Exception:        # what failed here fails again, with its own traceback, where it is used
            pass
        if self.when_idle is not None:
            self.when_idle(self.draw)

    def draw(self) -> None:
        if not self.drawn:
            self.drawn = True
            try:
                draw_ahead()
            except Exception:
                pass
            # Every object made so far (torch's, matplotlib's, the notebook's imports: some 400,000) out of the
            # collector's view for good: a full collection, which a check's garbage sets off every few checks, then
            # walks what was made since (0.4 s of CPU each time in a kernel that imported torch and matplotlib).
            gc.freeze()

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self.import_all, name="course-warm-up", daemon=True)
            self.thread.start()

    def wait_for_imports(self) -> None:
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()

    def finish(self) -> None:
        """On the kernel's thread: the imports done (here, if they have not started), then the figure."""
        if self.thread is None:
            self.thread = threading.current_thread()
            self.import_all()
        self.wait_for_imports()
        self.draw()


_warm_up = _WarmUp()


def import_ahead(*uses: str) -> None:
    """What torch would import on the first of these `uses` (keys of MODULES): imported now, or in a notebook
    kernel with the warm-up (at once if it has run already)."""
    unknown = set(uses) - set(MODULES)
    if unknown:
        raise KeyError(f"no first use named {', '.join(sorted(unknown))}; uses: {', '.join(MODULES)}")
    if _warm_up.in_kernel and _warm_up.thread is None:
        _warm_up.uses += [u for u in uses if u not in _warm_up.uses]
        return
    for use in uses:
        importlib.import_module(MODULES[use])


def in_kernel() -> None:
    """Defer the one-time costs in this notebook kernel: see the module's docstring."""
    from IPython import get_ipython

    if _warm_up.in_kernel:
        return
    _warm_up.in_kernel = True
    shell = get_ipython()
    loop = getattr(getattr(shell, "kernel", None), "io_loop", None)     # ipykernel's (tornado): thread-safe
    _warm_up.when_idle = loop.add_callback if loop is not None else None
    shell.events.register("pre_run_cell", _before_cell)
    shell.events.register("post_run_cell", _after_cell)
    os.register_at_fork(before=_warm_up.wait_for_imports)


def answered() -> None:
    """A check has given its answer: the warm-up starts when the cell that asked for it finishes."""
    _warm_up.answered = True


def ready() -> None:
    """Before a check runs an answer: the warm-up finished, run here if it has not started."""
    if _warm_up.in_kernel:
        _warm_up.finish()


def _before_cell(info=None) -> None:
    if _warm_up.thread is not None:
        _warm_up.finish()


def _after_cell(result=None) -> None:
    if _warm_up.answered:
        _warm_up.start()


def draw_ahead() -> None:
    """Draw and render a figure with the artists a check's pictures use (bars, steps, lines, a legend, a title,
    tick labels), in both layout engines, both as a notebook displays a figure (PNG, tight bounding box) and as a
    check displays its pictures (lib.viz.png.Picture). Nothing is shown:
    the figures are not pyplot's, which a notebook shows when a cell (or a widget) finishes."""
    import matplotlib
    from IPython.core.pylabtools import print_figure
    from IPython.display import display  # noqa: F401  (imported for the first check's pictures)
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from lib.viz import RENDER_RC
    from lib.viz.png import Picture

    for layout in ("constrained", None):
        fig = Figure(figsize=(3, 2), layout=layout)
        ax = fig.subplots()
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
        with matplotlib.rc_context(RENDER_RC):
            print_figure(fig, "png", bbox_inches="tight")
        Picture(fig)._repr_png_()
