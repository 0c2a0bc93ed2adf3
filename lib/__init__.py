"""The course's engine: simulated ranks, real launches, checkers. Knows nothing of any puzzle."""

from lib import sim
from lib.device import device
from lib.errors import LaunchError, PuzzleError, RankFailed


def launch(fn, world_size, *args, **kwargs):
    """Run `fn(torch.distributed, *args)` on real processes; see lib.launch.launch."""
    from lib.launch import launch as _launch
    return _launch(fn, world_size, *args, **kwargs)


__all__ = ["sim", "device", "launch", "PuzzleError", "RankFailed", "LaunchError"]
