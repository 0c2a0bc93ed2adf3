"""How long a learner waits for each check cell: the first in a fresh kernel after the notebook's setup
cell, and a second one (warm), for every puzzle of the course with its reference solution.

    python -m bench.check_times [puzzle ...]

Each puzzle gets its own Jupyter kernel, so "first" pays what a learner's first check pays (the simulator's
one-time costs, matplotlib's first figure) and nothing another puzzle paid before. The check cell runs as the
notebook has it, figures included, timed inside the kernel.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import nbformat

import puzzles
from lib.nbtools import puzzle_cells

ROOT = Path(__file__).resolve().parents[1]
_TIMED = "import time as _bench_time\n_bench_t0 = _bench_time.perf_counter()\n{}\n" \
         "_bench_dt = _bench_time.perf_counter() - _bench_t0"


@dataclass(frozen=True)
class CheckTime:
    notebook: str
    puzzle: str
    first: float          # seconds, the first check in a fresh kernel after the setup cell
    warm: float           # seconds, the same check again

    def as_dict(self) -> dict:
        return {"notebook": self.notebook, "puzzle": self.puzzle, "first_s": self.first, "warm_s": self.warm}


def _cells(notebook: str, tag: str) -> list:
    nb = nbformat.read(ROOT / "notebooks" / f"{notebook}.ipynb", as_version=4)
    return [c for c in nb.cells if c.cell_type == "code" and tag in c.metadata.get("tags", [])]


def _check_cell(notebook: str, name: str) -> str:
    cells = [c for c in _cells(notebook, "check") if c.metadata.get("course", {}).get("puzzle") == name]
    if len(cells) != 1:
        raise LookupError(f"{notebook} has {len(cells)} check cells for {name}")
    return cells[0].source


def _answers(notebook: str, module: str) -> str:
    """Every puzzle cell of the notebook filled in with its reference solution (later puzzles call earlier ones)."""
    nb = nbformat.read(ROOT / "notebooks" / f"{notebook}.ipynb", as_version=4)
    solutions = importlib.import_module(f"solutions.{module}")
    return "\n\n".join(inspect.getsource(getattr(solutions, name)) for name in puzzle_cells(nb))


class _Kernel:
    """A fresh Jupyter kernel on this checkout, in notebooks/, with strict checks (a failing check raises)."""

    def __init__(self, timeout: float) -> None:
        from jupyter_client.manager import KernelManager

        env = dict(os.environ, COURSE_STRICT="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        env.pop("MPLBACKEND", None)                 # the kernel's own inline backend, as in JupyterLab
        self.timeout = timeout
        self.sockets = tempfile.TemporaryDirectory(prefix="bench-kernel-")
        # Local sockets in a private folder: no TCP port to collide on, no warning about plain-text TCP.
        self.manager = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(self.sockets.name, "k"))
        self.manager.start_kernel(cwd=str(ROOT / "notebooks"), env=env)
        self.client = self.manager.client()
        self.client.start_channels()
        try:
            self.client.wait_for_ready(timeout=timeout)
        except BaseException:
            self.close()
            raise

    def run(self, code: str, expression: Optional[str] = None) -> Optional[float]:
        """Execute `code`; with `expression`, return its value (a number) afterwards."""
        reply = self.client.execute_interactive(code, user_expressions={"x": expression} if expression else {},
                                                timeout=self.timeout, output_hook=lambda msg: None)
        content = reply["content"]
        if content["status"] != "ok":
            raise RuntimeError(f"a cell failed in the kernel: {content.get('ename')}: {content.get('evalue')}")
        if expression is None:
            return None
        value = content["user_expressions"]["x"]
        if value["status"] != "ok":
            raise RuntimeError(f"could not read {expression} from the kernel")
        return float(value["data"]["text/plain"])

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
        self.sockets.cleanup()


def time_check(puzzle, timeout: float = 300.0) -> CheckTime:
    """Setup cell, every puzzle cell solved, then the puzzle's check cell twice, in a fresh kernel."""
    kernel = _Kernel(timeout)
    try:
        kernel.run(_cells(puzzle.notebook, "setup")[0].source)
        kernel.run(_answers(puzzle.notebook, puzzle.module))
        timed = _TIMED.format(_check_cell(puzzle.notebook, puzzle.name))
        first = kernel.run(timed, "_bench_dt")
        warm = kernel.run(timed, "_bench_dt")
    finally:
        kernel.close()
    return CheckTime(puzzle.notebook, puzzle.name, first, warm)


def chosen(names: Sequence[str] = ()) -> list:
    """The puzzles of puzzles.ALL named (all of them when none is)."""
    unknown = set(names) - {p.name for p in puzzles.ALL}
    if unknown:
        raise LookupError(f"no puzzle named {', '.join(sorted(unknown))}")
    return [p for p in puzzles.ALL if not names or p.name in names]


def main() -> None:
    print("| notebook | puzzle | first check | warm |\n|---|---|---|---|")
    for puzzle in chosen(sys.argv[1:]):
        t = time_check(puzzle)
        print(f"| {t.notebook} | {t.puzzle} | {t.first:.2f} s | {t.warm:.2f} s |", flush=True)


if __name__ == "__main__":
    main()
