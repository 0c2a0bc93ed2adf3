"""Inside the grading sandbox: run each puzzle of one notebook through its checker and report.

tools.grade starts `python -S -c BOOT NOTEBOOK_NAME` in the sandbox, with stdin holding a fresh
key, the notebook's cells and the puzzles to judge (the grader's list). Each result goes out on
stdout as one line, signed with the key (HMAC-SHA256), so that a line the learner's code writes
there does not count. Before any of the learner's code runs, the judge takes a fingerprint of the
checker (the course's modules, their classes and puzzles, builtins and torch's entry points); a
puzzle judged after the fingerprint changed is reported as tampered. In-process tampering is
detected, not prevented (README).
"""

from __future__ import annotations

import builtins
import hmac
import importlib
import io
import json
import os
import pkgutil
import sys
import types
from contextlib import redirect_stdout
from typing import Any, Callable, Iterator

KEY_BYTES = 32
# Bound when the judge is imported, before any learner code runs: replacing json.dumps, hmac.digest
# or os.write later does not change what the judge signs and writes.
_dumps, _digest, _write = json.dumps, hmac.digest, os.write
CACHES = {"__slotnames__"}          # attributes Python itself adds to a class (copy and pickle cache them)
STATUSES = ("solved", "failed", "not solved", "error", "missing", "tampered")
BOOT = """
import sys
sys.path[:0] = [{engine!r}] + {site!r}
from tools.judge import main
main(sys.argv[1])
"""


def sign(key: bytes, row: dict) -> bytes:
    """One result line: the HMAC of the row's JSON, a space, the JSON."""
    text = _dumps(row, sort_keys=True).encode()
    return _digest(key, text, "sha256").hex().encode() + b" " + text + b"\n"


def verified(key: bytes, line: bytes) -> dict | None:
    """The row a result line carries when its signature is right, else None."""
    mac, _, text = line.strip().partition(b" ")
    if not hmac.compare_digest(mac, hmac.digest(key, text, "sha256").hex().encode()):
        return None
    try:
        row = json.loads(text)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


# ---- the checker's fingerprint -------------------------------------------------------------------
def _attr(obj: Any, name: str) -> Any:
    try:                                             # some objects (torch.classes) raise on any lookup
        return getattr(obj, name, None)
    except Exception:
        return None


def _identity(value: Any) -> tuple:
    """What must stay the same for `value` to behave the same: the object, and a function's code and defaults."""
    fn = _attr(value, "__func__") or value           # staticmethod, classmethod, bound method
    return (id(value), id(_attr(fn, "__code__")), id(_attr(fn, "__defaults__")), id(_attr(fn, "__kwdefaults__")))


def _watched() -> Iterator[tuple[str, Any, bool]]:
    """(name, object, whether attributes added to it count) for everything a check relies on, each once."""
    import torch
    import torch.nn.functional
    ours = ("lib", "puzzles", "tools")
    seen: set[int] = set()

    def once(name: str, obj: Any, additions: bool) -> Iterator[tuple[str, Any, bool]]:
        if id(obj) not in seen:
            seen.add(id(obj))
            yield name, obj, additions

    for name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType) or name.split(".")[0] not in ours:
            continue
        yield from once(name, module, True)
        for attr, value in list(vars(module).items()):
            owner = _attr(value, "__module__") if isinstance(value, type) else type(value).__module__
            if isinstance(owner, str) and owner.split(".")[0] in ours and _attr(value, "__dict__") is not None \
                    and not isinstance(value, types.ModuleType):
                yield from once(f"{name}.{attr}", value, True)   # the course's classes, and objects such as a Puzzle
    for module in (builtins, torch, torch.nn.functional, json, hmac, os, io):
        yield from once(module.__name__, module, False)
    for cls in (torch.Tensor, torch.nn.Module, torch.nn.Parameter, hmac.HMAC):
        yield from once(f"{cls.__module__}.{cls.__qualname__}", cls, True)


