"""Labels that read on the colour behind them: black or white text chosen by the fill's luminance, and a line's
colour darkened where a label in it names the line on the figure's white.

A fill's luminance, not its place on a colour scale, decides which of black and white reads on it: WCAG 2.2 defines
relative luminance and the contrast ratio of two colours (https://www.w3.org/TR/WCAG22/#dfn-relative-luminance and
#dfn-contrast-ratio, sRGB's transfer function with its 0.04045 knee). Whichever of black and white contrasts more with
a fill reaches at least 4.58:1 on any fill, above WCAG's 4.5:1 for normal text (success criterion 1.4.3).
"""

from __future__ import annotations

import numpy as np

FIGURE_BACKGROUND = (1.0, 1.0, 1.0)     # what a translucent fill is seen against: the course's figures are white
NORMAL_TEXT = 4.5                        # WCAG 2.2's least contrast for text smaller than 18 pt (criterion 1.4.3)


def luminance(rgb) -> "np.ndarray":
    """WCAG's relative luminance (0 black, 1 white) of sRGB colours in [0, 1], shape (..., 3)."""
    c = np.asarray(rgb, dtype=float)[..., :3]
    linear = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return linear @ [0.2126, 0.7152, 0.0722]


def contrast(a, b) -> "np.ndarray":
    """WCAG's contrast ratio of two sets of sRGB colours, from 1 (the same) to 21 (black on white)."""
    la, lb = luminance(a), luminance(b)
    return (np.maximum(la, lb) + 0.05) / (np.minimum(la, lb) + 0.05)


def seen(colour, alpha: float | None = None) -> tuple:
    """The opaque RGB a matplotlib colour shows on the figure's white, translucent fills blended over it."""
    from matplotlib.colors import to_rgba

    r, g, b, a = to_rgba(colour, alpha)
    return tuple(a * np.array([r, g, b]) + (1 - a) * np.array(FIGURE_BACKGROUND))


def text_colour(fill, alpha: float | None = None) -> str:
    """The text colour, black or white, that contrasts more with `fill` (any matplotlib colour; `alpha` a patch's)."""
    behind = seen(fill, alpha)
    return "black" if contrast(behind, (0, 0, 0)) >= contrast(behind, (1, 1, 1)) else "white"


def darkened(colour, least: float = NORMAL_TEXT) -> tuple:
    """`colour` (a line's, say) mixed with black until text in it reaches `least` contrast on the figure's white:
    the same hue, so a label still says which line it names."""
    rgb = np.asarray(seen(colour))
    for black in np.linspace(0.0, 1.0, 41):
        if contrast(rgb * (1 - black), FIGURE_BACKGROUND) >= least:
            break
    return tuple(rgb * (1 - black))
