"""Grade submitted notebooks: every puzzle's checker, in strict mode, each notebook in its own sandbox.

    python -m tools.grade SUBMISSION [SUBMISSION ...] [--notebooks NAME,...|all] [--out grading/]
                          [--timeout 300] [--memory-gb 8] [--isolation auto|bubblewrap|namespaces|folder]

A SUBMISSION is a student's folder of notebooks (the folder's name is the student's; in nbgrader's
submitted/STUDENT/ASSIGNMENT/ it is STUDENT) or one notebook in such a folder (the same). Only the
assignment's notebooks are graded: --notebooks, or nbgrader's source/ASSIGNMENT/ (tools.submissions,
which also refuses links, FIFOs, devices and oversized files before any sandbox starts). Writes
scores.csv and scores.json to --out (tools.gradebook: nothing a notebook wrote reaches a terminal or a
spreadsheet as anything but text): one row per student, notebook and puzzle, 1 point per solved puzzle.

Each notebook runs in the strongest sandbox the machine allows (tools.sandbox; the grader prints
which one and what it does not contain): the engine and the problem set read-only, none of your
files (the answer key included), no network, every process it starts killed when it ends or at
--timeout, one memory limit for all of them, no privilege over the host (run by root, the notebook
runs as nobody). Inside, the judge (tools.judge) draws each check's cases and compares the results in
a process of its own, where none of the notebook's code runs; the learner's functions run in the
answers' process (tools.answers), whose results come back as data (tools.evidence). The judge signs
each row with a key that process never holds; unsigned rows are discarded and reported, and signed
rows the judge never writes (another student, an unknown or repeated puzzle, points other than 0 and
1) grade the whole notebook `tampered`.

Not contained, flagged: the simulator's meters and the puzzle's wrapping run in the answers' process,
beside the learner's code. A change there the fingerprint sees (tools.fingerprint) grades the notebook
`tampered`; every line of the notebook that reaches for the checker's internals (frames, the garbage
collector, raw memory, modules and attributes by name: tools.traces) is a `review` row, with the line.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from pathlib import Path
from typing import Optional

from tools import ROOT, course_notebooks
from tools.gradebook import printable, write
from tools.judge import BOOT, KEY_BYTES, STATUSES, verified
from tools.sandbox import METHODS, Finished, Isolation, Sandbox, choose_isolation, site_packages
from tools.submissions import Found, Refused, assignment, found, read
from tools.traces import MAX_TRACES, traces

PACKAGES = ("lib", "puzzles", "tools")           # what a sandbox holds (read-only); never solutions/
FIELDS = ("puzzle", "status", "points", "detail")
SAID = ("discarded", "tampered", "timeout", "memory limit", "crashed", "refused", "review", "grader error")


def engine_packages() -> dict[str, Path]:
    return {name: ROOT / name for name in PACKAGES}


def _course_notebook(notebook: str) -> Optional[Path]:
    return next((p for p in course_notebooks() if p.stem == notebook), None)


def puzzle_names(notebook: str) -> Optional[list[str]]:
    """The puzzles of the course's notebook `notebook` (e.g. 02_data_parallel), in order, from your copy in
    notebooks/ (tests keep it in step with puzzles/; reading it needs no torch), or None if there is none."""
    path = _course_notebook(notebook)
    if path is None:
        return None
    return [cell["metadata"]["course"]["puzzle"] for cell in json.loads(path.read_text())["cells"]
            if "puzzle" in cell["metadata"].get("tags", [])]


def _cells(data: bytes) -> dict:
    """The notebook's code cells as plain JSON (read without nbformat, slow to import, where the file is in
    format 4, as the course's notebooks are; the judge then needs no nbformat either)."""
    nb = json.loads(data)
    if nb.get("nbformat") != 4:
        import nbformat
        nb = nbformat.reads(data.decode(), as_version=4)
    return {"cells": [{"cell_type": c["cell_type"], "metadata": dict(c.get("metadata", {})),
                       "source": c["source"] if isinstance(c["source"], str) else "".join(c["source"])}
                      for c in nb["cells"] if c["cell_type"] == "code"]}


def _review(notebook: str, cells: dict) -> list[dict]:
    """A `review` row for each line of the notebook's graded cells that reaches for the checker (tools.traces)."""
    course = _cells(_course_notebook(notebook).read_bytes())["cells"]
    found = traces(cells["cells"], course)
    rows = [{"puzzle": t.cell if t.cell != "setup" else "", "status": "review", "points": 0, "detail": t.detail()}
            for t in found[:MAX_TRACES]]
    if len(found) > MAX_TRACES:
        rows.append({"puzzle": "", "status": "review", "points": 0,
                     "detail": f"and {len(found) - MAX_TRACES} more such lines"})
    return rows


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


