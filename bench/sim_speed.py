"""How fast the simulator answers, in CPU seconds: what it adds to each op, a check's first and warm run after
the notebook's setup cell, a ring all-reduce on 64 to 512 ranks and one training step of notebook 06's 3D puzzle on
(dp, pp, tp) = (8, 8, 8), 512 ranks.

    python -m bench.sim_speed                         # this checkout
    python -m bench.sim_speed --before /tmp/old       # and another checkout (a worktree of an older commit)
    python -m bench.sim_speed --scale                 # the many-rank figures, each as a ratio to a small op
    python -m bench.sim_speed --digest [--before /tmp/old]  # whether a change of the engine moved what checks judge

Absolute times drift on a shared machine; the many-rank figures are also given as ratios to a small torch op (an add
of two 256-float tensors) timed in the same process.

Each repeat runs `python bench/sim_speed.py --one` in a fresh process per checkout, the checkouts taking turns,
so that the same script measures both and a change of load on a shared machine falls on both. CPU time
(every thread of the process) rather than wall time: other work on the machine inflates it less.
This file imports only what every checkout has (torch, lib, puzzles, solutions), never `bench`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
OPS = 4000                     # ops per simulated run when timing the per-op overhead
CHECKED = ("ring_all_reduce", "data_parallel_train")


def _cpu(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def _quiet(fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        with contextlib.redirect_stdout(io.StringIO()):          # a check's ✓ lines
            fn()
    return run


def _add_ops(dist, x, n: int):
    for _ in range(n):
        x = x + 1
    return x


def _per_op_overhead(repeat: int = 5) -> dict:
    """CPU seconds a simulated rank adds to one small op (tracking, ownership, the clock): a run of OPS adds
    minus a run of none, per op, minus the same add outside the simulator."""
    import torch
    from lib import sim

    x = torch.zeros(16)
    inside = statistics.median(_cpu(lambda: sim.run(_add_ops, 1, x, OPS)) - _cpu(lambda: sim.run(_add_ops, 1, x, 0))
                               for _ in range(repeat)) / OPS
    outside = statistics.median(_cpu(lambda: _add_ops(None, x, OPS)) for _ in range(repeat)) / OPS
    return {"per_op_simulated_s": inside, "per_op_plain_s": outside, "per_op_overhead_s": inside - outside}


def _setup_cell(notebook: str) -> str:
    cells = json.loads((Path.cwd() / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
    return next("".join(c["source"]) for c in cells if "setup" in c.get("metadata", {}).get("tags", []))


def one(repeat: int = 3) -> dict:
    """Every figure of this checkout (the one importable from here), in this fresh process: the notebook's setup
    cell, then each check of CHECKED first and warm (seed 0, no figures), then the per-op overhead."""
    out = {}
    out["setup_cell_s"] = _cpu(lambda: exec(_setup_cell("02_data_parallel"), {}))
    import puzzles.data_parallel as P
    import solutions.data_parallel as S

    for name in CHECKED:
        check = _quiet(lambda name=name: getattr(P, name).check(getattr(S, name), seed=0, show=False))
        out[f"{name}_first_s"] = _cpu(check)
        out[f"{name}_warm_s"] = statistics.median(_cpu(check) for _ in range(repeat))
    out.update(_per_op_overhead())
    return out


@dataclass(frozen=True)
class Figure:
    """One figure for every checkout: median, min and max over the repeats, CPU seconds."""

    what: str
    key: str
    per_checkout: dict            # checkout label -> list of seconds, one per repeat

    def summary(self, label: str) -> tuple[float, float, float]:
        xs = self.per_checkout[label]
        return statistics.median(xs), min(xs), max(xs)

    def as_dict(self) -> dict:
        return {"what": self.what, "key": self.key,
                "median_s": {k: statistics.median(v) for k, v in self.per_checkout.items()},
                "samples_s": self.per_checkout}


FIGURES = [("per-op overhead of a simulated rank (one small add)", "per_op_overhead_s"),
           ("the setup cell of 02, fresh process", "setup_cell_s"),
           (f"`{CHECKED[0]}` check, the first check after the setup cell", f"{CHECKED[0]}_first_s"),
           *((f"`{name}` check, its first run (not the process's first check)", f"{name}_first_s")
             for name in CHECKED[1:]),
           *((f"`{name}` check, warm", f"{name}_warm_s") for name in CHECKED)]


def compare(checkouts: dict[str, Path], repeats: int, progress: Callable[[int, int], None] = lambda d, t: None,
            ) -> list[Figure]:
    """`repeats` fresh processes per checkout (label -> folder), taking turns; the figures of FIGURES."""
    runs: dict[str, list[dict]] = {label: [] for label in checkouts}
    progress(0, repeats)
    for r in range(repeats):
        order = list(checkouts.items())[::(-1 if r % 2 else 1)]
        for label, folder in order:
            runs[label].append(_fresh(folder))
        progress(r + 1, repeats)
    return [Figure(what, key, {label: [run[key] for run in runs[label]] for label in checkouts})
            for what, key in FIGURES]


def _fresh(folder: Path, what: str = "--one") -> dict:
    """`one()` (or --digest's figure) in a new process that imports `folder`'s lib, puzzles and solutions."""
    env = dict(os.environ, PYTHONPATH=str(folder), COURSE_STRICT="1")
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), what], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"sim_speed in {folder} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


SMALL_OPS = 20_000


def small_op_s() -> float:
    """CPU seconds of one small torch op in this process, the unit of the ratios: an add of two 256-float tensors (the
    fastest of 5 runs of SMALL_OPS). CPU time, as every figure here: a wall time on a loaded machine varied 2x."""
    import torch

    a, b = torch.randn(256), torch.randn(256)

    def adds() -> None:
        for _ in range(SMALL_OPS):
            torch.add(a, b)
    return min(_cpu(adds) for _ in range(5)) / SMALL_OPS


@dataclass(frozen=True)
class RingScale:
    ranks: int
    floats: int
    seconds: float               # CPU seconds, median
    repeats: int
    small_op_s: float            # one small op, timed in the same process

    @property
    def messages(self) -> int:
        """A ring all-reduce's messages: 2(N-1) steps, one message per rank per step."""
        return 2 * self.ranks * (self.ranks - 1)

    def as_dict(self) -> dict:
        per = self.seconds / self.messages
        return {"ranks": self.ranks, "floats": self.floats, "cpu_s": self.seconds, "repeats": self.repeats,
                "messages": self.messages, "per_message_s": per, "per_message_small_ops": per / self.small_op_s}


def ring_scaling(sizes: Sequence[tuple[int, int]] = ((64, 3), (128, 1), (256, 1), (512, 1))) -> list[RingScale]:
    """One ring all-reduce of 256 floats per rank on n simulated ranks, (n, repeats) for each of `sizes`."""
    import torch
    import solutions.data_parallel as S
    from lib import sim

    out = []
    for n, repeat in sizes:
        xs = sim.per_rank([torch.randn(n * 256) for _ in range(n)])
        cpu = statistics.median(_cpu(lambda n=n, xs=xs: sim.run(S.ring_all_reduce, n, xs, timeout=3600))
                                for _ in range(repeat))
        out.append(RingScale(n, n * 256, cpu, repeat, small_op_s()))
    return out


THREE_D = (8, 8, 8)              # (dp, pp, tp): 512 ranks


def three_d_step(shape: tuple[int, int, int] = THREE_D) -> dict:
    """One training step of notebook 06's 3D puzzle (its reference solution: 1F1B over pp micro-batches, Megatron TP,
    the DP average) on a tiny GPT of pp blocks and tp heads: CPU seconds, this process's peak resident memory and
    the simulated ranks' largest peak. Run in a fresh process (--three-d), so that the peak is this step's."""
    import torch
    import solutions.three_d as S
    from lib import sim
    from lib.models import GPTConfig
    from puzzles.parallel_gpt import shard_gpt, tiny_gpt

    dp, pp, tp = shape
    m, n = pp, dp * pp * tp
    cfg = GPTConfig(vocab=32, seq=8, hidden=8 * tp, heads=tp, layers=pp, tied=False)
    stages = shard_gpt(tiny_gpt(cfg, 0), pp, tp)
    gen = torch.Generator().manual_seed(0)
    tokens, targets = (torch.randint(cfg.vocab, (dp * m, cfg.seq), generator=gen) for _ in range(2))
    per_stage = sim.per_rank([stages[(r // tp) % pp][r % tp] for r in range(n)])      # row-major (dp, pp, tp)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = None

    def step() -> None:
        nonlocal result
        result = sim.run(S.train_3d, n, per_stage, tokens, targets, dp, pp, tp, m, 1, 0.1, timeout=3600)
    cpu = _cpu(step)
    return {"shape": list(shape), "ranks": n, "cpu_s": cpu, "small_op_s": small_op_s(),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "rss_before_bytes": before,
            "rank_peak_bytes": max(s.peak_memory for s in result.stats), "events": len(result.trace)}


def scale(rings: Sequence[tuple[int, int]], shape: tuple[int, int, int]) -> str:
    """Markdown: the per-op overhead, the ring's cost per message and the 3D step, each as a ratio to a small op."""
    first = small_op_s()
    # The 3D step's process first: on Linux a child's ru_maxrss starts at its parent's peak when it was started (it
    # survives fork and exec), so a child started after the rings below reported their 2.27 GiB as its own.
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--three-d", ",".join(map(str, shape))],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the 3D step failed:\n{done.stderr[-3000:]}")
    step = json.loads(done.stdout.strip().splitlines()[-1])
    op = _per_op_overhead()["per_op_overhead_s"]
    rows = ring_scaling(rings)
    # The unit: the fastest of the small op's timings in these processes. A busy machine slows a small op by up to
    # 2x here from one timing to the next; the fastest is its undisturbed cost, and the ratios err on the high side.
    small = min(first, step["small_op_s"], *(ring.small_op_s for ring in rows))
    lines = ["| what | CPU | in small ops |", "|---|---|---|",
             f"| one small op (torch.add of 256 floats), the fastest of {len(rows) + 2} timings | "
             f"{small * 1e6:.2f} µs | 1 |",
             f"| per-op overhead of a simulated rank (one small add) | {op * 1e6:.1f} µs | {op / small:.1f} |"]
    for ring in rows:
        per = ring.seconds / ring.messages
        lines.append(f"| ring all-reduce, {ring.ranks} ranks: {ring.seconds:.2f} s for {ring.messages:,} messages, "
                     f"per message | {per * 1e6:.0f} µs | {per / small:.0f} |")
    lines.append(f"| 3D step, (dp, pp, tp) = {tuple(shape)}, {step['ranks']} ranks, {step['events']:,} trace events; "
                 f"the process's peak memory {step['peak_rss_bytes'] / 2**30:.2f} GiB | {step['cpu_s']:.1f} s | "
                 f"{step['cpu_s'] / small / 1e6:.1f} M |")
    return "\n".join(lines)


# The checks whose runs --digest hashes: one or more of each kind of work (collectives by hand, DDP, both pipeline
# schedules, a 3D mesh, ZeRO-3, offloading to host memory)
DIGESTED = (("data_parallel", "ring_all_reduce"), ("data_parallel", "data_parallel_train"), ("pipeline", "gpipe"),
            ("pipeline", "one_f_one_b"), ("three_d", "train_3d"), ("zero", "zero3_train"),
            ("memory", "offloaded_adam_train"))
_STATS = ("rank", "bytes_sent", "bytes_received", "peak_memory", "clock", "flops", "host_peak_memory", "host_flops",
          "calls", "memory", "p2p_log", "largest_tensor")


def digest(checks: Sequence[tuple[str, str]] = DIGESTED, seed: int = 0) -> dict:
    """What the checks of `checks` ((module, puzzle), with their reference solutions) measure at `seed`, as one
    SHA-256: every simulated run's trace and, per rank, its bytes, peak memory, clock, FLOPs, memory timeline, calls
    and point-to-point order, floats to the last bit. Two checkouts with the same digest: a change of the engine
    moved nothing a check judges (the same seed gives the same trace, clocks and figures)."""
    import hashlib
    import importlib

    from lib.sim import runtime

    sha, runs, result = hashlib.sha256(), [0], runtime.Runtime.result

    def hashed(self):
        out = result(self)
        runs[0] += 1
        for e in out.trace:
            sha.update(repr((e.rank, e.op, e.group, e.peer, e.bytes, e.start, e.end)).encode())
        for stats in out.stats:
            sha.update(repr(tuple(getattr(stats, name, None) for name in _STATS)).encode())
        return out
    runtime.Runtime.result = hashed
    try:
        for module, name in checks:
            puzzles, solutions = (importlib.import_module(f"{kind}.{module}") for kind in ("puzzles", "solutions"))
            with contextlib.redirect_stdout(io.StringIO()):
                if not getattr(puzzles, name).check(getattr(solutions, name), seed=seed, show=False, strict=False):
                    raise RuntimeError(f"the reference solution of {name} fails its check at seed {seed}")
    finally:
        runtime.Runtime.result = result
    return {"runs": runs[0], "sha256": sha.hexdigest()}


def table(figures: list[Figure]) -> str:
    """Markdown: a row per figure, a column per checkout (median, min-max), and the first / the last."""
    labels = list(figures[0].per_checkout)
    ratio = len(labels) > 1
    head = "| what | " + " | ".join(labels) + (f" | {labels[0]} / {labels[-1]} |" if ratio else " |")
    lines = [head, "|---" * (len(labels) + 1 + ratio) + "|"]
    for f in figures:
        cells = [_span(*f.summary(label)) for label in labels]
        last = f" | {f.summary(labels[0])[0] / f.summary(labels[-1])[0]:.2f}×" if ratio else ""
        lines.append(f"| {f.what} | " + " | ".join(cells) + last + " |")
    return "\n".join(lines)


def _span(median: float, low: float, high: float) -> str:
    unit, scale = ("µs", 1e6) if median < 1e-3 else ("ms", 1e3)
    return f"{median * scale:,.1f} {unit} ({low * scale:,.1f}-{high * scale:,.1f})"


def _only_this_checkout() -> None:
    """The checkout measured is the one on PYTHONPATH: an editable install of another checkout must not supply the
    modules this one lacks (it would mix two versions of the course in one process)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.sim_speed", description=__doc__.split("\n\n")[0])
    ap.add_argument("--one", action="store_true", help="internal: this process's figures as one JSON line")
    ap.add_argument("--before", type=Path, help="another checkout to measure with the same script")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scale", action="store_true", help="the many-rank figures, as ratios to a small op")
    ap.add_argument("--rings", default="64,128,256,512", help="with --scale: the ring's numbers of ranks")
    ap.add_argument("--three-d", default=None, help="with --scale: the 3D step's dp,pp,tp (8,8,8); alone: internal")
    ap.add_argument("--digest", action="store_true",
                    help="a SHA-256 of what seven checks measure at seed 0 (with --before: of both checkouts)")
    args = ap.parse_args(argv)
    shape = tuple(int(v) for v in (args.three_d or ",".join(map(str, THREE_D))).split(","))
    if args.scale:
        print(scale([(int(n), 1) for n in args.rings.split(",")], shape))
        return
    if args.three_d:
        print(json.dumps(three_d_step(shape)))
        return
    if args.digest:
        if args.before is None:
            _only_this_checkout()
            print(json.dumps(digest()))
            return
        found = {label: _fresh(folder, "--digest") for label, folder in (("this checkout", ROOT),
                                                                         (str(args.before), args.before.resolve()))}
        for label, d in found.items():
            print(f"{label}: {d['runs']} simulated runs, sha256 {d['sha256']}")
        same = len({d["sha256"] for d in found.values()}) == 1
        print("identical: the same traces, clocks and figures" if same else "DIFFERENT: some run measured otherwise")
        return
    if args.one:
        _only_this_checkout()
        print(json.dumps(one()))
        return
    checkouts = {"this checkout": ROOT, **({f"{args.before}": args.before.resolve()} if args.before else {})}
    print(table(compare(checkouts, args.repeats)))


if __name__ == "__main__":
    main()
