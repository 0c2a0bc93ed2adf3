"""How long a learner waits for each check cell: the first in a fresh kernel after the notebook's first answer,
and then again (warm) several times, for every puzzle of the course with its reference solution.

    python -m bench.check_times [puzzle ...] [--repeats K] [--into bench/results/<machine>]

Every check draws fresh cases (a new seed each run), so one warm run is one draw: the warm figures are the median
and the slowest of K runs, since a learner may wait for any of them.

Each puzzle gets its own Jupyter kernel, so "first" pays what a learner's first check of an answer pays (the
simulator's one-time costs) and nothing another puzzle paid before. The kernel first runs what a learner runs
before: the notebook's cells up to its first check, whose stub gives the first answer ("not solved yet"), after
which the kernel pays torch's and matplotlib's one-time costs while the learner writes (lib.notebook.warm_up); then the
answers. The check cell runs as the notebook has it, figures included, timed inside the kernel.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import puzzles
from lib.notebook.cells import puzzle_cells, up_to_first_check

ROOT = Path(__file__).resolve().parents[1]


def _notebook(name: str):
    """A notebook of the course. nbformat is imported here, not at the top: bench's real-rank rows import this
    module (for its table) on GPU images without Jupyter."""
    import nbformat

    return nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)


_TIMED = "import time as _bench_time\n_bench_t0, _bench_c0 = _bench_time.perf_counter(), _bench_time.process_time()\n" \
         "{}\n_bench_dt = (_bench_time.perf_counter() - _bench_t0, _bench_time.process_time() - _bench_c0)"


@dataclass(frozen=True)
class CheckTime:
    notebook: str
    puzzle: str
    first: float          # wall seconds, the first check in a fresh kernel after the setup cell
    warm: float           # wall seconds, the same check again
    first_cpu: float      # CPU seconds of the kernel (all its threads) for each: on a loaded machine, closer to
    warm_cpu: float       # what an idle one takes than the wall time
    error: str = ""       # why a check cell failed with the reference solution (its times are then NaN)
    warm_cpu_max: float = float("nan")    # the slowest warm run's CPU seconds (warm and warm_cpu are medians)
    repeats: int = 1                      # warm runs, each on fresh cases

    def as_dict(self) -> dict:
        return {"notebook": self.notebook, "puzzle": self.puzzle, "first_s": self.first, "warm_s": self.warm,
                "first_cpu_s": self.first_cpu, "warm_cpu_s": self.warm_cpu, "warm_cpu_max_s": self.warm_cpu_max,
                "repeats": self.repeats, "error": self.error}


def _cells(notebook: str, tag: str) -> list:
    nb = _notebook(notebook)
    return [c for c in nb.cells if c.cell_type == "code" and tag in c.metadata.get("tags", [])]


def _check_cell(notebook: str, name: str) -> str:
    cells = [c for c in _cells(notebook, "check") if c.metadata.get("course", {}).get("puzzle") == name]
    if len(cells) != 1:
        raise LookupError(f"{notebook} has {len(cells)} check cells for {name}")
    return cells[0].source


def _answers(notebook: str, module: str) -> str:
    """Every puzzle cell of the notebook filled in with its reference solution (later puzzles call earlier ones)."""
    nb = _notebook(notebook)
    solutions = importlib.import_module(f"solutions.{module}")
    return "\n\n".join(inspect.getsource(getattr(solutions, name)) for name in puzzle_cells(nb))


class CellFailed(RuntimeError):
    """A cell raised in the kernel (with COURSE_STRICT=1, a check that did not pass); `name` is what it raised."""

    def __init__(self, name: str, value: str) -> None:
        super().__init__(f"a cell failed in the kernel: {name}: {value}")
        self.name = name


class _Kernel:
    """A fresh Jupyter kernel on this checkout (or the one at `root`), in its notebooks/; strict: a failing check
    raises (not strict: it prints, as in JupyterLab)."""

    def __init__(self, timeout: float, strict: bool = True, root: Path = ROOT) -> None:
        from jupyter_client.manager import KernelManager

        env = dict(os.environ, COURSE_STRICT="1" if strict else "0",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
        env.pop("MPLBACKEND", None)                 # the kernel's own inline backend, as in JupyterLab
        self.timeout = timeout
        self.sockets = tempfile.TemporaryDirectory(prefix="bench-kernel-")
        # Local sockets in a private folder: no TCP port to collide on, no warning about plain-text TCP.
        self.manager = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(self.sockets.name, "k"))
        self.manager.start_kernel(cwd=str(root / "notebooks"), env=env)
        self.client = self.manager.client()
        self.client.start_channels()
        try:
            self.client.wait_for_ready(timeout=timeout)
        except BaseException:
            self.close()
            raise

    def run(self, code: str, expression: Optional[str] = None,
            printed: Optional[list[str]] = None) -> Optional[tuple[float, ...]]:
        """Execute `code`; with `expression`, return its value (a tuple of numbers) afterwards. What the cell
        prints is appended to `printed` when given."""
        def output(msg: dict) -> None:
            if printed is not None and msg["header"]["msg_type"] == "stream":
                printed.append(msg["content"]["text"])

        reply = self.client.execute_interactive(code, user_expressions={"x": expression} if expression else {},
                                                timeout=self.timeout, output_hook=output)
        content = reply["content"]
        if content["status"] != "ok":
            raise CellFailed(content.get("ename", ""), content.get("evalue", ""))
        if expression is None:
            return None
        value = content["user_expressions"]["x"]
        if value["status"] != "ok":
            raise RuntimeError(f"could not read {expression} from the kernel")
        return tuple(float(x) for x in value["data"]["text/plain"].strip("()").split(","))

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
        self.sockets.cleanup()


def time_check(puzzle, repeats: int = 1, timeout: float = 300.0) -> CheckTime:
    """The notebook up to its first answer, every puzzle cell solved, then the puzzle's check cell once (first) and
    `repeats` times more (warm), in a fresh kernel."""
    kernel = _Kernel(timeout)
    try:
        _first_answer(kernel, puzzle.notebook)
        kernel.run(_answers(puzzle.notebook, puzzle.module))
        timed = _TIMED.format(_check_cell(puzzle.notebook, puzzle.name))
        first = kernel.run(timed, "_bench_dt")
        warm = [kernel.run(timed, "_bench_dt") for _ in range(repeats)]
    except CellFailed as failed:                # a reference solution that fails its check is reported, not timed
        nan = float("nan")
        return CheckTime(puzzle.notebook, puzzle.name, nan, nan, nan, nan, str(failed))
    finally:
        kernel.close()
    return CheckTime(puzzle.notebook, puzzle.name, first[0], statistics.median(w[0] for w in warm), first[1],
                     statistics.median(w[1] for w in warm), warm_cpu_max=max(w[1] for w in warm), repeats=repeats)


def _first_answer(kernel: _Kernel, notebook: str) -> None:
    """Run the notebook's cells up to its first check, whose stub is not solved yet (strict: it raises)."""
    *before, first_check = up_to_first_check(_notebook(notebook))
    for source in before:
        kernel.run(source)
    try:
        kernel.run(first_check)
    except CellFailed as failed:
        if failed.name != "NotSolved":
            raise


