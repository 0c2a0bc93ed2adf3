"""The edges a simulated rank could use to keep memory or work where the simulator cannot see it, guarded while a run
lasts.

Nothing here changes the process at import. `guarding()` puts every patch of `_table()` in place when a run starts and
puts each attribute back as it was when the run ends (lib.sim.runtime); outside a run `torch.save`, `Tensor.numpy`,
`threading.Thread.start` and the rest are torch's and Python's own. What stays, and why:
- Python's audit hook (lib.guard.audit), added by the first run (lib.guard.around_run): Python cannot remove one.
  While no rank runs it looks only at code compiled under the engine's or a library's file name (such code, compiled
  before a run, would pass for the engine's inside one); every other event returns at once.
- A run whose rank's thread could not be stopped leaves its patches in place after the run: that thread still runs
  the rank's code. The next run to end after that thread has ended puts them back.
- A puzzle's answer keys, guarded in place at its first case (lib.guard.offlimits): outside a rank they are what they
were.
A function's original kept from outside a run (a default argument, an alias taken before the run) is the original:
the doors Python's own C code announces (files, frames, the collector, tracers, processes) are the audit hook's,
refused however they are reached; the rest are patches of attributes, as before.

Inside a simulated rank:
- numpy, DLPack, pickling and a tensor's or storage's raw address (`data_ptr()`, which ctypes reads into numpy)
  are refused: the bytes would leave the simulator's view (and on a GPU, `.numpy()` of a device tensor fails
  anyway);
- `.tolist()` and `.item()` are allowed (split sizes, a loss to print) and their Python objects count toward
  the rank's memory until the run ends, since Python does not tell when they are freed;
- a raw storage a rank makes (`torch.UntypedStorage(n)`) is its memory, and a resized storage is re-measured;
  a storage's bytes written into a buffer (`_write_file`) and tensors or storages made over outside bytes
  (`torch.frombuffer`, `from_buffer`, `from_file`) are refused;
- starting a thread, switching torch's Python dispatch off or popping the simulator's mode from the learner's
  code is refused (the work would not be counted), and so is disabling saved-tensor hooks; a learner's
  saved-tensor hooks entered inside the check's own measuring hooks are composed with them, not hiding from them;
- the dispatch-mode stack is refused: the rank's own meters (its tracker: peak memory, FLOPs) live there; the
  frames below the learner's function, other threads' frames and the garbage collector's objects, where the check's
  cases and the other ranks' inputs live, are the audit hook's (lib.guard.audit), and so are files: what goes through
  a file is neither counted nor sent;
- `.tolist()` of a tensor another rank made, or of the run's originals, is refused as any op reading it is;
- the engine's own objects: the private names of its modules (the originals these patches keep, the ranks'
  registry) and of the classes of the handles a rank holds (a slot's descriptor reads around the handle's guard),
  `inspect.getattr_static` (which reads around every guard), and the engine's untracked block.
For torch's and the engine's own calls, every patch does exactly what torch does.
"""

from __future__ import annotations

import _thread
import functools
import inspect
import sys
import threading
import types
from typing import Callable, NamedTuple, Optional, Sequence

import torch
import torch.autograd.graph
import torch.utils._python_dispatch as python_dispatch

from lib.guard.audit import caller_file
from lib.sim import tracker as tracker_module
from lib.sim.context import current_rank, current_tracker, fail_run
from lib.sim.errors import OutOfView
from lib.sim.ownership import learner_line
from lib.sim.tracker import LIST_SLOT_BYTES, PYTHON_NUMBER_BYTES, UNTRACKED
from lib.whose_code import ENGINE

_OUT_OF_VIEW = ("The simulator measures a rank's memory in torch tensors; bytes moved into numpy arrays, "
                "DLPack capsules or pickled bytes would escape its memory budget.\n"
                "Hint: keep the data in tensors: .clone() or .detach() to keep a copy, torch.empty(...) for a "
                "buffer, .to(lib.host()) for host memory.")


def _standing_in_for(original: Callable) -> Callable:
    """functools.wraps without `__wrapped__`: a patch must not hand the learner's code the original it guards."""
    def wrap(patch: Callable) -> Callable:
        patch = functools.wraps(original)(patch)
        del patch.__wrapped__
        return patch
    return wrap


