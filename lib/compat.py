"""Names the course teaches that an older torch lacks, supplied from their older equivalents.

torch 2.13 renamed `all_gather_into_tensor` and `reduce_scatter_tensor` to `all_gather_single` and
`reduce_scatter_single` (same arguments, the old names now warn). GPU images, clusters' modules and hosted
notebooks often ship an older torch (the course's GPU machine has 2.11), so importing `lib` adds the new
names to `torch.distributed` where they are missing: a learner's code runs unchanged on either. A name
torch already has is never replaced.
"""

from __future__ import annotations

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

