"""The messages a third catalogue of first attempts (tests/attempts, written from the notebooks alone) gets, one per
attempt at one seed, for a person to read and judge: does the message name the mistake the attempt's note says?

    python -m bench.attempts --out bench/results/scratch/attempts.md           # every notebook, seed 0
    python -m bench.attempts --only nb03_zero --seed 2

The share named is counted by reading these messages, never by keywords (issue 48): the catalogue was not used to
tune the diagnosis, and the words a message should say are not written down in advance.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import pkgutil
import time
from pathlib import Path

import puzzles
import tests.attempts


def messages(only: str = "", seed: int = 0):
    """(module, puzzle, attempt, its note, passed, message, seconds) for every attempt, in catalogue order."""
    by_name = {p.name: p for p in puzzles.ALL}
    for module in sorted(m.name for m in pkgutil.iter_modules(tests.attempts.__path__)):
        if only and module not in only.split(","):
            continue
        for name, fn, note in importlib.import_module(f"tests.attempts.{module}").ATTEMPTS:
            out = io.StringIO()
            start = time.perf_counter()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                try:
                    passed = by_name[name].check(fn, strict=False, show=False, seed=seed)
                except BaseException as e:            # a check that crashes is a finding, not a stop
                    passed, out = None, io.StringIO(f"THE CHECK CRASHED: {type(e).__name__}: {e}")
            yield module, name, fn.__name__, note, passed, out.getvalue().strip(), time.perf_counter() - start


def report(rows) -> str:
    lines = []
    for module, name, attempt, note, passed, text, seconds in rows:
        verdict = {True: "PASSED", False: "failed", None: "CRASHED"}[passed]
        lines += [f"### {module} / {name} / {attempt}: {verdict} ({seconds:.1f} s)", f"Mistake: {note}", "```",
                  text, "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.attempts", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated modules of tests/attempts (nb01_memory, ...)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(messages(args.only, args.seed)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
