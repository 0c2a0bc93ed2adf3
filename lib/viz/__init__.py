"""Pictures of runs: timelines, memory plots, widgets."""

# How a check's pictures are rendered when the notebook displays them (matplotlib rcParams): glyphs laid out without
# FreeType's hinting take a quarter less CPU to draw, and at a notebook's 100 dpi the text reads the same.
RENDER_RC = {"text.hinting": "no_hinting"}


def place_axes(fig, ax, *, left: float, right: float, bottom: float, top: float) -> None:
    """Put `ax` at fixed margins (inches) inside `fig`: for the figures a check draws after every success, where a
    layout engine (tight or constrained) would measure every tick label once more, a fifth of the figure's CPU.
    The margins are what the engine found for the course's figures; a notebook crops the PNG to its contents."""
    width, height = fig.get_size_inches()
    ax.set_position([left / width, bottom / height, 1 - (left + right) / width, 1 - (bottom + top) / height])
