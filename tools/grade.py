"""Grade submitted notebooks: every puzzle's checker, in strict mode, one process per notebook.

    python -m tools.grade SUBMISSION [SUBMISSION ...] [--out grading/] [--timeout 300] [--memory-gb 8]

A SUBMISSION is a student's folder of notebooks (the folder's name is the student's) or one
notebook (its file name is used). Writes scores.csv and scores.json to --out: one row per
student, notebook and puzzle, 1 point per solved puzzle.

Each notebook runs in its own process, in a fresh sandbox folder that holds a copy of the
engine and the problem set and nothing else: the answer key (solutions/) is neither
importable nor on disk there, other submissions are not there, and the process has a
memory limit and a wall-clock limit after which it and everything it started are killed.
This keeps honest mistakes and casual peeking out. It is not a security boundary: the
process runs as the grader's user, so code that knows the instructor's absolute paths could
read them, and code determined to tamper with the checker inside its own process could.
For high stakes, run the grader in a container that holds no answer key.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from tools import ROOT

SANDBOXED_PACKAGES = ("lib", "puzzles", "tools")

# Runs in the child with `python -S`: no site processing, so the editable install's path hook
# (which would make solutions/ importable) is never loaded; site-packages is added by hand.
_BOOT = """
import sys
sys.path[:0] = [{code!r}] + {site!r}
from tools.grade import grade_notebook_here
grade_notebook_here({notebook!r}, {result!r})
"""


def grade_notebook_here(notebook: str, result: str) -> None:
    """In the sandbox: load the learner's answers, run each puzzle's checker strictly, write JSON."""
    import io
    from contextlib import redirect_stdout

    import nbformat

    import puzzles
    from lib.nbtools import load_answers

    path = Path(notebook)
    module = {m.NOTEBOOK: m for m in puzzles.MODULES}.get(path.stem)
    rows = []
    if module is None:
        rows.append({"puzzle": "", "status": "unknown notebook", "points": 0,
                     "detail": f"{path.name} is not a notebook of this course"})
    else:
        with redirect_stdout(io.StringIO()):            # the learner's prints are not the grader's output
            namespace, errors = load_answers(nbformat.read(path, as_version=4))
        for p in module.PUZZLES:
            if p.name in errors:
                rows.append({"puzzle": p.name, "status": "error", "points": 0, "detail": errors[p.name]})
                continue
            fn = namespace.get(p.name)
            if not callable(fn):
                rows.append({"puzzle": p.name, "status": "missing", "points": 0,
                             "detail": f"no function named {p.name}"})
                continue
            with redirect_stdout(io.StringIO()):
                outcome = p.evaluate(fn)
            status = "solved" if outcome.ok else "not solved" if not outcome.solved else "failed"
            rows.append({"puzzle": p.name, "status": status, "points": int(outcome.ok),
                         "detail": "" if outcome.ok else outcome.message.splitlines()[0][:500]})
    Path(result).write_text(json.dumps(rows))


def _limits(memory_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def grade_notebook(notebook: Path, timeout: float = 300.0, memory_gb: float = 8.0) -> list[dict]:
    """Grade one notebook in a sandboxed child process; never raises for what the notebook does."""
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        sandbox = Path(tmp)
        code = sandbox / "code"
        for package in SANDBOXED_PACKAGES:
            shutil.copytree(ROOT / package, code / package, ignore=shutil.ignore_patterns("__pycache__"))
        work = sandbox / "work"
        work.mkdir()
        shutil.copyfile(notebook, work / notebook.name)
        result = sandbox / "result.json"
        site = [p for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}]
        boot = _BOOT.format(code=str(code), site=site, notebook=str(work / notebook.name), result=str(result))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(sandbox), "MPLBACKEND": "Agg",
               "COURSE_STRICT": "1", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        child = subprocess.Popen([sys.executable, "-S", "-c", boot], cwd=work, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                 preexec_fn=_limits(int(memory_gb * 2**30)))
        try:
            _, stderr = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            return [{"puzzle": "", "status": "timeout", "points": 0,
                     "detail": f"the notebook did not finish within {timeout:g} s (an endless loop at top level?)"}]
        finally:
            try:
                os.killpg(child.pid, signal.SIGKILL)       # anything it left behind
            except ProcessLookupError:
                pass
        if not result.exists():
            tail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {child.returncode}"]
            return [{"puzzle": "", "status": "crashed", "points": 0, "detail": tail[0][:500]}]
        return json.loads(result.read_text())


def _submissions(paths: list[Path]) -> list[tuple[str, Path]]:
    pairs = []
    for path in paths:
        if path.is_dir():
            pairs += [(path.name, nb) for nb in sorted(path.glob("*.ipynb"))]
        elif path.suffix == ".ipynb":
            pairs.append((path.stem, path))
        else:
            raise SystemExit(f"grade: {path} is neither a folder of notebooks nor a .ipynb file")
    return pairs


def grade(paths: list[Path], out: Path, timeout: float = 300.0, memory_gb: float = 8.0) -> list[dict]:
    """Grade every submission; write out/scores.csv and out/scores.json; return the rows."""
    rows = []
    for student, notebook in _submissions(paths):
        print(f"grading {student}: {notebook.name} ...", flush=True)
        for row in grade_notebook(notebook, timeout, memory_gb):
            rows.append({"student": student, "notebook": notebook.stem, **row})
    out.mkdir(parents=True, exist_ok=True)
    fields = ["student", "notebook", "puzzle", "status", "points", "detail"]
    with open(out / "scores.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
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
    parser.add_argument("--memory-gb", type=float, default=8.0, help="address-space limit per notebook")
    args = parser.parse_args(argv)
    grade(args.submissions, args.out, args.timeout, args.memory_gb)


if __name__ == "__main__":
    main()
