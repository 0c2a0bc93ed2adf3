"""Pictures of runs: timelines, memory plots, widgets."""

# How a check's pictures are rendered when the notebook displays them (matplotlib rcParams): glyphs laid out without
# FreeType's hinting take a quarter less CPU to draw, and at a notebook's 100 dpi the text reads the same.
RENDER_RC = {"text.hinting": "no_hinting"}