def _refusing(original: Callable, what: str, gpu_note: str = "") -> Callable:
    @_standing_in_for(original)
    def refused(self, *args, **kwargs):
        rank = current_rank()
        if rank is not None:
            fail_run(OutOfView(f"rank {rank} called {what}{learner_line()}. {gpu_note}{_OUT_OF_VIEW}"))
        return original(self, *args, **kwargs)
    refused._lib_sim_patch = True
    return refused


_DISABLE_TORCH_DISPATCH = UNTRACKED      # the engine's own, unguarded in runs too


def untracked():
    """The engine's own work inside a rank (message copies, reductions): torch's Python dispatch switched off,
    so the tracker does not count it. Five times cheaper than telling the tracker to ignore the op. Refused to the
    rank's own code, whose work it would hide."""
    if current_rank() is not None and _from_learner():
            fail_run(OutOfView(f"rank {current_rank()} called lib.guard.boundary.untracked() "
                           "(switching off the simulator's "
                        f"tracking of ops){learner_line()}: {_HIDDEN_WORK}"))
    return _DISABLE_TORCH_DISPATCH()


_DISPATCH_STACK_AT = tracker_module._DISPATCH_STACK_AT       # the engine's own, unguarded in runs too


def _from_learner(depth: int = 2) -> bool:
    """Whether the function `depth` frames up was called by the learner's code, not torch's or the engine's."""
    file = caller_file(depth)
    return file is not None and not file.startswith(ENGINE)


def _refusing_from_learner(original: Callable, what: str, why: str) -> Callable:
    """`original`, refused when the learner's code calls it inside a simulated rank."""
    @_standing_in_for(original)
    def guarded(*args, **kwargs):
        rank = current_rank()
        if rank is not None and _from_learner():
            fail_run(OutOfView(f"rank {rank} called {what}{learner_line()}: {why}"))
        return original(*args, **kwargs)
    guarded._lib_sim_patch = True
    return guarded


_HIDDEN_WORK = ("work there runs outside the simulator's view, so its time, FLOPs and memory would not count.\n"
                "Hint: compute in your function's own thread, with torch's ordinary ops.")

def _private_to_a_rank(name: str) -> bool:
    """Whether a rank's own code is refused `name` on an engine class or module: a private name, or its __dict__ (every
    descriptor, every global), looked up from inside a simulated rank. Called from a __getattribute__: the caller
    to judge is three frames up."""
    return name.startswith("_") and (not name.startswith("__") or name == "__dict__") and current_rank() is not None \
        and _from_learner(3)


class _HandleClass(type):
    """The class of an engine handle: its private names are refused to a rank's code as the handle's own are (a slot's
    descriptor, `type(dist)._handle`, reads the slot around the handle's guard), and so is its __dict__ (every
    descriptor). A lookup on an instance does not come here: the guard costs the engine's own calls nothing."""

    def __getattribute__(cls, name: str):
        if _private_to_a_rank(name):
            refuse_reach(cls, name)
        return type.__getattribute__(cls, name)


class EngineHandle(metaclass=_HandleClass):
    """An object the learner's code is handed (the stand-in for its dist or a work handle, lib.guard.handles; an
    answer key's guard) whose private attributes lead to the simulator's own state: every rank's inputs and the rank's
    meters (bytes sent, memory, FLOPs, clock). Inside a simulated rank the learner's code may use its public API only;
    the engine's and torch's code may use it all."""

    __slots__ = ()

    def __getattribute__(self, name: str):
        if name.startswith("_") and (not name.startswith("__") or name in _UNPACKERS) and current_rank() is not None \
                and _from_learner():
            refuse_reach(self, name)
        return object.__getattribute__(self, name)


class _EngineModule(types.ModuleType):
    """A module of the engine: its private names (the originals of what lib.guard.boundary guards, the ranks' registry,
    the refusals' state) and its __dict__ are refused to a rank's code, as an engine handle's private attributes are."""

    def __getattribute__(self, name: str):
        if _private_to_a_rank(name):
            refuse_reach(self, name)
        return types.ModuleType.__getattribute__(self, name)


_ENGINE_PACKAGE = __name__.partition(".")[0]
_engine_modules_seen: tuple[int, list] = (0, [])


