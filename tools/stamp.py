"""Keep the notebooks' course furniture in step (run after editing or adding a notebook):
nbgrader metadata on puzzle and check cells, nbgrader's solution markers around each stub's body,
the badges and the first cell that open and run a notebook on a hosted service (tools.hosted), the
progress cell at the top, the texts every notebook shares (tools/texts/, one file each, so they
are written once), the kernel as ipykernel names it (KERNELSPEC: another display name makes JupyterLab mark the
notebook changed as it opens), and a mark on every course cell (`metadata.course.origin`), by which a refresh
tells a learner's own cells apart.

    python -m tools.stamp          # rewrites notebooks/*.ipynb in place; idempotent
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from lib.notebook.cells import add_grading_metadata, puzzle_cells, with_solution_markers
from tools import course_notebooks
from tools.hosted import badges, first_cell


def with_progress_cell(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """A first code cell that reports which puzzles of this notebook the saved copy solves."""
    if not any("progress" in c.metadata.get("tags", []) for c in nb.cells):
        first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        cell = nbformat.v4.new_code_cell('from tools.progress import progress\n\n'
                                         f'progress("{name}")  # of your saved copy: save (Ctrl-S) first')
        cell.metadata["tags"] = ["progress"]
        nb.cells[first_code:first_code] = [
            nbformat.v4.new_markdown_cell("Your progress in this notebook (run it again any time):"), cell]
    return nb


def _hosted(nb: nbformat.NotebookNode, part: str) -> nbformat.NotebookNode | None:
    return next((c for c in nb.cells if c.metadata.get("course", {}).get("hosted") == part), None)


def with_hosted_cells(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """Colab's and Binder's badges as the notebook's first cell, and after the title the first code cell, which
    makes the notebook run on a host that opens it alone (tools.hosted); both refreshed from tools.hosted."""
    for part, new_cell, source, where in (("badges", nbformat.v4.new_markdown_cell, badges(name), 0),
                                         ("first-cell", nbformat.v4.new_code_cell, first_cell(), 2)):
        cell = _hosted(nb, part)
        if cell is None:
            cell = new_cell()
            cell.metadata["course"] = {"hosted": part}
            nb.cells.insert(where, cell)
        cell.source = source
    return nb


KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def with_kernelspec(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The kernel every notebook runs on, named as ipykernel's own kernelspec names it."""
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    return nb


TEXTS = Path(__file__).resolve().parent / "texts"
SHARED_TEXTS = ("simulated_ranks",)      # placed after the notebook's introduction, in this order


def with_shared_texts(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Insert or refresh the shared markdown cells (metadata.course.text names the file they come from)."""
    for name in SHARED_TEXTS:
        source = (TEXTS / f"{name}.md").read_text().strip()
        cell = next((c for c in nb.cells if c.metadata.get("course", {}).get("text") == name), None)
        if cell is None:
            cell = nbformat.v4.new_markdown_cell(source)
            cell.metadata["course"] = {"text": name}
            how = next((i for i, c in enumerate(nb.cells) if "How the puzzles work" in c.source), 0)
            nb.cells.insert(how + 1, cell)
        cell.source = source
    return nb


def marked_as_course(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Every cell the course ships says so, so a learner's own cells can be told apart on refresh."""
    for cell in nb.cells:
        cell.metadata.setdefault("course", {})["origin"] = "course"
    return nb


def with_solution_regions(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Each stub's body between nbgrader's solution markers: nbgrader's student version keeps the def
    line, the signature and the docstring, and replaces only the body."""
    for cell in puzzle_cells(nb).values():
        cell.source = with_solution_markers(cell.source)
    return nb


def stamped(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """The notebook `name` with all of the course's furniture in place."""
    furnished = with_hosted_cells(with_shared_texts(with_progress_cell(nb, name)), name)
    return with_kernelspec(marked_as_course(add_grading_metadata(with_solution_regions(furnished))))


def main() -> None:
    for path in course_notebooks():
        nb = nbformat.read(path, as_version=4)
        before = nbformat.writes(nb)
        after = nbformat.writes(stamped(nb, path.stem))
        if after != before:
            path.write_text(after + "\n" if not after.endswith("\n") else after)
            print(f"stamped {path.name}")


if __name__ == "__main__":
    main()
