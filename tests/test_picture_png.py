"""How a check's figures reach the notebook: drawn once, cropped to their ink, a fast PNG."""

import io

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from IPython.core.pylabtools import print_figure  # noqa: E402
from PIL import Image  # noqa: E402

import lib.checker.puzzle  # noqa: E402
from lib.sim.result import Event  # noqa: E402
from lib.viz import RENDER_RC  # noqa: E402
from lib.viz.png import Picture, encode_png  # noqa: E402
from lib.viz.timeline import draw_timeline  # noqa: E402


def _events(world_size: int = 4) -> list:
    """Each rank computes, all-reduces with everyone, sends to its right neighbour, computes again."""
    out = []
    for r in range(world_size):
        out += [Event(r, "compute", "", None, 0, 0.0, 1e-3), Event(r, "all_reduce", "world", None, 64, 1e-3, 2e-3),
                Event(r, "send", "world", (r + 1) % world_size, 64, 2e-3, 2.5e-3),
                Event(r, "recv", "world", (r - 1) % world_size, 64, 2e-3, 2.5e-3),
                Event(r, "compute", "", None, 0, 2.5e-3, 4e-3)]
    return out


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"))


def _memory_figure():
    from lib.viz.plots import memory_over_time_figure

    class Stats:
        peak_memory, memory = 3 << 20, [(0.0, 0), (1.0, 2 << 20), (2.0, 3 << 20), (3.0, 1 << 20)]

    class Result:
        stats = [Stats()]
    return memory_over_time_figure({"zero3_train, rank 0": Result()}, title="zero3_train, N=4")


def test_png_round_trips_every_pixel():
    pixels = np.random.default_rng(0).integers(0, 256, (7, 5, 4), dtype=np.uint8)
    assert (_pixels(encode_png(pixels)) == pixels).all()


@pytest.mark.parametrize("figure", [lambda: draw_timeline(_events(), 4, title="a title\nof two lines"),
                                    _memory_figure], ids=["timeline", "memory"])
def test_a_picture_is_the_png_a_notebook_shows_cropped_alike(figure):
    fig = figure()
    with matplotlib.rc_context(RENDER_RC):
        tight = _pixels(print_figure(fig, "png", bbox_inches="tight"))
    size, canvas = fig.get_size_inches().copy(), fig.canvas
    ours = _pixels(Picture(fig)._repr_png_())
    assert abs(ours.shape[0] - tight.shape[0]) <= 8 and abs(ours.shape[1] - tight.shape[1]) <= 8
    assert (ours[0] == 255).all() and (ours[:, -1] == 255).all()           # the padding a tight box keeps
    assert (fig.get_size_inches() == size).all() and fig.canvas is canvas   # the figure is left as it was
    assert "Figure size" in repr(Picture(fig))


def test_a_title_wider_than_the_spill_is_rendered_whole_as_tight_renders_it():
    fig = draw_timeline(_events(), 4, title="a title far longer than the figure is wide " * 6)
    with matplotlib.rc_context(RENDER_RC):
        tight = _pixels(print_figure(fig, "png", bbox_inches="tight"))
    assert _pixels(Picture(fig)._repr_png_()).shape == tight.shape


def test_the_timeline_is_one_collection_with_a_rectangle_per_event_in_its_kinds_colour():
    events = _events()
    asked = []
    fig = draw_timeline(events, 4, kind_of=lambda e: asked.append(e) or ("DP" if e.op == "all_reduce" else "PP"))
    (bars,) = fig.axes[0].collections
    assert len(bars.get_paths()) == len(events)
    legend = {t.get_text(): matplotlib.colors.to_hex(h.get_facecolor())
              for t, h in zip(fig.axes[0].get_legend().get_texts(), fig.axes[0].get_legend().legend_handles)}
    assert set(legend) == {"DP", "PP", "compute"}
    colours = {matplotlib.colors.to_hex(c) for c in bars.get_facecolors()}
    assert colours == set(legend.values())
    assert len(asked) == len({(e.rank, e.op, e.group, e.peer) for e in events if e.lane == "comm"})


def test_a_passing_check_in_a_notebook_displays_pictures(monkeypatch):
    import IPython.display

    import puzzles
    from solutions.data_parallel import ring_all_reduce

    shown = []
    monkeypatch.setattr(lib.checker.puzzle, "_in_notebook", lambda: True)
    monkeypatch.setattr(IPython.display, "display", shown.append)
    puzzle = next(p for p in puzzles.ALL if p.name == "ring_all_reduce")
    assert puzzle.check(ring_all_reduce, seed=0)
    assert shown and all(isinstance(p, Picture) for p in shown)
    assert shown[0]._repr_png_().startswith(b"\x89PNG")
