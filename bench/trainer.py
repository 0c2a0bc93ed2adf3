"""Notebook 10's trainer, timed: the composed check on 8 simulated ranks (warm), and 30 training steps on one device,
on 8 simulated ranks and on 8 gloo processes, all with the reference pieces; the real run's losses against one
device's.

    python -m bench.trainer [--repeats K] [--out bench/results/trainer-NAME.md]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import platform
import statistics
import time
from pathlib import Path

import solutions.data_parallel
import solutions.pipeline
import solutions.tensor_parallel
import solutions.three_d
import solutions.trainer
import solutions.zero
from lib.notebook.pieces import Pieces
from puzzles import composed as C
from puzzles import trainer_check as T
from puzzles import trainer_runs as R
from puzzles.trainer import HSDP_SEAM, PIECES, SEAMS


def reference_pieces() -> tuple[Pieces, dict]:
    modules = (solutions.data_parallel, solutions.zero, solutions.tensor_parallel, solutions.pipeline,
               solutions.three_d)
    functions = {name: getattr(m, name) for m in modules for name in PIECES if hasattr(m, name)}
    return Pieces(functions=functions), {name: getattr(solutions.trainer, name) for name in (*SEAMS, HSDP_SEAM)}


def _timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def measure(repeats: int) -> list[tuple[str, float, str]]:
    pieces, seams = reference_pieces()
    check, run = C.Parts(), C.Parts(steps=30, lr=1e-2, max_norm=1.0)
    _timed(lambda: T.check_trainer(pieces, seams, check, strict=False, show=False), 1)   # warm: imports, first runs
    rows = []
    for label, parts in (("composed check, ZeRO-0 (own checks, 3 steps, float64)", check),
                         ("composed check, ZeRO-1", C.quick(check, zero=1)),
                         ("composed check, ZeRO-2", C.quick(check, zero=2)),
                         ("composed check, ZeRO-3 (the pipeline run twice a step: its recompute)",
                          C.quick(check, zero=3)),
                         ("composed check, HSDP as the DP axis: (dp, pp, tp) = (4, 1, 2), 2 nodes × 2 (own checks, "
                          "hsdp_gradients' included)", C.quick(check, dp=4, pp=1, tp=2, hsdp_nodes=2))):
        t, ok = _timed(lambda p=parts: T.check_trainer(pieces, seams, p, strict=False, show=False), repeats)
        rows.append((label, t, "passes" if ok else "FAILS"))
    t, _ = _timed(lambda: C.reference_run(run, T.data(run)), repeats)
    rows.append(("30 steps, one device", t, ""))
    t, sim = _timed(lambda: R.simulated_training(pieces, seams, run), repeats)
    rows.append(("30 steps, 8 simulated ranks", t, f"loss {sim['yours'][0]:.3f} → {sim['yours'][-1]:.3f}"))
    t, real = _timed(lambda: R.real_training(pieces, seams, run, show=False), repeats)
    gap = max(abs(a - b) for a, b in zip(real["yours"], real["one_device"]))
    rows.append(("30 steps, 8 gloo processes (6 forked launches of 5 steps, each resuming the last)", t,
                 f"largest loss difference from one device {gap:.1e}"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.trainer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = measure(args.repeats)
    text = "\n".join([f"# Notebook 10's trainer on {platform.machine()}, {platform.node() or 'this machine'}",
                      "", f"Median of {args.repeats} runs, wall time, reference pieces, (dp, pp, tp) = (2, 2, 2).", "",
                      "| run | seconds | note |", "|---|---|---|",
                      *(f"| {label} | {t:.2f} | {note} |" for label, t, note in rows)])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
