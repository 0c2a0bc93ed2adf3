"""Notebook surgery shared by tests and instructor tools: find puzzle cells, fill them in."""

from __future__ import annotations

import inspect
from types import ModuleType

import nbformat


def puzzle_cells(nb: nbformat.NotebookNode) -> dict[str, nbformat.NotebookNode]:
    """The cells where a learner writes each puzzle's function, by puzzle name."""
    return {c.metadata["course"]["puzzle"]: c for c in nb.cells
            if c.cell_type == "code" and "puzzle" in c.metadata.get("tags", [])}


def solve(nb: nbformat.NotebookNode, solutions: ModuleType) -> nbformat.NotebookNode:
    """A copy of `nb` whose puzzle cells hold the functions of the `solutions` module."""
    solved = nbformat.from_dict(nb)
    for name, cell in puzzle_cells(solved).items():
        cell.source = inspect.getsource(getattr(solutions, name))
    return solved