def chosen(names: Sequence[str] = ()) -> list:
    """The puzzles of puzzles.ALL named (all of them when none is)."""
    unknown = set(names) - {p.name for p in puzzles.ALL}
    if unknown:
        raise LookupError(f"no puzzle named {', '.join(sorted(unknown))}")
    return [p for p in puzzles.ALL if not names or p.name in names]


def table(rows: Sequence[CheckTime]) -> str:
    fewest, most = min((c.repeats for c in rows), default=1), max((c.repeats for c in rows), default=1)
    repeats = most if fewest == most else f"{fewest} to {most}"
    lines = [f"{TABLE_TITLE} the first check after the notebook's first answer, then the same check {repeats} times "
             "more (warm), each on fresh cases, as the notebook has it (the figures it draws included); wall time, "
             "and the kernel's CPU time; warm: the median, and the slowest draw:", "",
             "| notebook | puzzle | first: wall | first: CPU | warm: wall | warm: CPU | warm: CPU, slowest |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {c.notebook} | `{c.puzzle}` | {c.first:.2f} s | {c.first_cpu:.2f} s | {c.warm:.2f} s | "
              f"{c.warm_cpu:.2f} s | {c.warm_cpu_max:.2f} s |" if not c.error else
              f"| {c.notebook} | `{c.puzzle}` | the reference solution failed its check: "
              f"{c.error.splitlines()[0][:200]} | | | | |" for c in rows]
    return "\n".join(lines)


TABLE_TITLE = "Check cells with the reference solutions, each puzzle in a fresh Jupyter kernel:"


def update(stem: Path, rows: Sequence[CheckTime]) -> None:
    """Put these check times in a benchmark's results (<stem>.json and <stem>.md), keeping the other parts and the
    earlier times of the puzzles not timed again, in the course's order."""
    known = stem.with_suffix(".json")
    data = json.loads(known.read_text()) if known.exists() else {}       # a machine timed for the first time
    fields = {f.name for f in dataclasses.fields(CheckTime)}
    renamed = {"first_s": "first", "warm_s": "warm", "first_cpu_s": "first_cpu", "warm_cpu_s": "warm_cpu",
               "warm_cpu_max_s": "warm_cpu_max"}
    earlier = [CheckTime(**{k2: v for k, v in d.items() if (k2 := renamed.get(k, k)) in fields})
               for d in data.get("check_times", [])]
    by_name = {c.puzzle: c for c in (*earlier, *rows)}
    order = [p.name for p in puzzles.ALL]
    rows = sorted(by_name.values(), key=lambda c: order.index(c.puzzle) if c.puzzle in order else len(order))
    data["check_times"] = [c.as_dict() for c in rows]
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    report = stem.with_suffix(".md")
    kept = report.read_text().split(TABLE_TITLE)[0].rstrip() if report.exists() else ""   # the report's last part
    report.write_text(f"{kept}\n\n{table(rows)}\n".lstrip())


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.check_times", description=__doc__.split("\n\n")[0])
    ap.add_argument("puzzles", nargs="*", help="puzzle names (default: all)")
    ap.add_argument("--repeats", type=int, default=8, help="warm runs per puzzle, each on fresh cases (default 8)")
    ap.add_argument("--into", type=Path, help="results to update in place, e.g. bench/results/amd-epyc-2cpu (the "
                    "puzzles not timed keep their earlier rows)")
    args = ap.parse_args(argv)
    rows = []
    for puzzle in chosen(args.puzzles):
        rows.append(time_check(puzzle, args.repeats))
        c = rows[-1]
        print(f"{puzzle.name}: first {c.first_cpu:.2f} s CPU, warm {c.warm_cpu:.2f} s (slowest {c.warm_cpu_max:.2f} s)"
              f" {c.error}", file=sys.stderr, flush=True)
    print(table(rows))
    if args.into:
        update(args.into, rows)


if __name__ == "__main__":
    main()
