"""Notebook surgery shared by tests and the course's tools: find puzzle cells, fill them in,
load a learner's functions from a saved notebook, mark cells for nbgrader."""

from __future__ import annotations

import inspect
import traceback
from types import ModuleType
from typing import Any

import nbformat

NBGRADER_SCHEMA = 3


def _tags(cell) -> list[str]:
    return cell.metadata.get("tags", [])


def puzzle_cells(nb: nbformat.NotebookNode) -> dict[str, nbformat.NotebookNode]:
    """The cells where a learner writes each puzzle's function, by puzzle name."""
    return {c.metadata["course"]["puzzle"]: c for c in nb.cells
            if c.cell_type == "code" and "puzzle" in _tags(c)}


def solve(nb: nbformat.NotebookNode, solutions: ModuleType) -> nbformat.NotebookNode:
    """A copy of `nb` whose puzzle cells hold the functions of the `solutions` module."""
    solved = nbformat.from_dict(nb)
    for name, cell in puzzle_cells(solved).items():
        cell.source = inspect.getsource(getattr(solutions, name))
    return solved


def load_answers(nb: nbformat.NotebookNode) -> tuple[dict[str, Any], dict[str, str]]:
    """Run a notebook's setup and puzzle cells (nothing else) in a fresh namespace.

    Returns (the namespace, {puzzle name: the error its cell raised}). Each cell runs on its own,
    so one broken answer does not hide the others."""
    namespace: dict[str, Any] = {"__name__": "__learner__", "display": print}
    errors: dict[str, str] = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or not ({"setup", "puzzle"} & set(_tags(cell))):
            continue
        try:
            exec(compile(cell.source, f"<cell {cell.metadata.get('course', {}).get('puzzle', 'setup')}>", "exec"),
                 namespace)
        except BaseException as e:            # a learner's cell: anything may happen
            if isinstance(e, KeyboardInterrupt):
                raise
            name = cell.metadata.get("course", {}).get("puzzle")
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
