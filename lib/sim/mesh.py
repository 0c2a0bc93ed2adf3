"""torch's DeviceMesh for simulated ranks: the same names and methods, its groups made with `dist.new_group`.

    # torch's mesh on real ranks, this in simulation
    mesh = lib.real.backends.device_mesh(dist, (2, 2, 2), ("dp", "pp", "tp"))
    mesh["tp"].get_group(), mesh.get_group("dp"), mesh.get_local_rank("pp"), mesh["pp"].size(), mesh.mesh

As `init_device_mesh` does, every rank creates every group of every dimension, dimension by dimension (outermost
first) and, within one, in the order of the other dimensions' coordinates; a dimension that spans the whole world
uses the default group. Slicing a mesh creates no group: a sub-mesh shares its parent's.

For a puzzle whose statement is this arithmetic (a rank's coordinates, the groups), it is the answer key: within
`answer_key_refused(why)`, on that thread, these functions and device meshes raise OutOfView saying why, as
lib.checker.puzzle does for a Case built there and lib.planner for its search.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Iterator, Optional, Sequence, Union

import torch

from lib.whose_code import COURSE
from lib.sim.context import current_rank, fail_run
from lib.sim.errors import InvalidCall, OutOfView
from lib.sim.ownership import learner_line

Dim = Union[int, str, None]
_refusal = threading.local()          # .why: what the function running on this thread must do itself


def answer_key_refused(why: str) -> contextlib.AbstractContextManager:
    """Within the block, on this thread, coordinates, mesh_groups and device meshes raise OutOfView with `why`. The
    check's and the puzzles' to set: a simulated rank's own code may not set it (nor so lift it)."""
    rank = current_rank()
    if rank is not None and not sys._getframe(1).f_code.co_filename.startswith(COURSE):
        fail_run(OutOfView(f"rank {rank} called lib.sim.mesh.answer_key_refused{learner_line()}: what a puzzle "
                           "refuses is its check's to say, not the rank's to lift.\nHint: compute the coordinates "
                           "and groups yourself, from dist.get_rank() and the mesh's shape."))
    return _refusing(why)


@contextlib.contextmanager
def _refusing(why: str) -> Iterator[None]:
    before = getattr(_refusal, "why", None)
    _refusal.why = why
    try:
        yield
    finally:
        _refusal.why = before


def refuse_answer_key(name: str) -> None:
    """OutOfView when `name` (this module's arithmetic, or a device mesh made of it) is the running puzzle's answer."""
    why = getattr(_refusal, "why", None)
    if why:
        raise OutOfView(f"{name} does this puzzle's work for you: {why}.")


def mesh_groups(shape: Sequence[int], dim: int) -> list[list[int]]:
    """Every group along dimension `dim` of a mesh of `shape` over ranks 0..N-1 laid out row-major (the last
    dimension innermost), in the order torch creates them: by the other dimensions' coordinates, row-major."""
    refuse_answer_key("lib.sim.mesh.mesh_groups")
    ranks = torch.arange(_product(shape)).reshape(tuple(shape))                         # rank ids laid out on the mesh
    return ranks.movedim(dim, -1).reshape(-1, shape[dim]).tolist()                      # one row per group along `dim`


def coordinates(rank: int, shape: Sequence[int]) -> tuple[int, ...]:
    """The coordinates of `rank` on a row-major mesh of `shape` (the last dimension innermost)."""
    refuse_answer_key("lib.sim.mesh.coordinates")
    coords = []
    for size in reversed(shape):
        rank, c = divmod(rank, size)
        coords.append(c)
    return tuple(reversed(coords))


def mesh_shape_problem(shape: tuple[int, ...], names: Optional[Sequence[str]], world: int, rank: int
                       ) -> Optional[str]:
    """Why a device mesh of `shape` (dimensions `names`) cannot be laid over `world` ranks, or None: the words of
    both worlds, a simulated rank's refusal and a real process's (lib.real.backends.device_mesh)."""
    if not shape or min(shape) < 1 or _product(shape) != world:
        return (f"rank {rank} asked for a device mesh of shape {shape}: its sizes must be positive and multiply to "
                f"the world size, {world}.")
    if names is not None and (len(names) != len(shape) or len(set(names)) != len(names)):
        return f"mesh_dim_names {tuple(names)} must name each of the {len(shape)} dimensions of {shape} once."
    return None


