"""Every benchmark in one command: each notebook's algorithm against PyTorch's own on real ranks, the simulator's
fidelity and speed, each notebook's first answer and JupyterLab's start, and the check cells' times. Prints the
tables; writes bench/results/<machine>.{md,json,png}.

    python -m bench                      # everything, 4 ranks (gloo; NCCL when there is one GPU per rank)
    python -m bench --quick              # a subset at small sizes, under a minute (written to bench/results/scratch/)
    python -m bench --only rows --rows ddp,zero1 --world 2
    python -m bench --only rows --rows tp-dp --into bench/results/amd-epyc-2cpu   # add rows to earlier results
    python -m bench --before /tmp/old    # the simulator's speed here and in a checkout of an older commit
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from bench import runner, sim_speed
from bench.report import Report, machine, merge_rows
from bench.rows import PAIRS, ROWS

PARTS = ("rows", "fidelity", "sim", "first", "checks")
RESULTS = Path(__file__).resolve().parent / "results"


class Progress:
    """One line per benchmark with a bar of its repeats, redrawn in place on a terminal."""

    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.live = stream.isatty()

    def start(self, title: str):
        self.done += 1
        begun = time.perf_counter()
        label = f"[{self.done:>2}/{self.total}] {title:<46.46}"

        def update(step: int, steps: int) -> None:
            if step < steps and not self.live:
                return
            bar = "#" * round(20 * step / max(steps, 1))
            line = f"{label} [{bar:<20}] {step}/{steps}  {time.perf_counter() - begun:6.1f} s"
            self.stream.write(("\r" + line if self.live else line) + ("\n" if step == steps else ""))
            self.stream.flush()
        return update


def main(argv: list[str] | None = None) -> Report:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, a subset of rows, no 256-rank simulation, "
                                                        "one notebook's first answer, one check cell")
    ap.add_argument("--world", type=int, default=4, help="ranks (default 4)")
    ap.add_argument("--backend", choices=("gloo", "nccl"), help="default: NCCL with one GPU per rank, else gloo")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts among {', '.join(PARTS)}")
    ap.add_argument("--rows", default="", help="comma-separated row keys (default: all; see bench/rows.py)")
    ap.add_argument("--repeats", type=int, help="launches per row (default 3, quick 2)")
    ap.add_argument("--steps", type=int, help="timed steps per launch, after one warm-up step (default 3, quick 2)")
    ap.add_argument("--out", type=Path, help="folder for the results (default bench/results, quick: "
                                             "bench/results/scratch)")
    ap.add_argument("--machine", help="name of the results' files (default: from the CPU or GPU)")
    ap.add_argument("--into", type=Path, help="with --only rows: merge the rows measured into these results "
                                              "(<INTO>.json and .md; a row of the same key replaced, the rest kept) "
                                              "and redraw <INTO>.png, instead of writing new files")
    ap.add_argument("--before", type=Path, help="the simulator's speed also in this checkout (e.g. a worktree of an "
                                                "older commit), measured by the same script")
    args = ap.parse_args(argv)
    parts = [p for p in args.only.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"unknown part(s) {', '.join(sorted(unknown))}; choose among {', '.join(PARTS)}")
    if args.into and parts != ["rows"]:
        ap.error("--into merges rows only: add --only rows")
    keys = [k for k in args.rows.split(",") if k]
    missing = set(keys) - {r.key for r in ROWS}
    if missing:
        ap.error(f"unknown row(s) {', '.join(sorted(missing))}; rows: {', '.join(r.key for r in ROWS)}")

    backend = args.backend or ("nccl" if torch.backends.cuda.is_built() and torch.cuda.device_count() >= args.world
                                else "gloo")              # as lib.launch picks it
    plan = runner.Plan(world=args.world, quick=args.quick, repeats=args.repeats or (2 if args.quick else 3),
                       steps=args.steps or (2 if args.quick else 3), backend=backend)
    info = machine()
    if args.machine:
        info["name"] = args.machine
    report = Report(info, {"world": plan.world, "backend": backend, "quick": plan.quick, "repeats": plan.repeats,
                           "steps": plan.steps, "warmup": plan.warmup})
    started = time.perf_counter()
    out = args.out or (RESULTS / "scratch" if plan.quick else RESULTS)
    rows = [r for r in ROWS if (r.key in keys if keys else (r.quick or not args.quick))] if "rows" in parts else []
    if args.into:
        _real_then_simulated(report, plan, rows, [])
        print(report.markdown())
        paths = merge_rows(args.into, report)
        print("merged into " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
        return report
    if rows or "fidelity" in parts:
        _timed(report, out, "real_and_simulated", _real_then_simulated, report, plan, rows,
               PAIRS if "fidelity" in parts else [])
    if "sim" in parts:
        _timed(report, out, "sim_speed", _sim_speed, report, plan, args.before)
    if "first" in parts:
        _timed(report, out, "first_answer", _first_answer, report, plan.quick)
    if "checks" in parts:
        _timed(report, out, "check_times", _check_times, report, ["ring_all_reduce"] if plan.quick else [],
               1 if plan.quick else 8)
    report.seconds["total"] = time.perf_counter() - started

    print(report.markdown())
    paths = report.write(out)
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return report


def _timed(report: Report, out: Path, part: str, fn, *args) -> None:
    """Run one part; write what is measured so far, so that a long run stopped later keeps it."""
    start = time.perf_counter()
    fn(*args)
    report.seconds[part] = time.perf_counter() - start
    report.write(out)


def _real_then_simulated(report: Report, plan: runner.Plan, rows: list, pairs: list) -> None:
    """Every launch before every simulation (see bench.runner on forking after a simulation)."""
    progress = Progress(2 * len(rows) + 2 * len(pairs) + bool(pairs))
    print(f"{plan.world} real {plan.backend} ranks; per side {plan.repeats} launches × ({plan.warmup} warm-up + "
          f"{plan.steps} timed steps)", file=sys.stderr)
    if pairs:
        tick = progress.start("calibrating the simulator on these ranks")
        report.calibration = runner.calibrate(plan)
        tick(1, 1)
    report.rows = [runner.measure_row(r, plan, progress.start(f"{r.notebook} {r.title}")) for r in rows]
    report.pairs = [runner.measure_pair(p, plan, progress.start(f"{p.notebook} {p.what}")) for p in pairs]
    for r in report.rows:
        tick = progress.start(f"simulated bytes: {r.row.title}")
        runner.add_bytes(r, plan)
        tick(1, 1)
    for p in report.pairs:
        tick = progress.start(f"simulated: {p.pair.what}")
        runner.add_predictions(p, plan, report.calibration)
        tick(1, 1)


def _sim_speed(report: Report, plan: runner.Plan, before: Path | None) -> None:
    progress = Progress(2)
    checkouts = {"this checkout": sim_speed.ROOT, **({str(before): before.resolve()} if before else {})}
    report.sim_speed = sim_speed.compare(checkouts, 1 if plan.quick else 5,
                                         progress.start("simulator speed, fresh processes"))
    tick = progress.start("simulator speed, ring all-reduce on many ranks")
    report.ring_scaling = sim_speed.ring_scaling(((8, 1),) if plan.quick else ((8, 3), (64, 3), (256, 1)))
    tick(1, 1)


def _first_answer(report: Report, quick: bool) -> None:
    from bench import first_answer      # here, not above: it needs Jupyter, which a GPU image may lack (rows do not)

    notebooks = ["02_data_parallel"] if quick else []
    progress = Progress(2 if quick else 11)
    report.first_answer = first_answer.measure(notebooks, repeats=1 if quick else 3, lab=not quick,
                                               progress=progress.start)


def _check_times(report: Report, names: list[str], repeats: int) -> None:
    from bench import check_times       # here, not above: it needs Jupyter, which a GPU image may lack (rows do not)

    chosen = check_times.chosen(names)
    progress = Progress(len(chosen))
    for puzzle in chosen:
        tick = progress.start(f"check cell, fresh kernel: {puzzle.name}")
        report.check_times.append(check_times.time_check(puzzle, repeats))
        tick(1, 1)


if __name__ == "__main__":
    main()