def _engine_modules() -> list[types.ModuleType]:
    """Every loaded module of the engine (looked for again only when a module was imported since)."""
    global _engine_modules_seen
    if len(sys.modules) != _engine_modules_seen[0]:
        found = [module for name, module in list(sys.modules.items()) if type(module) is types.ModuleType
                 and (name == _ENGINE_PACKAGE or name.startswith(_ENGINE_PACKAGE + "."))]
        _engine_modules_seen = (len(sys.modules), found)
    return _engine_modules_seen[1]


def refuse_reach(handle: object, name: str) -> None:
    """Stop the rank whose code reached `name` of an engine handle (EngineHandle), its class or an engine module,
    naming the learner's line."""
    if isinstance(handle, types.ModuleType):
        owner = handle.__name__
    elif isinstance(handle, type):
        owner = f"type({_AS_HANDED.get(handle.__name__, handle.__name__)})"
    else:
        owner = _AS_HANDED.get(type(handle).__name__, type(handle).__name__)
    fail_run(OutOfView(f"rank {current_rank()} reached {owner}.{name}{learner_line()}: {_HANDLES}"))


# The engine's handles by the names a learner's code knows them (never the engine's class names)
_AS_HANDED = {"SimDist": "dist", "Work": "work", "StepFeed": "feed"}


# What hands out an object's private state whole: its __dict__, and pickling's view of it (a feed's __reduce__ returns
# its values and its position; object.__getstate__ its slots)
_UNPACKERS = frozenset({"__dict__", "__reduce__", "__reduce_ex__", "__getstate__"})
_HANDLES = ("behind the objects a check hands your function (dist; work, a handle async_op=True returns; feed, a "
            "feed of inputs) and the "
            "simulator's private names lie its own state (every rank's inputs, the rank's meters, what is yet to "
            "come), not the rank's to read or change.\nHint: use their public calls only (dist's as "
            "torch.distributed has them).")


_FRAMES = ("the frames below your function are the simulator's own: they hold every rank's inputs and the rank's "
           "meters.\nHint: use only the arguments your function receives; get other ranks' data through dist.")
_METERS = ("the simulator's dispatch mode is the rank's meter (memory, FLOPs, time): not the rank's to read or "
           "change.\nHint: compute with torch's ordinary ops; the check measures them.")


def _composing_enter(original_enter: Callable) -> Callable:
    """saved_tensors_hooks.__enter__ that, inside a rank, composes a learner's hooks with the check's measuring
    hooks below them (only the innermost hooks apply: nesting would otherwise hide saved tensors from the check)."""
    @_standing_in_for(original_enter)
    def enter(self):
        if current_rank() is not None and _from_learner():
            top = torch._C._autograd._top_saved_tensors_default_hooks(False)
            if top is not None and getattr(top[0], "_lib_measure", False):
                outer, inner = top[0], self.pack_hook
                self.pack_hook = lambda t: inner(outer(t))
        return original_enter(self)
    enter._lib_sim_patch = True
    return enter


def _counting(original: Callable, what: str) -> Callable:
    @_standing_in_for(original)
    def counted(self, *args, **kwargs):
        tracker = current_tracker()
        if tracker is not None:
            tracker.check_read(self, what)
        out = original(self, *args, **kwargs)
        if tracker is not None:
            n = self.numel() if isinstance(self, torch.Tensor) else self.nbytes()
            tracker.keep_outside(n * (PYTHON_NUMBER_BYTES + LIST_SLOT_BYTES), what)
        return out
    counted._lib_sim_patch = True
    return counted


def _storage_new(original_new: Callable) -> Callable:
    def new(cls, *args, **kwargs):
        storage = original_new(cls, *args, **kwargs)
        tracker = current_tracker()
        if tracker is not None:
            tracker.adopt_storage(storage)
        return storage
    new._lib_sim_patch = True
    return staticmethod(new)


def _storage_resize(original: Callable) -> Callable:
    @_standing_in_for(original)
    def resize(self, size):
        tracker = current_tracker()
        if tracker is not None:
            tracker.check_write(self, torch.ops.aten.resize_.default)
        out = original(self, size)
        if tracker is not None:
            tracker.adopt_storage(self, resized=True)
        return out
    resize._lib_sim_patch = True
    return resize


