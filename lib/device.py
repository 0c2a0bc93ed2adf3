"""The device a rank should put its tensors on, in either world."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

# (device, host) pairs that lib.device() and lib.host() answer on a real rank instead (see stand_in)
_STAND_INS: list[tuple[torch.device, torch.device]] = []


def device() -> torch.device:
    """CPU in simulation and on gloo; the rank's own GPU when the process group runs on NCCL.

    In simulation it is `cpu:0`, so that `.to(lib.device())` really copies a tensor back from
    host memory (`lib.host()`, `cpu:1`) instead of being skipped as a move from CPU to CPU."""
    from lib.sim.context import current_rank

    if current_rank() is not None:
        return torch.device("cpu", 0)
    if _STAND_INS:
        return _STAND_INS[-1][0]
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
    return torch.device("cpu")


def host() -> torch.device:
    """Host (CPU) memory, for offloading. In simulation it is `cpu:1`, which the simulator counts
    as host memory; on real ranks it is the CPU, so `.to(lib.host())` really leaves the GPU."""
    from lib.sim.context import current_rank

    if current_rank() is not None:
        return torch.device("cpu", 1)
    return _STAND_INS[-1][1] if _STAND_INS else torch.device("cpu")


@contextlib.contextmanager
def stand_in(device_: torch.device, host_: torch.device) -> Iterator[None]:
    """On a real rank, make device() and host() answer `device_` and `host_` for a while: lib.real.left_on_cpu
    answers cpu:0 and cpu:1 to tell, without a GPU, which tensors a GPU run would put on the GPU."""
    _STAND_INS.append((torch.device(device_), torch.device(host_)))
    try:
        yield
    finally:
        _STAND_INS.pop()
