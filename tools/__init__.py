"""The course's own tools: a learner's workspace and progress, the student release, grading.

Unlike lib/, these know the problem set (puzzles/); none of them needs solutions/ except
`python -m tools.stamp`, which only edits notebook metadata, and the instructors' pre-flight check
`python -m tools.gpu_check`, which runs the reference solutions.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
WORK = ROOT / "work"


def course_notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The course's notebooks, in order (NN_topic.ipynb)."""
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))
