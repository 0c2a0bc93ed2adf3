"""Every notebook runs under nbval as shipped (stubs) and solved (stubs replaced by the solutions)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import puzzles
from lib.notebook.cells import puzzle_cells, solve

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MODULE_OF = {m.NOTEBOOK: m for m in puzzles.MODULES}


def _nbval(path: Path, strict: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, COURSE_STRICT="1" if strict else "0", MPLBACKEND="Agg",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    # -n 0: the notebook's cells run in order in one kernel (the repository's addopts would hand them to workers).
    return subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider", "-n", "0",
                           str(path)],
                          cwd=path.parent, env=env, capture_output=True, text=True, timeout=900)


def test_notebooks_are_stored_without_outputs():
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text())
        dirty = [i for i, c in enumerate(nb["cells"])
                 if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
        assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_puzzle_has_its_cells(path):
    """The notebook and the problem set agree: a stub, a check cell and a real cell per puzzle (none for a
    prediction, whose real process would only repeat its arithmetic: Puzzle.real_cell)."""
    nb = nbformat.read(path, as_version=4)
    module = MODULE_OF[path.stem]
    names = [p.name for p in module.PUZZLES]
    assert list(puzzle_cells(nb)) == names
    sources = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for puzzle in module.PUZZLES:
        name = puzzle.name
        assert f"P.{name}.check({name})" in sources
        assert (f"P.{name}.real({name}" in sources) == puzzle.real_cell, name
        assert "raise NotImplementedError" in puzzle_cells(nb)[name].source


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_as_shipped(path):
    done = _nbval(path, strict=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def _write_solved(path: Path, folder: Path) -> None:
    """The instructor's solved copy of notebook `path`, saved in `folder` as a learner's would be."""
    solutions = importlib.import_module(f"solutions.{MODULE_OF[path.stem].__name__.split('.')[-1]}")
    nbformat.write(solve(nbformat.read(path, as_version=4), solutions), folder / path.name)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_solved_with_every_check_passing(path, tmp_path):
    _write_solved(path, tmp_path)
    solved = tmp_path / path.name
    for earlier in getattr(MODULE_OF[path.stem], "BUILDS_ON", ()):    # a notebook that reads the learner's saved copies
        _write_solved(ROOT / "notebooks" / f"{earlier}.ipynb", tmp_path)
    done = _nbval(solved, strict=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
