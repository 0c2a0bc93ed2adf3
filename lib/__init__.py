"""The course's engine: simulated ranks, real launches, checkers. Knows nothing of any puzzle."""

from lib import sim
from lib.compat import supply_newer_names
from lib.device import device, host
from lib.errors import LaunchError, PuzzleError, RankFailed
from lib.launch import launch  # binds the function over the submodule's name: lib.launch(fn, n, ...)

supply_newer_names()  # torch.distributed names an older torch lacks, from their older equivalents

__all__ = ["sim", "device", "host", "launch", "PuzzleError", "RankFailed", "LaunchError"]
