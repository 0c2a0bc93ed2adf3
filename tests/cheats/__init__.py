"""Catalogues of cheats, one module per notebook: right numbers without the lesson's algorithm, or work hidden
from the simulator. Each must be rejected by a message naming what it did (see tests/test_content.py)."""
