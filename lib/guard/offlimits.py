"""What the learner's function may not call while it runs: a puzzle's answer is derived, not looked up.

Two refusals, both by code object (a function is known by its code, and a copy of that code run under another name
by its fingerprint: its bytecode, names and constants, docstring included):
- a puzzle's answer keys, for every puzzle: what computes its expected answers, found in the case builder's code (the
  functions of its own package it calls, and theirs), and every formula of lib.analytic.formulas but the tools a
  notebook hands its learners (a Puzzle's `tools`, formulas.HANDED_TO_LEARNERS). Each is guarded once, at the first
  case built: called by a simulated rank's own code, it stops the run; called by the check's or a puzzle's code, or
  outside a rank, it is what it always was. The guard costs a rank nothing until it calls one.
- what a puzzle names (`off_limits`: building a module, the formula library, the measuring tools, a C function):
  while the learner's function runs, a profile hook on that thread stops the first call into any of them, and into
  the helpers of its own module a named function calls. A C function (numpy's) is seen when Python calls it;
  numpy's public ones run a Python dispatcher first (which arguments may override them), and that call is the one
  seen. The hook costs every call a look, so only the puzzles that name something (predictions, on tiny cases) pay.
Inside a simulated rank neither refusal can be caught or lifted: the run stops (lib.guard.boundary), and only the
engine may set or unset a profiler there (lib.guard.audit).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import sys
import threading
import types
from contextlib import contextmanager
from types import CodeType, FrameType, FunctionType, ModuleType
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

from lib.errors import PuzzleError
from lib.whose_code import COURSE, LIBRARIES
from lib.guard import audit
from lib.guard.audit import caller_file
from lib.guard.boundary import EngineHandle
from lib.sim.context import current_rank, fail_run
from lib.sim.errors import OutOfView
from lib.sim.ownership import learner_line

# What a prediction puzzle may not call: building any module (nn.Module.__init__, also on the meta device) and
# the library's own formulas, measurements and planner, which hold the answers.
MODULE_INIT = torch.nn.Module.__init__
FORMULAS = "lib.analytic.formulas"                 # the course's formulas: each answers some prediction
_SETPROFILE, _GETPROFILE = sys.setprofile, sys.getprofile       # the originals, before a watch refuses them


class OffLimits(PuzzleError):
    """The learner's function called something its puzzle puts out of reach (e.g. a formula that is the answer)."""


def tool(fn: Callable) -> Callable:
    """Mark `fn` as handed to the learner (a notebook imports it for them by name: a Puzzle's `tools`), or as
    computing no answer (lib.analytic.formulas.NO_ANSWER): never an answer key."""
    fn._never_an_answer_key = True
    return fn


