"""The edges a simulated rank could use to keep memory or work where the simulator cannot see it.

The tracker sees every op a rank runs, but a few calls move bytes in or out of torch without one, and a few
switch the tracker off or run work where it is not. Inside a simulated rank:
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
- looking at other threads' frames, the frames below the learner's function (sys._getframe, inspect's and
  traceback's frame walkers, an exception's or generator's frame), the garbage collector's objects or the
  dispatch-mode stack is refused: that is where the check's cases, the other ranks' inputs and the rank's own
  meters (its tracker: peak memory, FLOPs) live. Those Python's C code reaches are refused by an audit hook
  (lib.sim.audit), which no patch's original walks around;
- `.tolist()` of a tensor another rank made, or of the run's originals, is refused as any op reading it is;
- the engine's own objects: the private names of its modules (the originals these patches keep, the ranks'
  registry) and of the classes of the handles a rank holds (a slot's descriptor reads around the handle's guard),
  `inspect.getattr_static` (which reads around every guard), and the engine's untracked block;
- opening a file is refused: what goes through a file is neither counted nor sent (a rank could leave its data
  there for another, as processes of one machine could, but not ranks on different machines).
Outside a simulated rank, and for torch's and the engine's own calls, every patch does exactly what torch does.
"""

from __future__ import annotations

import _thread
import builtins
import functools
import io
import inspect
import os
import sys
import threading
import traceback
import types
from typing import Callable

import torch
import torch.autograd.graph
import torch.utils._python_dispatch as python_dispatch

from lib.sim import audit
from lib.sim.context import current_rank, current_runtime, current_tracker
from lib.sim.errors import OutOfView
from lib.places import ENGINE, LIBRARIES
from lib.sim.tracker import LIST_SLOT_BYTES, PYTHON_NUMBER_BYTES

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
            from lib.sim.ownership import learner_line
            fail_run(OutOfView(f"rank {rank} called {what}{learner_line()}. {gpu_note}{_OUT_OF_VIEW}"))
        return original(self, *args, **kwargs)
    refused._lib_sim_patch = True
    return refused


_DISABLE_TORCH_DISPATCH = torch._C._DisableTorchDispatch      # the engine's own, before install() guards it


def untracked():
    """The engine's own work inside a rank (message copies, reductions): torch's Python dispatch switched off,
    so the tracker does not count it. Five times cheaper than telling the tracker to ignore the op. Refused to the
    rank's own code, whose work it would hide."""
    if current_rank() is not None and _from_learner():
        from lib.sim.ownership import learner_line
        fail_run(OutOfView(f"rank {current_rank()} called lib.sim.boundary.untracked() (switching off the simulator's "
                        f"tracking of ops){learner_line()}: {_HIDDEN_WORK}"))
    return _DISABLE_TORCH_DISPATCH()


_DISPATCH_STACK_AT = torch._C._get_dispatch_stack_at           # the engine's own, before install() guards it


def tracking_switched_off(tracker) -> str:
    """What, if anything, stops `tracker` from seeing the ops of this thread: '' when it sees them all."""
    if torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Python):
        return "torch's Python dispatch is switched off"
    if not any(_DISPATCH_STACK_AT(i) is tracker for i in range(torch._C._len_torch_dispatch_stack())):
        return "the simulator's dispatch mode was taken off the stack"
    return ""


_getframe = sys._getframe                                      # the engine's own, before install() guards it


_ENGINE_CODE: dict = {}           # code object -> whether it is the engine's or torch's: asked at every dist call


def _engine_code(code) -> bool:
    known = _ENGINE_CODE.get(code)
    if known is None:
        if len(_ENGINE_CODE) > 100_000:              # notebook cells run again make new code objects
            _ENGINE_CODE.clear()
        known = _ENGINE_CODE[code] = code.co_filename.startswith(ENGINE)
    return known


def _from_learner(depth: int = 2) -> bool:
    """Whether the function `depth` frames up was called by the learner's code, not torch's or the engine's."""
    return not _engine_code(_getframe(depth).f_code)


_FRAME_GIVERS = {inspect.currentframe.__code__, inspect.stack.__code__, traceback.walk_stack.__code__}


def _guarded_getframe(depth: int = 0):
    """sys._getframe, refused inside a simulated rank where it would hand the learner's code a frame: called by
    that code itself, or by inspect.currentframe/inspect.stack/traceback.walk_stack called by it. Python's library
    reading frames for its own bookkeeping (logging, namedtuple, typing) still may."""
    if current_rank() is not None:
        caller = _getframe(1)
        asked_by = caller.f_back if caller.f_code in _FRAME_GIVERS and caller.f_back is not None else caller
        if not asked_by.f_code.co_filename.startswith(LIBRARIES):
            from lib.sim.ownership import learner_line
            name = caller.f_code.co_name if asked_by is not caller else "_getframe"
            what = f"{'sys' if name == '_getframe' else caller.f_globals.get('__name__', '')}.{name}"
            fail_run(OutOfView(f"rank {current_rank()} called {what}{learner_line()}: {_FRAMES}"))
    return _getframe(depth + 1)


