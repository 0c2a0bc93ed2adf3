"""The course's engine: simulated ranks, real launches, checkers. Knows nothing of any puzzle."""
# ruff: noqa: E402  (the torch check comes before the modules that use torch)

from lib.real.compat import require_supported_torch

require_supported_torch()  # an older torch is refused here, with what to do, not by an AttributeError in a check

from lib import sim
from lib.device import device, host
from lib.errors import LaunchError, PuzzleError, RankFailed
from lib.real.launch import launch  # binds the function over the submodule's name: lib.launch(fn, n, ...)

__all__ = ["sim", "device", "host", "launch", "PuzzleError", "RankFailed", "LaunchError"]