# ---- code: whose it is, what it calls, its fingerprint ------------------------------------------------------------
def _codes(code: CodeType) -> Iterator[CodeType]:
    """`code` and the code of every function, class body and lambda defined in it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


def _fingerprint(code: CodeType) -> tuple:
    """What a copy of `code` (its source exec'd under another name, in another file) has in common with it: the names
    it uses, its variables and its constants, docstring included (not its bytecode, which the compiler lays out
    differently from one source position to another)."""
    consts = tuple(_fingerprint(c) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.co_names, code.co_varnames, code.co_argcount, code.co_kwonlyargcount, consts


def _distinctive(code: CodeType) -> bool:
    """Whether a learner could not write `code` without copying it: it has a docstring, or many names."""
    return bool(code.co_consts and isinstance(code.co_consts[0], str)) or len(code.co_names + code.co_varnames) >= 12


def _callees(fn: FunctionType, within: tuple[str, ...]) -> Iterator[FunctionType]:
    """The Python functions defined in files under `within` that `fn`'s code names: global names, names imported in
    its body, and attributes named after a module it names (`formulas.expert_capacity`)."""
    scope = fn.__globals__
    for code in _codes(_code_of(fn)):
        names = code.co_names
        modules = [m for m in (scope.get(n, sys.modules.get(n)) for n in names) if isinstance(m, ModuleType)]
        for name in names:
            for found in (scope.get(name), *(getattr(m, name, None) for m in modules)):
                found = _unwrapped(found)
                if isinstance(found, FunctionType) and found.__code__.co_filename.startswith(within):
                    yield found


def _unwrapped(value: Any) -> Any:
    """The function behind a method or a decorator's wrapper (functools.wraps, lru_cache), or `value` itself."""
    value = getattr(value, "__func__", value) if isinstance(value, (staticmethod, classmethod, types.MethodType)) \
        else value
    if isinstance(value, FunctionType) or type(value).__name__ == "_lru_cache_wrapper":
        value = inspect.unwrap(value)
    return value


def _reached(roots: Iterable[FunctionType], within: tuple[str, ...]) -> set[FunctionType]:
    """`roots` and every function under `within` they call, and theirs."""
    seen, todo = set(), list(roots)
    while todo:
        fn = todo.pop()
        if fn not in seen:
            seen.add(fn)
            todo.extend(_callees(fn, within))
    return seen


def _code_of(fn: FunctionType) -> CodeType:
    """`fn`'s own code: an answer key's (guarded) is its original's, not its trampoline's."""
    key = (fn.__kwdefaults__ or {}).get("_lib_answer_key")
    return _ORIGINAL.__get__(key).__code__ if isinstance(key, _AnswerKey) else fn.__code__


def _package_dir(module_name: str) -> tuple[str, ...]:
    """The directory of `module_name`'s top-level package, as lib.whose_code writes directories (or the module's file,
    for a module of no package; nothing, for a notebook's)."""
    top = sys.modules.get(module_name.partition(".")[0])
    file = getattr(top, "__file__", None)
    if file is None:
        return ()
    if getattr(top, "__path__", None):
        where = os.path.dirname(file)
        return tuple({os.path.join(where, ""), os.path.join(os.path.realpath(where), "")})
    return tuple({file, os.path.realpath(file)})


def _module_functions(module: ModuleType) -> Iterator[FunctionType]:
    """The functions defined in `module` (methods of its classes included)."""
    for value in vars(module).values():
        for found in (vars(value).values() if isinstance(value, type) else (value,)):
            found = _unwrapped(found)
            if isinstance(found, FunctionType) and found.__code__.co_filename == module.__file__:
                yield found


# ---- answer keys: guarded for good, refused to a rank's own code -------------------------------------------------
_GUARDED_BUILDERS: set = set()
_COPIES: dict[tuple, str] = {}             # an answer key's fingerprint -> its name
_TRAMPOLINE = next(c for c in compile("def key(*args, _lib_answer_key=None, **kwargs):\n"
                                      "    return _lib_answer_key(args, kwargs)\n", "<answer key>", "exec").co_consts
                   if isinstance(c, CodeType))


def guard_answer_keys(builder: Callable) -> None:
    """Guard the answer keys of a puzzle whose cases `builder` makes (once per builder): from now on, each refuses a
    simulated rank's own code. Called at the first case built, when every function of the builder's module exists."""
    while isinstance(builder, functools.partial):     # a builder bound to some of its arguments: its function's
        builder = builder.func
    if builder in _GUARDED_BUILDERS:
        return
    _GUARDED_BUILDERS.add(builder)
    audit.watch_exec(refuse_copies)
    formulas = importlib.import_module(FORMULAS)
    for name in formulas.HANDED_TO_LEARNERS + formulas.NO_ANSWER:
        tool(getattr(formulas, name))
    keys = _reached([inspect.unwrap(builder)], _package_dir(builder.__module__) + (formulas.__file__,))
    keys |= set(_module_functions(formulas))
    for fn in keys - {inspect.unwrap(builder)}:
        if not getattr(fn, "_never_an_answer_key", False):
            _guard(fn)


def _guard(fn: FunctionType) -> None:
    """Make `fn` an answer key in place (every reference to it sees the guard): its code becomes a trampoline to a
    copy of it, which a rank's own code may not call. Its signature, source and line numbers stay its own."""
    if _code_of(fn) is not fn.__code__ or fn.__closure__ is not None:   # guarded already, or a nested function
        return
    label = f"{fn.__module__}.{fn.__qualname__}"
    original = FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__)
    original.__kwdefaults__, original.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    fn.__signature__ = inspect.signature(fn)
    for code in _codes(fn.__code__):
        if _distinctive(code):
            _COPIES.setdefault(_fingerprint(code), label)
    fn.__code__ = _TRAMPOLINE.replace(co_name=fn.__name__, co_qualname=fn.__qualname__,
                                      co_filename=fn.__code__.co_filename, co_firstlineno=fn.__code__.co_firstlineno)
    fn.__defaults__, fn.__kwdefaults__ = None, {"_lib_answer_key": _AnswerKey(original, label)}


