"""A layer's forward pass as a puzzle answer: the check runs backward itself from a gradient it held back, and
judges the collectives of each pass (Megatron-LM's pattern), the activations the forward keeps, the output and
every input's gradient. `dist` reaches the learner through counting_dist, which writes each collective down in
both worlds (a real process has no simulator's trace to read) and, in simulation, counts the calls that went
around it.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from lib.checker.compare import first_difference
from lib.checker.puzzle import Puzzle
from lib.errors import PuzzleError
from lib.checker.measure import saved_activation_bytes
from lib.sim.context import current_runtime, current_tracker
from lib.sim.tracker import UNTRACKED
from lib.units import fmt_bytes


class CollectivePattern(PuzzleError):
    """The layer talks differently from Megatron-LM's pattern (which collectives, of what size, in which pass)."""


class UnusableOutput(PuzzleError):
    """The layer's output cannot be checked or back-propagated: not a tensor, the wrong shape, or cut off from
    its inputs' autograd graph."""


class TooManyActivations(PuzzleError):
    """The forward pass keeps more for backward than the parallel layer needs."""


@dataclass
class Upstream:
    """What the check holds back from the learner: the gradient flowing into the layer's output, and
    the collectives Megatron-LM issues for it, as {"forward": [(op, elements)], "backward": [...]}."""

    grad: torch.Tensor
    pattern: Optional[dict] = None
    activations: Optional[tuple] = None     # (bytes autograd may save in forward, why[, hint])
    output: Optional[torch.Tensor] = None   # this rank's right output: a wrong one is the deeper mistake, and its
                                            # values' diagnosis is said before the memory it took (all the heads on
                                            # every rank both differ and keep more)


_KIND = {"all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
         "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
         "all_to_all_single": "all_to_all"}
_COUNTED = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send", "recv",
            "isend", "irecv", "gather", "scatter", *_KIND}


def _elements(name: str, args: tuple, kwargs: dict) -> int:
    """Elements of the whole buffer a collective works on (the gathered output, the scattered input)."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    lists = [a for a in (*args, *kwargs.values()) if isinstance(a, (list, tuple))]
    if name in ("all_gather_into_tensor", "all_gather_single"):
        return max(t.numel() for t in tensors)
    if name in ("reduce_scatter_tensor", "reduce_scatter_single"):
        return max(t.numel() for t in tensors)
    if name in ("all_gather", "reduce_scatter") and lists:
        return sum(t.numel() for t in lists[0])
    return tensors[0].numel() if tensors else 0


class WentAround(PuzzleError):
    """The layer reached the dist behind the one it was given, so that some of its collectives went uncounted."""


class _Watch:
    """How many communication calls the simulated rank posts in all, and how many through the dist handed out (a
    real process has no count to compare: there the check trusts the simulated one)."""

    def __init__(self) -> None:
        self.inside = self.depth = 0
        self.start = self.posted()

    @staticmethod
    def posted() -> Optional[int]:
        runtime = current_runtime()
        return len(runtime.me().posted) if runtime is not None else None

    def call(self, method: Callable, *args, **kwargs):
        """`method(*args, **kwargs)`, its posts counted as the handed-out dist's (once, should calls nest)."""
        before, self.depth = self.posted(), self.depth + 1
        try:
            return method(*args, **kwargs)
        finally:
            self.depth -= 1
            if self.depth == 0 and before is not None:
                self.inside += self.posted() - before

    def around(self) -> int:
        """Calls posted since the start that did not go through the dist handed out."""
        return 0 if self.start is None else self.posted() - self.start - self.inside


def counting_dist(dist, log: list) -> tuple[object, _Watch]:
    """(`dist` as the learner sees it, its watch): every call passes through, each collective is written down in
    `log` as (kind, elements). The dist behind it lives in this closure only: the object has no attribute holding
    it, no __dict__ (so no vars()), and names starting with _ are refused; a call that reaches it anyway (through
    the closure's cells) posts without passing the watch, which `_Watch.around` counts."""

    def forward(name: str):
        if name.startswith("_"):
            raise AttributeError(f"dist has no attribute {name!r}: a layer talks through the dist it is given, "
                                 "whose every collective the check counts.")
        attr = getattr(dist, name)
        if not callable(attr) or isinstance(attr, type):
            return attr                          # ReduceOp, P2POp, group: names, not calls

        def call(*args, **kwargs):
            if name in _COUNTED:
                log.append((_KIND.get(name, name), _elements(name, args, kwargs)))
            return watch.call(attr, *args, **kwargs)
        call.__name__ = call.__qualname__ = name     # a P2POp names its op by __name__
        return call

    class CountingDist:
        __slots__ = ()

        def __getattr__(self, name: str):
            return forward(name)

        def __repr__(self) -> str:
            return "<dist>"

    watch = _Watch()
    return CountingDist(), watch


def _went_around(watch: _Watch, phase: str, dist) -> None:
    n = watch.around()
    if n:
        raise WentAround(f"rank {dist.get_rank()} made {n} communication call{'s' * (n > 1)} in the {phase} pass "
                         "around the dist it was given (reaching for the dist behind it), which the check counts "
                         "collectives through: the layer's communication must go through `dist`.")


def describe_calls(calls: Sequence[tuple[str, int]]) -> str:
    if not calls:
        return "no collective"
    counts = Counter(calls)
    return ", ".join(f"{n} × {op} of {size:,} elements" if n > 1 else f"one {op} of {size:,} elements"
                     for (op, size), n in sorted(counts.items()))


def _leaves(names: Sequence[str], inputs: tuple) -> dict[str, torch.Tensor]:
    return {n: a for n, a in zip(names, inputs) if isinstance(a, torch.Tensor) and a.requires_grad}


