"""The import directions docs/ARCHITECTURE.md promises, read from the source: a room that reaches into one it
must not fails here, naming the file and the line."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COURSE = ("lib", "puzzles", "solutions", "tools", "notebooks", "tests", "bench")

SEAM = "lib.guard"        # the guard's one entry (lib/guard/__init__.py: around_run): all the engine may name of it
# (files, course packages their imports may name)
RULES = [
    ("lib/**/*.py", {"lib"}),
    ("lib/sim/*.py", {"lib.sim", "lib.errors", "lib.whose_code", "lib.units", "lib.viz", SEAM}),
    ("lib/analytic/schedules.py", set()),
    ("puzzles/*.py", {"lib", "puzzles"}),
    ("solutions/*.py", {"lib", "puzzles", "solutions"}),        # what a notebook hands the learner, and no more
]


def _course_imports(path: Path, root: Path = ROOT):
    """(line, module) for every import of a course package in `path`, at any depth (lazy imports and those for type
    checkers count); `from lib.sim import context` names lib.sim.context where that is a module of the package."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        if isinstance(node, ast.ImportFrom) and names:
            inner = [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}", root)]
            names = inner or names
        for name in names:
            if name.split(".")[0] in COURSE:
                yield node.lineno, name


def _is_module(name: str, root: Path) -> bool:
    where = root.joinpath(*name.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


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
    assert found == [(2, "puzzles.zero"), (3, "lib.viz.plots")]
    assert not _allowed("puzzles.zero", {"lib"}) and not _allowed("lib.viz", {"lib.sim", "lib.errors"})


ENGINE = ("lib/sim/*.py", "lib/checker/*.py", "lib/diagnose/*.py")


@pytest.mark.parametrize("pattern", ENGINE)
def test_the_engine_enters_the_guard_at_its_seam_only(pattern):
    bad = [f"{f.relative_to(ROOT)}:{line} imports {module}" for f in sorted(ROOT.glob(pattern))
           for line, module in _course_imports(f) if _allowed(module, {SEAM}) and module != SEAM]
    assert not bad, "the engine enters lib.guard through `from lib import guard` (guard.around_run) only:\n" + \
        "\n".join(bad)


def _circle(package: Path, root: Path = ROOT) -> list[str]:
    """A circle of imports among the modules of `package` (each module's imports at any depth), or []."""
    name = ".".join(package.relative_to(root).parts)
    graph = {f"{name}.{f.stem}": {m for _, m in _course_imports(f, root) if m.startswith(name + ".") and m != name}
             for f in sorted(package.glob("*.py")) if f.stem != "__init__"}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done or module not in graph:
            return []
        for imported in sorted(graph[module]):
            found = visit(imported, path + [module])
            if found:
                return found
        done.add(module)
        return []

    return next((c for c in (visit(m, []) for m in graph) if c), [])


def test_no_circle_of_imports_in_the_simulator():
    circle = _circle(ROOT / "lib" / "sim")
    assert not circle, "lib/sim's modules import each other in a circle: " + " -> ".join(circle)


def test_a_planted_circle_is_caught(tmp_path):
    package = tmp_path / "lib" / "planted"
    package.mkdir(parents=True)
    (package / "a.py").write_text("from lib.planted.b import f\n")
    (package / "b.py").write_text("def f():\n    from lib.planted import c\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import lib.planted.a\n")
    assert _circle(package, tmp_path) == ["lib.planted.a", "lib.planted.b", "lib.planted.c", "lib.planted.a"]


def test_the_engines_classes_inherit_nothing_of_the_guard():
    """A rank gets guarded stand-ins for them (lib.guard.handles): the classes themselves stay plain."""
    from lib.checker.feed import StepFeed
    from lib.sim.comm import Work
    from lib.sim.dist import SimDist
    from lib.sim.tracker import RankTracker

    for cls in (SimDist, Work, StepFeed, RankTracker):
        guarded = [c.__module__ for c in (*cls.__mro__, type(cls)) if c.__module__.startswith(SEAM)]
        assert not guarded, f"{cls.__name__} inherits from {guarded}"


def test_the_readme_serves_the_learner_and_the_map_names_every_room():
    """Issue 44: a README of at most 250 lines (the rest in docs/), and docs/ARCHITECTURE.md's picture naming every
    folder of lib/, so that a room added without its place on the map fails here."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    rooms = sorted(p.name for p in (ROOT / "lib").iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert rooms and not [r for r in rooms if f"{r}/" not in page], rooms