class _AnswerKey(EngineHandle):
    """What an answer key's trampoline calls: the function itself, unless a rank's own code called it. An engine
    handle: the rank's code may not read the original it holds."""

    __slots__ = ("_original", "_label")

    def __init__(self, original: FunctionType, label: str) -> None:
        self._original, self._label = original, label

    def __call__(self, args: tuple, kwargs: dict):
        if current_rank() is not None and _called_by_the_rank():
            _refuse(current_rank(), f"called {_LABEL.__get__(self)}")
        return _ORIGINAL.__get__(self)(*args, **kwargs)


_ORIGINAL, _LABEL = _AnswerKey._original, _AnswerKey._label     # the slots' descriptors: no guard on each call


def _called_by_the_rank() -> bool:
    """Whether the code that called the answer key (Python's library and torch passed through) is not the course's
    own (the engine's, the problem set's)."""
    file = caller_file(3, through=LIBRARIES, unless=COURSE)       # from the trampoline's caller down
    return file is not None and not file.startswith(COURSE)


def refuse_copies(code: CodeType) -> None:
    """Inside a simulated rank, code about to run by `exec` (lib.guard.audit.watch_exec): stop the run if it holds a
    copy
    of an answer key (inspect.getsource of one, exec'd under another name)."""
    for inner in _codes(code):
        label = _COPIES.get(_fingerprint(inner)) if _distinctive(inner) else None
        if label is not None:
            _refuse(current_rank(), f"ran a copy of {label} (exec'd from its source)")


_ANSWER_KEY = ("it computes the expected answer of a puzzle's check (an answer key), out of reach while your function "
               "runs.\nHint: compute your answer from the arguments your function receives.")


def _refuse(rank: int, what: str) -> None:
    fail_run(OutOfView(f"rank {rank} {what}{learner_line()}: {_ANSWER_KEY}"))


# ---- a puzzle's off-limits calls: watched while the learner's function runs ---------------------------------------
class _Watch:
    """The code objects that are off limits, each with the words that name it; copies of them by fingerprint; and
    the source files of modules named but not imported yet."""

    def __init__(self, targets: Mapping[str, Any]) -> None:
        self.codes: dict[CodeType, str] = {}
        self.files: dict[str, str] = {}
        self.builtins: dict[int, str] = {}           # C functions by id, seen at their c_call event
        for label, target in targets.items():
            if isinstance(target, str):          # a module by name, not imported until it is called
                self._watch_module_named(target, label)
            elif isinstance(target, ModuleType):
                self._watch_module(target, label)
            elif _is_c_function(target):
                self.builtins[id(target)] = label
            elif hasattr(target, "_implementation"):     # numpy's dispatcher over a C function
                self.builtins[id(target._implementation)] = label
                self.codes[_dispatcher_code(target)] = label
            else:
                fn = _unwrapped(target)
                if not isinstance(fn, FunctionType):
                    raise TypeError(f"{label}: only functions (Python's or C's) and modules can be put off limits, "
                                    f"not {type(target).__name__}")
                for helper in _reached([fn], (fn.__code__.co_filename,)):     # and the helpers of its module it calls
                    self._watch_code(helper, label)
        self.copies = {_fingerprint(code): label for code, label in self.codes.items() if _distinctive(code)}
        self.seen: dict[CodeType, str | None] = {}

    def _watch_code(self, fn: FunctionType, label: str) -> None:
        """`fn`'s code (its trampoline's too, for an answer key) and the code of every function defined in it."""
        for inner in (fn.__code__, *_codes(_code_of(fn))):
            self.codes.setdefault(inner, label)

    def _watch_module(self, module: ModuleType, label: str) -> None:
        """Every function of `module` (and of its submodules loaded so far), and its file or folder for the rest."""
        path = getattr(module, "__path__", None)
        self.files[os.path.join(list(path)[0], "") if path else module.__file__] = label
        prefix = module.__name__ + "."
        for name, loaded in list(sys.modules.items()):
            if (loaded is module or name.startswith(prefix)) and getattr(loaded, "__file__", None):
                for fn in _module_functions(loaded):
                    self._watch_code(fn, label)

    def _watch_module_named(self, name: str, label: str) -> None:
        if name in sys.modules:
            self._watch_module(sys.modules[name], label)
            return
        spec = importlib.util.find_spec(name)
        path = spec.submodule_search_locations
        self.files[os.path.join(list(path)[0], "") if path else spec.origin] = label

    def label_of(self, code: CodeType) -> str | None:
        label = self.codes.get(code)
        if label is not None:
            return label
        if code not in self.seen:
            self.seen[code] = self._file_label(code) or (self.copies.get(_fingerprint(code)) if _distinctive(code)
                                                          else None)
        return self.seen[code]

    def _file_label(self, code: CodeType) -> str | None:
        for where, label in self.files.items():
            if code.co_filename == where or (where.endswith(os.sep) and code.co_filename.startswith(where)):
                return label
        return None


