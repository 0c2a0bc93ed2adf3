"""The kernels an answer may not call: torch's ops that do the lesson's work for it (an attention kernel where the
lesson is attention). A ban on ops, applied by Puzzle(refuse=...) around the learner's function, in simulation
and on real ranks alike."""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterable, Iterator

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from lib.errors import PuzzleError
from lib.sim.context import current_tracker


class KernelRefused(PuzzleError):
    """The answer called a kernel that does the puzzle's work for it."""


class _Refusing(TorchDispatchMode):
    """Stops at the first op whose name starts with one of `prefixes`, with error(its name): on real ranks (a
    simulated rank's tracker refuses the ops itself, RankTracker.refusing)."""

    def __init__(self, prefixes: tuple[str, ...], error: Callable[[str], Exception]) -> None:
        super().__init__()
        self.prefixes, self.error = prefixes, error

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False          # as lib.sim.tracker: no torch.compile here, and no torch._dynamo import per op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._overloadpacket.__name__
        if name.startswith(self.prefixes):
            raise self.error(name)
        return func(*args, **(kwargs or {}))


class _RefusingFunctions(TorchFunctionMode):
    """Stops at the first torch function whose name starts with one of `prefixes`: a function that decomposes before
    dispatch (F.scaled_dot_product_attention on its math backend, torch's default for float64 on a GPU) reaches
    the dispatch modes only as its parts (matmuls, a softmax), which no op name refuses."""

    def __init__(self, prefixes: tuple[str, ...], error: Callable[[str], Exception]) -> None:
        super().__init__()
        self.prefixes, self.error = prefixes, error

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name.startswith(self.prefixes):
            raise self.error(name)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def kernels_refused(prefixes: Iterable[str], why: str) -> Iterator[None]:
    """Any torch function or op named with one of `prefixes` raises KernelRefused inside (in simulation and on real
    ranks): by the function's name before dispatch, and by the op's name after it."""
    prefixes = tuple(prefixes)

    def refused(name: str) -> KernelRefused:
        return KernelRefused(f"the answer called torch's {name}: {why}")

    tracker = current_tracker()
    with _RefusingFunctions(prefixes, refused), \
            _Refusing(prefixes, refused) if tracker is None else tracker.refusing(prefixes, refused):
        yield


def refusing_kernels(fn: Callable, prefixes: Iterable[str], why: str) -> Callable:
    """`fn` run under kernels_refused(prefixes, why)."""
    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        with kernels_refused(prefixes, why):
            return fn(*args, **kwargs)
    return guarded
