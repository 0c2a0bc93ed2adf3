"""The course's own tools: a learner's workspace and progress, the student release, grading
(in a sandbox), nbgrader's settings and the notebooks' furniture.

Unlike lib/, these know the problem set (puzzles/); none of them needs solutions/ except
`python -m tools.gpu_check`, the instructors' pre-flight check, which runs the reference solutions.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
WORK = ROOT / "work"


def course_notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The course's notebooks, in order (NN_topic.ipynb)."""
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))
