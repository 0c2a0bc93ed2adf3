"""Grade submitted notebooks: every puzzle's checker, in strict mode, each notebook in its own sandbox.

    python -m tools.grade SUBMISSION [SUBMISSION ...] [--out grading/] [--timeout 300] [--memory-gb 8]
                          [--isolation auto|bubblewrap|namespaces|folder]

A SUBMISSION is a student's folder of notebooks (the folder's name is the student's; in nbgrader's
submitted/STUDENT/ASSIGNMENT/ it is STUDENT) or one notebook in such a folder (the same). Writes
scores.csv and scores.json to --out: one row per student, notebook and puzzle, 1 point per solved
puzzle.

Each notebook runs in the strongest sandbox the machine allows (tools.sandbox; the grader prints
which one and what it does not contain): the engine and the problem set read-only, none of your
files (the answer key included), no network, every process it starts killed when it ends or at
--timeout, one memory limit for all of them. The grader owns identity and the puzzle list: the
judge inside (tools.judge) signs each result: unsigned rows are discarded and reported, and signed
rows the judge never writes (another student, an unknown or repeated puzzle, points other than 0 and
1) grade the whole notebook `tampered`.

Not contained: the judge calls the answers, so it runs in their process, and code there can reach
everything the judge holds. A notebook that takes the key from the judge's frame and writes exactly
one plausible row per puzzle before leaving with os._exit, or that rewrites the judge's list of
checks, scores full marks (tests/test_grade.py shows both). Keeping the key elsewhere (signing in a
parent process) would not help: the rows or checks it signs would still come from that process.
Containing it needs the verdict taken outside the answers' process, on evidence they cannot forge.
"""

from __future__ import annotations

import argparse
import csv
import json
import secrets
import time
from pathlib import Path
from typing import Optional

from tools import ROOT, course_notebooks
from tools.judge import BOOT, KEY_BYTES, STATUSES, verified
from tools.sandbox import METHODS, Finished, Isolation, Sandbox, choose_isolation, site_packages

PACKAGES = ("lib", "puzzles", "tools")           # what a sandbox holds (read-only); never solutions/
FIELDS = ("puzzle", "status", "points", "detail")


def engine_packages() -> dict[str, Path]:
    return {name: ROOT / name for name in PACKAGES}


def puzzle_names(notebook: str) -> Optional[list[str]]:
    """The puzzles of the course's notebook `notebook` (e.g. 02_data_parallel), in order, from your copy in
    notebooks/ (tests keep it in step with puzzles/; reading it needs no torch), or None if there is none."""
    path = next((p for p in course_notebooks() if p.stem == notebook), None)
    if path is None:
        return None
    return [cell["metadata"]["course"]["puzzle"] for cell in json.loads(path.read_text())["cells"]
            if "puzzle" in cell["metadata"].get("tags", [])]


def _cells(notebook: Path) -> dict:
    """The notebook's code cells as plain JSON (read without nbformat, slow to import, where the file is in
    format 4, as the course's notebooks are; the judge then needs no nbformat either)."""
    nb = json.loads(notebook.read_text())
    if nb.get("nbformat") != 4:
        import nbformat
        nb = nbformat.read(notebook, as_version=4)
    return {"cells": [{"cell_type": c["cell_type"], "metadata": dict(c.get("metadata", {})),
                       "source": c["source"] if isinstance(c["source"], str) else "".join(c["source"])}
                      for c in nb["cells"] if c["cell_type"] == "code"]}


def _invalid(row: dict, names: list[str], seen: dict) -> Optional[str]:
    """Why a signed row cannot stand, or None."""
    if set(row) != set(FIELDS):
        return f"a row with fields {sorted(row)} (another student's, or a forged one)"
    if row["puzzle"] not in names:
        return f"a row for {row['puzzle']!r}, not a puzzle of this notebook"
    if row["puzzle"] in seen:
        return f"a second row for {row['puzzle']}"
    if row["status"] not in STATUSES or row["points"] not in (0, 1) or row["points"] != (row["status"] == "solved"):
        return f"a row for {row['puzzle']} claiming {row['points']!r} points as {row['status']!r}"
    if not isinstance(row["detail"], str):
        return f"a row for {row['puzzle']} whose detail is not text"
    return None


def accepted_rows(output: bytes, key: bytes, names: list[str]) -> tuple[dict[str, dict], list[str]]:
    """The judge's rows, one per puzzle of `names`, from its signed output; and what was discarded, said.
    A signed row the judge never writes (a second one for a puzzle, an unknown puzzle, other fields or points)
    means the notebook read the key: every puzzle is then `tampered`, earlier rows included."""
    rows: dict[str, dict] = {}
    discarded, unsigned = [], 0
    for line in output.splitlines():
        if not line.strip():
            continue
        row = verified(key, line)
        if row is None:
            unsigned += 1
            continue
        problem = _invalid(row, names, rows)
        if problem:
            discarded.append(problem)
        else:
            rows[row["puzzle"]] = {field: row[field] for field in FIELDS}
    if discarded:
        detail = "the notebook signed results with the judge's key: " + "; ".join(discarded[:3])
        rows = {name: {"puzzle": name, "status": "tampered", "points": 0, "detail": detail[:500]} for name in names}
    if unsigned:
        discarded.append(f"{unsigned} line(s) of results without the grader's signature (written by the notebook)")
    return rows, discarded


