"""A process group seen as the whole world: the `dist` a piece written for the world group (a ring over every rank,
a pipeline over ranks 0..p-1) needs in order to run along one axis of a mesh, unchanged.

Ranks are the group's (0..len(ranks)-1); point-to-point peers are translated to global ranks and every collective
runs on the group. The same wrapper serves a simulated rank's dist and torch.distributed itself.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence


class GroupAsWorld:
    """`dist` restricted to `group`, whose members are the global `ranks`, in the group's order."""

    def __init__(self, dist: Any, group: Any, ranks: Sequence[int],
                 siblings: Sequence[Sequence[int]] = ()) -> None:
        """`siblings`: every group of the same kind (each a tuple of global ranks, this one among them, the same list
        on every rank), so that new_group can create each sibling's subgroup on every rank, as torch requires."""
        self._dist, self.group, self.ranks = dist, group, tuple(ranks)
        self.siblings = tuple(tuple(s) for s in siblings) or (self.ranks,)
        self.ReduceOp = dist.ReduceOp
        self._meshes: dict = {}        # a real process's meshes over this group, by (shape, names, device type)

    def new_group(self, ranks: Optional[Sequence[int]] = None, **kwargs) -> Any:
        """A subgroup of this group's ranks (0..len-1, this group's numbering): every rank calls new_group for the
        same subgroup of every sibling group, members or not, in the same order; this rank keeps its own."""
        local = range(len(self.ranks)) if ranks is None else ranks
        mine = None
        for sibling in self.siblings:
            made = self._dist.new_group([sibling[r] for r in local], **kwargs)
            if sibling == self.ranks:
                mine = made
        return mine

    def device_mesh(self, shape: tuple[int, ...], names: Optional[tuple[str, ...]], device_type: str) -> Any:
        """torch's DeviceMesh over this group's ranks laid out as `shape` (a real process's; lib.real.backends'
        device_mesh asks for it). DeviceMesh makes its groups with new_group, which every rank must call alike, so
        every rank builds each sibling group's mesh, in the same order, and keeps its own: once per shape, since a
        training step asks for it again."""
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        key = (shape, names, device_type)
        if key not in self._meshes:
            made = [DeviceMesh(device_type, torch.tensor(s).reshape(shape), mesh_dim_names=names)
                    for s in self.siblings]
            self._meshes[key] = made[self.siblings.index(self.ranks)]
        return self._meshes[key]

    def get_backend(self, group: Any = None) -> Any:
        return self._dist.get_backend(self._group(group))

    def __getattr__(self, name: str) -> Any:
        """A name this wrapper does not carry: the whole world's dist's own refusal where it has none, else a
        refusal in the learner's terms (its rank numbers are the world's, not this group's)."""
        if name.startswith("_"):
            raise AttributeError(name)
        if name in ("is_available", "is_initialized"):  # the world's answer is the group's
            return getattr(self._dist, name)
        getattr(self._dist, name)                        # the world's dist lacks it too: its refusal says so
        raise AttributeError(
            f"dist.{name} is not offered by the dist of a group seen as the world (ranks {list(self.ranks)} as 0.."
            f"{len(self.ranks) - 1}): it has get_rank, get_world_size, new_group, point-to-point calls and the tensor "
            "collectives, with ranks in the group's numbering.")

    def __repr__(self) -> str:
        return f"<dist over ranks {list(self.ranks)}>"

    def get_rank(self, group: Any = None) -> int:
        if group is None or group is self.group:
            return self.ranks.index(self._dist.get_rank())
        return self._dist.get_rank(group)              # a subgroup made by new_group: the rank inside it

    def get_world_size(self, group: Any = None) -> int:
        return len(self.ranks) if group is None or group is self.group else self._dist.get_world_size(group)

    def _group(self, group: Any) -> Any:
        return self.group if group is None else group

    # point to point: peers are this group's ranks
    def send(self, tensor, dst: int, group: Any = None, tag: int = 0):
        return self._dist.send(tensor, self.ranks[dst], tag=tag)

    def recv(self, tensor, src: int, group: Any = None, tag: int = 0):
        return self._dist.recv(tensor, self.ranks[src], tag=tag)

    def isend(self, tensor, dst: int, group: Any = None, tag: int = 0):
        return self._dist.isend(tensor, self.ranks[dst], tag=tag)

    def irecv(self, tensor, src: int, group: Any = None, tag: int = 0):
        return self._dist.irecv(tensor, self.ranks[src], tag=tag)

    def P2POp(self, op, tensor, peer: int, group: Any = None, tag: int = 0):
        real = {self.isend: self._dist.isend, self.irecv: self._dist.irecv}.get(op, op)
        return self._dist.P2POp(real, tensor, self.ranks[peer], tag=tag)

    def batch_isend_irecv(self, ops):
        return self._dist.batch_isend_irecv(ops)

    # collectives: on the group
    def barrier(self, group: Any = None, **kwargs):
        return self._dist.barrier(group=self._group(group), **kwargs)

    def broadcast(self, tensor, src: int, group: Any = None, async_op: bool = False):
        return self._dist.broadcast(tensor, self.ranks[src], group=self._group(group), async_op=async_op)

    def reduce(self, tensor, dst: int, op: Any = None, group: Any = None, async_op: bool = False):
        op = self.ReduceOp.SUM if op is None else op
        return self._dist.reduce(tensor, self.ranks[dst], op=op, group=self._group(group), async_op=async_op)

    def all_reduce(self, tensor, op: Any = None, group: Any = None, async_op: bool = False):
        op = self.ReduceOp.SUM if op is None else op
        return self._dist.all_reduce(tensor, op=op, group=self._group(group), async_op=async_op)

    def all_gather(self, tensor_list, tensor, group: Any = None, async_op: bool = False):
        return self._dist.all_gather(tensor_list, tensor, group=self._group(group), async_op=async_op)

    def reduce_scatter(self, output, input_list, op: Any = None, group: Any = None, async_op: bool = False):
        op = self.ReduceOp.SUM if op is None else op
        return self._dist.reduce_scatter(output, input_list, op=op, group=self._group(group), async_op=async_op)

    def all_to_all(self, output_tensor_list, input_tensor_list, group: Any = None, async_op: bool = False):
        return self._dist.all_to_all(output_tensor_list, input_tensor_list, group=self._group(group),
                                     async_op=async_op)

    def gather(self, tensor, gather_list=None, dst: int = 0, group: Any = None, async_op: bool = False):
        return self._dist.gather(tensor, gather_list, dst=self.ranks[dst], group=self._group(group),
                                 async_op=async_op)

    def scatter(self, tensor, scatter_list=None, src: int = 0, group: Any = None, async_op: bool = False):
        return self._dist.scatter(tensor, scatter_list, src=self.ranks[src], group=self._group(group),
                                  async_op=async_op)

    def _collective(self, name: str, *args, group: Any = None, **kwargs):
        return getattr(self._dist, name)(*args, group=self._group(group), **kwargs)

    def all_gather_single(self, output, input, group: Any = None, async_op: bool = False):
        return self._collective(_newest(self._dist, "all_gather_single", "all_gather_into_tensor"), output, input,
                                group=group, async_op=async_op)

    def reduce_scatter_single(self, output, input, op: Any = None, group: Any = None, async_op: bool = False):
        op = self.ReduceOp.SUM if op is None else op
        return self._collective(_newest(self._dist, "reduce_scatter_single", "reduce_scatter_tensor"), output, input,
                                op=op, group=group, async_op=async_op)

    all_gather_into_tensor = all_gather_single
    reduce_scatter_tensor = reduce_scatter_single

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, group: Any = None,
                          async_op: bool = False):
        return self._collective("all_to_all_single", output, input, output_split_sizes=output_split_sizes,
                                input_split_sizes=input_split_sizes, group=group, async_op=async_op)


def _newest(dist: Any, name: str, older: str) -> str:
    """torch 2.13's name where this dist has it, else the older one (torch 2.11 on the GPU machines)."""
    return name if hasattr(dist, name) else older