_WATCHES: dict[int, tuple[Mapping, _Watch]] = {}


def _watch_of(targets: Mapping[str, Any]) -> _Watch:
    """The watch of `targets`, made once per puzzle (a prediction's check watches each of its runs)."""
    known = _WATCHES.get(id(targets))
    if known is None or known[0] is not targets:
        known = _WATCHES[id(targets)] = (targets, _Watch(targets))
    return known[1]


def _is_c_function(target: Any) -> bool:
    return type(target).__name__ == "builtin_function_or_method"


_DISPATCHERS: dict[int, CodeType] = {}


def _dispatcher_code(target: Any) -> CodeType:
    """The code of the Python dispatcher numpy runs before `target`'s C function: called once with placeholder
    arguments under a profile hook that notes the first Python call (the C function then refuses the arguments)."""
    if id(target) not in _DISPATCHERS:
        seen: list[CodeType] = []

        def note(frame: FrameType, event: str, _arg: Any) -> None:
            if event == "call" and not seen:
                seen.append(frame.f_code)
        try:
            counts = [sum(p.default is p.empty for p in inspect.signature(target).parameters.values())]
        except ValueError:      # a C function without a signature (numpy 2.1's unravel_index): 0 to 3 arguments
            counts = range(4)
        for count in counts:
            before = _GETPROFILE()
            _SETPROFILE(note)
            try:
                target(*[None] * count)
            except Exception:
                pass
            finally:
                _SETPROFILE(before)
            if seen:
                break
        if not seen:
            raise TypeError(f"{target!r}: no Python dispatcher runs before it, so it cannot be put off limits")
        _DISPATCHERS[id(target)] = seen[0]
    return _DISPATCHERS[id(target)]


def _named(label: str, frame: FrameType) -> str:
    """How the message names the call: the module's class being built, or the function called."""
    if frame.f_code is MODULE_INIT.__code__:
        built = type(frame.f_locals.get("self")).__name__
        return f"{label} ({built}(...))"
    name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    return label if name == "<module>" else f"{label} ({name})"


@contextmanager
def watching(targets: Mapping[str, Any], advice: str) -> Iterator[None]:
    """Within the block, on this thread, the first call into any of `targets` (label -> a function, a module or
    a module's dotted name; a package counts with all its modules) raises OffLimits with `advice`; so does
    switching the watch off."""
    if not targets:
        yield
        return
    watch = _watch_of(targets)

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            label = watch.label_of(frame.f_code)
            if label is not None:
                fail_run(OffLimits(f"this puzzle puts {_named(label, frame)} out of reach: {advice}."))
        elif event == "c_call" and id(arg) in watch.builtins:
            fail_run(OffLimits(f"this puzzle puts {watch.builtins[id(arg)]} ({arg.__name__}) out of reach: {advice}."))

    def refusing(*_a: Any, **_k: Any) -> None:
        fail_run(OffLimits(f"this puzzle's check watches which library calls your function makes; touching its watch "
                        f"(sys.setprofile, sys.getprofile, sys.settrace) is not allowed: {advice}."))

    # The hooks' setters and sys.getprofile are refused meanwhile: without the watch's own function, a setter
    # saved earlier can switch it off but not back on, which the end of the block notices (inside a simulated rank
    # no code but the engine's may set or unset a profiler at all: lib.guard.audit).
    get = sys.getprofile
    saved = get(), sys.setprofile, sys.settrace, threading.setprofile, threading.settrace
    sys.setprofile(profile)
    sys.setprofile = sys.settrace = threading.setprofile = threading.settrace = sys.getprofile = refusing
    try:
        yield
        if get() is not profile:
            fail_run(OffLimits(f"this puzzle's watch on library calls was switched off while your function ran: "
                            f"{advice}."))
    finally:
        sys.setprofile, sys.settrace, threading.setprofile, threading.settrace = saved[1:]
        sys.getprofile = get
        sys.setprofile(saved[0])


def call_watched(targets: Mapping[str, Any], advice: str, fn: Callable, *args: Any) -> Any:
    """fn(*args) under `watching(targets, advice)`."""
    with watching(targets, advice):
        return fn(*args)

