"""The course's engine: simulated ranks, real launches, checkers. Knows nothing of any puzzle."""

from lib import sim
from lib.device import device, host
from lib.errors import LaunchError, PuzzleError, RankFailed
from lib.launch import launch  # binds the function over the submodule's name: lib.launch(fn, n, ...)

__all__ = ["sim", "device", "host", "launch", "PuzzleError", "RankFailed", "LaunchError"]
