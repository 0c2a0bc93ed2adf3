"""The import directions docs/ARCHITECTURE.md promises, read from the source: a room that reaches into one it
must not fails here, naming the file and the line."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COURSE = ("lib", "puzzles", "solutions", "tools", "notebooks", "tests", "bench")

# (files, course packages their imports may name)
RULES = [
    ("lib/**/*.py", {"lib"}),
    ("lib/sim/*.py", {"lib.sim", "lib.errors", "lib.whose_code", "lib.units", "lib.viz", "lib.guard"}),
    ("lib/analytic/schedules.py", set()),
    ("puzzles/*.py", {"lib", "puzzles"}),
    ("solutions/*.py", {"lib", "puzzles", "solutions"}),        # what a notebook hands the learner, and no more
]


def _course_imports(path: Path):
    """(line, module) for every import of a course package in `path`, at any depth (lazy imports count)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        for name in names:
            if name.split(".")[0] in COURSE:
                yield node.lineno, name


def _allowed(module: str, allowed: set[str]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in allowed)


@pytest.mark.parametrize("pattern,allowed", RULES, ids=[r[0] for r in RULES])
def test_rooms_import_only_what_the_architecture_page_allows(pattern, allowed):
    files = sorted(ROOT.glob(pattern))
    assert files, f"no file matches {pattern}: update RULES and docs/ARCHITECTURE.md together"
    bad = [f"{f.relative_to(ROOT)}:{line} imports {module}" for f in files
           for line, module in _course_imports(f) if not _allowed(module, allowed)]
    assert not bad, "\n".join(bad)


def test_the_rule_catches_a_forbidden_import(tmp_path):
    sneaky = tmp_path / "engine.py"
    sneaky.write_text("def f():\n    import puzzles.zero\n    from lib.viz import plots\n")
    found = list(_course_imports(sneaky))
    assert found == [(2, "puzzles.zero"), (3, "lib.viz")]
    assert not _allowed("puzzles.zero", {"lib"}) and not _allowed("lib.viz", {"lib.sim", "lib.errors"})
