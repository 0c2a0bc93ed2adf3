"""Traces, in a notebook's code, of reaching into the checker: the lines a person should read before trusting
the notebook's score.

The verdict is the judge's, in a process the learner's code cannot reach; but the simulator's meters (bytes,
FLOPs, memory, who sent what) and the puzzle's wrapping of the answer run beside that code, in the answers'
process, and code written to change them can (tools.fingerprint sees the common cases only). Such code has to
name what it reaches for: frames, the garbage collector, raw memory, other processes' files, modules and
attributes by name, code made from text. This finds those names in the cells the grader runs, as Python reads
them: NFKC-normalised (Python takes `ｓｙｓ._ｇｅｔｆｒａｍｅ` for `sys._getframe`), comments left out, lines
the course's own notebook has left out too.
"""

from __future__ import annotations

import io
import re
import tokenize
import unicodedata
from typing import NamedTuple

CHECKER = r"(sim|guard|checker|diagnose|notebook|errors|whose_code|real)"
TRACES = [(re.compile(pattern), what) for pattern, what in [
    (r"\b(_getframe|f_back|f_locals|f_globals|f_code|tb_frame|currentframe|_current_frames|settrace|setprofile)\b"
     r"|\binspect\s*\.\s*(stack|trace|getouterframes|getinnerframes)\b|\b(bdb|pdb)\b"
     r"|\b(walk_stack|walk_tb|extract_stack|get_stack)\b", "the checker's frames"),
    (r"\bweakref\b|\bfinalize\s*\(", "weak references and their callbacks (which run wherever the collector is)"),
    (r"\bgc\b", "the garbage collector (every object, the checker's included)"),
    (r"\bctypes\b|/proc\b|\bprocess_vm_|\bmmap\b|\bptrace\b", "raw memory or another process"),
    (r"\bos\s*\.\s*(_exit|write|writev|pwrite|dup|dup2|fdopen|pread|read|open|kill|killpg|fork|setsid|closerange)\b"
     r"|\bsignal\b|\bfaulthandler\b", "the process's files, exit or signals"),
    (r"\bsys\s*\.\s*(modules|meta_path|path_hooks|addaudithook|stdout|__stdout__)\b|\bimportlib\b|\b__import__\b"
     r"|\b__loader__\b|\b__spec__\b", "modules by name"),
    (r"\b__(code|globals|closure|builtins|subclasses|dict|class|bases|mro|func|self|defaults|kwdefaults|wrapped"
     r"|getattribute|setattr|reduce|reduce_ex|eq|hash|bool|float|index)__\b|\bbuiltins\b",
     "Python's internals (a function's code, an object's class, comparisons)"),
    (r"\b(setattr|delattr|getattr|vars|globals|locals)\s*\(", "attributes by name"),
    (r"\b(exec|eval|compile)\s*\(|\bmarshal\b|\bbase64\b|\bcodecs\b|\bpickle\b|\bzlib\b", "code made from text"),
    (r"\b__torch_function__\b|\b__torch_dispatch__\b|\bTorch(Function|Dispatch)Mode\b|\b_python_dispatch\b"
     r"|\btorch\s*\.\s*(_C|library|overrides|_ops|ops)\b|\bas_subclass\b|\b_make_subclass\b", "torch's dispatch"),
    (rf"\blib\s*\.\s*{CHECKER}\b|\b(tools|solutions)\s*\.\s*[A-Za-z_]|\b(from|import)\s+(tools|solutions)\b|\bP\s*\.\s*\w",
     "the checker's modules (its checks, the simulator's meters, the judge)"),
    (r"\bmath\s*\.\s*\w+\s*=|\btorch\s*\.\s*\w+(\s*\.\s*\w+)*\s*=(?!=)", "a library's function replaced"),
]]
MAX_TRACES = 20                 # per notebook, the rest counted


class Trace(NamedTuple):
    cell: str                   # the puzzle the cell answers, or "setup"
    line: int                   # 1-based, in the cell
    text: str                   # the line as written
    what: str                   # what it reaches for

    def detail(self) -> str:
        return f"cell {self.cell}, line {self.line}: {self.text.strip()[:200]}  <- {self.what}"


def _without_comments(source: str) -> list[str]:
    """`source`'s lines with comments blanked (the whole text where it does not tokenize)."""
    lines = source.splitlines()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                row, col = token.start
                lines[row - 1] = lines[row - 1][:col]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return lines


def _normal(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def traces(cells: list[dict], course_cells: list[dict]) -> list[Trace]:
    """The traces in `cells` (code cells as tools.grade reads them: source and metadata) that the grader runs
    (setup and puzzle cells), in the lines not found in `course_cells` (the course's notebook)."""
    course = {_normal(line).strip() for c in course_cells for line in c["source"].splitlines()}
    found = []
    for cell in cells:
        tags = set(cell["metadata"].get("tags", []))
        if not {"setup", "puzzle"} & tags:
            continue
        name = cell["metadata"].get("course", {}).get("puzzle") or "setup"
        written = cell["source"].splitlines()
        for number, line in enumerate(_without_comments(_normal(cell["source"])), 1):
            if not line.strip() or line.strip() in course:
                continue
            what = [what for pattern, what in TRACES if pattern.search(line)]
            if what:
                found.append(Trace(str(name), number, written[number - 1] if number <= len(written) else line,
                                   "; ".join(what)))
    return found