def fingerprint() -> dict[str, tuple[dict[str, tuple], bool]]:
    return {name: ({attr: _identity(v) for attr, v in list(vars(obj).items())}, additions)
            for name, obj, additions in _watched()}


def changes(before: dict[str, tuple[dict[str, tuple], bool]]) -> list[str]:
    """What differs from the fingerprint `before`: replaced or removed attributes, and attributes added to
    the course's objects and to classes (a submodule imported meanwhile is not a change)."""
    found = []
    for name, obj, _ in _watched():
        if name not in before:
            continue
        then, additions = before[name]
        now = vars(obj)
        for attr, was in then.items():
            if attr not in now:
                found.append(f"{name}.{attr} removed")
            elif _identity(now[attr]) != was:
                found.append(f"{name}.{attr} replaced")
        if additions:
            found += [f"{name}.{attr} added" for attr, value in list(now.items())
                      if attr not in then and attr not in CACHES and not isinstance(value, types.ModuleType)]
    return found


# ---- judging -----------------------------------------------------------------------------------
def _status(evaluate: Callable, fn: Any) -> tuple[str, str]:
    with redirect_stdout(io.StringIO()):                 # the learner's prints are not the grader's output
        outcome = evaluate(fn)
    if outcome.ok:
        return "solved", ""
    return ("not solved" if outcome.status == "unattempted" else "failed"), outcome.message.splitlines()[0][:500]


def load_checker() -> None:
    """Import all that a check uses, so that the fingerprint taken next covers it."""
    import torch._dynamo                   # noqa: F401  (imported by the first check anyway; it rewraps torch.manual_seed)

    import lib.sim
    import puzzles                         # noqa: F401
    for found in pkgutil.iter_modules(lib.sim.__path__):
        importlib.import_module(f"lib.sim.{found.name}")


def judge(notebook: str, cells: dict, emit: Callable[[dict], None], names: list[str]) -> None:
    """Run the puzzles `names` of `notebook` (a name such as 02_data_parallel), and emit one row for each:
    the grader's list, so that the judge never writes a row the grader takes for a forged one."""
    load_checker()
    import puzzles
    from lib.nbtools import load_answers
    module = {m.NOTEBOOK: m for m in puzzles.MODULES}[notebook]
    checks = [(p.name, p.evaluate) for p in module.PUZZLES if p.name in names]   # bound before learner code runs
    before = fingerprint()
    with redirect_stdout(io.StringIO()):
        namespace, errors = load_answers(cells)
    tampered: list[str] = []
    for name, evaluate in checks:
        fn = namespace.get(name)
        if not tampered and name in errors:
            status, detail = "error", errors[name]
        elif not tampered and not callable(fn):
            status, detail = "missing", f"no function named {name}"
        elif not tampered:
            try:
                status, detail = _status(evaluate, fn)
            except BaseException as e:                    # the learner's code escaped the checker
                status, detail = "error", f"{type(e).__name__}: {e}"[:500]
        tampered = tampered or changes(before)
        if tampered:
            status, detail = "tampered", "the notebook changed the checker: " + ", ".join(tampered[:5])
        emit({"puzzle": name, "status": status, "points": int(status == "solved"), "detail": detail})


def main(notebook: str) -> None:
    """The sandbox's entry point: stdin holds the key, then the notebook's cells and the puzzles as JSON."""
    stdin = sys.stdin.buffer.read()
    key, cells = stdin[:KEY_BYTES], json.loads(stdin[KEY_BYTES:])
    names = cells.pop("puzzles")
    null = os.open(os.devnull, os.O_RDONLY)               # stdin is a file: left open, os.pread(0, ...) reads the key
    os.dup2(null, 0)
    os.close(null)
    results = os.dup(1)                                   # only the judge writes here
    os.dup2(2, 1)                                         # the learner's output goes to the log
    judge(notebook, cells, lambda row: _write(results, sign(key, row)), names)
    os._exit(0)                                           # no atexit hooks, no waiting for the learner's threads
