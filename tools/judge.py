"""Inside the grading sandbox: judge each puzzle of one notebook, in a process where none of its code runs.

tools.grade starts `python -I -S -B -c BOOT NOTEBOOK_NAME` in the sandbox (the sandbox's process 1), with stdin
holding a fresh key, the notebook's cells and the puzzles to judge (the grader's list). The judge imports the
checker, makes itself not dumpable, forks the answers' process (tools.answers) before it reads the key, and only
then reads stdin. Each puzzle's check (lib.checker.puzzle's own Puzzle.evaluate) runs here, in full: the cases and their
expected values are drawn here, results are compared here; only lib.sim.run, wherever the check runs the
learner's function, happens in the answers' process, whose results come back as data (tools.evidence). Each row
goes out on stdout, signed with the key (HMAC-SHA256), a file the answers' process never holds. What the
learner's code changed of the checker there (tools.fingerprint), the answers' process reports after each
puzzle: from then on puzzles are `tampered`.
"""

from __future__ import annotations

import functools
import hmac
import json
import os
import sys
import types
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:                 # the grader imports this module for the key and the rows: it needs no torch
    from tools.answers import Answers

KEY_BYTES = 32
# Bound when the judge is imported: the judge's output never depends on what is looked up later.
_dumps, _digest, _write = json.dumps, hmac.digest, os.write
STATUSES = ("solved", "failed", "not solved", "error", "missing", "tampered")
BOOT = """
import sys
sys.dont_write_bytecode = True
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


# ---- the learner's function, which runs elsewhere ---------------------------------------------------------
class Learner:
    """Stands in the judge for the learner's function of `puzzle`: a check's runs of it go to the answers'
    process (run_there); called here, it refuses."""

    def __init__(self, puzzle: Any) -> None:
        self.puzzle = puzzle
        self.__name__ = self.__qualname__ = puzzle.name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.__name__} runs in the answers' process only, never in the judge")


def _parts(fn: Any) -> list:
    """What a wrapping holds: a functools.partial's function and arguments, a closure's variables (a function
    made by functools.wraps around the answer, as lib.checker.kernels' refusing_kernels is)."""
    if isinstance(fn, functools.partial):
        return [fn.func, *fn.args, *fn.keywords.values()]
    if isinstance(fn, types.FunctionType):
        parts = []
        for variable in fn.__closure__ or ():
            try:
                parts.append(variable.cell_contents)
            except ValueError:                    # a variable not bound yet
                parts.append(None)
        return parts
    return []


def _learner_in(fn: Any, depth: int = 0) -> Optional[Learner]:
    if isinstance(fn, Learner):
        return fn
    for part in _parts(fn) if depth < 20 else []:
        found = _learner_in(part, depth + 1)
        if found is not None:
            return found
    return None


def _same(a: Any, b: Any, depth: int = 0) -> bool:
    """Whether two wrappings (functools.partial and closures, as Puzzle.wrap makes them) wrap the same things the
    same way."""
    if a is b:
        return True
    if depth > 20 or type(a) is not type(b):
        return False
    if isinstance(a, functools.partial):
        return a.keywords.keys() == b.keywords.keys() and len(a.args) == len(b.args) and \
            all(_same(x, y, depth + 1) for x, y in zip(_parts(a), _parts(b)))
    if isinstance(a, types.FunctionType):
        return a.__code__ is b.__code__ and a.__defaults__ == b.__defaults__ and len(_parts(a)) == len(_parts(b)) \
            and all(_same(x, y, depth + 1) for x, y in zip(_parts(a), _parts(b)))
    try:
        return bool(a == b)
    except Exception:
        return False


def route_runs(answers: Answers) -> None:
    """Make lib.sim.run, wherever the checker looks it up, run the learner's function in the answers' process
    (and everything else, such as a known mistake's reference, here)."""
    import lib.sim.runtime
    here = lib.sim.runtime.run

    @functools.wraps(here)
    def run(fn: Callable, world_size: int, *args, protect: Any = None, **kwargs):
        learner = _learner_in(fn)
        if learner is None:
            return here(fn, world_size, *args, protect=protect, **kwargs)
        wrapped = fn is not learner
        if wrapped and not _same(fn, learner.puzzle.wrap(learner)):
            raise RuntimeError("the checker runs the learner's function wrapped in a way the grader cannot send to "
                               "the answers' process (tools/judge.py: route_runs)")
        # `protect` (the expected results) stays here: the answers' process never sees them.
        return answers.run(learner.puzzle.notebook, learner.puzzle.name, wrapped, world_size, args, kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").split(".")[0] in ("lib", "puzzles") and vars(module).get("run") is here:
            module.run = run


# ---- judging -----------------------------------------------------------------------------------------------
def _status(puzzle: Any) -> tuple[str, str]:
    outcome = puzzle.evaluate(Learner(puzzle))
    if outcome.ok:
        return "solved", ""
    return ("not solved" if outcome.status == "unattempted" else "failed"), outcome.message.splitlines()[0][:500]


def judge(notebook: str, cells: dict, emit: Callable[[dict], None], names: list[str], answers: Answers) -> None:
    """Run the puzzles `names` of `notebook` (a name such as 02_data_parallel), and emit one row for each:
    the grader's list, so that the judge never writes a row the grader takes for a forged one."""
    import puzzles
    from tools.answers import AnswersGone
    from tools.evidence import Unreadable
    module = {m.NOTEBOOK: m for m in puzzles.MODULES}[notebook]
    checks = [p for p in module.PUZZLES if p.name in names]
    errors, defined, setup = answers.load(cells, [p.name for p in checks])
    tampered = answers.changes()
    for puzzle in checks:
        name = puzzle.name
        if tampered:
            status, detail = "tampered", ""
        elif setup is not None:
            status, detail = "error", f"the setup cell raised {setup}"
        elif name in errors:
            status, detail = "error", errors[name]
        elif name not in defined:
            status, detail = "missing", f"no function named {name}"
        else:
            try:
                status, detail = _status(puzzle)
            except (AnswersGone, Unreadable):
                raise
            except Exception as e:                        # an error of the learner's that the check does not catch
                status, detail = "error", f"{type(e).__name__}: {e}"[:500]
            tampered = answers.changes()
        if tampered:
            status, detail = "tampered", "the notebook changed the checker: " + ", ".join(tampered[:5])
        emit({"puzzle": name, "status": status, "points": int(status == "solved"), "detail": detail})


def main(notebook: str) -> None:
    """The sandbox's entry point: stdin holds the key, then the notebook's cells and the puzzles as JSON."""
    from tools.answers import Answers, AnswersGone, dumpable
    from tools.evidence import Unreadable
    from tools.fingerprint import load_checker

    dumpable(False)                                       # before anything is worth reading here
    load_checker(notebook)
    answers = Answers.start()                             # before the key is read: it never holds it
    route_runs(answers)
    stdin = sys.stdin.buffer.read()
    key, cells = stdin[:KEY_BYTES], json.loads(stdin[KEY_BYTES:])
    names = cells.pop("puzzles")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    results = os.dup(1)                                   # only the judge writes here
    os.dup2(2, 1)
    try:
        judge(notebook, cells, lambda row: _write(results, sign(key, row)), names, answers)
        answers.close()
    except (AnswersGone, Unreadable) as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(3)
    os._exit(0)                                           # no atexit hooks, no waiting for anything
