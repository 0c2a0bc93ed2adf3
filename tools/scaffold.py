"""Scaffold a new puzzle in one command: its spec, its reference solution, its notebook cells (statement, stub,
check, real run, with the course's tags and metadata) and a catalogued wrong answer, all working at once.

    python -m tools.scaffold data_parallel recursive_doubling_all_reduce --after ring_all_reduce --world-sizes 2,4,8

The example it writes is a sum over ranks (every rank returns the sum of every rank's vector, within a ring
all-reduce's bytes): replace the case builder, the reference and the statement with the lesson, keeping the
shape. It prints the commands that test the puzzle (docs/ARCHITECTURE.md, "Add a puzzle", gives the same).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import textwrap
from pathlib import Path

import nbformat

from tools import ROOT
from tools.stamp import stamped

SPEC = '''

# ---- {name}: scaffolded, a sum over ranks; replace it with the lesson ----
def _{name}_case(rng: random.Random, world: int) -> Case:
    """Each rank holds a vector of float64s; every rank returns the sum of all of them."""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    xs = [torch.randn(4 * world, generator=g, dtype=torch.float64) for _ in range(world)]
    total = sum(xs)
    ring = 2 * (world - 1) / world * total.numel() * total.element_size()
    # allowed_ops=None lets the answer call any collective; a lesson that builds one from messages forbids the
    # rest, e.g. allowed_ops=frozenset({{"send", "recv"}}).
    return Case(world, (per_rank(xs),), [total] * world, f"N={{world}}, {{total.numel()}} values per rank",
                allowed_ops=None,
                budgets=[Budget("bytes_sent", ring, "2(N-1)/N × the vector's bytes, what a ring all-reduce sends")])


{name} = Puzzle(
    "{name}", NOTEBOOK, _{name}_case,
    world_sizes={world_sizes},
    hints=["Every rank needs the sum of every rank's vector.", "dist.all_reduce sums a tensor in place."],
    describe="Every rank returns the sum of all ranks' vectors.")
'''

REFERENCE = '''

def {name}(dist, x):
    dist.all_reduce(x)
    return x
'''

WRONG = '''

def {name}_alone(dist, x):
    """Each rank returns its own vector: nothing was exchanged."""
    return x.clone()


WRONG.append(("{name}", {name}_alone,
              "expected", "unchanged from what rank"))
'''

STATEMENT = ("## Puzzle {number}: `{name}`\n\nEvery rank holds a vector `x`; return, on every rank, the sum of "
             "all ranks' vectors. (Scaffolded: write the lesson's statement here, at most five lines.)")
STUB = ('def {name}(dist, x):\n    """Return the sum of every rank\'s x, on every rank."""\n'
        '    raise NotImplementedError  # your code here')

NEEDS = {"random": "import random", "torch": "import torch", "Budget": "from lib.checker.puzzle import Budget",
         "Case": "from lib.checker.puzzle import Case", "Puzzle": "from lib.checker.puzzle import Puzzle",
         "per_rank": "from lib.sim import per_rank"}
PUZZLES_LIST = re.compile(r"^PUZZLES = \[(?P<names>[^\]]*)\]\n", re.M)
HEADING = re.compile(r"^## Puzzle (\d+):", re.M)
MENTION = re.compile(r"\b[Pp]uzzle (\d+)\b")              # prose that names a puzzle by its number
CHECK_TEXT = "**Check** on simulated ranks (several world sizes and shapes):"
REAL_TEXT = ("**Real run**: the same function on {n} real processes (gloo on this CPU; NCCL when there are {n} GPUs), "
             "compared with the reference.")


def next_commands(name: str, notebook: str) -> list[str]:
    """What to run after each edit of a puzzle: the guide's three commands, printed by the scaffold too."""
    return [f"python -m pytest -n 0 tests/test_content.py -k {name}",
            f'python -m pytest -n 0 tests/test_notebooks.py -k "cells and {notebook[:2]}"',
            f"python -m tools.sweep {name}"]


class ScaffoldError(ValueError):
    """The scaffold cannot be written as asked (the message says why and what to do)."""


def scaffold(module: str, name: str, root: Path = ROOT, *, after: str | None = None,
             world_sizes: tuple[int, ...] = (2, 4)) -> tuple[list[Path], list[str]]:
    """Write puzzle `name` into the notebook of puzzles/<module>.py, after puzzle `after` (default: last);
    returns the files changed and the notebook's prose lines that name a puzzle by a number that moved."""
    spec_path = root / "puzzles" / f"{module}.py"
    if not spec_path.exists():
        raise ScaffoldError(f"no puzzles/{module}.py: the modules are {', '.join(_modules(root))}.")
    if not name.isidentifier():
        raise ScaffoldError(f"{name!r} is not a Python identifier: a puzzle is named as its function is.")
    if not world_sizes or min(world_sizes) < 1:
        raise ScaffoldError(f"world sizes {world_sizes}: give one or more positive sizes, e.g. 2,4,8.")
    spec = spec_path.read_text()
    if re.search(rf"^{name} = Puzzle\(", spec, re.M):
        raise ScaffoldError(f"puzzles/{module}.py already has a puzzle {name}.")
    listed = PUZZLES_LIST.search(spec)
    if listed is None:
        raise ScaffoldError(f"puzzles/{module}.py has no `PUZZLES = [...]` list to add the puzzle to.")
    names = [n.strip() for n in listed.group("names").split(",") if n.strip()]
    if after is not None and after not in names:
        raise ScaffoldError(f"no puzzle {after} in puzzles/{module}.py to place it after: {', '.join(names)}.")
    notebook = _notebook_of(spec, root)
    names.insert(names.index(after) + 1 if after else len(names), name)
    block = SPEC.format(name=name, world_sizes=tuple(world_sizes))
    spec = _with_imports(spec, block)
    listed = PUZZLES_LIST.search(spec)
    spec_path.write_text(spec[:listed.start()].rstrip("\n") + block + "\n\n" + _puzzles_list(names)
                         + spec[listed.end():])
    reference = root / "solutions" / f"{module}.py"
    reference.write_text(reference.read_text() + REFERENCE.format(name=name))
    wrong = root / "tests" / "wrong" / f"{module}.py"
    wrong.write_text(wrong.read_text() + WRONG.format(name=name))
    stale = _add_cells(notebook, name, after, 4 if 4 in world_sizes else max(world_sizes))
    return [spec_path, reference, wrong, notebook], stale