class SimDeviceMesh:
    """A device mesh over simulated ranks; use `lib.real.backends.device_mesh(dist, shape, names)` to make one."""

    def __init__(self, dist: Any, shape: Sequence[int], names: Optional[Sequence[str]] = None,
                 device_type: str = "cpu") -> None:
        shape = tuple(int(s) for s in shape)
        world = dist.get_world_size()
        problem = mesh_shape_problem(shape, names, world, dist.get_rank())
        if problem:
            raise InvalidCall(problem)
        self._dist = dist
        self._full_shape = shape
        self._names = tuple(names) if names is not None else None
        self._dims = tuple(range(len(shape)))          # which dimensions of the full mesh this (sub-)mesh spans
        self.device_type = device_type
        me = dist.get_rank()
        self._coordinate = coordinates(me, shape)
        self._groups = [None if size == world else _my_group(dist, shape, d, me)
                        for d, size in enumerate(shape)]

    # ---- what torch's DeviceMesh offers -------------------------------------------------------
    @property
    def mesh(self) -> torch.Tensor:
        """The global ranks of this mesh, laid out in its shape (a sub-mesh: the slice holding this rank)."""
        full = torch.arange(_product(self._full_shape)).reshape(self._full_shape)       # rank ids on the full mesh
        index = tuple(slice(None) if d in self._dims else c for d, c in enumerate(self._coordinate))
        return full[index]

    @property
    def mesh_dim_names(self) -> Optional[tuple[str, ...]]:
        return None if self._names is None else tuple(self._names[d] for d in self._dims)

    @property
    def ndim(self) -> int:
        return len(self._dims)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._full_shape[d] for d in self._dims)

    def size(self, mesh_dim: Optional[int] = None) -> int:
        """Ranks in the mesh, or along dimension `mesh_dim` (an index: torch's size() takes no name)."""
        if mesh_dim is None:
            return _product(self.shape)
        if isinstance(mesh_dim, str):
            raise InvalidCall(f"mesh.size({mesh_dim!r}): torch's DeviceMesh.size takes a dimension's index, and "
                              f"raises TypeError for a name.\nHint: mesh[{mesh_dim!r}].size() is the size of the "
                              f"{mesh_dim!r} dimension in both worlds.")
        return self.shape[mesh_dim]

    def get_rank(self) -> int:
        return self._dist.get_rank()

    def get_coordinate(self) -> tuple[int, ...]:
        return tuple(self._coordinate[d] for d in self._dims)

    def get_group(self, mesh_dim: Dim = None):
        """The process group along one dimension of this mesh (by name or index; none needed when 1-D)."""
        return self._groups[self._dim(mesh_dim, "get_group")]

    def get_all_groups(self) -> list:
        return [self._groups[d] for d in self._dims]

    def get_local_rank(self, mesh_dim: Dim = None) -> int:
        """This rank's coordinate along one dimension: its rank in that dimension's group."""
        return self._coordinate[self._dim(mesh_dim, "get_local_rank")]

    def __getitem__(self, names: Union[str, tuple[str, ...]]) -> "SimDeviceMesh":
        """The sub-mesh of the named dimensions (in the mesh's order), sharing this mesh's groups."""
        names = (names,) if isinstance(names, str) else tuple(names)
        if self._names is None:
            raise InvalidCall("Cannot slice a DeviceMesh without mesh_dim_names: pass names to device_mesh.")
        valid = self.mesh_dim_names
        if not names or any(n not in valid for n in names) or len(set(names)) != len(names):
            raise InvalidCall(f"Invalid mesh_dim_names {names} specified. Valid mesh_dim_names are {list(valid)}.")
        if names == valid:
            return self
        dims = tuple(self._names.index(n) for n in names)
        if list(dims) != sorted(dims):
            raise InvalidCall(f"Invalid mesh_dim_names {names} specified. Mesh dim indices should be in ascending "
                              f"order (torch slices dimensions in the mesh's own order, {list(valid)}).")
        sub = object.__new__(SimDeviceMesh)
        sub.__dict__.update(self.__dict__)
        sub._dims = dims
        return sub

    def __repr__(self) -> str:
        names = self.mesh_dim_names or tuple(f"dim_{i}" for i in range(self.ndim))
        sizes = ", ".join(f"{n}={s}" for n, s in zip(names, self.shape))
        return f"DeviceMesh(({sizes}), {self.device_type!r}, simulated)"

    # ---- helpers ---------------------------------------------------------------------------------
    def _dim(self, mesh_dim: Dim, what: str) -> int:
        """The full mesh's dimension that `mesh_dim` (a name, an index into this mesh, or None when 1-D) names."""
        if mesh_dim is None:
            if self.ndim > 1:
                raise InvalidCall(f"mesh.{what}() on a {self.ndim}-D mesh: name the dimension, e.g. "
                                  f"mesh.{what}({(self.mesh_dim_names or ('0',))[0]!r}), or slice it first: "
                                  f"mesh[{(self.mesh_dim_names or ('name',))[0]!r}].{what}().")
            return self._dims[0]
        if isinstance(mesh_dim, str):
            if mesh_dim not in (self.mesh_dim_names or ()):
                raise InvalidCall(f"mesh.{what}({mesh_dim!r}): this mesh's dimensions are "
                                  f"{list(self.mesh_dim_names or ())}.")
            return self._dims[self.mesh_dim_names.index(mesh_dim)]
        if not isinstance(mesh_dim, int) or not 0 <= mesh_dim < self.ndim:
            raise InvalidCall(f"mesh.{what}({mesh_dim!r}): a dimension is a name or an index below {self.ndim}.")
        return self._dims[mesh_dim]


def _my_group(dist: Any, shape: tuple[int, ...], dim: int, me: int):
    """Create every group along `dim` (every rank calls new_group for each, in torch's order); keep this rank's."""
    mine = None
    for ranks in mesh_groups(shape, dim):
        group = dist.new_group(ranks)
        if me in ranks:
            mine = group
    return mine


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out
