"""The learners' and instructors' tools: workspace, progress, nbgrader metadata, release, grading."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import nbformat
import pytest

import solutions.data_parallel as S
from lib.nbtools import add_grading_metadata, puzzle_cells, solve
from tools import NOTEBOOKS, ROOT, course_notebooks
from tools.grade import grade
from tools.progress import notebook_progress
from tools.release import make_release, student_readme, verify
from tools.stamp import marked_as_course, with_progress_cell
from tools.workspace import sync

NB02 = NOTEBOOKS / "02_data_parallel.ipynb"


def _read(path: Path):
    return nbformat.read(path, as_version=4)


# ---- workspace ---------------------------------------------------------------------------------
def test_sync_creates_copies_then_keeps_answers_and_own_cells_when_the_course_changes(tmp_path):
    source, work = tmp_path / "course", tmp_path / "work"
    shutil.copytree(NOTEBOOKS, source)
    assert {name: what for name, what in sync(source, work)}[NB02.name] == "created"

    mine = _read(work / NB02.name)
    puzzle_cells(mine)["ring_all_reduce"].source = "def ring_all_reduce(dist, x):\n    return 'my answer'\n"
    mine.cells.append(nbformat.v4.new_code_cell("scratch = 42"))
    nbformat.write(mine, work / NB02.name)
    assert dict(sync(source, work))[NB02.name] == "up to date"

    course = _read(source / NB02.name)                 # the course is updated upstream, cells renumbered
    course.cells[0].source += "\n\nA new paragraph from the course."
    for cell in course.cells:
        cell.id = f"new-{cell.id}"
    nbformat.write(course, source / NB02.name)
    assert dict(sync(source, work))[NB02.name].startswith("refreshed")

    assert dict(sync(source, work))[NB02.name] == "up to date"       # refreshing twice changes nothing
    new = _read(work / NB02.name)
    assert "A new paragraph from the course." in new.cells[0].source
    assert sum("Your own cells" in c.source for c in new.cells) == 1
    assert "my answer" in puzzle_cells(new)["ring_all_reduce"].source
    assert any(c.source == "scratch = 42" for c in new.cells)
    backups = list((work / ".backup").glob("02_data_parallel.*.ipynb"))
    assert len(backups) == 1 and "my answer" in backups[0].read_text()


def test_work_folder_is_ignored_by_git():
    ignored = subprocess.run(["git", "check-ignore", "-q", "work/02_data_parallel.ipynb"], cwd=ROOT)
    assert ignored.returncode == 0


# ---- progress --------------------------------------------------------------------------------------
def test_progress_tells_solved_unsolved_and_broken_apart(tmp_path):
    nb = solve(_read(NB02), S)
    cells = puzzle_cells(nb)
    cells["ring_all_gather"].source = "def ring_all_gather(dist, chunk):\n    raise NotImplementedError\n"
    cells["ring_all_reduce"].source = "def ring_all_reduce(dist, x)\n    return x\n"           # a syntax error
    cells["param_server_all_reduce"].source = "def param_server_all_reduce(dist, x):\n    return x\n"
    nbformat.write(nb, tmp_path / NB02.name)
    status = {name: s for name, s, _ in notebook_progress(tmp_path / NB02.name)}
    assert status == {"param_server_all_reduce": "failing", "ring_reduce_scatter": "solved",
                      "ring_all_gather": "not solved", "ring_all_reduce": "failing",
                      "data_parallel_train": "solved", "bucketed_data_parallel_train": "solved"}


# ---- notebook furniture ------------------------------------------------------------------------------
@pytest.mark.parametrize("path", course_notebooks(), ids=[p.stem for p in course_notebooks()])
def test_notebooks_carry_grading_metadata_and_a_progress_cell(path):
    """`python -m tools.stamp` has been run: stamping again changes nothing."""
    nb = _read(path)
    again = marked_as_course(add_grading_metadata(with_progress_cell(_read(path), path.stem)))
    assert nbformat.writes(again) == nbformat.writes(nb)
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert len(graded) == len(answers) == len(puzzle_cells(nb))


@pytest.mark.slow
def test_nbgrader_generates_the_assignment(tmp_path):
    """nbgrader reads our metadata: generate_assignment keeps every graded check cell and stub."""
    source = tmp_path / "source" / "ps"
    source.mkdir(parents=True)
    for path in course_notebooks():
        shutil.copyfile(path, source / path.name)
    (tmp_path / "nbgrader_config.py").write_text('c = get_config()\nc.CourseDirectory.course_id = "course"\n')
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", "ps", "--force"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for path in course_notebooks():
        released = _read(tmp_path / "release" / "ps" / path.name)
        graded = [c for c in released.cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert len(graded) == len(puzzle_cells(_read(path)))


# ---- the student release --------------------------------------------------------------------------
def test_release_ships_the_course_without_the_answer_key(tmp_path):
    dest = make_release(tmp_path / "release")
    assert verify(dest) == []
    assert not (dest / "solutions").exists() and not (dest / "tests").exists()
    assert {p.name for p in (dest / "notebooks").glob("*.ipynb")} == {p.name for p in course_notebooks()}
    # The release stands on its own: its problem set imports without the solutions.
    site = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    probe = ("import sys; sys.path[:0] = [sys.argv[1]] + sys.argv[2:]\n"
             "import puzzles, importlib.util\n"
             "print(len(puzzles.ALL), importlib.util.find_spec('solutions') is None)")
    out = subprocess.run([sys.executable, "-S", "-c", probe, str(dest), *site], capture_output=True, text=True,
                         timeout=120, cwd=dest)
    assert out.stdout.split() == [str(len(__import__("puzzles").ALL)), "True"], out.stderr[-2000:]


def test_the_release_readme_sends_students_only_where_the_release_goes(tmp_path):
    dest = make_release(tmp_path / "release")
    readme, course = (dest / "README.md").read_text(), (ROOT / "README.md").read_text()
    assert "./course test" in course and "./course test" not in readme
    assert "solutions.data_parallel" in course and "solutions." not in readme
    assert "## Benchmarks" in course and "## Benchmarks" not in readme
    assert "./course lab" in readme and "## How a puzzle works" in readme and "mine:ring_all_reduce" in readme
    (dest / "README.md").write_text(readme + "\nRun `./course test -m 'not slow'`.\n")
    assert verify(dest) == ["README.md mentions './course test', which the release has not"]


def test_course_only_parts_are_cut_whole():
    text = "a\n<!-- course only -->\nb\n<!-- end course only -->\nc   # [course only]\nd\n"
    assert student_readme(text) == "a\nd\n"


# ---- grading -------------------------------------------------------------------------------------------
def _submission(folder: Path, answers: dict[str, str]) -> Path:
    nb = _read(NB02)
    for name, source in answers.items():
        puzzle_cells(nb)[name].source = source
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / NB02.name)
    return folder


@pytest.mark.slow
def test_grading_scores_each_puzzle_and_contains_what_submissions_do(tmp_path):
    solved = {name: inspect.getsource(getattr(S, name)) for name in puzzle_cells(_read(NB02))}
    subs = [
        _submission(tmp_path / "subs" / "ada", solved),
        _submission(tmp_path / "subs" / "bo", {
            "ring_reduce_scatter": solved["ring_reduce_scatter"],
            "ring_all_gather": "def ring_all_gather(dist, chunk):\n    raise ValueError('oops')\n",
            "param_server_all_reduce": "from solutions.data_parallel import param_server_all_reduce\n",
            "ring_all_reduce": "SECRET = open('../solutions/data_parallel.py').read()\n"
                               "def ring_all_reduce(dist, x):\n    return x\n",
        }),
        _submission(tmp_path / "subs" / "cy", {"ring_all_gather": "while True:\n    pass\n"}),
    ]
    start = time.monotonic()
    rows = grade(subs, tmp_path / "out", timeout=60)
    assert time.monotonic() - start < 240
    table = {(r["student"], r["puzzle"]): r for r in rows}
    assert sum(r["points"] for r in rows if r["student"] == "ada") == 6
    assert table["bo", "ring_reduce_scatter"]["status"] == "solved"
    assert table["bo", "ring_all_gather"]["status"] == "failed" and "oops" in table["bo", "ring_all_gather"]["detail"]
    assert table["bo", "param_server_all_reduce"]["status"] == "error"
    assert "No module named 'solutions'" in table["bo", "param_server_all_reduce"]["detail"]
    # The sandbox's tree holds no solutions/ to peek at.
    assert table["bo", "ring_all_reduce"]["status"] == "error"
    assert "No such file" in table["bo", "ring_all_reduce"]["detail"]
    assert table["bo", "data_parallel_train"]["status"] == "not solved"
    assert [r["status"] for r in rows if r["student"] == "cy"] == ["timeout"]
    csv_text = (tmp_path / "out" / "scores.csv").read_text()
    assert csv_text.splitlines()[0] == "student,notebook,puzzle,status,points,detail"
    assert json.loads((tmp_path / "out" / "scores.json").read_text()) == rows
