"""torch.distributed's calls on Python objects (all_gather_object and its kin), monitored_barrier, and what a
simulated rank's `dist` says of the rest of torch.distributed.

Objects travel pickled, as torch sends them (a byte tensor per object): what cannot be pickled fails here as it
would there, and each rank receives its own copy. Tensors inside them travel beside the pickle, as copies (the
simulator refuses to pickle a storage inside a rank: lib.guard.boundary). The bytes a call is charged are the
pickles' and the tensors' (torch also sends their sizes first; that small message is left out).
"""

from __future__ import annotations

import io
import pickle
from typing import NamedTuple

import torch
import torch.distributed as _td

from lib.sim.errors import InvalidCall
from lib.sim.ownership import tensors_within

OBJECT_CALLS = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                "monitored_barrier")

# torch.distributed names a learner may reach for, with what to use on simulated ranks instead
_INSTEAD = {
    "init_process_group": "no need: the ranks start with the process group made (the same holds under lib.launch "
                          "and torchrun's launcher in this course)",
    "destroy_process_group": "no need: the run ends the process group when the ranks return",
    "new_subgroups": "use dist.new_group, called by every rank for every group, in the same order",
    "new_subgroups_by_enumeration": "use dist.new_group, called by every rank for every group, in the same order",
    "all_reduce_coalesced": "use one dist.all_reduce per tensor, or one all_reduce of a flat buffer (torch.cat)",
    "all_gather_coalesced": "use one dist.all_gather per tensor, or dist.all_gather_into_tensor of a flat buffer",
    "send_object_list": "use dist.send of a tensor, or dist.broadcast_object_list",
    "recv_object_list": "use dist.recv into a tensor, or dist.broadcast_object_list",
    "init_device_mesh": "use lib.real.backends.device_mesh(dist, shape, names), which builds a mesh in both worlds",
    "DeviceMesh": "use lib.real.backends.device_mesh(dist, shape, names), which builds a mesh in both worlds",
    "get_node_local_rank": "use int(os.environ['LOCAL_RANK']), which each simulated rank has as torchrun sets it",
    "ProcessGroup": "use the group dist.new_group returns (dist.group.WORLD for every rank)",
}


class Packed(NamedTuple):
    """One object as it travels: its pickle, and copies of the tensors in it."""

    blob: bytes
    tensors: list

    @property
    def nbytes(self) -> int:
        return len(self.blob) + sum(t.nbytes for t in self.tensors)


class _Pickler(pickle.Pickler):
    def __init__(self, file, tensors: list) -> None:
        super().__init__(file)
        self.tensors = tensors

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            with torch._C._DisableTorchDispatch():
                self.tensors.append(obj.detach().clone())
            return len(self.tensors) - 1
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, packed: Packed) -> None:
        super().__init__(io.BytesIO(packed.blob))
        self.tensors = packed.tensors

    def persistent_load(self, pid):
        with torch._C._DisableTorchDispatch():
            return self.tensors[pid].clone()


def _pickled(obj, rank: int, what: str) -> Packed:
    try:
        buffer, tensors = io.BytesIO(), []
        _Pickler(buffer, tensors).dump(obj)
        return Packed(buffer.getvalue(), tensors)
    except Exception as e:
        raise InvalidCall(f"rank {rank} called {what} with an object that cannot be pickled ({type(e).__name__}: "
                          f"{e}). torch.distributed pickles every object it sends, so it fails there too.\nHint: "
                          "send plain data (numbers, strings, lists, dicts, tensors), not functions or open "
                          "files.") from None


def _objects_list(value, rank: int, what: str, arg: str, size: int) -> list:
    if not isinstance(value, list) or len(value) != size:
        got = f"a list of {len(value)}" if isinstance(value, list) else type(value).__name__
        raise InvalidCall(f"rank {rank} called {what} with {arg} of {got}: it needs a list of {size} (one slot per "
                          "rank of the group), which the call fills in place.")
    return value