def grade_notebook(notebook: str, data: bytes, isolation: Isolation, timeout: float = 300.0,
                   memory_gb: float = 8.0) -> list[dict]:
    """Grade one notebook (the course's `notebook`, e.g. 02_data_parallel, saved as `data`) in a sandbox; never
    raises for what the notebook does."""
    names = puzzle_names(notebook)
    if names is None:
        return [{"puzzle": "", "status": "unknown notebook", "points": 0,
                 "detail": f"{notebook}.ipynb is not a notebook of this course"}]
    try:
        cells = _cells(data)
        stdin = json.dumps({**cells, "puzzles": names}).encode()
    except Exception as e:                       # not a notebook nbformat can read
        return [{"puzzle": name, "status": "unreadable", "points": 0, "detail": f"{type(e).__name__}: {e}"[:500]}
                for name in names]
    key = secrets.token_bytes(KEY_BYTES)
    with Sandbox(isolation, engine_packages()) as box:
        boot = BOOT.format(engine=box.engine, site=site_packages())
        done = box.run(["-I", "-S", "-B", "-c", boot, notebook], key + stdin, timeout, int(memory_gb * 2**30))
    rows, discarded = accepted_rows(done.output, key, names)
    tampered = next((r for r in rows.values() if r["status"] == "tampered"), None)
    if tampered:                                 # the whole notebook: earlier results no longer mean anything
        rows = {name: dict(tampered, puzzle=name) for name in names}
    status, detail = _ending(done, timeout, memory_gb)
    result = [rows.get(name) or {"puzzle": name, "status": status, "points": 0, "detail": detail} for name in names]
    return (result + [{"puzzle": "", "status": "discarded", "points": 0, "detail": d} for d in discarded]
            + _review(notebook, cells))


def _grade_found(entry: Found, isolation: Isolation, timeout: float, memory_gb: float) -> list[dict]:
    """The rows of one notebook found in a submission: refused with the reason, or graded."""
    try:
        if entry.refused:
            raise Refused(entry.refused)
        data = read(entry)
    except Refused as e:
        return [{"puzzle": "", "status": "refused", "points": 0, "detail": str(e)}]
    return grade_notebook(entry.notebook, data, isolation, timeout, memory_gb)


def grade(paths: list[Path], out: Path, timeout: float = 300.0, memory_gb: float = 8.0,
          isolation: str = "auto", notebooks: Optional[str] = None) -> list[dict]:
    """Grade every submission's notebooks of the assignment (`notebooks`, see tools.submissions.assignment);
    write out/scores.csv and out/scores.json; return the rows."""
    entries = found(paths, assignment(paths, notebooks))
    chosen = choose_isolation(engine_packages(), ROOT / "solutions", isolation)
    print(("WARNING: " if chosen.method == "folder" or chosen.answer_key else "") + chosen.describe(), flush=True)
    rows = []
    for entry in entries:
        start = time.monotonic()
        try:
            graded = _grade_found(entry, chosen, timeout, memory_gb)
        except Exception as e:                   # the grader's own fault: said on this notebook, the others go on
            graded = [{"puzzle": "", "status": "grader error", "points": 0, "detail": f"{type(e).__name__}: {e}"}]
        rows += [{"student": entry.student, "notebook": entry.notebook, **row} for row in graded]
        puzzles_graded = [r for r in graded if r["puzzle"] and r["status"] != "review"]
        print(printable(f"graded {entry.student}: {entry.name}: {sum(r['points'] for r in graded)} of "
                        f"{len(puzzles_graded)} ({time.monotonic() - start:.1f} s)"), flush=True)
        for row in graded:
            if row["status"] in SAID:
                print(printable(f"  {row['status']}: {row['puzzle'] + ': ' if row['puzzle'] else ''}{row['detail']}"))
    write(rows, out, ["student", "notebook", *FIELDS])
    totals: dict[str, int] = {}
    for row in rows:
        totals[row["student"]] = totals.get(row["student"], 0) + row["points"]
    for student, points in totals.items():
        print(printable(f"{student}: {points} points"))
    print(printable(f"scores written to {out / 'scores.csv'} and {out / 'scores.json'}"))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("submissions", nargs="+", type=Path)
    parser.add_argument("--notebooks", help="the assignment's notebooks, comma-separated (e.g. 02_data_parallel), "
                        "or all; only these are graded (default: nbgrader's source/ASSIGNMENT/)")
    parser.add_argument("--out", type=Path, default=ROOT / "grading")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per notebook")
    parser.add_argument("--memory-gb", type=float, default=8.0, help="memory limit per notebook, all its processes")
    parser.add_argument("--isolation", choices=("auto", *METHODS), default="auto",
                        help="the sandbox: the strongest this machine allows (auto), or exactly this one")
    args = parser.parse_args(argv)
    try:
        grade(args.submissions, args.out, args.timeout, args.memory_gb, args.isolation, args.notebooks)
    except RuntimeError as e:                    # the sandbox asked for does not work on this machine
        raise SystemExit(f"grade: {e}") from None


if __name__ == "__main__":
    main()
