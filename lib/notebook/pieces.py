"""The learner's own answers to earlier notebooks, for a notebook that builds on them: read from their saved copies
(NN_topic.ipynb in the notebook's own folder: work/ under ./course lab, the notebook's folder on Colab or Binder) or
from a module file they name; never out of solutions/, which learners do not have.

A piece that cannot be had is named with what to do first ("ring_all_reduce: still the stub: finish notebook 02,
puzzle 4 first"), never raised as a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional

from lib.errors import is_the_stub
from lib.notebook.cells import load_answers


@dataclass(frozen=True)
class Gap:
    """A piece the learner has not handed over yet, and why."""

    name: str
    notebook: str
    number: Optional[int]          # its puzzle's number in its notebook, when known
    why: str

    def __str__(self) -> str:
        puzzle = f", puzzle {self.number}" if self.number else ""
        return f"{self.name}: {self.why}: finish notebook {self.notebook[:2]}{puzzle} ({self.notebook}) first"


@dataclass
class Pieces:
    """The learner's functions by puzzle name, where each came from, and the pieces still missing."""

    functions: dict[str, Callable] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.gaps

    def __getitem__(self, name: str) -> Callable:
        return self.functions[name]

    def report(self) -> str:
        """What a learner reads: each piece found and where from, then what to finish first."""
        lines = [f"✓ {name} from {where}" for name, where in self.origin.items()]
        if self.gaps:
            lines += ["", "Still to do before the trainer can run:"] + [f"  ○ {gap}" for gap in self.gaps]
        return "\n".join(lines)


def _inside_solutions(path: Path) -> bool:
    return any(part == "solutions" for part in path.resolve().parts[:-1])


def _from_module(path: Path, wanted: Mapping[str, str]) -> dict[str, Callable]:
    """The functions of a module file, by name (only those asked for)."""
    spec = importlib.util.spec_from_file_location(f"learner_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: getattr(module, name) for name in wanted if callable(getattr(module, name, None))}


def _from_notebook(path: Path) -> tuple[dict[str, Callable], dict[str, str]]:
    """A saved notebook's puzzle functions (its setup and puzzle cells run in a fresh namespace), and the errors
    its puzzle cells raised."""
    with contextlib.redirect_stdout(io.StringIO()):          # its setup cells' printing belongs to that notebook
        namespace, errors = load_answers(json.loads(path.read_text(encoding="utf-8")))
    return {k: v for k, v in namespace.items() if callable(v)}, errors


def learner_pieces(wanted: Mapping[str, str], *, folder: Optional[Path] = None, module: Optional[Path] = None,
                   numbers: Optional[Mapping[str, int]] = None) -> Pieces:
    """The learner's function for each name in `wanted` (name -> its notebook, "02_data_parallel"): from `module`
    (a .py file) where it defines it, else from the saved notebook in `folder` (the current folder by default).
    `numbers` gives each puzzle's number in its notebook, for the messages."""
    folder = Path.cwd() if folder is None else Path(folder)
    numbers = numbers or {}
    pieces, loaded = Pieces(), {}
    found: dict[str, Callable] = {}
    if module is not None:
        module = Path(module)
        if _inside_solutions(module):
            raise ValueError(f"{module} is in solutions/, the instructor's answers: name a file of your own")
        found = _from_module(module, wanted)
    for name, notebook in wanted.items():
        gap = functools.partial(Gap, name, notebook, numbers.get(name))
        if name in found:
            fn, where = found[name], str(module)
        else:
            path = folder / f"{notebook}.ipynb"
            if not path.exists():
                pieces.gaps.append(gap(f"no saved copy of notebook {notebook[:2]} in {folder}"))
                continue
            if path not in loaded:
                loaded[path] = _from_notebook(path)
            functions, errors = loaded[path]
            if name in errors:
                pieces.gaps.append(gap(f"its cell raises {errors[name].splitlines()[-1]}"))
                continue
            if name not in functions:
                pieces.gaps.append(gap("not defined in your copy"))
                continue
            fn, where = functions[name], path.name
        if is_the_stub(fn):
            pieces.gaps.append(gap("still the stub"))
            continue
        pieces.functions[name], pieces.origin[name] = fn, where
    return pieces
