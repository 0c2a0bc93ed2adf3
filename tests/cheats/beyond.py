"""Cheats on notebook 09's puzzles, each with the words its rejection must contain."""

import puzzles.beyond as P
from tests.cheats.common import everywhere

CHEATS = everywhere(P)