def _ending(done: Finished, timeout: float, memory_gb: float) -> tuple[str, str]:
    """The status of puzzles left without a result, from how the notebook's process ended."""
    if done.timed_out:
        return "timeout", f"the notebook did not finish within {timeout:g} s (an endless loop?); it was killed"
    if done.out_of_memory:
        return "memory limit", f"the notebook's processes went over {memory_gb:g} GiB together and were killed"
    if done.returncode:
        last = (done.errors.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return "crashed", last[:500]
    return "no result", "the notebook's process ended without reporting this puzzle"


def grade_notebook(notebook: Path, isolation: Isolation, timeout: float = 300.0,
                   memory_gb: float = 8.0) -> list[dict]:
    """Grade one notebook in a sandbox; never raises for what the notebook does."""
    names = puzzle_names(notebook.stem)
    if names is None:
        return [{"puzzle": "", "status": "unknown notebook", "points": 0,
                 "detail": f"{notebook.name} is not a notebook of this course"}]
    try:
        cells = json.dumps({**_cells(notebook), "puzzles": names}).encode()
    except Exception as e:                       # not a notebook nbformat can read
        return [{"puzzle": name, "status": "unreadable", "points": 0, "detail": f"{type(e).__name__}: {e}"[:500]}
                for name in names]
    key = secrets.token_bytes(KEY_BYTES)
    with Sandbox(isolation, engine_packages()) as box:
        boot = BOOT.format(engine=box.engine, site=site_packages())
        done = box.run(["-S", "-c", boot, notebook.stem], key + cells, timeout, int(memory_gb * 2**30))
    rows, discarded = accepted_rows(done.output, key, names)
    tampered = next((r for r in rows.values() if r["status"] == "tampered"), None)
    if tampered:                                 # the whole notebook: earlier results no longer mean anything
        rows = {name: dict(tampered, puzzle=name) for name in names}
    status, detail = _ending(done, timeout, memory_gb)
    result = [rows.get(name) or {"puzzle": name, "status": status, "points": 0, "detail": detail} for name in names]
    return result + [{"puzzle": "", "status": "discarded", "points": 0, "detail": d} for d in discarded]


def _student(folder: Path) -> str:
    """A folder's student: its name, or in nbgrader's submitted/STUDENT/ASSIGNMENT/, the student's."""
    folder = folder.resolve()
    return folder.parent.name if folder.parent.parent.name == "submitted" else folder.name


def _submissions(paths: list[Path]) -> list[tuple[str, Path]]:
    pairs = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.ipynb"))
            if not found:                        # else the student would be missing from the scores, unsaid
                hint = " (nbgrader's layout: give submitted/STUDENT/ASSIGNMENT)" if any(path.glob("*/*.ipynb")) else ""
                print(f"WARNING: {path}: no notebook (.ipynb) in this folder, nothing graded for it{hint}")
            pairs += [(_student(path), nb) for nb in found]
        elif path.suffix == ".ipynb":            # named as the course's notebook: its folder says whose it is
            pairs.append((_student(path.parent), path))
        else:
            raise SystemExit(f"grade: {path} is neither a folder of notebooks nor a .ipynb file")
    return pairs


def grade(paths: list[Path], out: Path, timeout: float = 300.0, memory_gb: float = 8.0,
          isolation: str = "auto") -> list[dict]:
    """Grade every submission; write out/scores.csv and out/scores.json; return the rows."""
    pairs = _submissions(paths)
    chosen = choose_isolation(engine_packages(), ROOT / "solutions", isolation)
    print(("WARNING: " if chosen.method == "folder" or chosen.answer_key else "") + chosen.describe(), flush=True)
    rows = []
    for student, notebook in pairs:
        start = time.monotonic()
        graded = grade_notebook(notebook, chosen, timeout, memory_gb)
        rows += [{"student": student, "notebook": notebook.stem, **row} for row in graded]
        puzzles_graded = [r for r in graded if r["status"] != "discarded"]
        print(f"graded {student}: {notebook.name}: {sum(r['points'] for r in graded)} of {len(puzzles_graded)} "
              f"({time.monotonic() - start:.1f} s)", flush=True)
        for row in graded:
            if row["status"] in ("discarded", "tampered", "timeout", "memory limit", "crashed"):
                print(f"  {row['status']}: {row['puzzle'] + ': ' if row['puzzle'] else ''}{row['detail']}")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scores.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["student", "notebook", *FIELDS])
        writer.writeheader()
        writer.writerows(rows)
    (out / "scores.json").write_text(json.dumps(rows, indent=1))
    totals: dict[str, int] = {}
    for row in rows:
        totals[row["student"]] = totals.get(row["student"], 0) + row["points"]
    for student, points in totals.items():
        print(f"{student}: {points} points")
    print(f"scores written to {out / 'scores.csv'} and {out / 'scores.json'}")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("submissions", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "grading")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per notebook")
    parser.add_argument("--memory-gb", type=float, default=8.0, help="memory limit per notebook, all its processes")
    parser.add_argument("--isolation", choices=("auto", *METHODS), default="auto",
                        help="the sandbox: the strongest this machine allows (auto), or exactly this one")
    args = parser.parse_args(argv)
    try:
        grade(args.submissions, args.out, args.timeout, args.memory_gb, args.isolation)
    except RuntimeError as e:                    # the sandbox asked for does not work on this machine
        raise SystemExit(f"grade: {e}") from None


if __name__ == "__main__":
    main()
