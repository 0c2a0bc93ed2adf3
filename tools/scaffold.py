"""Scaffold a new puzzle in one command: its spec, its reference solution, its notebook cells (statement, stub,
check, real run, with the course's tags and metadata) and a catalogued wrong answer, all working at once.

    python -m tools.scaffold data_parallel recursive_doubling_all_reduce

The example it writes is a sum over ranks (every rank returns the sum of every rank's vector, within a ring
all-reduce's bytes): replace the case builder, the reference and the statement with the lesson, keeping the
shape. Then run the puzzle's tests (docs/ARCHITECTURE.md, "Add a puzzle") and sweep its catalogue over seeds:

    python -m pytest tests/test_content.py -k recursive_doubling_all_reduce
    python -m tools.sweep recursive_doubling_all_reduce
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

import nbformat

from tools import ROOT
from tools.stamp import stamped

SPEC = '''

# ---- {name} (scaffolded: replace the example, a sum over ranks, with the lesson) -------------------------
def _{name}_case(rng: random.Random, world: int) -> Case:
    """Each rank holds a vector of float64s; every rank returns the sum of all of them."""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    xs = [torch.randn(4 * world, generator=g, dtype=torch.float64) for _ in range(world)]
    total = sum(xs)
    ring = 2 * (world - 1) / world * total.numel() * total.element_size()
    return Case(world, (per_rank(xs),), [total] * world, f"N={{world}}, {{total.numel()}} values per rank",
                budgets=[Budget("bytes_sent", ring, "2(N-1)/N × the vector's bytes, what a ring all-reduce sends")])


{name} = Puzzle(
    "{name}", NOTEBOOK, _{name}_case, world_sizes=(2, 3, 4),
    hints=["Every rank needs the sum of every rank's vector.", "dist.all_reduce sums a tensor in place."],
    describe="Every rank returns the sum of all ranks' vectors.")
PUZZLES.append({name})
'''

REFERENCE = '''

def {name}(dist, x):
    dist.all_reduce(x)
    return x
'''

WRONG = '''

def {name}_without_communication(dist, x):
    """Each rank returns its own vector: nothing was exchanged."""
    return x.clone()


WRONG.append(("{name}", {name}_without_communication, "expected", "unchanged from what rank"))
'''

STATEMENT = ("## Puzzle {number}: `{name}`\n\nEvery rank holds a vector `x`; return, on every rank, the sum of "
             "all ranks' vectors. (Scaffolded: write the lesson's statement here, at most five lines.)")
STUB = ('def {name}(dist, x):\n    """Return the sum of every rank\'s x, on every rank."""\n'
        '    raise NotImplementedError  # your code here')

NEEDS = {"random": "import random", "torch": "import torch", "Budget": "from lib.checker.puzzle import Budget",
         "Case": "from lib.checker.puzzle import Case", "Puzzle": "from lib.checker.puzzle import Puzzle",
         "per_rank": "from lib.sim import per_rank"}


class ScaffoldError(ValueError):
    """The scaffold cannot be written as asked (the message says why and what to do)."""


def scaffold(module: str, name: str, root: Path = ROOT) -> list[Path]:
    """Write puzzle `name` into the notebook of puzzles/<module>.py; returns the files changed."""
    spec_path = root / "puzzles" / f"{module}.py"
    if not spec_path.exists():
        raise ScaffoldError(f"no puzzles/{module}.py: the modules are {', '.join(_modules(root))}.")
    if not name.isidentifier():
        raise ScaffoldError(f"{name!r} is not a Python identifier: a puzzle is named as its function is.")
    spec = spec_path.read_text()
    if re.search(rf"^{name} = Puzzle\(", spec, re.M):
        raise ScaffoldError(f"puzzles/{module}.py already has a puzzle {name}.")
    notebook = _notebook_of(spec, root)
    spec_path.write_text(_with_imports(spec, SPEC.format(name=name)) + SPEC.format(name=name))
    reference = root / "solutions" / f"{module}.py"
    reference.write_text(reference.read_text() + REFERENCE.format(name=name))
    wrong = root / "tests" / "wrong" / f"{module}.py"
    wrong.write_text(wrong.read_text() + WRONG.format(name=name))
    _add_cells(notebook, name)
    return [spec_path, reference, wrong, notebook]


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


def _add_cells(path: Path, name: str) -> None:
    """Statement, stub, check and real cells after the last puzzle's, with the course's tags; then stamped."""
    nb = nbformat.read(path, as_version=4)
    after = max((i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                 and {"check", "real"} & set(c.metadata.get("tags", []))), default=len(nb.cells) - 1)
    number = 1 + sum("puzzle" in c.metadata.get("tags", []) for c in nb.cells)
    cells = [nbformat.v4.new_markdown_cell(STATEMENT.format(name=name, number=number))]
    for tag, source in (("puzzle", STUB.format(name=name)), ("check", f"P.{name}.check({name});"),
                        ("real", f"P.{name}.real({name}, world_size=2);")):
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = [tag]
        cell.metadata["course"] = {"puzzle": name}
        cells.append(cell)
    nb.cells[after + 1:after + 1] = cells
    nbformat.write(stamped(nb, path.stem), path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.scaffold", description=__doc__.split("\n\n")[0])
    ap.add_argument("module", help="the problem-set module, e.g. data_parallel (puzzles/<module>.py)")
    ap.add_argument("name", help="the puzzle's function name")
    args = ap.parse_args(argv)
    try:
        changed = scaffold(args.module, args.name)
    except ScaffoldError as e:
        print(f"scaffold: {e}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"wrote {path.relative_to(ROOT)}")
    importlib.invalidate_caches()
    print(f"next: python -m pytest tests/test_content.py -k {args.name}; python -m tools.sweep {args.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
