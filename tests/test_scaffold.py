"""The guide to adding a puzzle works when followed literally: `python -m tools.scaffold` writes a puzzle whose
spec, reference, notebook cells and catalogue pass the puzzle's own tests at once, in a copy of the course, and
`python -m tools.sweep` sweeps its catalogue over seeds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
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


NAME = "recursive_doubling_all_reduce_in_log_steps"      # a realistic name: long, as the lesson's names are
RECURSIVE_DOUBLING = f'''

def {NAME}(dist, x):
    rank, world = dist.get_rank(), dist.get_world_size()
    other = torch.empty_like(x)
    step = 1
    while step < world:
        partner = rank ^ step
        sent = dist.isend(x, partner)
        dist.recv(other, partner)
        sent.wait()
        x = x + other
        step *= 2
    return x
'''
# The contributor's realistic wrong answer: the partner at rank + step instead of rank XOR step (pairs do not match)
WRONG_PARTNER = RECURSIVE_DOUBLING.replace(f"def {NAME}(", f"def {NAME}_partner_plus(").replace(
    "partner = rank ^ step", "partner = (rank + step) % world") + f'''

WRONG.append(("{NAME}", {NAME}_partner_plus,
              ("expected", "wait")))
'''


def _as_the_lesson(copy: Path) -> None:
    """What a contributor does next (docs/ARCHITECTURE.md): the reference becomes the lesson's algorithm, the case
    forbids the collective it builds, and a realistic wrong answer joins the catalogue."""
    spec = copy / "puzzles" / "data_parallel.py"
    text = spec.read_text().replace("allowed_ops=None,", "allowed_ops=P2P,", 1)
    spec.write_text(text.replace("ring = 2 * (world - 1) / world * total.numel()",
                                 "ring = (world.bit_length() - 1) * total.numel()", 1))
    solutions = copy / "solutions" / "data_parallel.py"
    text = solutions.read_text()
    solutions.write_text(text[:text.index(f"\n\ndef {NAME}(dist, x):")] + RECURSIVE_DOUBLING)
    wrong = copy / "tests" / "wrong" / "data_parallel.py"
    wrong.write_text(wrong.read_text() + WRONG_PARTNER)


def _passed_and_failed(stdout: str) -> tuple[set[str], list[str]]:
    rows = [line for line in stdout.splitlines() if "::" in line and (" PASSED" in line or " FAILED" in line)]
    passed = {r.split("::")[1].split(" ")[0].split("[")[0] for r in rows if " PASSED" in r}
    return passed, [r for r in rows if " FAILED" in r]


def test_a_realistic_puzzle_scaffolded_beside_the_ring_passes_its_own_tests_and_sweep(tmp_path):
    copy = _copy_of_the_course(tmp_path / "course")
    made = _python(copy, "-m", "tools.scaffold", "data_parallel", NAME, "--after", "ring_all_reduce",
                   "--world-sizes", "2,4,8")
    assert made.returncode == 0, made.stderr
    assert f"python -m tools.sweep {NAME}" in made.stdout, made.stdout          # the guide's commands
    assert "read again the prose that names them by number" in made.stdout, made.stdout   # "as puzzle 5" moved
    spec = (copy / "puzzles" / "data_parallel.py").read_text()
    listed = re.search(r"^PUZZLES = \[([^\]]*)\]", spec, re.M).group(1).replace("\n", " ").split(",")
    order = [n.strip() for n in listed]
    assert order[order.index("ring_all_reduce") + 1] == NAME, order
    nb = nbformat.read(copy / "notebooks" / "02_data_parallel.ipynb", as_version=4)
    owners = [c.metadata.get("course", {}).get("puzzle") for c in nb.cells]
    ring_last = max(i for i, o in enumerate(owners) if o == "ring_all_reduce")
    assert owners[ring_last + 2] == NAME and "## Puzzle 5:" in nb.cells[ring_last + 1].source
    headings = [int(m) for c in nb.cells if c.cell_type == "markdown"
                for m in re.findall(r"^## Puzzle (\d+):", c.source, re.M)]
    assert headings == list(range(1, len(headings) + 1)), headings
    _as_the_lesson(copy)

    tests = _python(copy, "-m", "pytest", "-v", "-n", "0", "-p", "no:cacheprovider", "tests/test_content.py",
                    "tests/test_notebooks.py", "-k", f"{NAME} or (every_puzzle_has_its_cells and 02)")
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    passed, failed = _passed_and_failed(tests.stdout)
    assert not failed and passed >= {
        "test_solution_passes_in_simulation", "test_solution_passes_on_real_gloo_ranks",
        "test_stub_is_reported_not_solved", "test_cheat_is_rejected_naming_what_it_did",
        "test_every_puzzle_has_its_cells"}, tests.stdout[-2000:]
    wrong_run = [line for line in tests.stdout.splitlines() if "test_wrong_answer_fails" in line and " PASSED" in line]
    assert len(wrong_run) == 2, "\n".join(wrong_run)          # the scaffold's and the contributor's, by -k NAME
    swept = _python(copy, "-m", "tools.sweep", NAME, "--seeds", "2")
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
    with pytest.raises(ScaffoldError, match="no puzzle nowhere in puzzles/data_parallel.py to place it after"):
        scaffold("data_parallel", "x", copy, after="nowhere")
