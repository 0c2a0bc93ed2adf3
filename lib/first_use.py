"""Torch imports some of its own modules on first use, a second or more of CPU each: torch._dynamo when the first
optimizer is built (torch.optim's constructors are wrapped to keep torch.compile out) and sympy with the first
backward given an explicit gradient. A puzzle module whose checks meet them imports them ahead, with the notebook's
setup cell, so that a learner's first check takes as long as the next one.
"""

from __future__ import annotations

import importlib

MODULES = {"optimizer": "torch._dynamo",
           "explicit_gradient": "torch.fx.experimental.symbolic_shapes"}


def import_ahead(*uses: str) -> None:
    """Import now what torch would import on the first of these `uses` (keys of MODULES)."""
    for use in uses:
        importlib.import_module(MODULES[use])