def _puzzles_list(names: list[str]) -> str:
    """`PUZZLES = [...]` wrapped as the course's code is, at 120 columns."""
    lines = textwrap.wrap(", ".join(names), width=120 - len("PUZZLES = ["), break_long_words=False,
                          break_on_hyphens=False)
    return "PUZZLES = [" + ("\n" + " " * len("PUZZLES = [")).join(lines) + "]\n"


def _modules(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "puzzles").glob("*.py") if not p.stem.startswith("_")
                  and p.stem != "parallel_gpt")


def _notebook_of(spec: str, root: Path) -> Path:
    found = re.search(r'^NOTEBOOK = "([^"]+)"', spec, re.M)
    path = root / "notebooks" / f"{found.group(1)}.ipynb" if found else None
    if path is None or not path.exists():
        raise ScaffoldError("the module names no notebook (NOTEBOOK = \"NN_topic\") that exists in notebooks/.")
    return path


def _with_imports(spec: str, block: str) -> str:
    """`spec` with the imports `block` needs and it lacks, after its last top-level import."""
    missing = [line for word, line in NEEDS.items()
               if re.search(rf"\b{word}\b", block) and not re.search(rf"^(import|from) .*\b{word}\b", spec, re.M)]
    if not missing:
        return spec
    lines = spec.split("\n")
    last = max(i for i, line in enumerate(lines) if re.match(r"(import|from) \S+", line))
    return "\n".join(lines[:last + 1] + missing + lines[last + 1:])


def _add_cells(path: Path, name: str, after: str | None, real_world: int) -> list[str]:
    """Statement, stub, check and real cells after puzzle `after`'s last cell (default: the last puzzle's), the
    puzzles' headings numbered again in order; then stamped. Returns the prose lines that name a puzzle by a number
    the insertion changed (for the contributor to read again)."""
    nb = nbformat.read(path, as_version=4)
    if after is None:
        at = max((i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                  and {"check", "real"} & set(c.metadata.get("tags", []))), default=len(nb.cells) - 1)
    else:
        at = max(i for i, c in enumerate(nb.cells) if c.metadata.get("course", {}).get("puzzle") == after)
    cells = [nbformat.v4.new_markdown_cell(STATEMENT.format(name=name, number=0))]
    for tag, source, before in (
            ("puzzle", STUB.format(name=name), None),
            ("check", f"P.{name}.check({name});", CHECK_TEXT),
            ("real", f"P.{name}.real({name}, world_size={real_world});", REAL_TEXT.format(n=real_world))):
        if before:
            cells.append(nbformat.v4.new_markdown_cell(before))
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = [tag]
        cell.metadata["course"] = {"puzzle": name}
        cells.append(cell)
    nb.cells[at + 1:at + 1] = cells
    number, renumbered = 0, {}
    for cell in nb.cells:
        found = HEADING.search(cell.source) if cell.cell_type == "markdown" else None
        if found:
            number += 1
            renumbered[int(found.group(1))] = number
            cell.source = HEADING.sub(f"## Puzzle {number}:", cell.source, count=1)
    nbformat.write(stamped(nb, path.stem), path)
    return [f"{path.name}: {line.strip()}" for c in nb.cells if c.cell_type == "markdown"
            for line in c.source.splitlines() if MENTION.search(line) and not HEADING.search(line)
            and any(int(n) != renumbered.get(int(n), int(n)) for n in MENTION.findall(line))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.scaffold", description=__doc__.split("\n\n")[0])
    ap.add_argument("module", help="the problem-set module, e.g. data_parallel (puzzles/<module>.py)")
    ap.add_argument("name", help="the puzzle's function name")
    ap.add_argument("--after", help="the puzzle it follows in the notebook and in PUZZLES (default: the last)")
    ap.add_argument("--world-sizes", default="2,4", help="the world sizes its check runs, e.g. 2,4,8 (default 2,4)")
    args = ap.parse_args(argv)
    try:
        sizes = tuple(int(s) for s in args.world_sizes.split(",") if s.strip().isdigit())
        if len(sizes) != len(args.world_sizes.split(",")):
            raise ScaffoldError(f"--world-sizes {args.world_sizes!r}: whole numbers and commas, e.g. 2,4,8")
        changed, stale = scaffold(args.module, args.name, after=args.after, world_sizes=sizes)
    except ValueError as e:
        print(f"scaffold: {e}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print("the puzzles after it moved down one: read again the prose that names them by number:\n"
              + "\n".join(f"  {line}" for line in stale))
    importlib.invalidate_caches()
    print("next, after each edit:\n" + "\n".join(f"  {c}" for c in next_commands(args.name, changed[-1].stem)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
