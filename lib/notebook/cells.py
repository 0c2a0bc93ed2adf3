"""Notebook surgery shared by tests and the course's tools: find puzzle cells, fill them in,
load a learner's functions from a saved notebook, mark cells for nbgrader.

A notebook here is nbformat's NotebookNode or the plain dict `json.load` makes of the file: the progress cell
reads saved notebooks as JSON, since importing nbformat costs about 2 s (its validator's jsonschema builds the
IRI grammars of rfc3987_syntax at import)."""

from __future__ import annotations

import ast
import inspect
import textwrap
import traceback
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import nbformat

NBGRADER_SCHEMA = 3
STUB = "raise NotImplementedError  # your code here"          # a puzzle's body until the learner writes it
BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"   # nbgrader's solution region


def _tags(cell) -> list[str]:
    return cell["metadata"].get("tags", [])


def source(cell) -> str:
    """A cell's source as one string (a notebook file may store it as a list of lines)."""
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def puzzle_cells(nb: nbformat.NotebookNode) -> dict[str, nbformat.NotebookNode]:
    """The cells where a learner writes each puzzle's function, by puzzle name."""
    return {c["metadata"]["course"]["puzzle"]: c for c in nb["cells"]
            if c["cell_type"] == "code" and "puzzle" in _tags(c)}


def up_to_first_check(nb: nbformat.NotebookNode) -> list[str]:
    """The sources of the code cells from the top up to and including the first check cell: what a learner runs
    before the notebook's first answer."""
    sources = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        sources.append(source(cell))
        if "check" in _tags(cell):
            return sources
    raise LookupError("the notebook has no check cell")


def solve(nb: nbformat.NotebookNode, solutions: ModuleType) -> nbformat.NotebookNode:
    """A copy of `nb` whose puzzle cells hold the functions of the `solutions` module (inside the
    solution markers where the cell has them: the result is then an nbgrader source notebook)."""
    import nbformat

    solved = nbformat.from_dict(nb)
    for name, cell in puzzle_cells(solved).items():
        cell.source = with_answer(cell.source, inspect.getsource(getattr(solutions, name)))
    return solved


class _Function(NamedTuple):
    """Where the parts of a source's first function are, as indices into its lines."""

    lines: list[str]
    head_end: int          # the def line(s) end here
    body_start: int        # the body after the docstring starts here (head_end without a docstring)
    end: int
    indent: str            # of the body


def _function(source: str) -> _Function:
    fn = next(node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef))
    first = fn.body[0]
    has_doc = isinstance(first, ast.Expr) and isinstance(getattr(first.value, "value", None), str)
    return _Function(source.splitlines(), first.lineno - 1, first.end_lineno if has_doc else first.lineno - 1,
                     fn.end_lineno, " " * first.col_offset)


def with_solution_markers(source: str) -> str:
    """A puzzle cell's source with its function's body between nbgrader's solution markers, so that
    nbgrader's student version keeps the def line, the signature and the docstring. Idempotent."""
    if BEGIN_SOLUTION in source:
        return source
    f = _function(source)
    return "\n".join(f.lines[:f.body_start] + [f.indent + BEGIN_SOLUTION] + f.lines[f.body_start:f.end]
                     + [f.indent + END_SOLUTION] + f.lines[f.end:])


def with_answer(cell_source: str, function_source: str) -> str:
    """The cell with `function_source` as its answer: where the cell has solution markers, the answer's
    signature, the cell's docstring and the answer's body between the markers; else the whole answer."""
    if BEGIN_SOLUTION not in cell_source:
        return function_source
    cell, answer = _function(cell_source), _function(function_source)
    after = next(i for i, line in enumerate(cell.lines) if END_SOLUTION in line) + 1
    body = textwrap.indent(textwrap.dedent("\n".join(answer.lines[answer.body_start:answer.end])), cell.indent)
    return "\n".join(answer.lines[:answer.head_end] + cell.lines[cell.head_end:cell.body_start]
                     + [cell.indent + BEGIN_SOLUTION] + body.splitlines() + [cell.indent + END_SOLUTION]
                     + cell.lines[after:])


def load_answers(nb: nbformat.NotebookNode) -> tuple[dict[str, Any], dict[str, str]]:
    """Run a notebook's setup and puzzle cells (nothing else) in a fresh namespace.

    Returns (the namespace, {puzzle name: the error its cell raised}). Each cell runs on its own,
    so one broken answer does not hide the others."""
    namespace: dict[str, Any] = {"__name__": "__learner__", "display": print}
    errors: dict[str, str] = {}
    for cell in nb["cells"]:                  # item access: a notebook parsed by json.load works too
        if cell["cell_type"] != "code" or not ({"setup", "puzzle"} & set(_tags(cell))):
            continue
        name = cell["metadata"].get("course", {}).get("puzzle")
        try:
            exec(compile(source(cell), f"<cell {name or 'setup'}>", "exec"), namespace)
        except BaseException as e:            # a learner's cell: anything may happen
            if isinstance(e, KeyboardInterrupt):
                raise
            if name:
                errors[name] = "".join(traceback.format_exception_only(type(e), e)).strip()
            else:
                raise
    return namespace, errors


def add_grading_metadata(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Mark puzzle cells as nbgrader solution cells and check cells as autograded tests (1 point).

    Everything else is left unmarked (nbgrader leaves such cells alone)."""
    for cell in nb.cells:
        name = cell.metadata.get("course", {}).get("puzzle")
        if cell.cell_type != "code" or not name:
            continue
        if "puzzle" in _tags(cell):
            cell.metadata["nbgrader"] = {"grade": False, "grade_id": f"{name}-answer", "locked": False,
                                         "schema_version": NBGRADER_SCHEMA, "solution": True, "task": False}
        elif "check" in _tags(cell):
            cell.metadata["nbgrader"] = {"grade": True, "grade_id": f"{name}-check", "locked": True, "points": 1,
                                         "schema_version": NBGRADER_SCHEMA, "solution": False, "task": False}
    return nb
