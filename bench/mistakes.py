"""How well the checks teach: the share of realistic first attempts (tests/mistakes) whose failure message names
the mistake, per notebook, over several seeds, and how long a learner waits for each of those failures (the check's
wall time, diagnosis included: a failure replays the learner's function to name its mistake). Writes
bench/results/mistakes.md.

    python -m bench.mistakes                 # every notebook, seeds 0-2
    python -m bench.mistakes --only moe --seeds 5 --show   # one notebook, print each unnamed message
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import pkgutil
import statistics
import time
from collections import defaultdict
from pathlib import Path

import puzzles
import tests.mistakes

RESULTS = Path(__file__).resolve().parent / "results" / "mistakes.md"


def measure(only: str = "", seeds: int = 3, show: bool = False) -> dict[str, list[tuple[str, int, int, bool, float]]]:
    """{notebook: [(attempt, seeds named, seeds run, passed on some seed, slowest check's seconds)]}."""
    by_name = {p.name: p for p in puzzles.ALL}
    rows: dict[str, list] = defaultdict(list)
    for module in sorted(m.name for m in pkgutil.iter_modules(tests.mistakes.__path__)):
        if only and module not in only.split(","):
            continue
        for attempt in importlib.import_module(f"tests.mistakes.{module}").MISTAKES:
            puzzle = by_name[attempt.puzzle]
            named = passed = 0
            slowest = 0.0
            for seed in range(seeds):
                out = io.StringIO()
                start = time.perf_counter()
                with contextlib.redirect_stdout(out):
                    ok = puzzle.check(attempt.fn, strict=False, show=False, seed=seed)
                slowest = max(slowest, time.perf_counter() - start)
                text = out.getvalue()
                passed += ok
                named += (not ok) and attempt.names_it(text)
                if show and not ok and not attempt.names_it(text):
                    print(f"--- {attempt.puzzle} / {attempt.fn.__name__} (seed {seed}), wants {attempt.words}:\n{text}")
            rows[puzzle.notebook].append((f"{attempt.puzzle}/{attempt.fn.__name__}", named, seeds, passed > 0, slowest))
    return rows


def table(rows: dict[str, list]) -> str:
    lines = ["| notebook | attempts | named (all seeds) | share | failing check, median / slowest (s) | "
             "passed a check |", "|---|---|---|---|---|---|"]
    total = named_all = 0
    for notebook in sorted(rows):
        entries = rows[notebook]
        named = sum(n == s for _, n, s, *_ in entries)
        total, named_all = total + len(entries), named_all + named
        passed = [a for a, _, _, p, _ in entries if p]
        waits = [w for *_, w in entries]
        slowest = max(entries, key=lambda e: e[-1])
        lines.append(f"| {notebook} | {len(entries)} | {named} | {named / max(len(entries), 1):.0%} | "
                     f"{statistics.median(waits):.2f} / {slowest[-1]:.2f} ({slowest[0]}) | "
                     f"{', '.join(passed) or 'none'} |")
    lines.append(f"| all | {total} | {named_all} | {named_all / max(total, 1):.0%} | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.mistakes", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated catalogue modules (memory, zero, moe, ...)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--show", action="store_true", help="print the message of every attempt not named")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    text = table(measure(args.only, args.seeds, args.show))
    print(text)
    if not args.only:
        args.out.write_text(f"# Realistic first attempts named by their failure message (seeds 0-{args.seeds - 1})\n\n"
                            f"{text}\n")


if __name__ == "__main__":
    main()