class _Patch(NamedTuple):
    """One attribute guarded while a run lasts: `make(original)` is what stands in for it."""

    owner: object
    name: str
    make: Callable[[Callable], object]


def _table() -> list[_Patch]:
    """Every attribute the simulator guards while ranks run, with what stands in for it."""
    gpu = "On a GPU this fails for a tensor in device memory. "
    off = "switching off the simulator's tracking of ops"
    raw = "(a raw address)"
    refuse = _refusing_from_learner
    table = [_Patch(torch.Tensor, "numpy", lambda o: _refusing(o, "Tensor.numpy()", gpu)),
             _Patch(torch.Tensor, "__array__", lambda o: _refusing(o, "numpy on a tensor (Tensor.__array__)", gpu)),
             _Patch(torch.Tensor, "__dlpack__", lambda o: _refusing(o, "Tensor.__dlpack__ (DLPack export)")),
             _Patch(torch, "save", lambda o: _refusing(o, "torch.save")),
             _Patch(torch.serialization, "save", lambda o: _refusing(o, "torch.save")),
             _Patch(torch.Tensor, "tolist", lambda o: _counting(o, "Tensor.tolist()")),
             _Patch(torch.UntypedStorage, "tolist", lambda o: _counting(o, "UntypedStorage.tolist()")),
             _Patch(torch.UntypedStorage, "__new__", _storage_new),
             _Patch(torch.UntypedStorage, "resize_", _storage_resize),
             _Patch(threading.Thread, "start", lambda o: refuse(o, "threading.Thread.start (a thread of its own)",
                                                                 _HIDDEN_WORK)),
             _Patch(_thread, "start_new_thread", lambda o: refuse(o, "_thread.start_new_thread", _HIDDEN_WORK)),
             _Patch(torch.autograd.graph.saved_tensors_hooks, "__enter__", _composing_enter),
             _Patch(inspect, "getattr_static", lambda o: refuse(o, "inspect.getattr_static (attributes read around "
                                                                   "their guards)", _HANDLES)),
             _Patch(torch, "frombuffer", lambda o: refuse(o, "torch.frombuffer (a tensor over bytes outside torch)",
                                                          _OUT_OF_VIEW))]
    for cls, name in ((torch.Tensor, "data_ptr"), (torch.Tensor, "const_data_ptr"), (torch.UntypedStorage, "data_ptr"),
                      (torch.TypedStorage, "data_ptr"), (torch.TypedStorage, "_data_ptr")):
        if not hasattr(cls, name):       # Tensor.const_data_ptr is newer than torch 2.11
            continue
        table.append(_Patch(cls, name, functools.partial(
            _refused_as, f"{cls.__name__}.{name}() {raw}", "ctypes reads the bytes there into numpy. " + _OUT_OF_VIEW)))
    for cls in (torch.UntypedStorage, torch.TypedStorage):
        table.append(_Patch(cls, "__reduce__", lambda o: _refusing(o, "pickle on a tensor's storage (pickle.dumps or "
                                                                      "torch.save)")))
        # Storage bytes written to a Python buffer or a file, and storages made over such bytes, are memory the
        # tracker cannot see: refused like numpy.
        table.append(_Patch(cls, "_write_file", functools.partial(
            _refused_as, f"{cls.__name__}._write_file (its bytes into a buffer or a file)", _OUT_OF_VIEW)))
        for name in ("from_buffer", "from_file"):
            table.append(_Patch(cls, name, lambda o, what=f"{cls.__name__}.{name} (a storage over bytes outside torch)":
                                staticmethod(refuse(o, what, _OUT_OF_VIEW))))
    for module, name in ((torch._C, "_DisableTorchDispatch"), (torch._C, "_pop_torch_dispatch_stack"),
                         (torch._C, "_unset_dispatch_mode"), (torch._C, "_dispatch_tls_set_dispatch_key_excluded"),
                         (torch._C, "_ExcludeDispatchKeyGuard"), (python_dispatch, "_disable_current_modes"),
                         (python_dispatch, "_pop_mode"), (python_dispatch, "_pop_mode_temporarily"),
                         (python_dispatch, "_pop_torch_dispatch_stack"),
                         (torch.autograd.graph, "disable_saved_tensors_hooks")):
        table.append(_Patch(module, name, functools.partial(_refused_as, f"{module.__name__}.{name} ({off})",
                                                            _HIDDEN_WORK)))
    for module, name in ((python_dispatch, "_get_current_dispatch_mode_stack"),
                         (python_dispatch, "_get_current_dispatch_mode"), (torch._C, "_get_dispatch_stack_at"),
                         (torch._C, "_get_dispatch_mode")):
        table.append(_Patch(module, name, functools.partial(_refused_as, f"{module.__name__}.{name} (the "
                                                            "dispatch-mode stack)", _METERS)))
    return table


