"""Per-rank accounting of the tensors a rank allocates and the FLOPs it computes.

A TorchDispatchMode is thread-local, so the mode entered in a rank's thread sees exactly
that rank's work: factory calls, op outputs and autograd's buffers in a CPU backward. Each
output's storage is counted once (views share it) and released by a finalizer when the
storage dies, wherever the last reference was hidden.

Device and host memory are told apart by placement: in simulation `lib.host()` is the
device `cpu:1` and `lib.device()` is `cpu:0`, so a tensor made with `device=lib.host()` or
moved with `.to(lib.host())` is host memory, and so is whatever an op computes from host
tensors. A tensor made with a plain `cpu` device (`device=x.device`, since a host tensor's
device reads `cpu`) is neutral: it goes with either side and counts as device memory.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Callable, Iterator, NamedTuple, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lib.sim.flops import composite, flops_of, formula_of
from lib.sim.errors import InvalidCall
from lib.sim.in_flight import BufferRules
from lib.sim.ownership import Ownership, tensor_inputs, written_args
from lib.sim.reads import ArgumentReads

HOST = torch.device("cpu", 1)
PYTHON_NUMBER_BYTES = 24                # a Python float or int object
LIST_SLOT_BYTES = 8                     # its slot in a list
DEVICE, ON_HOST, NEUTRAL = 0, 1, 2      # where a storage lives
_BIT = (1, 2, 4)                        # a place as a bit, to collect an op's places in one int
# Ops that may take a host tensor and a device tensor together, as on a GPU.
_CROSSING = {torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default}
# Ops that wrap memory allocated outside the dispatcher (torch.tensor(list), torch.as_tensor, torch.from_numpy):
# their output aliases their input, but the storage is new to this rank.
_FRESH = {torch.ops.aten.lift_fresh.default}
_SCALAR = torch.ops.aten._local_scalar_dense.default       # .item(), float(t): a Python number leaves torch
# The engine's own work inside a rank (message copies, reductions): torch's Python dispatch switched off, so the
# tracker does not count it. Five times cheaper than telling the tracker to ignore the op. Taken at import: while a run
# lasts, the name on torch._C is refused to a rank's own code (lib.guard.boundary).
UNTRACKED = torch._C._DisableTorchDispatch
_DISPATCH_STACK_AT = torch._C._get_dispatch_stack_at


aten = torch.ops.aten
# Ops that only reserve memory or rename it: no work (views are free by their schema).
_FREE = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default, aten.new_empty.default,
         aten.new_empty_strided.default, aten.lift_fresh.default, aten._local_scalar_dense.default}


class _Op(NamedTuple):
    """What the tracker needs to know of one op, read once from its schema and the FLOP registry: the
    dispatcher runs thousands of ops per check, and hashing an OpOverload is a Python call."""

    func: object                        # kept alive, so that its id stays its own
    run: Callable                       # what runs it: the C++ op itself (OpOverload.__call__ only forwards to it)
    counted: bool                       # costs work (not free, not a pure view, not a host/device copy)
    crossing: bool
    fresh: bool
    aliases: bool                       # returns (a view of) one of its inputs
    writes: bool                        # writes into one of its arguments
    written: tuple                      # (positions, keyword names) of the arguments it writes
    formula: Optional[Callable]         # FLOPs from its shapes (lib.sim.flops), or None
    formula_kind: int                   # lib.sim.flops.BY_SHAPES or BY_TENSORS
    composite: bool                     # made of other ops (lib.sim.flops.composite): the tracker sees those


_OPS: dict[int, _Op] = {}


def _op(func) -> _Op:
    """The op's facts, cached by id."""
    known = _OPS.get(id(func))
    if known is None:
        packet = func._overloadpacket
        aliases = any(r.alias_info is not None for r in func._schema.returns)
        written = written_args(func)
        writes = written != ((), ())
        counter, kind = formula_of(packet)
        run = func._op if type(func) is torch._ops.OpOverload else func
        known = _OPS[id(func)] = _Op(
            func, run, func not in _FREE and (writes or not aliases) and func not in _CROSSING, func in _CROSSING,
            func in _FRESH, aliases, writes, written, counter, kind, composite(func))
    return known


def _work(op: _Op, inputs: list, args: tuple, kwargs: dict, out) -> tuple[float, float]:
    """(FLOPs, bytes read and written) of one op: FLOPs by its formula where it has one (lib.sim.flops), else one per
    element of the largest tensor it touches (elementwise ops, reductions). `inputs`: its argument tensors
    (tensor_inputs), measured after the op ran (an in-place resize_ has changed them)."""
    outputs = (out,) if isinstance(out, torch.Tensor) else _tensors(out) if isinstance(out, (list, tuple)) else ()
    nbytes = largest = 0
    for t in (*inputs, *outputs):
        n = t.numel()
        nbytes += n * t.element_size()
        if n > largest:
            largest = n
    if op.formula is None:
        return float(largest), float(nbytes)
    return float(flops_of(op.formula, op.formula_kind, args, kwargs, out)), float(nbytes)


