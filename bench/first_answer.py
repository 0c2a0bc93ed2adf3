"""How long a learner waits for the first answer: each notebook's cells from the top (progress, setup, the
figures before the first puzzle, the stub) up to and including the first check cell, in a fresh Jupyter kernel,
against `import torch` alone in a fresh process; and how long `./course lab`'s JupyterLab takes to serve its page.

    python -m bench.first_answer [notebook ...] [--repeats K] [--solved] [--lab] [--out bench/results/NAME]
    python -m bench.first_answer --before /tmp/old     # and the same in a checkout of an older commit

With the stub the first check prints "not solved yet": that is the first answer. `--solved` also times the
cells with the reference solutions pasted into the puzzle cells (the first check then passes and draws its
pictures). Each run gets its own kernel, as JupyterLab starts one; the figures are the median of K runs, wall
time and the kernel's CPU time (all its threads). On a machine shared with other work, CPU time is the steadier.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import nbformat

from bench.check_times import ROOT, _Kernel
from lib.notebook.cells import solve, up_to_first_check
from tools import course_notebooks

TARGET = 2.0            # the cells up to the first answer, at most this many times `import torch` alone
LAB = [sys.executable, "-m", "jupyterlab"]           # what ./course lab runs
_CLOCKS = "(__import__('time').perf_counter(), __import__('time').process_time())"


@dataclass(frozen=True)
class Seconds:
    """Median wall and CPU seconds of several runs."""

    wall: float
    cpu: float
    runs: int

    @classmethod
    def median(cls, samples: Sequence[tuple[float, float]]) -> "Seconds":
        return cls(statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples), len(samples))

    def as_dict(self) -> dict:
        return {"wall_s": self.wall, "cpu_s": self.cpu, "runs": self.runs}


@dataclass(frozen=True)
class FirstAnswer:
    notebook: str
    cells: int                          # code cells run, the first check cell included
    stub: Seconds                       # those cells as shipped (the check says "not solved yet")
    setup: Seconds                      # of which the first two code cells (progress and setup)
    solved: Optional[Seconds] = None    # the same cells with the reference solutions pasted in
    answer: str = ""                    # what the first check printed with the stub, up to its first colon
    before: Optional[Seconds] = None    # `stub` in another checkout (an older commit's), measured alternately

    def as_dict(self) -> dict:
        return {"notebook": self.notebook, "cells": self.cells, "stub": self.stub.as_dict(),
                "setup": self.setup.as_dict(), "solved": self.solved.as_dict() if self.solved else None,
                "answer": self.answer, "before": self.before.as_dict() if self.before else None}


def run_cells(sources: Sequence[str], root: Path = ROOT,
              timeout: float = 300.0) -> tuple[list[tuple[float, float]], str]:
    """Run the cells in a fresh kernel on the checkout at `root` (not strict: a stub's check prints, as in
    JupyterLab). Returns the kernel's clocks (perf_counter, process_time) before the first cell and after each, and
    the last cell's printed text."""
    kernel = _Kernel(timeout, strict=False, root=root)
    try:
        clocks = [kernel.run("", _CLOCKS)]
        printed: list[str] = []
        for source in sources:
            printed.clear()
            clocks.append(kernel.run(source, _CLOCKS, printed=printed))
    finally:
        kernel.close()
    return clocks, "".join(printed)


