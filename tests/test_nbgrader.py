"""nbgrader as docs/INSTRUCTORS.md sets it up: the real nbgrader 0.9.6 on the notebooks, and what it relies on."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip ships the same parser
    from pip._vendor import tomli as tomllib

import lib.checker.puzzle
import solutions.data_parallel as S
from lib.notebook.cells import BEGIN_SOLUTION, STUB, puzzle_cells, solve
from tools import NOTEBOOKS, ROOT, course_notebooks
from tools.autograde import needed_for_grades
from tools.grade import PACKAGES
from tools.submissions import student as student_of

NB02 = NOTEBOOKS / "02_data_parallel.ipynb"


def test_checks_are_strict_whenever_nbgrader_grades(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("COURSE_STRICT", raising=False)
    assert lib.checker.puzzle.strict_default() is False
    for mode in ("autograde", "validate"):
        monkeypatch.setenv("NBGRADER_EXECUTION", mode)
        assert lib.checker.puzzle.strict_default() is True
        monkeypatch.setenv("COURSE_STRICT", "0")         # a student's cell cannot turn it off
        assert lib.checker.puzzle.strict_default() is True
        monkeypatch.delenv("COURSE_STRICT")


def test_the_install_leaves_the_answer_key_out():
    """`pip install -e .` installs what pyproject's package search finds: not solutions/."""
    from setuptools import find_namespace_packages

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_namespace_packages(where=str(ROOT / found["where"][0]), include=found["include"],
                                       exclude=found.get("exclude", ()))
    assert {p.split(".")[0] for p in packages} == set(PACKAGES)


def test_autograding_runs_only_what_grades_depend_on():
    nb = nbformat.read(NB02, as_version=4)
    own = nbformat.v4.new_code_cell("helper = 1")                # a cell the student added
    ran = [c for c in nb.cells + [own] if c.cell_type == "code" and needed_for_grades(c)]
    tags = [set(c.metadata.get("tags", [])) for c in ran]
    assert tags.count({"setup"}) == 1 and tags.count({"puzzle"}) == tags.count({"check"}) == len(puzzle_cells(nb))
    assert ran[-1] is own and len(ran) == 2 + 2 * len(puzzle_cells(nb))
    assert not any("save_trace" in c.source or "progress(" in c.source or ".real(" in c.source for c in ran)


def test_a_folder_in_nbgraders_submitted_is_read_as_its_student(tmp_path):
    assert student_of(tmp_path / "submitted" / "ada" / "ps1") == "ada"
    assert student_of(tmp_path / "bo") == "bo"


def _instructors_config() -> str:
    """The nbgrader_config.py of docs/INSTRUCTORS.md, as an instructor would copy it."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "INSTRUCTORS.md").read_text(), re.S)
    config = [b for b in blocks if "get_config()" in b]
    assert len(config) == 1, "docs/INSTRUCTORS.md: one nbgrader_config.py block"
    return "\n".join(line.strip() for line in config[0].splitlines()) + "\n"


def _nbgrader(course: Path, env: dict, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]          # nbgrader logs some errors and goes on


@pytest.mark.slow
def test_nbgrader_from_scratch_scores_solved_untouched_and_half_solved_submissions(tmp_path):
    """docs/INSTRUCTORS.md's steps with the real nbgrader: generate_assignment on every notebook, then autograde
    three submissions of notebook 02 without COURSE_STRICT (nbgrader's own signal makes checks strict)."""
    code = tmp_path / "install"                       # what `pip install -e .` provides: no solutions/
    code.mkdir()
    for package in PACKAGES:
        (code / package).symlink_to(ROOT / package)
    course = tmp_path / "course"
    (course / "source" / "ps").mkdir(parents=True)
    for path in course_notebooks():
        shutil.copyfile(path, course / "source" / "ps" / path.name)
    (course / "nbgrader_config.py").write_text(_instructors_config())
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_STRICT", "NBGRADER_EXECUTION")}
    env.update(PYTHONPATH=str(code), MPLBACKEND="Agg",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    _nbgrader(course, env, "generate_assignment", "ps", "--force")

    for path in course_notebooks():
        released = nbformat.read(course / "release" / "ps" / path.name, as_version=4)
        graded = [c for c in released.cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert len(graded) == len(puzzle_cells(nbformat.read(path, as_version=4)))
        for name, cell in puzzle_cells(released).items():   # the def line and docstring stay, the stub is ours
            lines = cell.source.splitlines()
            assert lines[0].startswith(f"def {name}(") and lines[1].strip().startswith('"""'), cell.source
            assert lines[2:] == ["    " + STUB] and BEGIN_SOLUTION not in cell.source

    release = nbformat.read(course / "release" / "ps" / NB02.name, as_version=4)
    untouched = nbformat.from_dict(release)
    for cell in untouched.cells:                      # traps for plain nbgrader: a skipped or unmarked test
        if "check" in cell.metadata.get("tags", []):
            cell.metadata["tags"].append("skip-execution")
    del [c for c in untouched.cells if "check" in c.metadata.get("tags", [])][0].metadata["nbgrader"]
    half = nbformat.from_dict(release)
    names = list(puzzle_cells(half))
    for name in names[:3]:
        puzzle_cells(half)[name].source = inspect.getsource(getattr(S, name))
    for student, nb in {"solved": solve(release, S), "untouched": untouched, "half": half}.items():
        (course / "submitted" / student / "ps").mkdir(parents=True)
        nbformat.write(nb, course / "submitted" / student / "ps" / NB02.name)
    _nbgrader(course, env, "autograde", "ps", "--force")

    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        scores = {s: gradebook.find_submission("ps", s).score for s in ("solved", "untouched", "half")}
    assert scores == {"solved": len(names), "untouched": 0, "half": 3}
    for student in scores:
        folder = course / "autograded" / student / "ps"
        assert [p.name for p in folder.iterdir()] == [NB02.name], "autograding left files behind"
        graded = nbformat.read(folder / NB02.name, as_version=4)
        for cell in graded.cells:
            tags = cell.metadata.get("tags", [])
            if "real" in tags or "progress" in tags:
                assert not cell.outputs, "autograding ran a real or progress cell"
            if "check" in tags and student == "solved":
                assert any("✓" in o.get("text", "") for o in cell.outputs), cell.outputs
