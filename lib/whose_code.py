"""Whose code a frame runs: the engine's (lib/ and torch), the problem set's (puzzles/), Python's library, or the
learner's.

Directories both as imported and resolved, each ending in a separator (torch's must not take in torchvision's): a
course installed through symlinks (as nbgrader's test installs it) runs its modules under the link's path, and a
check must not take its own engine for the learner's code.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import torch


def _both(directory: str) -> tuple[str, ...]:
    return tuple({os.path.join(os.path.abspath(directory), ""), os.path.join(str(Path(directory).resolve()), "")})


LIB = _both(str(Path(__file__).parent))
ENGINE = LIB + _both(str(Path(torch.__file__).parent))
# The course's own code, which may call what a puzzle's check keeps from the learner (its answer keys): the engine's
# and the problem set's, never a rank's own.
COURSE = LIB + _both(str(Path(__file__).parents[1] / "puzzles"))
# Code that is not the learner's: the engine, Python's own library and installed packages.
LIBRARIES = ENGINE + tuple({p for k in ("stdlib", "platstdlib", "purelib", "platlib")
                            for p in _both(sysconfig.get_paths()[k])}) + ("<frozen ",)