def time_notebook(path: Path, repeats: int, solved: bool = False, before: Optional[Path] = None) -> FirstAnswer:
    """The notebook at `path` (in notebooks/ of a checkout, whose code its kernels run); with `before`, the same
    notebook of that checkout too, the two taking turns so that a change of load falls on both."""
    nb, root = nbformat.read(path, as_version=4), path.parent.parent
    sources = up_to_first_check(nb)
    older = up_to_first_check(nbformat.read(before / "notebooks" / path.name, as_version=4)) if before else []
    stub, setup, earlier, answer = [], [], [], ""
    for _ in range(repeats):
        clocks, printed = run_cells(sources, root)
        stub.append(_elapsed(clocks[0], clocks[-1]))
        setup.append(_elapsed(clocks[0], clocks[2]))
        answer = printed.strip().split(":", 1)[0]
        if before:
            clocks, _ = run_cells(older, before)
            earlier.append(_elapsed(clocks[0], clocks[-1]))
    answered = None
    if solved:
        from puzzles import of_notebook

        solutions = importlib.import_module(f"solutions.{of_notebook(path.stem).__name__.rsplit('.', 1)[-1]}")
        with_answers = up_to_first_check(solve(nb, solutions))
        answered = Seconds.median([_elapsed(clocks[0], clocks[-1]) for clocks, _ in
                                   (run_cells(with_answers, root) for _ in range(repeats))])
    return FirstAnswer(path.stem, len(sources), Seconds.median(stub), Seconds.median(setup), answered, answer,
                       Seconds.median(earlier) if earlier else None)


def _elapsed(start: tuple[float, float], end: tuple[float, float]) -> tuple[float, float]:
    return end[0] - start[0], end[1] - start[1]


