"""What the guard (lib/guard) costs, in CPU time: a kernel's `sys._getframe()` before the course is imported, after
`import lib` and after one check; and what each guard adds to a simulated rank's ops and dist calls, by switching
them off one at a time.

    python -m bench.guard_cost [--repeats 5]

Each figure comes from a fresh process (Python's audit hook cannot be removed once added): `--frames` for the
`sys._getframe()` cost, `--one GUARD` for the per-op and per-call figures with GUARD switched off ("none": every
guard on). The guards switched off:
- audit: Python's audit hook (lib.guard.audit), never added;
- patches: the attributes lib.guard.boundary patches while a run lasts (numpy, threads, the dispatch stack, ...);
- modules: the engine's modules made _EngineModules while a run lasts (their private names refused);
- stand-ins: the guarded stand-ins a rank gets for its dist and work handles (lib.guard.handles);
- ownership: the share-nothing check of every op (lib.sim.ownership: fidelity, not a guard, measured for scale).
An op is an add of two 16-float tensors (bench.sim_speed's per-op overhead); a dist call an isend, a recv and a wait
of 16 floats between 2 ranks. Outside the simulator the add costs about 2 µs here.

Measured 2026-12-07 on the 2-core AMD EPYC machine (shared with other work; 3 fresh processes each):
bench/results/guard-cost-amd-epyc-2cpu.md (sys._getframe() after a check: ~0.9-1.1 µs on main, ~0.46-0.49 µs
here; 12 ns before any run; no guard told apart from the noise per op once the audit hook turned builtins.id away).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUARDS = ("none", "audit", "patches", "modules", "stand-ins", "ownership")
CALLS = 500                  # dist call rounds per run when timing a dist call


def _ns(statement: str, number: int = 200_000) -> float:
    return min(timeit.repeat(statement, globals={"getframe": sys._getframe, "x": 1}, number=number, repeat=5)) \
        / number * 1e9


_FRAME_LABELS = {"getframe_before_import_ns": "sys._getframe(), before import lib",
                 "getframe_after_import_ns": "sys._getframe(), after import lib",
                 "getframe_after_a_check_ns": "sys._getframe(), after a check",
                 "id_before_import_ns": "id(), before import lib", "id_after_a_check_ns": "id(), after a check"}


def frames() -> dict:
    """sys._getframe()'s cost in this fresh process before the course, after `import lib` and after one check; and
    id()'s (Python raises an audit event for each, and the tracker calls it once per op) before and after."""
    out = {"getframe_before_import_ns": _ns("getframe()"), "id_before_import_ns": _ns("id(x)")}
    import lib  # noqa: F401

    out["getframe_after_import_ns"] = _ns("getframe()")
    import puzzles.data_parallel as P
    import solutions.data_parallel as S
    from bench.sim_speed import _quiet

    _quiet(lambda: P.ring_all_reduce.check(S.ring_all_reduce, seed=0, show=False))()
    out["getframe_after_a_check_ns"] = _ns("getframe()")
    out["id_after_a_check_ns"] = _ns("id(x)")
    return out


def _switch_off(guard: str) -> None:
    """Switch `guard` off in this process, before its first run."""
    from lib.guard import audit, boundary, handles
    from lib.sim import ownership

    if guard == "audit":
        audit.install = lambda: None
    elif guard == "patches":
        boundary._table = list
    elif guard == "modules":
        boundary._engine_modules = list
    elif guard == "stand-ins":
        handles.handed = lambda value: value
    elif guard == "ownership":
        ownership.Ownership.check = lambda *args, **kwargs: None
    elif guard != "none":
        raise SystemExit(f"unknown guard {guard!r}: one of {', '.join(GUARDS)}")


def _exchanges(dist, x, n: int):
    peer = 1 - dist.get_rank()
    for _ in range(n):
        work = dist.isend(x, peer)
        dist.recv(x, peer)
        work.wait()
    return x


def one(guard: str) -> dict:
    """Per-op and per-dist-call CPU seconds with `guard` switched off, in this fresh process."""
    import torch

    from bench.sim_speed import _cpu, _per_op_overhead
    from lib import sim

    _switch_off(guard)
    out = _per_op_overhead()
    x = torch.zeros(16)
    out["per_call_s"] = statistics.median(_cpu(lambda: sim.run(_exchanges, 2, x, CALLS))
                                          - _cpu(lambda: sim.run(_exchanges, 2, x, 0)) for _ in range(5)) / CALLS
    return out


def _fresh(*what: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "bench.guard_cost", *what], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"guard_cost {' '.join(what)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(repeats: int) -> str:
    """Markdown: the frames' cost, and each guard's share of an op and of a dist call (median of `repeats`)."""
    runs = [_fresh("--frames") for _ in range(repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    lines = ["| call, when | ns |", "|---|---|", *(f"| {_FRAME_LABELS[k]} | {v:.0f} |" for k, v in med.items()), ""]
    per = {}
    for _ in range(repeats):                   # the guards take turns, so a change of load falls on all of them
        for guard in GUARDS:
            per.setdefault(guard, []).append(_fresh("--one", guard))
    fig = {g: {k: statistics.median(r[k] for r in rs) for k in ("per_op_overhead_s", "per_call_s")}
           for g, rs in per.items()}
    lines += ["| switched off | per-op overhead µs | saved per op µs | per dist call µs | saved per call µs |",
              "|---|---|---|---|---|"]
    base = fig["none"]
    for guard, f in fig.items():
        op, call = f["per_op_overhead_s"] * 1e6, f["per_call_s"] * 1e6
        lines.append(f"| {guard} | {op:.2f} | {base['per_op_overhead_s'] * 1e6 - op:+.2f} | {call:.1f} | "
                     f"{base['per_call_s'] * 1e6 - call:+.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--one", choices=GUARDS, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.frames:
        print(json.dumps(frames()))
    elif args.one:
        print(json.dumps(one(args.one)))
    else:
        print(report(args.repeats))


if __name__ == "__main__":
    main()