def _tensors(values) -> list:
    """The tensors among `values` and inside their lists and tuples, however nested (an op's arguments or
    outputs), in order: torch's tree_flatten does the same at ten times the cost, and runs on every op."""
    found, pending = [], list(reversed(values))
    while pending:
        v = pending.pop()
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            pending.extend(reversed(v))
    return found


def _raise(error: Exception) -> None:
    raise error


class StoppedClock:
    """The clock of memory counted outside a simulated run: every sample at time 0."""

    clock = 0.0


class RankTracker(TorchDispatchMode):
    """Counts live bytes (current and peak, device and host) and FLOPs of one rank.

    on_work(flops, nbytes, on_host) advances the rank's clock for one op (its FLOPs and the bytes it touches);
    on_transfer(nbytes, to_host) charges a copy between host and device memory. `clock`: what holds the rank's
    simulated time as its `.clock` (the memory timeline's samples are taken at it; an attribute read rather than a
    call, twice per op). With `ownership`, the storages it counts are the rank's, and ops that break share-nothing
    are reported to on_violation.
    """

    def __init__(self, on_work: Callable[[float, float, bool], None], clock: object = StoppedClock(),
                 on_transfer: Callable[[int, bool], None] = lambda nbytes, to_host: None,
                 on_violation: Callable[[Exception], None] = _raise, limit: float = float("inf"),
                 rank: int = 0, ownership: Optional[Ownership] = None) -> None:
        super().__init__()
        self._on_violation = on_violation
        self._limit = limit                # live bytes (device + host) past which the run is stopped
        self._rank = rank
        self._ownership = ownership
        self.current = self.peak = 0
        self.host_current = self.host_peak = 0
        self.outside = 0                   # bytes taken out of torch as Python values (counted in `current`)
        self.flops = 0.0
        self.host_flops = 0.0
        self.largest = 0                   # bytes of the largest storage the rank's ops allocated (not its arguments)
        self.reads: Optional[ArgumentReads] = None      # bytes read of its arguments, once watch_arguments is called
        self.samples: list[tuple[float, int]] = [(0.0, 0)]
        self._sizes: dict[int, tuple[int, int]] = {}     # storage -> (bytes, DEVICE / ON_HOST / NEUTRAL)
        # storage -> a weak reference whose callback releases it (a third of the cost of weakref.finalize)
        self._watch: dict[int, weakref.ref] = {}
        self._hosted = 0                                  # how many live storages are on the host
        self._on_work = on_work
        self._on_transfer = on_transfer
        self._clock = clock
        # storage -> rank of every rank's storages (ownership.owners), written here at each allocation and release
        self._owners = ownership.owners if ownership is not None else None
        self._refusals: list[tuple[tuple[str, ...], Callable[[str], Exception]]] = []    # innermost last
        self._verdicts: dict[int, Optional[Callable[[str], Exception]]] = {}   # id(func) -> its refusal, or None
        self.buffers = BufferRules(rank)    # buffers a dist call made unusable for a while (lib.sim.in_flight)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No torch.compile runs inside a simulated rank: skip the wrapper that would import torch._dynamo
        (about 2 s) on the first op and cost time on every op after it."""
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = _OPS.get(id(func)) or _op(func)
        if self._refusals:
            self._refuse(func)
        if op.composite:
            with self:
                return func.decompose(*args, **kwargs)
        inputs = tensor_inputs(args, kwargs)
        if self._ownership is not None:
            broken = self._ownership.check(self._rank, func, args, kwargs, op.written, inputs)
            if broken is not None:
                self._on_violation(broken)
        if self.buffers.marks:
            broken = self.buffers.check_op(func, op.written, op.aliases and not op.writes, args, kwargs, inputs)
            if broken is not None:
                self._on_violation(broken)
        place = self._placement(func, inputs, kwargs) if kwargs or self._hosted else DEVICE
        on_host = place == ON_HOST
        out = op.run(*args, **kwargs)
        if self.reads is not None:
            self.reads.count(func, op.aliases and not op.writes, inputs, out)
        if op.counted:
            flops, nbytes = _work(op, inputs, args, kwargs, out)
            self.flops += flops
            if on_host:
                self.host_flops += flops
            self._on_work(flops, nbytes, on_host)
        if op.crossing:
            source, target = (args[0], out) if func is torch.ops.aten._to_copy.default else (args[1], args[0])
            if isinstance(source, torch.Tensor):
                sides = {self._place(source), self._place(target, place)}
                if sides == {DEVICE, ON_HOST}:
                    self._on_transfer(source.nbytes, self._place(source) == DEVICE)
        if op.aliases:
            if op.fresh:
                self.adopt(out, place)
            elif op.writes:
                self._remeasure(out)       # an in-place op (resize_, set_, out=) may have resized its storage
            return out                     # a view or an in-place result: no new storage
        if func is _SCALAR:
            self.keep_outside(PYTHON_NUMBER_BYTES, ".item()")
        if isinstance(out, torch.Tensor):
            self.adopt_storage(out.untyped_storage(), place)
        else:
            for t in _tensors(out if isinstance(out, (list, tuple)) else ()):
                self.adopt(t, place)
        return out

    @contextlib.contextmanager
    def refusing(self, prefixes: tuple[str, ...], error: Callable[[str], Exception]) -> Iterator[None]:
        """While it lasts, an op whose name starts with one of `prefixes` raises error(its name) instead of running
        (a puzzle's refused kernels, lib.checker.contract). Checked here rather than by a dispatch mode of its own: a
        second
        Python mode on the stack costs every op a second trip through Python."""
        rule = (prefixes, error)
        self._refusals.append(rule)
        self._verdicts.clear()
        try:
            yield
        finally:
            self._refusals.remove(rule)
            self._verdicts.clear()

    def _refuse(self, func) -> None:
        """Raise the refusal of `func`, if a rule refuses it (the innermost rule first, as nested modes would);
        the verdict is kept per op."""
        key = id(func)
        if key not in self._verdicts:
            name = func._overloadpacket.__name__
            self._verdicts[key] = next((error for prefixes, error in reversed(self._refusals)
                                        if name.startswith(prefixes)), None)
        error = self._verdicts[key]
        if error is not None:
            raise error(func._overloadpacket.__name__)

    def _placement(self, func, inputs: list, kwargs: dict) -> int:
        """Where the op's outputs live (`inputs`: its tensors, tensor_inputs); mixing host and device inputs is an
        error. Only an op with keyword arguments or a rank holding host memory needs to ask."""
        target = kwargs.get("device")
        if target is not None:
            target = torch.device(target)
            if target.index is not None:
                return ON_HOST if target == HOST else DEVICE
        if not self._hosted:
            return DEVICE                  # nothing on the host yet: the common, fast case
        seen = self._places(inputs)
        if seen & _BIT[DEVICE] and seen & _BIT[ON_HOST] and func not in _CROSSING:
            self._on_violation(InvalidCall(
                f"{func._overloadpacket.__name__} was given a tensor in host memory and one in device "
                "memory. On a GPU this fails (tensors must be on the same device).\n"
                "Hint: bring one to the other's side first, with .to(lib.device()) or .to(lib.host()). In "
                "simulation, place new tensors with device=lib.device() or lib.host(): a host tensor's .device "
                "reads plain 'cpu' there."))
        if seen & _BIT[ON_HOST] and not seen & _BIT[DEVICE]:
            return ON_HOST
        if seen & _BIT[DEVICE]:
            return DEVICE
        return NEUTRAL if target is not None or seen & _BIT[NEUTRAL] else DEVICE

    def _places(self, tensors: list) -> int:
        """The places (a bit per place, _BIT) of the `tensors` of more than 0 dimensions. Runs on every op once the
        rank holds host memory."""
        sizes, seen = self._sizes, 0
        for t in tensors:
            if t.dim() > 0:
                known = sizes.get(t.untyped_storage()._cdata)
                seen |= _BIT[known[1] if known is not None else DEVICE]
        return seen

    def adopt_copies(self, memo: dict, largest_before: int) -> None:
        """Count every tensor a deep copy made (its memo): the rank's own copy of its arguments, whatever
        holds them (containers, modules, dataclasses). They are not the rank's allocations: `largest` goes back to
        `largest_before`, what it was before the copy made its storages."""
        memo.pop(id(memo), None)           # deepcopy's keep-alive list holds the originals
        for copy in memo.values():
            if isinstance(copy, torch.Tensor):
                self.adopt(copy)
        self.largest = largest_before

    def watch_arguments(self, arguments: list) -> None:
        """Measure the bytes the rank's ops read of each of `arguments` (its own copies, adopted already)."""
        self.reads = ArgumentReads(arguments)

    def _remeasure(self, out) -> None:
        for t in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                known = self._sizes.get(storage._cdata)
                if known is not None and known[0] != storage.nbytes():
                    self.adopt_storage(storage, resized=True)

    def keep_outside(self, nbytes: int, what: str) -> None:
        """Bytes that left torch as Python values (`what`): this rank's memory until the run ends."""
        self.outside += nbytes
        self._change(nbytes, on_host=False)

    def check_write(self, storage, func) -> None:
        """Share-nothing for a write that bypasses the dispatcher (a storage resized in place)."""
        if self._ownership is not None:
            probe = torch.empty(0, dtype=torch.uint8)
            with UNTRACKED():
                probe.set_(storage)
            broken = self._ownership.check(self._rank, func, (probe,), {})
            if broken is not None:
                self._on_violation(broken)

    def check_read(self, obj, what: str) -> None:
        """Share-nothing for a read that bypasses the dispatcher (`what`: Tensor.tolist() of a tensor or storage)."""
        if self._ownership is not None:
            storage = obj.untyped_storage() if isinstance(obj, torch.Tensor) else obj
            owner = self._ownership.owners.get(storage._cdata)
            if owner is not None and owner != self._rank:
                self._on_violation(self._ownership.read_error(self._rank, owner, what))
        if self.buffers.marks and isinstance(obj, torch.Tensor):
            broken = self.buffers.check_read(obj, what)
            if broken is not None:
                self._on_violation(broken)
        if self.reads is not None and isinstance(obj, torch.Tensor):
            self.reads.read(obj)

    def _place(self, t: torch.Tensor, default: int = DEVICE) -> int:
        known = self._sizes.get(t.untyped_storage()._cdata)
        return known[1] if known is not None else default

    def adopt(self, t: torch.Tensor, place: int = DEVICE) -> None:
        """Count `t`'s storage as this rank's until it is freed (once, however many views)."""
        self.adopt_storage(t.untyped_storage(), place)

    def adopt_storage(self, storage, place: int = DEVICE, resized: bool = False) -> None:
        """Count a storage as this rank's until it is freed; `resized`: re-measure one already counted."""
        key = storage._cdata
        known = self._sizes.get(key)
        if known is None:
            if not resized:
                self._adopt_new(storage, key, place)
            return
        size = storage.nbytes()
        if known[0] != size:               # resized in place: it stays where it is
            self._sizes[key] = (size, known[1])
            self.largest = max(self.largest, size)
            self._change(size - known[0], known[1] == ON_HOST)

    def _adopt_new(self, storage, key: int, place: int) -> None:
        """Count a storage this rank has not counted yet (an op's new output, the common case) until it dies."""
        size = storage.nbytes()
        self._watch[key] = weakref.ref(storage, functools.partial(self._release, key))
        if self._owners is not None:
            self._owners[key] = self._rank
        self._sizes[key] = (size, place)
        if size > self.largest:
            self.largest = size
        if place == ON_HOST:
            self._hosted += 1
        self._change(size, place == ON_HOST)

    def _release(self, key: int, _ref=None) -> None:
        """Forget a storage that died (the callback of its weak reference, `_ref`)."""
        self._watch.pop(key, None)
        self.buffers.marks.pop(key, None)
        known = self._sizes.pop(key, None)
        if known is None:
            return
        if self._owners is not None:
            self._owners.pop(key, None)
        if self.reads is not None:
            self.reads.forget(key)
        if known[1] == ON_HOST:
            self._hosted -= 1
        if known[0]:
            self._change(-known[0], known[1] == ON_HOST)

    def _change(self, delta: int, on_host: bool) -> None:
        if delta > 0 and self.current + self.host_current + delta > self._limit:
            self._on_violation(InvalidCall(
                f"rank {self._rank} holds more than {self._limit / 2**30:.2f} GiB of tensors, the simulator's limit "
                "for one rank, and the run was stopped before it exhausted this machine's memory.\n"
                "Hint: look for a loop that keeps every result (a list that only grows, a graph kept alive by "
                "a running total). For a bigger experiment, pass memory_limit= to lib.sim.run."))
        if on_host:
            self.host_current += delta
            self.host_peak = max(self.host_peak, self.host_current)
            return
        self.current += delta
        if self.current > self.peak:
            self.peak = self.current
        self.samples.append((self._clock.clock, self.current))


def tracking_switched_off(tracker: RankTracker) -> str:
    """What, if anything, stops `tracker` from seeing the ops of this thread: '' when it sees them all."""
    if torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Python):
        return "torch's Python dispatch is switched off"
    depth = torch._C._len_torch_dispatch_stack()
    if depth and _DISPATCH_STACK_AT(depth - 1) is tracker:          # where it is at nearly every dist call
        return ""
    if not any(_DISPATCH_STACK_AT(i) is tracker for i in range(depth)):
        return "the simulator's dispatch mode was taken off the stack"
    return ""


def in_host_memory(tracker: RankTracker, t: torch.Tensor) -> bool:
    """Whether `t` lives in the rank's host memory (made on or moved to lib.host()), by its tracker."""
    return tracker._hosted > 0 and tracker._place(t) == ON_HOST      # none on the host: no look at its storage
