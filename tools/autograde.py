"""nbgrader, set up for this course: call `configure(c)` from the course's nbgrader_config.py.

    c = get_config()
    c.CourseDirectory.course_id = "llm-training-puzzles"
    from tools.autograde import configure
    configure(c)

What it changes from nbgrader's defaults, and why:
- the student version's stub is the course's own line, so it reads like the course's notebooks;
- autograding runs only what grades depend on (the setup cell, the answers, the learner's own cells and
  the graded check cells), not the real runs in processes, the progress cell, figures, widgets or
  demos: less than half the CPU time, and no files such as hello.trace.json left in the autograded folder;
- graded cells always run: plain nbgrader skips a cell a submission tags `skip-execution` and then
  scores that test as passed; a graded cell a submission deleted or unmarked is put back;
- a per-cell timeout that leaves room for a check's several simulated cases on a busy machine.
Checks are strict while nbgrader autogrades or validates (lib.checker.puzzle.strict_default).
"""

from __future__ import annotations

from typing import Any

from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute
from nbgrader.utils import is_grade, is_solution

from lib.notebook.cells import STUB

CELL_TIMEOUT = 300          # seconds per cell


def needed_for_grades(cell) -> bool:
    """Whether autograding must run `cell`: graded and answer cells, the setup cell, the learner's own cells."""
    if cell.cell_type != "code" or is_grade(cell) or is_solution(cell):
        return True
    if cell.metadata.get("course", {}).get("origin") != "course":       # tools.stamp marks every course cell
        return True
    return "setup" in cell.metadata.get("tags", [])


class GradingExecute(Execute):
    """nbgrader's Execute, running only the cells grades depend on, and every graded cell whatever its tags."""

    def preprocess_cell(self, cell, resources, index):
        if not needed_for_grades(cell):
            return cell, resources
        tags = cell.metadata.get("tags", [])
        if self.skip_cells_with_tag in tags:
            cell.metadata["tags"] = [t for t in tags if t != self.skip_cells_with_tag]
        return super().preprocess_cell(cell, resources, index)


def configure(c: Any) -> None:
    """Set nbgrader up for this course (see the module's docstring)."""
    defaults = Autograde.class_traits()["autograde_preprocessors"].default()
    c.Autograde.autograde_preprocessors = [GradingExecute if p is Execute else p for p in defaults]
    c.ClearSolutions.code_stub = {"python": STUB}
    c.OverwriteCells.add_missing_cells = True
    c.Execute.timeout = CELL_TIMEOUT