def import_torch() -> tuple[float, float]:
    """`import torch` in a fresh interpreter: wall time and the child's CPU time."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_of(pid: int) -> float:
    """CPU seconds a running process has used so far (Linux: /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lab_start(repeats: int, timeout: float = 120.0) -> Seconds:
    """JupyterLab as `./course lab` starts it, from the command until its page is served (HTTP 200)."""
    samples = []
    for _ in range(repeats):
        port, token = _free_port(), secrets.token_hex(8)
        url = f"http://127.0.0.1:{port}/lab?token={token}"
        with tempfile.TemporaryDirectory(prefix="bench-lab-") as home:
            command = [*LAB, "--no-browser", f"--ServerApp.root_dir={home}", f"--ServerApp.port={port}",
                       "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
                       *(["--allow-root"] if os.geteuid() == 0 else [])]          # as ./course lab
            env = dict(os.environ, JUPYTER_CONFIG_DIR=home, JUPYTER_RUNTIME_DIR=home,
                       PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
            start = time.perf_counter()
            server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                samples.append((_served(url, server, start + timeout) - start, _cpu_of(server.pid)))
            finally:
                server.terminate()
                server.wait(timeout=30)
    return Seconds.median(samples)


def _served(url: str, server: subprocess.Popen, deadline: float) -> float:
    """When `url` first answered 200, polling every 20 ms."""
    while time.perf_counter() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {server.returncode} before serving {url}")
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return time.perf_counter()
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"JupyterLab did not serve {url} in time")


def table(rows: Sequence[FirstAnswer], torch_alone: Seconds, lab: Optional[Seconds] = None,
          before: str = "") -> str:
    runs = max((r.stub.runs for r in rows), default=torch_alone.runs)
    budget = TARGET * torch_alone.cpu
    lines = [f"{TABLE_TITLE} each notebook's code cells from the top up to and including the first check cell, "
             f"in a fresh Jupyter kernel, median of {runs} kernels; against `import torch` alone in a fresh process "
             f"({torch_alone.wall:.2f} s wall, {torch_alone.cpu:.2f} s CPU, median of {torch_alone.runs}, taken "
             f"between the notebooks). Target: the first answer within {TARGET:g}× `import torch`, {budget:.2f} s "
             "of CPU here." + (f" Before: {before}, its kernels alternating with these." if before else ""), "",
             "| notebook | cells | first answer: wall | CPU | × import torch (CPU) | of which progress + setup: CPU | "
             + ("before: CPU | " if before else "") + "solved: wall | solved: CPU | the first answer |",
             "|---|---|---|---|---|---|" + ("---|" if before else "") + "---|---|---|"]
    for r in rows:
        solved = f"{r.solved.wall:.2f} s | {r.solved.cpu:.2f} s" if r.solved else "- | -"
        ratio = r.stub.cpu / torch_alone.cpu
        earlier = (f"{r.before.cpu:.2f} s ({r.before.cpu / torch_alone.cpu:.2f}×) | " if r.before else "- | ") \
            if before else ""
        lines.append(f"| {r.notebook} | {r.cells} | {r.stub.wall:.2f} s | {r.stub.cpu:.2f} s | "
                     f"{ratio:.2f}× {'(met)' if ratio <= TARGET else '(missed)'} | {r.setup.cpu:.2f} s | {earlier}"
                     f"{solved} | {r.answer} |")
    if lab:
        lines += ["", f"`./course lab`'s JupyterLab, from its command until its page is served: {lab.wall:.2f} s wall, "
                      f"{lab.cpu:.2f} s of the server's CPU (median of {lab.runs} starts)."]
    return "\n".join(lines)


TABLE_TITLE = "The first answer:"


def measure(notebooks: Sequence[str] = (), repeats: int = 3, solved: bool = False, lab: bool = False,
            progress: Optional[Callable[[str], Callable[[int, int], None]]] = None,
            before: Optional[Path] = None) -> dict:
    """Every figure of this benchmark, as JSON-ready data and a Markdown table; with `before` (a checkout of an
    older commit), that checkout's first answers beside these. `progress(title)`, when given, is called as each
    measurement starts and returns what to call with (1, 1) when it ends (bench's Progress)."""
    paths = [p for p in course_notebooks() if not notebooks or p.stem in notebooks]
    unknown = set(notebooks) - {p.stem for p in paths}
    if unknown:
        raise LookupError(f"no notebook named {', '.join(sorted(unknown))}")
    progress = progress or (lambda title: lambda step, steps: None)
    rows, torch_alone = [], []
    for path in paths:
        tick = progress(f"first answer, fresh kernel: {path.stem}")
        torch_alone.append(import_torch())         # one between each two notebooks: the load of the moment
        rows.append(time_notebook(path, repeats, solved, before))
        tick(1, 1)
    torch_alone.append(import_torch())
    started = None
    if lab:
        tick = progress("JupyterLab's start, as ./course lab")
        started = lab_start(repeats)
        tick(1, 1)
    alone = Seconds.median(torch_alone)
    label = _describe(before) if before else ""
    return {"import_torch": alone.as_dict(), "target": TARGET, "before": label,
            "notebooks": [r.as_dict() for r in rows], "lab_start": started.as_dict() if started else None,
            "table": table(rows, alone, started, label)}


def _describe(checkout: Path) -> str:
    """A checkout's commit, e.g. "4ce391b"."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True)
    return f"commit {out.stdout.strip()}" if out.returncode == 0 else str(checkout)


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.first_answer", description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", help="notebook names, e.g. 02_data_parallel (default: all)")
    ap.add_argument("--repeats", type=int, default=3, help="fresh kernels per notebook (default 3)")
    ap.add_argument("--solved", action="store_true", help="also with the reference solutions pasted in")
    ap.add_argument("--lab", action="store_true", help="also JupyterLab's start, as ./course lab starts it")
    ap.add_argument("--out", type=Path, help="write <OUT>.json and <OUT>.md, e.g. bench/results/first-answer")
    ap.add_argument("--before", type=Path, help="also the notebooks and code of this checkout (e.g. a clone of an "
                    "older commit), its kernels alternating with this one's")
    args = ap.parse_args(argv)
    result = measure(args.notebooks, args.repeats, args.solved, args.lab,
                     lambda title: lambda step, steps: print(f"done: {title}", file=sys.stderr, flush=True),
                     args.before.resolve() if args.before else None)
    print(result["table"])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps({k: v for k, v in result.items() if k != "table"},
                                                            indent=1) + "\n")
        args.out.with_suffix(".md").write_text(result["table"] + "\n")


if __name__ == "__main__":
    main()