class ObjectCollectives:
    """The calls on Python objects, over RankComm's collectives (attached to RankComm by lib.sim.dist)."""

    def _receive_objects(self, rank: int, packed: Packed):
        """Unpickle on rank `rank`: the tensors in the objects become that rank's memory."""
        obj = _Unpickler(packed).load()
        tracker = self._rt.ranks[rank].tracker
        for t in tensors_within(obj):
            tracker.adopt(t)
        return obj

    def _object_call(self, name: str, what: str, g, payload, finish, root=None):
        nbytes = sum(p.nbytes for p in payload[1]) if isinstance(payload[1], list) else payload[1].nbytes
        return self._collective(name, g, text=f"{what}()", signature=(root,), payload=payload,
                                nbytes=nbytes * (g.size() if name in ("all_gather", "gather") else 1),
                                finish=finish, async_op=False, root=root)

    def all_gather_object(self, object_list, obj, group=None):
        g = self._comm.resolve(self._rank, group, "all_gather_object")
        out = _objects_list(object_list, self._rank, "all_gather_object", "object_list", g.size())
        blob = _pickled(obj, self._rank, "all_gather_object")

        def finish(payloads):
            blobs = [payloads[r][1] for r in g.ranks]
            return {r: self._fill(r, payloads[r][0], blobs) for r in payloads}
        return self._object_call("all_gather", "all_gather_object", g, (out, blob), finish)

    def gather_object(self, obj, object_gather_list=None, dst=None, group=None, group_dst=None):
        g = self._comm.resolve(self._rank, group, "gather_object")
        root = self._root(g, dst, group_dst, "dst", "gather_object")
        out = None
        if self._rank == root:
            out = _objects_list(object_gather_list, self._rank, "gather_object", "object_gather_list", g.size())
        blob = _pickled(obj, self._rank, "gather_object")

        def finish(payloads):
            return {root: self._fill(root, payloads[root][0], [payloads[r][1] for r in g.ranks])}
        return self._object_call("gather", "gather_object", g, (out, blob), finish, root)

    def broadcast_object_list(self, object_list, src=None, group=None, device=None, group_src=None):
        g = self._comm.resolve(self._rank, group, "broadcast_object_list")
        root = self._root(g, src, group_src, "src", "broadcast_object_list")
        if not isinstance(object_list, list):
            raise InvalidCall(f"rank {self._rank} called broadcast_object_list with {type(object_list).__name__}: "
                              "it takes a list, the same length on every rank, which the call fills in place.")
        blobs = [_pickled(o, self._rank, "broadcast_object_list") for o in object_list] if self._rank == root else []

        def finish(payloads):
            sent = payloads[root][1]
            return {r: self._fill(r, payloads[r][0], sent) for r in payloads if r != root}
        return self._object_call("broadcast", "broadcast_object_list", g, (object_list, blobs), finish, root)

    def scatter_object_list(self, scatter_object_output_list, scatter_object_input_list=None, src=None, group=None,
                            group_src=None):
        g = self._comm.resolve(self._rank, group, "scatter_object_list")
        root = self._root(g, src, group_src, "src", "scatter_object_list")
        out = scatter_object_output_list
        if not isinstance(out, list) or len(out) < 1:
            raise InvalidCall(f"rank {self._rank} called scatter_object_list with scatter_object_output_list="
                              f"{out!r}: it takes a list of at least one slot, whose first the call fills.")
        blobs = []
        if self._rank == root:
            ins = _objects_list(scatter_object_input_list, self._rank, "scatter_object_list",
                                "scatter_object_input_list", g.size())
            blobs = [_pickled(o, self._rank, "scatter_object_list") for o in ins]

        def finish(payloads):
            sent = payloads[root][1]
            return {r: self._fill(r, payloads[r][0], [sent[i]], keep_rest=True) for i, r in enumerate(g.ranks)}
        return self._object_call("scatter", "scatter_object_list", g, (out, blobs), finish, root)

    def _fill(self, rank: int, slots: list, blobs: list, keep_rest: bool = False):
        def deliver() -> None:
            objs = [self._receive_objects(rank, b) for b in blobs]
            if keep_rest:
                slots[:len(objs)] = objs
            else:
                slots[:] = objs
        return deliver

    def monitored_barrier(self, group=None, timeout=None, wait_all_ranks: bool = False):
        """A barrier. (On real ranks it is gloo's alone: NCCL process groups refuse it.)"""
        return self.barrier(group)


def refuse_unknown(name: str):
    """What a simulated rank's `dist.<name>` says where the simulator has no such name."""
    if name.startswith("__"):
        raise AttributeError(name)
    instead = _INSTEAD.get(name)
    if instead is not None:
        raise AttributeError(f"dist.{name} is not available on simulated ranks: {instead}.")
    if hasattr(_td, name):
        raise AttributeError(f"dist.{name} is part of torch.distributed, but not of what the simulated ranks offer "
                             "(the calls the course teaches: see `dir(dist)`).")
    raise AttributeError(f"torch.distributed has no attribute {name!r}: see `dir(dist)` for the calls a rank may "
                         "use.")
