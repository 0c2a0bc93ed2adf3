"""The guide to adding a puzzle works when followed literally: `python -m tools.scaffold` writes a puzzle whose
spec, reference, notebook cells and catalogue pass the puzzle's own tests at once, in a copy of the course, and
`python -m tools.sweep` sweeps its catalogue over seeds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import ROOT
from tools.scaffold import ScaffoldError, scaffold

pytestmark = pytest.mark.slow


def _copy_of_the_course(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, target)
    return dest


def _python(copy: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(copy), COURSE_STRICT="0")
    return subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=900)


def test_a_scaffolded_puzzle_passes_its_own_tests_and_sweep(tmp_path):
    copy = _copy_of_the_course(tmp_path / "course")
    made = _python(copy, "-m", "tools.scaffold", "data_parallel", "demo_sum")
    assert made.returncode == 0, made.stderr
    tests = _python(copy, "-m", "pytest", "-v", "-n", "0", "-p", "no:cacheprovider", "tests/test_content.py",
                    "tests/test_notebooks.py", "-k", "demo_sum or (every_puzzle_has_its_cells and 02)")
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    passed = {line.split("::")[1].split("[")[0] for line in tests.stdout.splitlines() if line.endswith("PASSED")
              or " PASSED " in line}
    kinds = {"test_solution_passes_in_simulation", "test_solution_passes_on_real_gloo_ranks",
             "test_stub_is_reported_not_solved", "test_wrong_answer_fails_with_reason_diagnosis_and_its_own_hint",
             "test_cheat_is_rejected_naming_what_it_did", "test_every_puzzle_has_its_cells"}
    assert passed >= kinds, (kinds - passed, tests.stdout[-2000:])
    swept = _python(copy, "-m", "tools.sweep", "demo_sum", "--seeds", "2")
    assert swept.returncode == 0 and "0 not as catalogued" in swept.stdout, swept.stdout + swept.stderr
    lint = subprocess.run([str(Path(sys.executable).parent / "ruff"), "check", "puzzles", "solutions", "tests/wrong"],
                          cwd=copy, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


def test_a_sweep_reports_an_entry_that_is_not_as_catalogued(tmp_path):
    copy = _copy_of_the_course(tmp_path / "course")
    assert _python(copy, "-m", "tools.scaffold", "data_parallel", "demo_sum").returncode == 0
    wrong = copy / "tests" / "wrong" / "data_parallel.py"
    wrong.write_text(wrong.read_text().replace('"unchanged from what rank"', '"words no message says"'))
    swept = _python(copy, "-m", "tools.sweep", "demo_sum", "--seeds", "1", "--quiet")
    assert swept.returncode == 1 and "failed without naming it" in swept.stdout, swept.stdout + swept.stderr


def test_scaffold_refuses_what_it_cannot_write(tmp_path):
    copy = _copy_of_the_course(tmp_path / "course")
    with pytest.raises(ScaffoldError, match="no puzzles/nowhere.py"):
        scaffold("nowhere", "x", copy)
    with pytest.raises(ScaffoldError, match="already has a puzzle ring_all_reduce"):
        scaffold("data_parallel", "ring_all_reduce", copy)
    with pytest.raises(ScaffoldError, match="not a Python identifier"):
        scaffold("data_parallel", "two words", copy)
