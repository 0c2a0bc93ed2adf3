"""Cheats on notebook 05's puzzles, each with the words its rejection must contain."""

import puzzles.pipeline as P
from tests.cheats.common import everywhere

CHEATS = everywhere(P)
