"""Share nothing: which simulated rank owns each storage, and the rules real processes enforce.

Simulated ranks are threads of one process; real ranks are processes. While a run lasts:
- every storage a rank allocates (op outputs, factory calls, its copy of the arguments, what `dist`
  delivers into its buffers) is owned by that rank;
- an op of rank r that reads a storage owned by another rank broke the rule: that data could only
  have reached r through `dist`;
- an op of rank r that writes in place into a storage it does not own (another rank's, or one made
  before the run: a global, a closure, a default argument) broke the rule: in real processes the
  write lands in r's private copy and nobody else sees it;
- a torch.Generator used by two ranks broke the rule: each real process draws from its own copy.
Reading a tensor made before the run stays allowed, as it is in a forked process, except the run's own
arguments and expected results (owned by CHECK): each rank receives its own copy of its arguments, so a rank
that reads the originals is reading every rank's inputs, or the answer.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Iterator, Optional

import torch

from lib.sim.errors import SharedMemory
from lib.whose_code import COURSE, LIBRARIES

_WRITES: dict = {}

CHECK = -1          # the owner of the run's own arguments and expected results

SHARE_NOTHING = ("In real processes ranks share no memory: data reaches another rank only through dist "
                 "(send/recv, broadcast, all_reduce, ...).")


def written_args(func) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(positions, keyword names) of the arguments an op writes into, from its schema; cached per op."""
    known = _WRITES.get(func)
    if known is None:
        args = func._schema.arguments
        writes = [(i, a) for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
        known = _WRITES[func] = (tuple(i for i, a in writes if not a.kwarg_only),
                                 tuple(a.name for _, a in writes))
    return known


def tensor_inputs(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors an op was given, in order: its arguments, the tensors in its list arguments (an aten op's
    arguments nest no deeper), then its keyword arguments'. Collected once per op, for every rule that reads them."""
    found = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            for t in a:                    # a loop, not a comprehension: a comprehension is a call of its own
                if isinstance(t, torch.Tensor):
                    found.append(t)
    return found


def tensors_within(obj, seen: Optional[set] = None) -> Iterator[torch.Tensor]:
    """Every tensor reachable in `obj`: tensors (and their .grad), modules' parameters and buffers, lists,
    tuples, sets, dicts, dataclasses and objects' attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, torch.dtype, torch.device)):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
        if obj.grad is not None:
            yield obj.grad
    elif isinstance(obj, torch.nn.Module):
        yield from (t for t in [*obj.parameters(), *obj.buffers()])
        yield from (g for p in obj.parameters() if (g := p.grad) is not None)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for item in obj:
            yield from tensors_within(item, seen)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from tensors_within(item, seen)
    elif hasattr(obj, "__dict__") and not callable(obj):
        for item in vars(obj).values():
            yield from tensors_within(item, seen)


def learner_line() -> str:
    """Where in the learner's code the current op was called, as ' at file:line (`source`)', or '' (the source
    quoted: a message goes on after it with a colon, and a line like `with open(p) as f:` ends in one). Not a line of
    the problem set's, which the learner's code called (an answer key)."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(LIBRARIES + COURSE):
            source = f" (`{frame.line.strip()}`)" if frame.line else ""
            return f" at {Path(frame.filename).name}:{frame.lineno}{source}"
    return ""


class Ownership:
    """The owner of every storage the ranks of one run allocated, and of every generator they used."""

    def __init__(self) -> None:
        # storage key -> rank, written by each rank's tracker as its storages are born and die (RankTracker)
        self.owners: dict[int, int] = {}
        self._generators: dict[int, tuple[torch.Generator, int]] = {}

    def check(self, rank: int, func, args: tuple, kwargs: dict, written: Optional[tuple] = None,
              inputs: Optional[list] = None) -> Optional[SharedMemory]:
        """The rule `func` would break if rank `rank` ran it on these arguments, or None. Runs on every op
        of every rank: written for speed (`written`: the op's written_args, `inputs`: its tensors, tensor_inputs,
        when the caller has them)."""
        if inputs is None:
            inputs = tensor_inputs(args, kwargs)
        owners, tensor = self.owners, torch.Tensor
        for t in inputs:
            owner = owners.get(t.untyped_storage()._cdata)
            if owner is not None and owner != rank:
                return self.read_error(rank, owner, func)
        positions, names = written_args(func) if written is None else written
        for i in positions:
            t = args[i] if i < len(args) else None
            if isinstance(t, tensor) and owners.get(t.untyped_storage()._cdata) != rank:
                return self._write_error(rank, owners.get(t.untyped_storage()._cdata), func)
        if not kwargs:
            return None
        for name in names:
            t = kwargs.get(name)
            if isinstance(t, tensor) and owners.get(t.untyped_storage()._cdata) != rank:
                return self._write_error(rank, owners.get(t.untyped_storage()._cdata), func)
        generator = kwargs.get("generator")
        if generator is not None and generator is not torch.default_generator:
            first = self._generators.setdefault(id(generator), (generator, rank))[1]
            if first != rank:
                return SharedMemory(
                    f"rank {rank} drew random numbers from a torch.Generator that rank {first} also used "
                    f"({_name(func)}{learner_line()}). Each real process draws from its own copy of a generator, "
                    "so the ranks would get the same numbers there and different ones here.\n"
                    "Hint: make the generator inside your function (torch.Generator().manual_seed(...)), "
                    "not in a global, a closure or a notebook cell.")
        return None

    def protect(self, objects) -> None:
        """Make every tensor in `objects` (containers, modules, dataclasses, however nested) CHECK's."""
        for t in tensors_within(objects):
            self.owners[t.untyped_storage()._cdata] = CHECK

    @staticmethod
    def read_error(rank: int, owner: int, func) -> SharedMemory:
        if owner == CHECK:
            return SharedMemory(
                f"rank {rank} read a tensor of the run itself ({_name(func)}{learner_line()}): an original of the "
                "arguments the ranks were given, or the check's expected result. Each rank receives its own copy "
                "of its arguments; the originals hold every rank's inputs and are not yours to read.\n"
                "Hint: use only the arguments your function receives; get other ranks' data through dist.")
        return SharedMemory(
            f"rank {rank} read a tensor that rank {owner} made, without any dist call ({_name(func)}"
            f"{learner_line()}). {SHARE_NOTHING}\n"
            "Hint: a global, a closure or a notebook variable? Data kept there by one rank is not there for the "
            "others in real processes: send it with dist.")

    @staticmethod
    def _write_error(rank: int, owner: Optional[int], func) -> SharedMemory:
        if owner is not None:
            return SharedMemory(
                f"rank {rank} wrote in place into a tensor that rank {owner} made ({_name(func)}"
                f"{learner_line()}). {SHARE_NOTHING}\n"
                "Hint: a global, a closure or a notebook variable shared by the ranks? Each rank must write "
                "into tensors of its own, and send what the others need with dist.")
        return SharedMemory(
            f"rank {rank} wrote in place into a tensor made outside the run ({_name(func)}{learner_line()}): "
            "a global, a closure, a default argument or a notebook variable, such as a model defined in the "
            "notebook used instead of the one your function receives. Each real process writes into its own "
            "private copy of such a tensor, so the other ranks never see the change.\n"
            "Hint: work on the arguments your function receives (each rank gets its own copy) and on tensors "
            "it makes itself.")


def _name(func) -> str:
    """An op's name, or what a patch of lib.guard.boundary says was called."""
    return func if isinstance(func, str) else func._overloadpacket.__name__
