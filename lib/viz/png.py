"""A check's figures as a notebook shows them, for less CPU: one draw, cropped to what it inked.

IPython's inline backend renders a figure with `bbox_inches="tight"`: a pass that lays out and measures every
artist, then the draw, then a PNG through Pillow at zlib's default level. A figure drawn at fixed margins
(lib.viz.place_axes) needs no measuring: `Picture` draws it once onto a canvas wider than the figure (a title longer
than the figure still shows, as with "tight") by plain Agg, crops the canvas to its ink plus the inline backend's
padding, and writes the PNG itself at zlib's fastest level, unfiltered. The picture is the one "tight" gives,
within a pixel or two of margin; a figure that inks the canvas's edge is rendered as the inline backend would, so
nothing is cut.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np

SPILL = (2.0, 0.5)     # inches drawn beyond the figure's sides and beyond its top and bottom: a long title overhangs
PNG_LEVEL = 1          # zlib's fastest: a third of the default level's time, for a file a few tens of KiB larger


class Picture:
    """A matplotlib figure displayed as a PNG of its ink (`_repr_png_`): what `display(figure)` would show.
    Rendered under lib.viz.RENDER_RC, as a check's pictures are."""

    def __init__(self, figure) -> None:
        self.figure = figure

    def __repr__(self) -> str:
        width, height = self.figure.get_size_inches() * self.figure.dpi
        return f"<Figure size {width:g}x{height:g} with {len(self.figure.axes)} Axes>"

    def _repr_png_(self) -> bytes:
        import matplotlib

        from lib.viz import RENDER_RC
        with matplotlib.rc_context(RENDER_RC):
            pixels = ink(self.figure)
            if pixels is None:                  # ink at the canvas's edge: it may go further; measure, as "tight"
                from IPython.core.pylabtools import print_figure
                return print_figure(self.figure, "png", bbox_inches="tight")
        return encode_png(pixels)


class _Discard(io.RawIOBase):
    """A file that keeps nothing: the canvas's pixels are read from its renderer, not copied out."""

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return len(data)


def ink(figure) -> "np.ndarray | None":
    """The figure drawn (RGBA, rows top down) on a canvas SPILL inches wider, cropped to its ink plus the padding a
    tight bounding box keeps (savefig.pad_inches); None when the ink reaches the canvas's edge."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.transforms import Bbox

    (width, height), (side, end) = figure.get_size_inches(), SPILL
    before = figure.canvas                               # FigureCanvasAgg(figure) makes itself the figure's
    canvas = FigureCanvasAgg(figure)
    try:
        canvas.print_figure(_Discard(), format="rgba", dpi=figure.dpi, facecolor=figure.get_facecolor(),
                            edgecolor=figure.get_edgecolor(),
                            bbox_inches=Bbox.from_extents(-side, -end, width + side, height + end))
        pixels = np.asarray(canvas.renderer.buffer_rgba())
    finally:
        figure.set_canvas(before)
    packed = pixels.view(np.uint32)[..., 0]
    inked = packed != packed[0, 0]                        # a corner of the spill is background
    rows, cols = np.flatnonzero(inked.any(axis=1)), np.flatnonzero(inked.any(axis=0))
    if not len(rows):
        return pixels[:1, :1]
    if rows[0] == 0 or cols[0] == 0 or rows[-1] == len(inked) - 1 or cols[-1] == inked.shape[1] - 1:
        return None
    pad = round(matplotlib.rcParams["savefig.pad_inches"] * figure.dpi)
    top, bottom = max(rows[0] - pad, 0), min(rows[-1] + 1 + pad, pixels.shape[0])
    left, right = max(cols[0] - pad, 0), min(cols[-1] + 1 + pad, pixels.shape[1])
    return pixels[top:bottom, left:right]


def encode_png(pixels: np.ndarray, level: int = PNG_LEVEL) -> bytes:
    """An 8-bit RGBA image (rows top down) as PNG: every row unfiltered, deflated at `level`. Filtering rows would
    shrink the file and cost more than deflating it; a check's pictures are flat colours that deflate well."""
    height, width, _ = pixels.shape
    rows = np.zeros((height, 1 + 4 * width), np.uint8)            # each row: filter type 0 (none), its bytes
    rows[:, 1:] = pixels.reshape(height, 4 * width)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)  # 8 bits, RGBA, deflate, adaptive, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), level))
            + chunk(b"IEND", b""))
