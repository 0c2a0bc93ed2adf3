"""Every picture a learner sees, rendered as the notebook shows it: not blank, and every label readable.

The pictures: those the notebooks draw before their puzzles (found in the notebooks: the cells that call a figure of
lib.viz, run as the notebook runs them) and those a passing check displays (Puzzle.picture of the reference
solution, for every puzzle). A notebook shows a figure through the inline backend: IPython's print_figure at the
figure's dpi, on its white face, with bbox_inches="tight" (matplotlib-inline's print_figure_kwargs; its rc is empty
since 0.1.4, so matplotlib's defaults hold, as here); a check displays lib.viz.png.Picture. Each figure is rendered
once, by that very path, and read while it is drawn.

A label reads when its colour contrasts with what its glyphs are drawn on: the canvas under the label's box is kept
just before its glyphs are drawn (everything drawn before them there, the label's own box included) and just after;
its glyph pixels are those that changed. The contrast is WCAG's ratio (lib.viz.contrast) between the label's colour
and the colour under each glyph pixel, and 90% of a label's glyph pixels must reach 3:1: a glyph that crosses a
cell's thin border is not unreadable for a few pixels. 3:1 is WCAG 2.2's least contrast for large text and for the
parts of a graphic one must see to understand it (success criteria 1.4.3 and 1.4.11). The labels here are smaller
than WCAG's "large" (18 pt), for which it would ask 4.5:1, but they are a figure's labels, not prose; the labels the
course writes on coloured cells, black or white by luminance, reach 4.58:1 whatever the fill
(test_a_label_chosen_by_luminance_reads_on_any_fill). A label that changed no pixel (drawn in the colour under it)
is measured against everything under its box: 1:1 on a plain fill.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import io
import re
from pathlib import Path
from unittest import mock

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from IPython.core.pylabtools import print_figure  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.backends.backend_agg import RendererAgg  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from PIL import Image  # noqa: E402

import puzzles  # noqa: E402
from lib.notebook.cells import puzzle_cells  # noqa: E402
from lib.viz.contrast import contrast, text_colour  # noqa: E402
from lib.viz.png import Picture  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

LEAST_CONTRAST = 3.0        # WCAG 2.2, success criteria 1.4.3 (large text) and 1.4.11 (graphical objects)
READABLE_SHARE = 0.9        # of a label's glyph pixels, at LEAST_CONTRAST or more
GLYPH = 24                  # a pixel whose channel moves by more than this when a label's glyphs are drawn is theirs
LEAST_INK = 0.02            # of a picture's pixels, beside its labels' glyphs: less, and nothing is drawn


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"))


def _tight(fig) -> np.ndarray:
    """The figure as the inline backend sends it to the notebook."""
    return _pixels(print_figure(fig, "png", bbox_inches="tight"))


def _picture(fig) -> np.ndarray:
    """The figure as a passing check displays it."""
    return _pixels(Picture(fig)._repr_png_())


class _Label:
    """A text drawn on a canvas: its box there (rows, columns), the canvas's pixels in it before its glyphs (after
    everything drawn before them, its own box and arrow included) and after them."""

    def __init__(self, text: Text) -> None:
        self.text, self.box, self.before, self.after = text, None, None, None

    def under(self, renderer) -> np.ndarray:
        return np.asarray(renderer.buffer_rgba())[self.box][..., :3].copy()


@contextlib.contextmanager
def _labels_drawn():
    """The labels drawn meanwhile, on the canvas that draws their glyphs (a tight print measures in a dry run)."""
    labels: list[_Label] = []
    drawing: list[_Label] = []
    draw_label, draw_glyphs = Text.draw, RendererAgg.draw_text

    def label(self, renderer):
        drawing.append(_Label(self))
        try:
            draw_label(self, renderer)
        finally:
            if (done := drawing.pop()).box is not None and self.get_text().strip():
                labels.append(done)

    def glyphs(self, *args, **kwargs):
        done = drawing[-1] if drawing else None
        if done is not None and done.box is None:
            box, height = done.text.get_window_extent(self), self.height
            done.box = (slice(max(int(height - box.y1) - 1, 0), max(int(np.ceil(height - box.y0)) + 1, 0)),
                        slice(max(int(box.x0) - 1, 0), max(int(np.ceil(box.x1)) + 1, 0)))
            done.before = done.under(self)
        draw_glyphs(self, *args, **kwargs)
        if done is not None:
            done.after = done.under(self)
    with mock.patch.object(Text, "draw", label), mock.patch.object(RendererAgg, "draw_text", glyphs):
        yield labels


def _glyph_pixels(label: _Label) -> np.ndarray:
    return np.abs(label.after.astype(int) - label.before).max(axis=-1) > GLYPH


def _unreadable(label: _Label) -> str | None:
    """Why the label does not read on what its glyphs are drawn on, or None when it does."""
    if not label.before.size:
        return None                                          # drawn outside the canvas
    glyph = _glyph_pixels(label)
    under = (label.before[glyph] if glyph.any() else label.before.reshape(-1, 3)) / 255
    text = label.text
    colour = np.asarray(matplotlib.colors.to_rgba(text.get_color(), text.get_alpha()))
    ratios = contrast(colour[3] * colour[:3] + (1 - colour[3]) * under, under)
    share = np.mean(ratios >= LEAST_CONTRAST)
    if share >= READABLE_SHARE:
        return None
    return (f"{text.get_text()!r} in {matplotlib.colors.to_hex(colour[:3])} on "
            f"{matplotlib.colors.to_hex(np.median(under, axis=0))}: {share:.0%} of its pixels at "
            f"{LEAST_CONTRAST:g}:1 or more, median {np.median(ratios):.2f}:1")


def _reading(fig, render) -> tuple[float, list[str], int]:
    """The figure rendered once by `render`: (the share of its pixels drawn beside its labels' glyphs, the labels
    that do not read, the number of labels)."""
    with _labels_drawn() as labels:
        shown = render(fig)
    packed = np.ascontiguousarray(shown).view(np.uint32)[..., 0]
    inked = np.count_nonzero(packed != packed[0, 0]) - sum(np.count_nonzero(_glyph_pixels(x)) for x in labels)
    return inked / packed.size, [why for x in labels if (why := _unreadable(x))], len(labels)


# A notebook's pictures before its puzzles: its cells that call a figure of lib.viz or display one, run after the
# notebook's setup cell and the earlier cells that define the names they use; not the cells that run a learner's
# function (their figures are a check's: timelines and memory over time, below).

def _cell_value(source: str, namespace: dict):
    """Run a cell as IPython does and return the value of its last line, if an expression."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), namespace)
    return eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace) if last else None


