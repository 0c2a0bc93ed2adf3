"""Sweep one puzzle over many seeds: its reference passes every one, and every catalogued wrong answer, cheat and
realistic mistake (tests/wrong, tests/cheats, tests/mistakes) fails every one, for the reason its entry names.

A catalogue entry that fails on most seeds but not all (a case that sometimes cannot tell the mistake apart, or
a message that names it only sometimes) is the defect this finds; the test suite draws one fresh seed per run.

    python -m tools.sweep ring_all_reduce                # seeds 0-29
    python -m tools.sweep ring_all_reduce --seeds 100 --quiet
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import pkgutil
import sys
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Row:
    """One function swept: what it is, and on which seeds it did not do what its entry says."""

    kind: str                      # reference, wrong, cheat, mistake
    fn: Callable
    words: tuple[tuple[str, ...], ...] = ()     # the message must contain one of each group (none: the reference)
    failures: dict[int, str] = field(default_factory=dict)

    def names_it(self, text: str) -> bool:
        return all(any(w in text for w in group) for group in self.words)


def _alternatives(words) -> tuple[str, ...]:
    return words if isinstance(words, tuple) else (words,)


def entries(name: str) -> list[Row]:
    """The reference and every catalogue entry of puzzle `name`."""
    try:
        import tests.cheats
        import tests.mistakes
        import tests.wrong
    except ImportError:
        raise SystemExit("sweep needs the course's tests/ (a checkout of the course, not a student release).") from None
    puzzle = _puzzle(name)
    reference = getattr(importlib.import_module(f"solutions.{puzzle.module}"), name)
    rows = [Row("reference", reference)]
    for package, attribute, kind in ((tests.wrong, "WRONG", "wrong"), (tests.cheats, "CHEATS", "cheat"),
                                     (tests.mistakes, "MISTAKES", "mistake")):
        for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
            for entry in getattr(importlib.import_module(f"{package.__name__}.{module}"), attribute, []):
                if kind == "mistake":
                    if entry.puzzle == name:
                        rows.append(Row(kind, entry.fn, (entry.words,) if entry.named_yet else ()))
                elif entry[0] == name:      # (puzzle, fn, reason[, diagnosis]), as tests/test_content.py reads them
                    rows.append(Row(kind, entry[1], tuple(_alternatives(w) for w in entry[2:4] if w is not None)))
    return rows


def _puzzle(name: str):
    import puzzles
    found = {p.name: p for p in puzzles.ALL}
    if name not in found:
        raise SystemExit(f"no puzzle {name!r}; the puzzles are: {', '.join(found)}.")
    return found[name]


def sweep(name: str, seeds: range) -> list[Row]:
    puzzle = _puzzle(name)
    rows = entries(name)
    for row in rows:
        for seed in seeds:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                ok = puzzle.check(row.fn, strict=False, show=False, seed=seed)
            text = out.getvalue()
            if row.kind == "reference":
                if not ok:
                    row.failures[seed] = text.splitlines()[0] if text else "failed"
            elif ok:
                row.failures[seed] = "passed"
            elif not row.names_it(text):
                row.failures[seed] = "failed without naming it: " + " / ".join(text.splitlines()[:2])[:300]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("puzzle")
    ap.add_argument("--seeds", type=int, default=30, help="seeds 0 to N-1 (default 30)")
    ap.add_argument("--quiet", action="store_true", help="only the entries that misbehave")
    args = ap.parse_args(argv)
    rows = sweep(args.puzzle, range(args.seeds))
    bad = 0
    for row in rows:
        wrong = len(row.failures)
        bad += wrong > 0
        if wrong or not args.quiet:
            verdict = "ok" if not wrong else f"{wrong} of {args.seeds} seeds not as catalogued"
            print(f"{row.kind:9} {row.fn.__name__:48} {verdict}")
            for seed, why in list(row.failures.items())[:3]:
                print(f"          seed {seed}: {why}")
    print(f"{args.puzzle}: {len(rows)} functions over {args.seeds} seeds, {bad} not as catalogued.")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
