"""The course on a host that opens a notebook alone (Colab, Kaggle, a downloaded .ipynb): the first cell of
every notebook, and what it runs once it has fetched the course.

The cell (written into each notebook by `python -m tools.stamp`, from `first_cell` below) does nothing where
the course is importable already (`./course lab`, an installed course) and only puts the checkout on the path
where the notebook sits in one (Binder, `jupyter lab notebooks`). Elsewhere it fetches `lib`, `puzzles` and
`tools` (never `solutions`) from REPOSITORY at REF, the ref the notebook was stamped with and the badges open
it from, so the notebook and its engine come from the same version, then calls `setup`: it installs only
the pinned dependencies the host lacks, keeps the host's own torch, and imports `lib`, which refuses a torch
older than the course supports (lib.real.compat) with what to do.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

REPOSITORY = "https://github.com/llm-training-puzzles/llm-training-puzzles"
REF = "main"           # a branch or tag: for a class, a release's tag, then `python -m tools.stamp`
HOME = "llm-training-puzzles"   # the folder the first cell fetches into, in the host's working directory
# What the host runs the notebook with: never installed by the first cell, whatever version the host has.
HOST_PROVIDES = ("jupyterlab", "ipykernel")

FIRST_CELL = """\
# Opened alone (Colab, Kaggle, a downloaded notebook)? This cell fetches the course's code at this notebook's
# version and installs only what this machine lacks. Where the course is installed (./course lab), it does nothing.
import importlib.util, os, shutil, subprocess, sys
REPOSITORY, REF, HOME = "{repository}", "{ref}", "{home}"
if importlib.util.find_spec("puzzles") is None:
    if os.path.isfile(os.path.join("..", "tools", "hosted.py")):  # opened inside a checkout (Binder)
        sys.path.insert(0, os.path.abspath(".."))
    else:
        if not os.path.isdir(HOME):  # lib, puzzles and tools only: never the reference solutions
            shutil.rmtree(HOME + ".part", ignore_errors=True)
            subprocess.run(["git", "clone", "-q", "--depth=1", "--filter=blob:none", "--sparse", "--branch", REF,
                            REPOSITORY, HOME + ".part"], check=True)
            subprocess.run(["git", "-C", HOME + ".part", "sparse-checkout", "set", "lib", "puzzles", "tools"],
                           check=True)
            os.rename(HOME + ".part", HOME)
        sys.path.insert(0, os.path.abspath(HOME))
    from tools.hosted import setup
    setup()"""

COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
BINDER_BADGE = "https://mybinder.org/badge_logo.svg"


def first_cell() -> str:
    """The source of every notebook's first code cell, with this course's repository and ref."""
    return FIRST_CELL.format(repository=REPOSITORY, ref=REF, home=HOME)


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


def _commit(root: Path) -> str:
    """The commit a fetched course is at (empty outside a git checkout)."""
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f" (commit {done.stdout.strip()})" if done.returncode == 0 else ""


def setup(root: Path | None = None) -> None:
    """Install what the host lacks of the course's pins, then import the course, which refuses an older torch."""
    root = root or Path(__file__).resolve().parents[1]
    lacking = missing(requirements(root / "pyproject.toml"))
    if lacking:
        print(f"course: installing what this machine lacks: {' '.join(lacking)}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *lacking], check=True)
    import lib  # noqa: F401  an older torch is refused here, saying what to do

    import torch
    print(f"course: {root}{_commit(root)}, torch {torch.__version__}, Python {sys.version.split()[0]}")