def _defines(source: str) -> set[str]:
    """The names a cell binds: assigned, defined, imported, or a lambda's arguments."""
    names = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) or isinstance(n, ast.arg):
            names.add(n.id if isinstance(n, ast.Name) else n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
    return names


def _free(source: str) -> set[str]:
    """The names a cell uses and does not bind itself."""
    used = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - _defines(source)


def notebook_pictures(path: Path) -> list[tuple[str, Figure]]:
    """(where, figure) for every figure the notebook's picture cells draw, in order."""
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    setup = next(c for c in cells if "setup" in c.metadata.get("tags", []))
    plain = [c for c in cells if not c.metadata.get("tags")]
    drawing = {a.asname or a.name for n in ast.walk(ast.parse(setup.source)) if isinstance(n, ast.ImportFrom)
               and n.module.startswith("lib.viz") for a in n.names if not a.name.endswith("_explorer")} | {"display"}
    learners = set(puzzle_cells(nb))
    shown: list = []
    namespace = {"display": lambda *objects: shown.extend(objects)}
    pictures = []
    with contextlib.redirect_stdout(io.StringIO()):
        exec(setup.source, namespace)
        for i, cell in enumerate(plain):
            uses = _free(cell.source)
            if not uses & drawing or uses & learners:
                continue
            for needed in sorted(uses - set(namespace) - set(dir(builtins))):
                _cell_value(next(c.source for c in reversed(plain[:i]) if needed in _defines(c.source)), namespace)
            shown.clear()
            value = _cell_value(cell.source, namespace)
            for n, fig in enumerate(shown + [value]):
                if isinstance(fig, Figure):
                    call = next(line for line in cell.source.splitlines() if set(re.findall(r"\w+", line)) & drawing)
                    where = f"{path.stem} cell {nb.cells.index(cell)} ({call.strip()[:60]})"
                    pictures.append((where + (f", figure {n}" if n else ""), fig))
    return pictures


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_notebooks_pictures_are_drawn_and_every_label_reads(path):
    before = plt.get_fignums()
    pictures = notebook_pictures(path)
    assert pictures, f"{path.name}: no picture cell found"
    assert plt.get_fignums() == before                          # each figure closed: the notebook shows it once
    _assert_read([(where, fig, _tight) for where, fig in pictures])


@pytest.mark.slow
@pytest.mark.parametrize("module", puzzles.MODULES, ids=[m.NOTEBOOK for m in puzzles.MODULES])
def test_the_pictures_after_a_passing_check_are_drawn_and_every_label_reads(module):
    solutions = importlib.import_module(f"solutions.{module.__name__.split('.')[-1]}")
    pictures = []
    for puzzle in module.PUZZLES:
        fn = getattr(solutions, puzzle.name)
        outcome = puzzle.evaluate(fn, seed=0)
        assert outcome.ok, outcome.message
        pictures += [(f"{puzzle.name} figure {n}", fig, _picture) for n, fig in enumerate(puzzle.picture(outcome, fn))]
    assert pictures, f"no check of {module.NOTEBOOK} draws a picture"
    _assert_read(pictures)


def _assert_read(pictures) -> None:
    failures = []
    for where, fig, render in pictures:
        inked, unreadable, _ = _reading(fig, render)
        assert inked >= LEAST_INK, f"{where} is blank: {inked:.1%} of its pixels drawn beside its labels"
        failures += [f"{where}: {why}" for why in unreadable]
    assert not failures, "labels that do not read:\n" + "\n".join(failures)


def test_a_label_chosen_by_luminance_reads_on_any_fill():
    fills = np.random.default_rng(0).random((2000, 3))
    best = [contrast(fill, (0, 0, 0) if text_colour(fill) == "black" else (1, 1, 1)) for fill in fills]
    assert min(best) >= 4.5                                     # WCAG's least for normal text
    assert text_colour("#F7FBFF") == "black" and text_colour("#08306B") == "white"    # Blues' two ends
    assert text_colour("#08306B", alpha=0.1) == "black"        # a faint fill is seen as the white behind it


def test_a_label_on_a_fill_of_about_its_colour_is_found_and_a_blank_picture_too():
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(3, 1.5))
    ax.add_patch(Rectangle((0, 0), 1, 1, facecolor="#F7FBFF"))
    ax.add_patch(Rectangle((1, 0), 1, 1, facecolor="#08306B"))
    ax.text(0.5, 0.5, "faint", color="white", ha="center")
    ax.text(1.5, 0.6, "boxed", color="black", ha="center", bbox=dict(facecolor="white"))   # reads on its own box
    ax.text(1.5, 0.2, "dark", color="black", ha="center")
    ax.set(xlim=(0, 2), ylim=(0, 1))
    ax.axis("off")
    empty, nothing = plt.subplots(figsize=(3, 1.5))
    nothing.axis("off")
    empty.suptitle("a title over nothing")
    for render in (_tight, _picture):
        inked, unreadable, labels = _reading(fig, render)
        assert labels == 3 and inked >= LEAST_INK
        assert [why.split()[0] for why in unreadable] == ["'faint'", "'dark'"], unreadable
        assert _reading(empty, render)[0] < LEAST_INK


def test_a_peak_labelled_in_its_lines_colour_reads_whatever_the_colour():
    from lib.viz.plots import memory_over_time_figure

    class Run:
        def __init__(self, peak: int) -> None:
            self.stats = [type("Stats", (), {"peak_memory": peak, "memory": [(0.0, 0), (1.0, peak), (2.0, 0)]})]
    runs = {f"run {i}": Run((i + 1) << 20) for i in range(10)}     # matplotlib's ten colours, orange and olive too
    inked, unreadable, labels = _reading(memory_over_time_figure(runs), _picture)
    assert not unreadable and labels > 20