_guarded_getframe._lib_sim_patch = True


def _refusing_from_learner(original: Callable, what: str, why: str) -> Callable:
    """`original`, refused when the learner's code calls it inside a simulated rank."""
    @_standing_in_for(original)
    def guarded(*args, **kwargs):
        rank = current_rank()
        if rank is not None and _from_learner():
            from lib.sim.ownership import learner_line
            fail_run(OutOfView(f"rank {rank} called {what}{learner_line()}: {why}"))
        return original(*args, **kwargs)
    guarded._lib_sim_patch = True
    return guarded


_HIDDEN_WORK = ("work there runs outside the simulator's view, so its time, FLOPs and memory would not count.\n"
                "Hint: compute in your function's own thread, with torch's ordinary ops.")
_FILES = ("the simulator does not see what goes through a file, and ranks on different machines share none.\n"
          "Hint: pass data between ranks with dist, and keep what a rank needs in tensors of its own.")

class _HandleClass(type):
    """The class of an engine handle: its private names are refused to a rank's code as the handle's own are (a slot's
    descriptor, `type(dist)._engine`, reads the slot around the handle's guard), and so is its __dict__ (every
    descriptor). A lookup on an instance does not come here: the guard costs the engine's own calls nothing."""

    def __getattribute__(cls, name: str):
        if name.startswith("_") and (not name.startswith("__") or name == "__dict__") and current_rank() is not None \
                and _from_learner():
            refuse_reach(cls, name)
        return type.__getattribute__(cls, name)


class EngineHandle(metaclass=_HandleClass):
    """An object the learner's code is handed (its dist, a work handle) whose private attributes lead to the
    simulator's own state: every rank's inputs and the rank's meters (bytes sent, memory, FLOPs, clock). Inside a
    simulated rank the learner's code may use its public API only; the engine's and torch's code may use it all."""

    __slots__ = ()

    def __getattribute__(self, name: str):
        if name.startswith("_") and (not name.startswith("__") or name in _UNPACKERS) and _from_learner() \
                and current_rank() is not None:
            refuse_reach(self, name)
        return object.__getattribute__(self, name)


class _EngineModule(types.ModuleType):
    """A module of the engine: its private names (the originals of what lib.sim.boundary guards, the ranks' registry,
    the refusals' state) and its __dict__ are refused to a rank's code, as an engine handle's private attributes are."""

    def __getattribute__(self, name: str):
        if name.startswith("_") and (not name.startswith("__") or name == "__dict__") and current_rank() is not None \
                and _from_learner():
            refuse_reach(self, name)
        return types.ModuleType.__getattribute__(self, name)


_ENGINE_PACKAGE = __name__.partition(".")[0]
_modules_seen = 0


def guard_engine_modules() -> None:
    """Make every loaded module of the engine an _EngineModule (at each run's start: a module imported since is
    guarded from the next run on)."""
    global _modules_seen
    if len(sys.modules) == _modules_seen:
        return
    for name, module in list(sys.modules.items()):
        if (name == _ENGINE_PACKAGE or name.startswith(_ENGINE_PACKAGE + ".")) and type(module) is types.ModuleType:
            module.__class__ = _EngineModule
    _modules_seen = len(sys.modules)


def refuse_reach(handle: object, name: str) -> None:
    """Stop the rank whose code reached `name` of an engine handle (EngineHandle), its class or an engine module,
    naming the learner's line."""
    from lib.sim.ownership import learner_line
    owner = handle.__name__ if isinstance(handle, (type, types.ModuleType)) else type(handle).__name__
    fail_run(OutOfView(f"rank {current_rank()} reached {owner}.{name}{learner_line()}: {_HANDLES}"))


