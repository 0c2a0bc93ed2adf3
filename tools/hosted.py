"""The course on a host that opens a notebook alone (Colab, Kaggle, a downloaded .ipynb): the first cell of
every notebook, and what it runs once it has installed the course.

The cell (written into each notebook by `python -m tools.stamp`, from `first_cell` below) does nothing where
the course is importable already (`./course lab`, Binder, whose `postBuild` installs it, `pip install -e .`).
Elsewhere pip installs the course from REPOSITORY at REF, the ref the notebook was stamped with and the badges
open it from, so the notebook and its engine come from the same version: the packages `lib`, `puzzles` and
`tools` (pyproject.toml; never `solutions`), without their dependencies. Then `setup` installs only the pinned
dependencies the host lacks, keeps the versions the host has (its torch too), and imports `lib`, which refuses
a torch older than the course supports (lib.real.compat) with what to do. Running the cell again, or the notebook
after a restart, finds the course installed and fetches nothing.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

REPOSITORY = "https://github.com/llm-training-puzzles/llm-training-puzzles"
REF = "main"           # a branch or tag: for a class, a release's tag, then `python -m tools.stamp`
DISTRIBUTION = "llm-training-puzzles"   # the course's name in pyproject.toml, as pip installs it
# What the host runs the notebook with: never installed by the first cell, whatever version the host has.
HOST_PROVIDES = ("jupyterlab", "ipykernel")

FIRST_CELL = """\
# Opened alone (Colab, Kaggle, a downloaded notebook)? This installs the course at this notebook's version, and only
# what this machine lacks (tools/hosted.py). Where the course is installed (./course lab, Binder), it does nothing.
import importlib.util, subprocess, sys
if not importlib.util.find_spec("puzzles"):
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "git+{repository}@{ref}"], check=True)
    importlib.invalidate_caches(); from tools.hosted import setup; setup()"""

COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
BINDER_BADGE = "https://mybinder.org/badge_logo.svg"


def first_cell() -> str:
    """The source of every notebook's first code cell, with this course's repository and ref."""
    return FIRST_CELL.format(repository=REPOSITORY, ref=REF)


def colab_url(notebook: str) -> str:
    """Where Colab opens the notebook `notebook` (e.g. "02_data_parallel") at REF."""
    return f"{REPOSITORY.replace('https://github.com/', 'https://colab.research.google.com/github/')}" \
           f"/blob/{REF}/notebooks/{notebook}.ipynb"


def binder_url(notebook: str | None = None) -> str:
    """Binder at REF, in JupyterLab: on the notebook `notebook`, else on the notebooks' folder."""
    path = f"notebooks%2F{notebook}.ipynb" if notebook else "notebooks"
    return f"{REPOSITORY.replace('https://github.com/', 'https://mybinder.org/v2/gh/')}/{REF}?labpath={path}"


def badges(notebook: str) -> str:
    """The markdown of the badges at the top of a notebook: Colab, then Binder."""
    return (f"[![Open in Colab]({COLAB_BADGE})]({colab_url(notebook)}) "
            f"[![Open in Binder]({BINDER_BADGE})]({binder_url(notebook)})")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: Path, extras: tuple[str, ...] = ()) -> list[str]:
    """The course's pinned dependencies (`name==version`) from its pyproject.toml, with the named extras."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pip ships the same parser
        from pip._vendor import tomli as tomllib
    project = tomllib.loads(pyproject.read_text())["project"]
    found = list(project["dependencies"])
    for extra in extras:
        found += project["optional-dependencies"][extra]
    return found


def missing(pins: list[str]) -> list[str]:
    """The pins whose package is not installed at any version, less what the host runs the notebook with."""
    lacking = []
    for pin in pins:
        name = re.split(r"[=<>!~ ;\[]", pin, maxsplit=1)[0]
        if _canonical(name) in HOST_PROVIDES:
            continue
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            lacking.append(pin)
    return lacking


def installed_requirements() -> list[str]:
    """The pinned dependencies of the installed course (pyproject.toml's, without the extras)."""
    return [r for r in importlib.metadata.requires(DISTRIBUTION) or [] if ";" not in r]


def _source() -> str:
    """Where pip installed the course from: its address and commit (empty for a copy not installed from git)."""
    try:
        origin = json.loads(importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json") or "{}")
    except importlib.metadata.PackageNotFoundError:
        return ""
    commit = origin.get("vcs_info", {}).get("commit_id", "")
    return f" from {origin.get('url', '?')} (commit {commit[:7]})" if commit else ""


def setup() -> None:
    """Install what the host lacks of the course's pins, then import the course, which refuses an older torch."""
    lacking = missing(installed_requirements())
    if lacking:
        print(f"course: installing what this machine lacks: {' '.join(lacking)}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *lacking], check=True)
    import lib  # noqa: F401  an older torch is refused here, saying what to do

    import torch
    print(f"course: {DISTRIBUTION} {importlib.metadata.version(DISTRIBUTION)}{_source()}, torch {torch.__version__}, "
          f"Python {sys.version.split()[0]}")
