"""The device a rank should put its tensors on, in either world."""

from __future__ import annotations

import os

import torch


def device() -> torch.device:
    """CPU in simulation and on gloo; the rank's own GPU when the process group runs on NCCL.

    In simulation it is `cpu:0`, so that `.to(lib.device())` really copies a tensor back from
    host memory (`lib.host()`, `cpu:1`) instead of being skipped as a move from CPU to CPU."""
    from lib.sim.context import current_rank

    if current_rank() is not None:
        return torch.device("cpu", 0)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
    return torch.device("cpu")


def host() -> torch.device:
    """Host (CPU) memory, for offloading. In simulation it is `cpu:1`, which the simulator counts
    as host memory; on real ranks it is the CPU, so `.to(lib.host())` really leaves the GPU."""
    from lib.sim.context import current_rank

    return torch.device("cpu", 1) if current_rank() is not None else torch.device("cpu")
