"""Which files the grader reads, and how: the notebooks of the assignment asked for, each a regular file inside
its student's folder, opened without following a link, never blocking, and read up to NOTEBOOK_BYTES.

A notebook that is a symbolic link (to another student's, or to the instructor's solved copy), a FIFO, a device,
a file with other names (a hard link) or one too large is refused, with the reason, before any sandbox starts;
so is a notebook of another assignment dropped in the folder, unless the instructor asks for it.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tools import course_notebooks

NOTEBOOK_BYTES = 16 * 2**20          # more is outputs: the grader reads no notebook larger (clear its outputs)
ALL = "all"


class Refused(Exception):
    """A file the grader does not read, and why."""


@dataclass(frozen=True)
class Found:
    """A notebook of a student's folder: to grade, or refused (`refused` says why)."""

    student: str
    folder: Path
    name: str                        # the file's name in the folder
    refused: Optional[str] = None

    @property
    def notebook(self) -> str:
        return self.name.removesuffix(".ipynb")


def student(folder: Path) -> str:
    """A folder's student: its name, or in nbgrader's submitted/STUDENT/ASSIGNMENT/, the student's."""
    folder = folder.resolve()
    return folder.parent.name if folder.parent.parent.name == "submitted" else folder.name


def assignment(paths: list[Path], asked: Optional[str]) -> Optional[set[str]]:
    """The notebooks to grade: those `asked` names (comma-separated; `all`: every notebook of the course), else
    those of nbgrader's source/ASSIGNMENT/ where every folder is nbgrader's submitted/STUDENT/ASSIGNMENT/, else
    None where each argument is one notebook (it names itself). Raises SystemExit where it cannot tell."""
    course = {p.stem for p in course_notebooks()}
    if asked:
        names = course if asked.strip() == ALL else {n.strip().removesuffix(".ipynb") for n in asked.split(",")}
        unknown = sorted(names - course)
        if unknown:
            raise SystemExit(f"grade: --notebooks: {', '.join(unknown)} is not a notebook of this course "
                             f"({', '.join(sorted(course))})")
        return names
    folders = [p for p in paths if p.is_dir()]
    if not folders:
        return None
    sources = {p.resolve().parents[2] / "source" / p.resolve().name for p in folders
               if len(p.resolve().parents) > 2 and p.resolve().parent.parent.name == "submitted"}
    if len(sources) == 1 and len(folders) == sum(p.resolve().parent.parent.name == "submitted" for p in folders):
        source = sources.pop()
        if source.is_dir():
            return {p.stem for p in source.glob("*.ipynb")} & course
    raise SystemExit("grade: which notebooks does this assignment hold? Say it with --notebooks, e.g. "
                     "--notebooks 02_data_parallel (several: comma-separated; every notebook of the course: all). "
                     "Only those are graded: a notebook of another assignment dropped in a folder earns nothing.")


def found(paths: list[Path], asked: Optional[set[str]]) -> list[Found]:
    """Each argument's notebooks: every entry of a folder whose name ends in .ipynb, or the one notebook named.
    Entries that are not the assignment's notebooks or not regular files come back refused."""
    out: list[Found] = []
    for path in paths:
        if path.is_dir():
            names = sorted(entry.name for entry in os.scandir(path) if entry.name.endswith(".ipynb"))
            if not names:
                hint = " (nbgrader's layout: give submitted/STUDENT/ASSIGNMENT)" if any(path.glob("*/*.ipynb")) else ""
                print(f"WARNING: {path}: no notebook (.ipynb) in this folder, nothing graded for it{hint}")
            out += [Found(student(path), path, name) for name in names]
        elif path.suffix == ".ipynb":                 # named as the course's notebook: its folder says whose it is
            out.append(Found(student(path.parent), path.parent, path.name))
        else:
            raise SystemExit(f"grade: {path} is neither a folder of notebooks nor a .ipynb file")
    return [f if asked is None or f.notebook in asked else
            Found(f.student, f.folder, f.name, "not a notebook of the assignment asked for (--notebooks): not graded")
            for f in out]


def read(found: Found) -> bytes:
    """The notebook's bytes, read from a regular file inside its folder without following a link or waiting on
    a FIFO or a device; Refused otherwise, or where it holds more than NOTEBOOK_BYTES."""
    try:
        folder = os.open(found.folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise Refused(f"its folder cannot be opened ({e.strerror})") from None
    try:
        fd = os.open(found.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=folder)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused("a symbolic link: the grader reads only a file of the student's own") from None
        raise Refused(f"it cannot be opened ({e.strerror})") from None
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused("not a regular file (a FIFO, a device, a folder): nothing a notebook is saved as")
        if info.st_nlink > 1:
            raise Refused(f"a file with {info.st_nlink} names (a hard link): maybe another file's content; copy it "
                          "to grade it")
        data = os.read(fd, NOTEBOOK_BYTES + 1)
        while len(data) <= NOTEBOOK_BYTES and (more := os.read(fd, NOTEBOOK_BYTES + 1 - len(data))):
            data += more
    finally:
        os.close(fd)
    if len(data) > NOTEBOOK_BYTES:
        raise Refused(f"larger than {NOTEBOOK_BYTES // 2**20} MiB (outputs, most likely): clear its outputs "
                      "(jupyter nbconvert --clear-output) to grade it")
    return data