NO_GRADIENT = "no gradient: backward never reached this input"


def _check_pattern(phase: str, calls: list, pattern: dict, dist) -> None:
    want = pattern[phase]
    if sorted(calls) != sorted(want):
        raise CollectivePattern(f"the {phase} pass should issue {describe_calls(want)} (Megatron-LM's pattern); "
                                f"rank {dist.get_rank()} issued {describe_calls(calls)}.")


def _forward_memory(forward: Callable[[], None], given: list[torch.Tensor]) -> tuple[int, int]:
    """(bytes autograd saves while `forward()` runs, bytes it leaves allocated on this rank's tracker)."""
    tracker = current_tracker()
    before = tracker.current if tracker is not None else 0
    saved = saved_activation_bytes(forward, exclude=given)
    return saved, (tracker.current - before if tracker is not None else 0)


def _by_world(got: torch.Size, want: torch.Size, dist) -> str:
    """A shape off by N along one dimension, said as what it is: a part cut again, or the whole where a part
    belongs."""
    world = dist.get_world_size()
    off = [d for d, (g, w) in enumerate(zip(got, want)) if g != w]
    if world < 2 or len(got) != len(want) or len(off) != 1:
        return ""
    d = off[0]
    if got[d] * world == want[d]:
        return (f" Dimension {d} is 1/N of this rank's (N = {world}): a shard cut from what is already this rank's "
                "shard (the weights handed in are this rank's part already)?")
    if got[d] == want[d] * world:
        return f" Dimension {d} is N = {world} times this rank's: the whole where this rank's part belongs?"
    return ""


def forward_backward(fn: Callable, names: Sequence[str], tolerance: tuple[float, float], dist, *args) -> dict:
    """Run the learner's forward, then backward from the held-back upstream gradient. `tolerance`: the puzzle's
    (rtol, atol), by which an output is right before its memory is judged.

    Returns {"output": ..., "<input>.grad": ...}; raises UnusableOutput for an output backward cannot use,
    CollectivePattern when the collectives of either pass differ from Megatron's (forward's checked first), and
    TooManyActivations when the forward saves more bytes for backward than upstream.activations allows."""
    *inputs, upstream = args
    log: list[tuple[str, int]] = []
    counting, watch = counting_dist(dist, log)
    given = [a for a in inputs if isinstance(a, torch.Tensor)]
    out = None

    def forward_pass() -> None:
        nonlocal out
        out = fn(counting, *inputs)

    saved, kept = _forward_memory(forward_pass, given)
    _went_around(watch, "forward", dist)
    forward = list(log)
    if not isinstance(out, torch.Tensor):
        raise UnusableOutput(f"the layer should return a tensor, got {type(out).__name__}.")
    if out.shape != upstream.grad.shape:
        raise UnusableOutput(f"the output should have shape {tuple(upstream.grad.shape)} on this rank, "
                                f"got {tuple(out.shape)}.{_by_world(out.shape, upstream.grad.shape, dist)}")
    if not out.requires_grad:
        raise UnusableOutput("the output does not depend on any input through autograd: no gradient "
                                "can flow back (was a result computed under torch.no_grad or detached?).")
    if upstream.pattern is not None:
        _check_pattern("forward", forward, upstream.pattern, dist)     # before memory: the deeper mistake
    # What forward leaves alive counts too (the output aside): a tensor kept by a closure, as
    # torch.utils.checkpoint keeps its inputs, is memory autograd's saved tensors do not show.
    saved = max(saved, kept - out.nbytes)
    if (upstream.activations is not None and saved > upstream.activations[0]
            and _right(out, upstream.output, *tolerance)):
        limit, why, *hint = upstream.activations
        hint = hint[0] if hint else ("a rank should keep only its 1/N of the 4h-wide activations, once each: "
                                     "use F.gelu, and gather no hidden units.")
        raise TooManyActivations(
            f"rank {dist.get_rank()}'s forward saved {fmt_bytes(saved)} of activations for backward; the "
            f"tensor-parallel layer needs at most {fmt_bytes(limit)} ({why}).\nHint: {hint}")
    out.backward(upstream.grad)
    _went_around(watch, "backward", dist)
    backward = log[len(forward):]
    if upstream.pattern is not None:
        _check_pattern("backward", backward, upstream.pattern, dist)
    result = {"output": out.detach()}
    result.update({f"{n}.grad": NO_GRADIENT if t.grad is None else t.grad
                   for n, t in _leaves(names, tuple(inputs)).items()})
    return result


def _right(out: torch.Tensor, expected: Optional[torch.Tensor], rtol: float, atol: float) -> bool:
    """Whether the layer's output is the right one (True where the case did not say what that is), by the check's own
    comparison at the puzzle's tolerances, off the rank's tracker (the check's temporaries): an output the check will
    accept has its memory judged, whatever tolerances a layer puzzle sets."""
    if expected is None:
        return True
    with UNTRACKED():
        return first_difference(expected, out.detach(), rtol=rtol, atol=atol) is None


class LayerPuzzle(Puzzle):
    """A puzzle whose answer is a layer's forward pass: the check runs backward itself and compares the
    output and the gradient of every input that requires one (`arg_names` name the inputs)."""

    def __init__(self, name: str, notebook: str, make_case: Callable, *, arg_names: Sequence[str], **kw) -> None:
        super().__init__(name, notebook, make_case, **kw)
        self.arg_names = tuple(arg_names)

    def wrap(self, fn: Callable) -> Callable:
        """Each rank runs the learner's forward, then backward against the kept upstream gradient."""
        if not callable(fn):
            return fn
        return functools.partial(forward_backward, fn, self.arg_names, (self.rtol, self.atol))
