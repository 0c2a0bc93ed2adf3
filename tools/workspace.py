"""A learner's own copies of the notebooks, in work/ (ignored by git), never overwritten.

    python -m tools.workspace          # create missing copies; refresh the others

Refreshing takes the course's current notebook and puts the learner's answers (puzzle
cells) and any cells the learner added back in; the previous copy is kept in work/.backup/.
Pulling course updates therefore never conflicts with, or loses, a learner's work.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import time
from pathlib import Path

import nbformat

from lib.notebook.cells import puzzle_cells
from tools import NOTEBOOKS, WORK, course_notebooks


OWN_CELLS = "own-cells"          # tag of the heading above the learner's own cells


def version(course: nbformat.NotebookNode) -> str:
    """A fingerprint of the course's notebook: a learner's copy records the one it was made from."""
    return hashlib.sha256(nbformat.writes(course).encode()).hexdigest()[:16]


def _is_own(cell) -> bool:
    """A cell the learner made: the course marks every cell it ships (tools.stamp)."""
    return cell.metadata.get("course", {}).get("origin") != "course" and OWN_CELLS not in cell.metadata.get("tags", [])


def stamped(nb: nbformat.NotebookNode, course_version: str) -> nbformat.NotebookNode:
    nb.metadata.setdefault("course", {})["made_from"] = course_version
    return nb


def refreshed(course: nbformat.NotebookNode, mine: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The course's notebook with the learner's answers and own cells carried over."""
    new = nbformat.from_dict(course)
    answers = puzzle_cells(mine)
    for name, cell in puzzle_cells(new).items():
        if name in answers:
            cell.source = answers[name].source
    theirs = [c for c in mine.cells if _is_own(c)]
    if theirs:
        heading = nbformat.v4.new_markdown_cell("## Your own cells (kept from your earlier copy)")
        heading.metadata["tags"] = [OWN_CELLS]
        new.cells.append(heading)
        new.cells.extend(nbformat.from_dict(c) for c in theirs)
    return stamped(new, version(course))


def sync(source: Path = NOTEBOOKS, work: Path = WORK) -> list[tuple[str, str]]:
    """Create or refresh every learner copy; returns (notebook, what happened) pairs."""
    work.mkdir(exist_ok=True)
    report = []
    for path in course_notebooks(source):
        target = work / path.name
        course = nbformat.read(path, as_version=4)
        if not target.exists():
            nbformat.write(stamped(course, version(course)), target)
            report.append((path.name, "created"))
            continue
        mine = nbformat.read(target, as_version=4)
        if mine.metadata.get("course", {}).get("made_from") == version(course):
            report.append((path.name, "up to date"))
            continue
        new = refreshed(course, mine)
        backup = work / ".backup" / f"{target.stem}.{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
        backup.parent.mkdir(exist_ok=True)
        shutil.copyfile(target, backup)
        nbformat.write(new, target)
        report.append((path.name, "refreshed (your answers kept; the old copy is in "
                                  f"{backup.relative_to(work.parent)})"))
    return report


def main() -> None:
    for name, what in sync():
        print(f"work/{name}: {what}")
    sys.exit(0)


if __name__ == "__main__":
    main()
