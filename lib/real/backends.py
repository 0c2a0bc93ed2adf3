"""Where a real rank's objects live: moving a case's objects to the rank's device, the device type of a
process group's meshes, and whether NCCL can run the ranks asked for on this machine.

One home for these rules, so that every oracle, wrapper and case builder of every notebook gets them
from the same place: a tensor a rank is handed follows `lib.device()`, a mesh follows the group's backend.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from lib.device import device
from lib.group_as_world import GroupAsWorld
from lib.sim.context import current_rank
from lib.sim.mesh import mesh_shape_problem, refuse_answer_key


def to_device(obj: Any, where: Optional[torch.device] = None) -> Any:
    """`obj` with every tensor in it on `where` (the rank's device by default): tensors, modules, and
    lists, tuples, named tuples, dicts and dataclasses of them, however nested, and objects that move
    themselves (`_moved_to(where)`: lib.checker.feed.StepFeed). Other objects come back as they are. A leaf tensor
    that needs a gradient stays a leaf, so its .grad is filled on the device."""
    where = device() if where is None else torch.device(where)
    mover = getattr(type(obj), "_moved_to", None)
    if mover is not None:
        return mover(obj, where)
    if isinstance(obj, torch.nn.Module):
        return obj.to(where)
    if isinstance(obj, torch.Tensor):
        if obj.device == where or not obj.is_leaf:
            return obj.to(where)
        return obj.detach().to(where).requires_grad_(obj.requires_grad)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_device(o, where) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, where) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, where) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        moved = {f.name: to_device(getattr(obj, f.name), where) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **moved)
    return obj


def mesh_device_type(dist: Any, group: Any = None) -> str:
    """The device type of meshes over `group`: "cuda" when it runs on NCCL, "cpu" on gloo (a CPU mesh on
    an NCCL group fails: "No backend type associated with device type cpu")."""
    return "cuda" if "nccl" in str(dist.get_backend(group)).lower() else "cpu"


def device_mesh(dist: Any, shape: Optional[tuple[int, ...]] = None, names: Optional[tuple[str, ...]] = None):
    """torch's DeviceMesh over every rank of the default group (one dimension unless `shape` says otherwise; over
    the group's ranks where `dist` is a group seen as the world, lib.group_as_world),
    on the device type of the group's backend; on a simulated rank, lib.sim.mesh's mesh with the same methods,
    so that one function asks a mesh for its groups in both worlds."""
    refuse_answer_key("device_mesh (torch's DeviceMesh)")
    shape = (dist.get_world_size(),) if shape is None else tuple(shape)
    names = None if names is None else tuple(names)
    if current_rank() is not None:
        from lib.sim.mesh import SimDeviceMesh

        return SimDeviceMesh(dist, shape, names, "cpu")     # its ranks stand for NCCL, but their tensors are the CPU's
    from torch.distributed.device_mesh import init_device_mesh

    problem = mesh_shape_problem(shape, names, dist.get_world_size(), dist.get_rank())
    if problem:                         # torch's own words would be a reshape's ("shape '[3, 2]' is invalid ...")
        raise ValueError(problem)
    if isinstance(dist, GroupAsWorld):       # a mesh over the group's ranks
        return dist.device_mesh(shape, names, mesh_device_type(dist))
    return init_device_mesh(mesh_device_type(dist), shape, mesh_dim_names=names)


def visible_gpus() -> int:
    """GPUs this process may use. Asks NVML, which leaves CUDA uninitialised: forking afterwards stays safe."""
    return torch.cuda.device_count() if torch.backends.cuda.is_built() else 0


def gpus_in_words(n: int) -> str:
    """'no GPU', '1 GPU', '8 GPUs'."""
    return "no GPU" if n == 0 else "1 GPU" if n == 1 else f"{n} GPUs"


def nccl_shortfall(world_size: int, gpus: int) -> Optional[str]:
    """Why NCCL cannot run `world_size` ranks on a machine with `gpus` GPUs; None when it can.

    NCCL needs a GPU of its own per rank: two ranks on one GPU fail ("Duplicate GPU detected")."""
    if gpus >= world_size:
        return None
    if gpus == 0:
        return "this machine has no GPU that torch can use (torch.cuda.device_count() is 0), and NCCL runs only on GPUs"
    return (f"this machine has {gpus_in_words(gpus)}, and NCCL needs one GPU per rank (two ranks on one GPU fail with "
            "'Duplicate GPU detected')")


def where_it_runs(world_size: int, gpus: Optional[int] = None) -> str:
    """In words, which backend `world_size` ranks get on this machine by default."""
    gpus = visible_gpus() if gpus is None else gpus
    backend = "NCCL, one GPU per rank" if gpus >= world_size else "gloo on the CPU"
    return f"on this machine ({gpus_in_words(gpus)}) world_size={world_size} runs on {backend}"
