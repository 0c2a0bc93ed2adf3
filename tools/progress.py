"""Which puzzles a learner has solved, by running the checkers on their saved notebooks.

    python -m tools.progress            # every notebook in work/ (or notebooks/ if there is no work/)

In a notebook, `progress("02_data_parallel")` reports on that notebook's saved copy.
"""

from __future__ import annotations

import io
import json
import os
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Optional

import puzzles
from lib.checker.puzzle import FAILING, PASSED, UNATTEMPTED
from lib.notebook.cells import load_answers
from tools import NOTEBOOKS, WORK, course_notebooks

SYMBOLS = {"solved": "✓", "not solved": "○", "failing": "✗", "missing": "?"}


def notebook_progress(path: Path) -> list[tuple[str, str, str]]:
    """(puzzle, status, detail) for each puzzle of the notebook at `path`."""
    module = puzzles.of_notebook(path.stem)
    if module is None:
        return []
    with redirect_stdout(io.StringIO()):          # the notebook's own prints are not the report
        namespace, errors = load_answers(json.loads(path.read_text(encoding="utf-8")))
    rows = []
    for p in module.PUZZLES:
        fn = namespace.get(p.name)
        if p.name in errors:
            rows.append((p.name, "failing", f"its cell raised {errors[p.name]}"))
        elif fn is None:
            rows.append((p.name, "missing", f"no function named {p.name} in the notebook"))
        else:
            with redirect_stdout(io.StringIO()):
                outcome = p.evaluate(fn)
            status = {PASSED: "solved", FAILING: "failing", UNATTEMPTED: "not solved"}[outcome.status]
            rows.append((p.name, status, "" if outcome.ok else outcome.message.splitlines()[0]))
    return rows


def progress(notebook: Optional[str] = None, folder: Optional[Path] = None) -> None:
    """Print the progress of one notebook (by name, e.g. "01_memory") or of all of them.

    Looks in the current folder when it holds the notebook (a learner's kernel runs in work/),
    otherwise in work/, otherwise in notebooks/. Says nothing while nbgrader grades (the check cells
    are the grade there; running every checker twice would only cost time)."""
    if os.environ.get("NBGRADER_EXECUTION"):
        print("Progress is not computed while nbgrader grades: the check cells below are the grade.")
        return
    if folder is None:
        here = Path.cwd()
        folder = here if notebook and (here / f"{notebook}.ipynb").exists() else WORK if WORK.exists() else NOTEBOOKS
    paths = [folder / f"{notebook}.ipynb"] if notebook else course_notebooks(folder)
    for path in paths:
        if not path.exists():
            print(f"{path.name}: not found in {folder}")
            continue
        rows = notebook_progress(path)
        done = sum(status == "solved" for _, status, _ in rows)
        print(f"{path.stem}: {done} of {len(rows)} solved (saved copy: {path})")
        for name, status, detail in rows:
            print(f"  {SYMBOLS[status]} {name}" + (f": {detail}" if detail and status != "not solved" else ""))


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    progress(folder=folder)


if __name__ == "__main__":
    main()