def _refused_as(what: str, why: str, original: Callable) -> Callable:
    return _refusing_from_learner(original, what, why)


_ABSENT = object()


class _Installed:
    """The patches in place while a run lasts, or a rank's thread that could not be stopped lives: what each attribute
    held before (its own value in its owner's __dict__, or _ABSENT where it was inherited), and the engine's modules
    made _EngineModules."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs = 0                                   # runs under way
        self.left_running: list[threading.Thread] = []   # ranks' threads that would not stop
        self.saved: list[tuple[object, str, object]] = []
        self.made: dict[tuple[int, str], tuple[object, object]] = {}     # (owner, name) -> (its own, stand-in)
        self.modules: list[types.ModuleType] = []

    def enter(self) -> None:
        with self.lock:
            if self.saved and self.runs == 0 and not self.left_running:
                raise OutOfView("the simulator's record of its guards was changed between runs (lib.guard.boundary's "
                                "_INSTALLED): its guards would stay off. Restart the kernel and run the notebook "
                                "from the top.")
            if not self.saved:
                try:
                    self._install()
                except BaseException:              # a patch that cannot be made: none of them stays
                    self._restore()
                    raise
            self.runs += 1

    def leave(self, left_running: Sequence[threading.Thread] = ()) -> None:
        with self.lock:
            self.runs -= 1
            self.left_running = [t for t in (*self.left_running, *left_running) if t.is_alive()]
            if self.runs == 0 and not self.left_running:
                self._restore()

    def _install(self) -> None:
        global _TABLE
        if _TABLE is None:
            _TABLE = _table()
        for patch in _TABLE:
            own = patch.owner.__dict__.get(patch.name, _ABSENT)
            key = (id(patch.owner), patch.name)
            made = self.made.get(key)
            if made is None or made[0] is not own:           # first run, or changed since: stand in for it anew
                made = self.made[key] = (own, patch.make(getattr(patch.owner, patch.name)))
            self.saved.append((patch.owner, patch.name, own))
            setattr(patch.owner, patch.name, made[1])
        self.modules = _engine_modules()
        for module in self.modules:
            module.__class__ = _EngineModule

    def _restore(self) -> None:
        while self.saved:                              # each entry gone once put back: an interrupted restore resumes
            owner, name, own = self.saved[-1]
            if own is _ABSENT:
                if name in owner.__dict__:
                    delattr(owner, name)
            else:
                setattr(owner, name, own)
            self.saved.pop()
        for module in self.modules:
            module.__class__ = types.ModuleType
        self.modules = []


_TABLE: Optional[list[_Patch]] = None
_INSTALLED = _Installed()
# What each run rebinds (tools.fingerprint counts these as present only, the rest of the module by identity).
__run_state__ = ("_TABLE", "_INSTALLED", "_engine_modules_seen")


class guarding:
    """The boundary in place for one run: every patch of _table() and the engine's modules guarded on entry, each
    attribute as it was again on exit, once no other run is under way and no rank's thread that could not be stopped
    still runs (`left_running`, said before the exit: that thread runs the rank's code)."""

    def __init__(self) -> None:
        self.left_running: list[threading.Thread] = []

    def __enter__(self) -> "guarding":
        _INSTALLED.enter()
        return self

    def __exit__(self, *_exc) -> None:
        _INSTALLED.leave(self.left_running)


def patched_attributes() -> list[tuple[object, str]]:
    """(owner, name) of every attribute a run patches, for the tests that check they are restored."""
    return [(p.owner, p.name) for p in _TABLE or _table()]


