"""The instructors' pre-flight check: every puzzle's reference solution through its real cell, on this machine.

    ./course gpu-check                  # or: python -m tools.gpu_check [--only NAME ...] [--out FILE] [--jobs N]

Run it on the class's machine before class. Each puzzle runs where its real cell can: on NCCL at world size 1
and at min(GPUs, 8) when there are 2 or more GPUs (one GPU per rank), on gloo where NCCL cannot (no GPU, or a
pipeline's 2 stages on a 1-GPU machine). Prints one table (puzzle, backend, world size, ✓/✗, seconds) with the
versions of torch, CUDA and NCCL and the GPU model, then what failed; exits non-zero if anything failed.
`--jobs N` runs N puzzles at a time (each in its own processes; NCCL communicators may share a GPU), for a machine
with cores to spare: the table is the same, in course order.
"""

from __future__ import annotations

import argparse
import importlib
import io
import multiprocessing
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

import puzzles
from lib.checker.puzzle import Puzzle
from lib.real.backends import gpus_in_words, visible_gpus

MOST_RANKS = 8          # NCCL runs go up to one node's worth of GPUs


@dataclass
class Run:
    """One real-cell run of a reference solution and how it went."""

    puzzle: str
    backend: str
    world_size: int
    ok: bool = False
    seconds: float = 0.0
    problem: str = ""


def plan(puzzle: Puzzle, gpus: int) -> list[tuple[str, int]]:
    """(backend, world size) of the runs a puzzle gets on a machine with `gpus` GPUs: NCCL at world size 1 and
    at min(gpus, 8) where the puzzle runs there, else gloo at the real cell's default world size."""
    sizes = {1} if max(puzzle.world_sizes) == 1 else {1, min(gpus, MOST_RANKS)} if gpus >= 2 else {1}
    runs = [("nccl", n) for n in sorted(sizes) if puzzle.min_world_size <= n <= gpus]
    return runs or [("gloo", max(puzzle.real_world_size, puzzle.min_world_size))]


def reference_solution(puzzle: Puzzle) -> Callable:
    try:
        module = importlib.import_module(f"solutions.{puzzle.module}")
    except ModuleNotFoundError:
        raise SystemExit("gpu-check runs the reference solutions, which this release of the course does not "
                         "ship: run it from the course's repository.") from None
    return getattr(module, puzzle.name)


def run_one(puzzle: Puzzle, backend: str, world_size: int, timeout: float) -> Run:
    """The puzzle's real cell on its reference solution, its output kept for the report."""
    solution = reference_solution(puzzle)
    out = io.StringIO()
    start = time.monotonic()
    with redirect_stdout(out):
        ok = puzzle.real(solution, world_size=world_size, backend=backend, strict=False, timeout=timeout)
    text = out.getvalue()
    problem = "" if ok else (text[text.find("✗"):] if "✗" in text else text).strip()
    return Run(puzzle.name, backend, world_size, ok, time.monotonic() - start, problem)


def sweep(selected: Sequence[Puzzle], timeout: float = 300.0, gpus: Optional[int] = None,
          progress: Callable[[Run], None] = lambda run: None, jobs: int = 1) -> list[Run]:
    """Every planned run of every puzzle in `selected`, in course order; `jobs` of them at a time."""
    gpus = visible_gpus() if gpus is None else gpus
    planned = [(puzzle, backend, n) for puzzle in selected for backend, n in plan(puzzle, gpus)]
    if jobs <= 1:
        runs = []
        for puzzle, backend, n in planned:
            runs.append(run_one(puzzle, backend, n, timeout))
            progress(runs[-1])
        return runs
    # spawned workers: this process may have touched CUDA, and a forked copy of it could not
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_run_named, puzzle.name, backend, n, timeout): (puzzle.name, backend, n)
                   for puzzle, backend, n in planned}
        runs = {}
        for done in as_completed(futures):
            runs[done] = _outcome(done, *futures[done])
            progress(runs[done])
        return [runs[f] for f in futures]


def _outcome(future, name: str, backend: str, world_size: int) -> Run:
    """The run a worker sent back, or a failed one saying why the worker could not (it died, say)."""
    try:
        return future.result()
    except Exception as e:          # a worker process that crashed breaks the pool: every run left says so
        return Run(name, backend, world_size, problem=f"the worker process running it failed: {type(e).__name__}: {e}")


def _run_named(name: str, backend: str, world_size: int, timeout: float) -> Run:
    """run_one in a worker process, which finds the puzzle by name (a Puzzle does not travel between processes)."""
    return run_one(next(p for p in puzzles.ALL if p.name == name), backend, world_size, timeout)


def machine() -> str:
    """torch, CUDA, NCCL and the GPUs, in one line (read after the runs: it initialises CUDA)."""
    parts = [f"torch {torch.__version__}", f"Python {platform.python_version()}"]
    gpus = visible_gpus()
    if torch.version.cuda:
        parts.append(f"CUDA {torch.version.cuda}")
    if gpus:
        try:
            parts.append("NCCL " + ".".join(map(str, torch.cuda.nccl.version())))
        except (RuntimeError, AttributeError):
            parts.append("NCCL unknown")
        names = [torch.cuda.get_device_name(i) for i in range(gpus)]
        parts.append(", ".join(f"{names.count(n)} × {n}" for n in dict.fromkeys(names)))
    else:
        parts.append("no GPU (gloo on the CPU only)")
    return " · ".join(parts)


def report(runs: Sequence[Run]) -> str:
    """The table, the machine, a summary line and what failed, as Markdown."""
    lines = ["| puzzle | backend | world size | | seconds |", "|---|---|---|---|---|"]
    lines += [f"| {r.puzzle} | {r.backend} | {r.world_size} | {'✓' if r.ok else '✗'} | {r.seconds:.1f} |"
              for r in runs]
    passed = sum(r.ok for r in runs)
    lines += ["", machine(), "", f"{passed} of {len(runs)} runs passed "
              f"({len({r.puzzle for r in runs})} puzzles; NCCL runs: {sum(r.backend == 'nccl' for r in runs)})."]
    for r in runs:
        if not r.ok:
            lines += ["", f"✗ {r.puzzle} on {r.backend}, world size {r.world_size}:", r.problem]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="./course gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="PUZZLE", help="only these puzzles (by name)")
    parser.add_argument("--out", type=Path, help="also write the report to this file (Markdown)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run (default 300)")
    parser.add_argument("--jobs", type=int, default=1, help="puzzles run at a time (default 1)")
    args = parser.parse_args(argv)
    selected = [p for p in puzzles.ALL if not args.only or p.name in args.only]
    unknown = sorted(set(args.only or ()) - {p.name for p in selected})
    if unknown:
        parser.error(f"no puzzle named {', '.join(unknown)}")
    gpus = visible_gpus()
    print(f"gpu-check: {len(selected)} puzzles' reference solutions through their real cells, on a machine with "
          f"{gpus_in_words(gpus)}", flush=True)
    runs = sweep(selected, args.timeout, gpus, jobs=args.jobs, progress=lambda r: print(
        f"  {'✓' if r.ok else '✗'} {r.puzzle} ({r.backend}, world size {r.world_size}, {r.seconds:.1f} s)", flush=True))
    text = report(runs)
    print("\n" + text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
