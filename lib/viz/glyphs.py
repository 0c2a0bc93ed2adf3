"""Agg drawing text from a cache of rendered glyphs: the same pixels, without asking FreeType again.

Matplotlib's Agg renderer asks FreeType for every glyph of every text it draws, through a few Python calls per
glyph; a check's figure has 300 to 700 glyphs (a three-line title, the lane labels, ticks, a legend), about a third
of its drawing time. A glyph's bitmap depends only on its font, size, dpi, transform, hinting flags and the fraction
of a pixel where it starts, so `GlyphCanvas` keeps each bitmap and moves it to the glyph's whole-pixel position:
the same check drawn again, or another whose labels repeat, asks FreeType only for what it has not drawn before.

This replaces one private method of matplotlib's Agg renderer (matplotlib 3.11's text path); `GlyphCanvas` is
plain Agg where matplotlib draws text otherwise (tests/test_pictures.py compares the two pixel for pixel).
"""

from __future__ import annotations

import math

from matplotlib.backends import backend_agg
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.ft2font import FT2Font, RenderMode

SUPPORTED = all(hasattr(FT2Font, name) for name in ("_render_glyph", "_set_transform", "set_size")) and \
    hasattr(RendererAgg, "_draw_text_glyphs_and_boxes") and hasattr(backend_agg, "get_hinting_flag")
LIMIT = 50_000                     # bitmaps kept (a few MiB at most); the cache starts over past it
_bitmaps: dict[tuple, tuple] = {}  # (font, size, dpi, glyph, angle, slant, extend, flags, x/64, y/64 fraction): bitmap


def _transform(angle: float, slant: float, extend: float) -> list[list[int]]:
    """FreeType's 16.16 matrix for a glyph rotated by `angle`, slanted and extended: as matplotlib computes it."""
    import numpy as np

    cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
    return (0x10000 * np.array([[cos, -sin], [sin, cos]]) @ [[extend, extend * slant], [0, 1]]).round().astype(int)


class GlyphRenderer(RendererAgg):
    """RendererAgg whose plain text draws glyph bitmaps from the cache (mathtext and aliased text: as Agg does)."""

    def _draw_text_glyphs_and_boxes(self, gc, x, y, angle, glyphs, boxes):
        if boxes or not gc.get_antialiased():
            return super()._draw_text_glyphs_and_boxes(gc, x, y, angle, glyphs, boxes)
        cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        flags, height, dpi = backend_agg.get_hinting_flag(), self.height, self.dpi
        draw = self._renderer.draw_text_image
        if len(_bitmaps) > LIMIT:
            _bitmaps.clear()
        for font, size, glyph, slant, extend, dx, dy in glyphs:     # dy is upwards, as FreeType's y
            at_x, at_y = round(0x40 * (x + dx * cos - dy * sin)), round(0x40 * (height - y + dx * sin + dy * cos))
            key = (font, size, dpi, glyph, angle, slant, extend, flags, at_x & 63, at_y & 63)
            bitmap = _bitmaps.get(key)
            if bitmap is None:
                font.set_size(size, dpi)
                font._set_transform(_transform(angle, slant, extend), [at_x & 63, at_y & 63])
                rendered = font._render_glyph(glyph, flags, RenderMode.NORMAL)
                bitmap = _bitmaps[key] = (rendered.buffer, rendered.left, rendered.top)
            buffer, left, top = bitmap
            draw(buffer, left + (at_x >> 6), int(height) - (top + (at_y >> 6)) + buffer.shape[0], 0, gc)


class GlyphCanvas(FigureCanvasAgg):
    """An Agg canvas drawing with GlyphRenderer where this matplotlib has the text path it replaces."""

    def get_renderer(self):
        if not SUPPORTED:
            return super().get_renderer()
        w, h = self.get_width_height(physical=True)
        if getattr(self, "_glyph_key", None) != (w, h, self.figure.dpi):
            self.renderer, self._glyph_key = GlyphRenderer(w, h, self.figure.dpi), (w, h, self.figure.dpi)
        return self.renderer
