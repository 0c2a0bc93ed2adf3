"""Which torch the course runs on, and the names it teaches that an older torch lacks.

The one place that says which torch versions are supported: 2.11 (OLDEST_TORCH) through the pinned 2.13.0
(PINNED_TORCH, what ./course installs and every figure was measured on). `import lib` refuses an older torch
with what to do, instead of an AttributeError in the middle of a check.

torch 2.13 renamed `all_gather_into_tensor` and `reduce_scatter_tensor` to `all_gather_single` and
`reduce_scatter_single` (same arguments, the old names now warn). GPU images, clusters' modules and hosted
notebooks often ship an older torch (the course's GPU machine has 2.11), so importing `lib` adds the new
names to `torch.distributed` where they are missing: a learner's code runs unchanged on either. A name
torch already has is never replaced.
"""

from __future__ import annotations

import re

OLDEST_TORCH = (2, 11)   # the oldest torch with every op the course uses, the two names below supplied
PINNED_TORCH = "2.13.0"  # pyproject.toml's pin (tests/test_hosted.py keeps the two equal)


class UnsupportedTorch(ImportError):
    """torch is older than the course supports: raised by `import lib`, with what to do."""


def torch_problem(version: str) -> str | None:
    """Why the course cannot run on torch `version` ("2.10.0+cu121"), or None when it can."""
    found = re.match(r"(\d+)\.(\d+)", str(version))
    if found and tuple(map(int, found.groups())) >= OLDEST_TORCH:
        return None
    oldest = ".".join(map(str, OLDEST_TORCH))
    return (f"the course needs torch {oldest} or newer (tested on {oldest} and {PINNED_TORCH}); this Python has "
            f"torch {version}. Install the pinned one: `pip install torch=={PINNED_TORCH}` (in a notebook: "
            f"`%pip install torch=={PINNED_TORCH}`, then restart the kernel, in Colab Runtime > Restart session, "
            f"and run the notebook again from the top), or run the course from a checkout with ./course lab, "
            f"which installs it.")


def require_supported_torch() -> None:
    """Raise UnsupportedTorch when the imported torch is older than OLDEST_TORCH."""
    import torch

    problem = torch_problem(torch.__version__)
    if problem:
        raise UnsupportedTorch(problem)


# new name -> the older function with the same arguments and behaviour
NEWER_NAMES = {"all_gather_single": "all_gather_into_tensor", "reduce_scatter_single": "reduce_scatter_tensor"}


def supply_newer_names() -> list[str]:
    """Add every name of NEWER_NAMES that torch.distributed lacks; return the names added."""
    import torch.distributed as dist

    if not dist.is_available():
        return []
    added = []
    for new, old in NEWER_NAMES.items():
        if not hasattr(dist, new) and hasattr(dist, old):
            setattr(dist, new, getattr(dist, old))
            added.append(new)
    return added