# What hands out an object's private state whole: its __dict__, and pickling's view of it (a feed's __reduce__ returns
# its values and its position; object.__getstate__ its slots)
_UNPACKERS = frozenset({"__dict__", "__reduce__", "__reduce_ex__", "__getstate__"})
_HANDLES = ("behind the objects a check hands your function (dist, its work handles, a feed of inputs) and the "
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


def fail_run(error: Exception) -> None:
    """Stop the simulated run of this thread's rank with `error` (the rank's code cannot catch it); outside a run,
    raise it."""
    runtime = current_runtime()
    if runtime is None:
        raise error
    runtime.fail(error)


def install() -> None:
    """Patch torch once (at import of lib.sim); idempotent."""
    if getattr(torch.Tensor.numpy, "_lib_sim_patch", False):
        return
    gpu = "On a GPU this fails for a tensor in device memory. "
    torch.Tensor.numpy = _refusing(torch.Tensor.numpy, "Tensor.numpy()", gpu)
    torch.Tensor.__array__ = _refusing(torch.Tensor.__array__, "numpy on a tensor (Tensor.__array__)", gpu)
    torch.Tensor.__dlpack__ = _refusing(torch.Tensor.__dlpack__, "Tensor.__dlpack__ (DLPack export)")
    for cls, name in ((torch.Tensor, "data_ptr"), (torch.Tensor, "const_data_ptr"), (torch.UntypedStorage, "data_ptr"),
                      (torch.TypedStorage, "data_ptr"), (torch.TypedStorage, "_data_ptr")):
        if not hasattr(cls, name):       # Tensor.const_data_ptr is newer than torch 2.11
            continue
        setattr(cls, name, _refusing_from_learner(getattr(cls, name), f"{cls.__name__}.{name}() (a raw address)",
                                                  "ctypes reads the bytes there into numpy. " + _OUT_OF_VIEW))
    for cls in (torch.UntypedStorage, torch.TypedStorage):
        cls.__reduce__ = _refusing(cls.__reduce__, "pickle on a tensor's storage (pickle.dumps or torch.save)")
    save = _refusing(lambda obj, *a, **k: _original_save(obj, *a, **k), "torch.save")
    torch.save = torch.serialization.save = save
    torch.Tensor.tolist = _counting(torch.Tensor.tolist, "Tensor.tolist()")
    torch.UntypedStorage.tolist = _counting(torch.UntypedStorage.tolist, "UntypedStorage.tolist()")
    torch.UntypedStorage.__new__ = _storage_new(torch._C.StorageBase.__new__)
    torch.UntypedStorage.resize_ = _storage_resize(torch.UntypedStorage.resize_)
    hide = "a thread of its own"
    threading.Thread.start = _refusing_from_learner(threading.Thread.start, "threading.Thread.start (" + hide + ")",
                                                    _HIDDEN_WORK)
    _thread.start_new_thread = _refusing_from_learner(_thread.start_new_thread, "_thread.start_new_thread",
                                                      _HIDDEN_WORK)
    off = "switching off the simulator's tracking of ops"
    for module, name in ((torch._C, "_DisableTorchDispatch"), (torch._C, "_pop_torch_dispatch_stack"),
                         (torch._C, "_unset_dispatch_mode"), (torch._C, "_dispatch_tls_set_dispatch_key_excluded"),
                         (torch._C, "_ExcludeDispatchKeyGuard"), (python_dispatch, "_disable_current_modes"),
                         (python_dispatch, "_pop_mode"), (python_dispatch, "_pop_mode_temporarily"),
                         (python_dispatch, "_pop_torch_dispatch_stack"),
                         (torch.autograd.graph, "disable_saved_tensors_hooks")):
        setattr(module, name, _refusing_from_learner(getattr(module, name), f"{module.__name__}.{name} ({off})",
                                                     _HIDDEN_WORK))
    torch.autograd.graph.saved_tensors_hooks.__enter__ = _composing_enter(
        torch.autograd.graph.saved_tensors_hooks.__enter__)
    inspect.getattr_static = _refusing_from_learner(inspect.getattr_static, "inspect.getattr_static (attributes "
                                                    "read around their guards)", _HANDLES)
    audit.install()            # the collector's lists, other threads' frames, tracebacks' and generators' frames
    sys._getframe = _guarded_getframe
    for module, name in ((python_dispatch, "_get_current_dispatch_mode_stack"),
                         (python_dispatch, "_get_current_dispatch_mode"), (torch._C, "_get_dispatch_stack_at"),
                         (torch._C, "_get_dispatch_mode")):
        setattr(module, name, _refusing_from_learner(getattr(module, name), f"{module.__name__}.{name} (the "
                                                     "dispatch-mode stack)", _METERS))
    # Storage bytes written to a Python buffer or a file, and tensors made over such bytes, are memory the
    # tracker cannot see: refused like numpy.
    for cls in (torch.UntypedStorage, torch.TypedStorage):
        cls._write_file = _refusing_from_learner(cls._write_file, f"{cls.__name__}._write_file (its bytes into a "
                                                 "buffer or a file)", _OUT_OF_VIEW)
        for name in ("from_buffer", "from_file"):
            setattr(cls, name, staticmethod(_refusing_from_learner(
                getattr(cls, name), f"{cls.__name__}.{name} (a storage over bytes outside torch)", _OUT_OF_VIEW)))
    torch.frombuffer = _refusing_from_learner(torch.frombuffer, "torch.frombuffer (a tensor over bytes outside "
                                              "torch)", _OUT_OF_VIEW)
    builtins.open = io.open = _refusing_from_learner(builtins.open, "open (a file)", _FILES)
    os.open = _refusing_from_learner(os.open, "os.open (a file)", _FILES)


_original_save = torch.serialization.save
