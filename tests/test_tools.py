"""The learners' and instructors' tools: workspace, progress, notebook furniture, release (grading: test_grade)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

import solutions.data_parallel as S
from lib.notebook.cells import (BEGIN_SOLUTION, END_SOLUTION, STUB, puzzle_cells, solve, with_answer,
                                with_solution_markers)
from tools import NOTEBOOKS, ROOT, course_notebooks
from tools.progress import notebook_progress
from tools.release import make_release, student_readme, verify
from tools.stamp import stamped
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
def test_notebooks_carry_grading_metadata_solution_markers_and_a_progress_cell(path):
    """`python -m tools.stamp` has been run: stamping again changes nothing."""
    nb = _read(path)
    assert nbformat.writes(stamped(_read(path), path.stem)) == nbformat.writes(nb)
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert len(graded) == len(answers) == len(puzzle_cells(nb))
    for name, cell in puzzle_cells(nb).items():
        lines = cell.source.splitlines()
        assert lines[0].startswith(f"def {name}(") and lines[1].strip().startswith('"""')
        assert [line.strip() for line in lines[2:]] == [BEGIN_SOLUTION, STUB, END_SOLUTION]


def test_solution_markers_are_added_once_and_answers_go_between_them():
    stub = 'def f(dist, x):\n    """Doc."""\n    raise NotImplementedError  # your code here\n\nprint("after")'
    marked = with_solution_markers(stub)
    assert marked == ('def f(dist, x):\n    """Doc."""\n    ### BEGIN SOLUTION\n'
                      '    raise NotImplementedError  # your code here\n    ### END SOLUTION\n\nprint("after")')
    assert with_solution_markers(marked) == marked
    answer = "def f(dist, x, scale=2):\n    y = x * scale\n    return y\n"
    assert with_answer(marked, answer) == ('def f(dist, x, scale=2):\n    """Doc."""\n    ### BEGIN SOLUTION\n'
                                           '    y = x * scale\n    return y\n    ### END SOLUTION\n\nprint("after")')
    assert with_answer("def f(dist, x):\n    pass", answer) == answer       # no markers: the whole answer


# ---- the student release --------------------------------------------------------------------------
def test_release_ships_the_course_without_the_answer_key(tmp_path):
    dest = make_release(tmp_path / "release")
    assert verify(dest) == []
    assert not (dest / "solutions").exists() and not (dest / "tests").exists()
    assert {p.name for p in (dest / "notebooks").glob("*.ipynb")} == {p.name for p in course_notebooks()}
    # verify() imported the release's problem set on its own; a module that needs the answer key breaks it.
    (dest / "puzzles" / "leaky.py").write_text("import solutions.data_parallel\n")
    init = dest / "puzzles" / "__init__.py"
    init.write_text(init.read_text() + "\nimport puzzles.leaky\n")
    problems = verify(dest)
    assert len(problems) == 1 and "do not import on their own" in problems[0], problems
    assert "No module named 'solutions'" in problems[0], problems


def test_the_release_readme_sends_students_only_where_the_release_goes(tmp_path):
    dest = make_release(tmp_path / "release")
    readme, course = (dest / "README.md").read_text(), (ROOT / "README.md").read_text()
    assert "./course test" in course and "./course test" not in readme
    assert "solutions.data_parallel" in course and "solutions." not in readme
    assert "docs/BENCHMARKS.md" in course and "docs/BENCHMARKS.md" not in readme
    assert "docs/INSTRUCTORS.md" in course and "docs/INSTRUCTORS.md" not in readme
    assert "./course lab" in readme and "## How a puzzle works" in readme and "mine:ring_all_reduce" in readme
    # the documents the student README links travel with it; those for instructors and benchmarks stay behind
    assert (dest / "docs" / "TRUST.md").is_file() and (dest / "docs" / "SIMULATOR.md").is_file()
    assert not (dest / "docs" / "INSTRUCTORS.md").exists() and not (dest / "docs" / "BENCHMARKS.md").exists()
    (dest / "README.md").write_text(readme + "\nRun `./course test -m 'not slow'`.\n")
    assert verify(dest) == ["README.md mentions './course test', which the release has not"]
    (dest / "README.md").write_text(readme)
    (dest / "docs" / "TRUST.md").unlink()
    assert verify(dest) == ["README.md links docs/TRUST.md, which the release has not"]


def test_course_only_parts_are_cut_whole():
    text = "a\n<!-- course only -->\nb\n<!-- end course only -->\nc   # [course only]\nd\n"
    assert student_readme(text) == "a\nd\n"


def _installed(release: Path) -> None:
    """Give `release` the install ./course would make there, as this environment (its packages linked in), and the
    stamp that says it is installed: the release's commands then run at once."""
    ours = Path(sys.prefix)
    venv = release / ".venv"
    (venv / "bin").mkdir(parents=True)
    shutil.copy(ours / "pyvenv.cfg", venv)
    (venv / "lib").symlink_to(ours / "lib")
    for name in ("python", "jupyter"):
        (venv / "bin" / name).symlink_to(Path(sys.executable) if name == "python" else ours / "bin" / name)
    digest = hashlib.sha256((release / "pyproject.toml").read_bytes()).hexdigest()
    (venv / ".course-installed").write_text(digest + "\n")       # a learner's install: no test tools asked for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lab_page(release: Path) -> str:
    """`./course lab` in the release: the HTML of JupyterLab's page, once the server answers."""
    port, token = _free_port(), "release-test"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JUPYTER_CONFIG_PATH")}
    env.update(HOME=str(release / "home"), PATH=f"{Path(sys.prefix) / 'bin'}{os.pathsep}{env['PATH']}")
    lab = subprocess.Popen([str(release / "course"), "lab", "--no-browser", f"--port={port}",
                            f"--ServerApp.token={token}"], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert lab.poll() is None, lab.stderr.read()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10) as page:
                    return page.read().decode()
            except OSError:
                time.sleep(0.5)
        pytest.fail("./course lab did not answer in 120 s")
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=60)


@pytest.mark.slow
def test_every_command_the_release_offers_works_there(tmp_path):
    release = make_release(tmp_path / "release")
    _installed(release)
    usage = subprocess.run([str(release / "course"), "--help"], capture_output=True, text=True, timeout=60).stdout
    offered = set(re.findall(r"\./course (\w[\w-]*)", usage))
    assert offered == {"lab", "sync", "progress"}, usage
    for command in ("test", "bench", "release", "grade", "gpu-check"):       # what a release cannot run
        done = subprocess.run([str(release / "course"), command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "usage:" in done.stderr, (command, done.stderr)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    synced = subprocess.run([str(release / "course"), "sync"], capture_output=True, text=True, timeout=300, env=env)
    assert synced.returncode == 0, synced.stderr[-3000:]
    assert {p.name for p in (release / "work").glob("*.ipynb")} == {p.name for p in course_notebooks()}
    progress = subprocess.run([str(release / "course"), "progress"], capture_output=True, text=True, timeout=300,
                              env=env)
    assert progress.returncode == 0 and "02_data_parallel" in progress.stdout, progress.stdout + progress.stderr
    page = _lab_page(release)
    config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page,
                                  re.S).group(1))
    assert "@jupyter/nbgrader" in config["disabledExtensions"], config["disabledExtensions"]   # instructors' tools
