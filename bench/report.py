"""What a benchmark run leaves: the machine it ran on, Markdown tables, JSON, and a plot."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from bench import check_times as checks
from bench.rows import ROWS
from bench.runner import Calibration, PairResult, RowResult
from bench import sim_speed as speed
from bench.timing import Timing
from lib.units import fmt_bytes, fmt_time


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[str]:
    """GPU names from nvidia-smi: asking torch would initialise CUDA in a process that later forks ranks."""
    if not torch.backends.cuda.is_built() or torch.cuda.device_count() == 0 or not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def machine() -> dict:
    """What the figures were measured on, and a short name for the results' files."""
    gpus, cpu, cores = _gpus(), _cpu_model(), os.cpu_count() or 1
    slug = f"{gpus[0]}-x{len(gpus)}" if gpus else f"{cpu}-{cores}cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", slug.lower().replace("(r)", "").replace("(tm)", "")).strip("-")
    return {"name": slug, "cpu": cpu, "cores": cores, "gpus": gpus, "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if gpus else None,
            "python": platform.python_version(), "os": f"{platform.system()} {platform.release()}",
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


@dataclass
class Report:
    machine: dict
    settings: dict
    rows: list[RowResult] = field(default_factory=list)
    calibration: Optional[Calibration] = None
    pairs: list[PairResult] = field(default_factory=list)
    sim_speed: list[speed.Figure] = field(default_factory=list)
    ring_scaling: list[speed.RingScale] = field(default_factory=list)
    check_times: list[checks.CheckTime] = field(default_factory=list)
    first_answer: Optional[dict] = None             # bench.first_answer.measure's figures and table
    seconds: dict = field(default_factory=dict)       # how long each part took

    # ---- JSON ---------------------------------------------------------------------------------------
    def as_dict(self) -> dict:
        return {
            "machine": self.machine, "settings": self.settings, "seconds": self.seconds,
            "rows": [_row_dict(r, self.settings["quick"]) for r in self.rows],
            "fidelity": None if self.calibration is None else {
                "calibration": {"flops_per_s": self.calibration.flops_per_s,
                                "memory_bandwidth_bytes_per_s": self.calibration.memory_bandwidth,
                                "latency_s": self.calibration.latency,
                                "bandwidth_bytes_per_s": self.calibration.bandwidth,
                                "matmul": list(self.calibration.matmul),
                                "all_reduce_bytes": list(self.calibration.messages),
                                "collective_s": self.calibration.collectives},
                "pairs": [{"notebook": p.pair.notebook, "what": p.pair.what, "a": p.pair.a.name, "b": p.pair.b.name,
                           "a_time": p.a.as_dict(), "b_time": p.b.as_dict(), "measured_ratio": p.measured,
                           "predicted_ratio": p.predicted, "predicted_ratio_h100": p.predicted_h100}
                          for p in self.pairs]},
            "sim_speed": [s.as_dict() for s in self.sim_speed],
            "ring_scaling": [s.as_dict() for s in self.ring_scaling],
            "first_answer": None if self.first_answer is None else
            {k: v for k, v in self.first_answer.items() if k != "table"},
            "check_times": [c.as_dict() for c in self.check_times],
        }

    def write(self, folder: Path) -> dict[str, Path]:
        """<machine>.json, .md and .png in `folder`; returns their paths."""
        folder.mkdir(parents=True, exist_ok=True)
        stem = folder / self.machine["name"]
        paths = {"json": stem.with_suffix(".json"), "md": stem.with_suffix(".md"), "png": stem.with_suffix(".png")}
        paths["json"].write_text(json.dumps(self.as_dict(), indent=1) + "\n")
        paths["md"].write_text(self.markdown())
        if self.rows:
            from bench.plot import draw
            draw(self, paths["png"])
        else:
            paths.pop("png")
        return paths

    # ---- Markdown -----------------------------------------------------------------------------------
    def header(self) -> str:
        m, s = self.machine, self.settings
        where = ", ".join(m["gpus"]) if m["gpus"] else f"{m['cpu']}, {m['cores']} cores, no GPU"
        load = "" if not m.get("load_average") else f"; load average {m['load_average'][0]:.1f} at the start"
        return (f"Measured on {where}; torch {m['torch']}, Python {m['python']}, {m['os']}{load}. "
                f"{s['world']} {s['backend']} ranks; a step's time is the slowest rank's, median (min-max) of "
                f"{_n(s['repeats'], 'launch', 'launches')} × {_n(s['steps'], 'step')} after "
                f"{_n(s['warmup'], 'warm-up step')}{' (quick run: small sizes)' if s['quick'] else ''}.")

    def markdown(self) -> str:
        parts = [self.header()]
        if self.rows:
            parts += [rows_table(self.rows), all_reduce_table(self.rows)]
        if self.pairs:
            parts.append(fidelity_table(self.pairs, self.calibration))
        if self.sim_speed or self.ring_scaling:
            parts.append(sim_speed_table(self.sim_speed, self.ring_scaling))
        if self.first_answer:
            parts.append(self.first_answer["table"])
        if self.check_times:                            # last: bench.check_times.update replaces it in place
            parts.append(checks.table(self.check_times))
        return "\n\n".join(p for p in parts if p) + "\n"


def _n(count: int, one: str, many: str = "") -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"


def _row_dict(r: RowResult, quick: bool) -> dict:
    return {"key": r.row.key, "notebook": r.row.notebook, "title": r.row.title, "ours": r.row.ours.name,
            "theirs": r.row.theirs.name, "inputs": r.row.ours.setup.describe(quick),
            "ours_time": r.ours.as_dict(), "theirs_time": r.theirs.as_dict(), "ratio": r.ratio,
            "target": r.row.target, "meets_target": r.meets, "bytes_sent_per_rank_per_step": r.bytes_sent,
            "message_bytes": r.message_bytes, "busbw_ours": r.busbw(r.ours), "busbw_theirs": r.busbw(r.theirs),
            "why": r.row.why}


def _row_result(d: dict, world: int) -> RowResult:
    """A row of a results file, as the run that measured it had it."""
    timing = [Timing(t["median_s"], t["min_s"], t["max_s"], t["samples"]) for t in (d["ours_time"], d["theirs_time"])]
    row = next(r for r in ROWS if r.key == d["key"])
    return RowResult(row, *timing, world, d["message_bytes"], d["bytes_sent_per_rank_per_step"])


def merge_rows(stem: Path, report: "Report") -> dict[str, Path]:
    """Put the rows of `report` into the results at <stem>.json and .md (a row with the same key replaced, the
    others and every other part kept, in bench.rows' order) and redraw <stem>.png from all of them. Each merged
    row notes the load and the commit it was measured at, which the file's header does not describe."""
    paths = {k: stem.with_suffix(f".{k}") for k in ("json", "md", "png")}
    data = json.loads(paths["json"].read_text())
    same = ("world", "backend", "quick")
    if any(data["settings"][k] != report.settings[k] for k in same):
        raise ValueError(f"{paths['json']} was measured with {({k: data['settings'][k] for k in same})}, this run "
                         f"with {({k: report.settings[k] for k in same})}: its rows would not compare")
    apart = {"load_average": report.machine.get("load_average"), "commit": _commit(),
             "repeats": report.settings["repeats"], "steps": report.settings["steps"]}
    new = {r.row.key: {**_row_dict(r, report.settings["quick"]), "measured_apart": apart} for r in report.rows}
    order = {r.key: i for i, r in enumerate(ROWS)}
    data["rows"] = sorted([d for d in data["rows"] if d["key"] not in new] + list(new.values()),
                          key=lambda d: order.get(d["key"], len(order)))
    paths["json"].write_text(json.dumps(data, indent=1) + "\n")
    rows = [_row_result(d, data["settings"]["world"]) for d in data["rows"] if d["key"] in order]
    lines = paths["md"].read_text().split("\n")
    first = lines.index(next(line for line in lines if line.startswith("| nb | row |")))
    last = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    paths["md"].write_text("\n".join(lines[:first] + rows_table(rows).split("\n") + lines[last:]))
    from bench.plot import draw
    draw(Report(data["machine"], data["settings"], rows=rows), paths["png"])
    return paths


def _commit() -> Optional[str]:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent,
                         capture_output=True, text=True)
    return out.stdout.strip() or None


def _span(t: Timing) -> str:
    return f"{fmt_time(t.median)} ({fmt_time(t.min)}-{fmt_time(t.max)})"


def _verdict(r: RowResult) -> str:
    if r.meets is None:
        return "-"
    return f"≤ {r.row.target:g}: " + ("met" if r.meets else f"missed: {r.row.why}" if r.row.why else "missed")


def rows_table(rows: list[RowResult]) -> str:
    lines = ["| nb | row | ours | PyTorch's | ours: step | PyTorch: step | sent / rank / step | ours / PyTorch | "
             "target |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.row.notebook} | {r.row.title} | `{r.row.ours.name}` | `{r.row.theirs.name}` | "
                     f"{_span(r.ours)} | {_span(r.theirs)} | {fmt_bytes(r.bytes_sent)} | **{r.ratio:.2f}×** | "
                     f"{_verdict(r)} |")
    return "\n".join(lines)


def _gbps(bps: Optional[float]) -> str:
    return "-" if bps is None else f"{bps / 1e9:.2f} GB/s"


def all_reduce_table(rows: list[RowResult]) -> str:
    ring = [r for r in rows if r.message_bytes is not None]
    if not ring:
        return ""
    lines = ["All-reduce, bus bandwidth as nccl-tests defines it (size / time × 2(N-1)/N):", "",
             "| size | ring_all_reduce | busbw | dist.all_reduce | busbw | ours / PyTorch |",
             "|---|---|---|---|---|---|"]
    for r in ring:
        lines.append(f"| {fmt_bytes(r.message_bytes)} | {fmt_time(r.ours.median)} | {_gbps(r.busbw(r.ours))} | "
                     f"{fmt_time(r.theirs.median)} | {_gbps(r.busbw(r.theirs))} | {r.ratio:.2f}× |")
    return "\n".join(lines)


def fidelity_table(pairs: list[PairResult], cal: Optional[Calibration]) -> str:
    lines = []
    if cal is not None:
        collectives = ", ".join(f"{op} {fmt_time(t)}" for op, t in cal.collectives.items())
        lines += [f"Simulator fidelity. The cost model calibrated on these ranks: {cal.flops_per_s / 1e9:.1f} GFLOP/s "
                  f"and {cal.memory_bandwidth / 1e9:.1f} GB/s of memory bandwidth per rank (matmul "
                  f"{'×'.join(map(str, cal.matmul))}, elementwise add; all ranks at once), link latency "
                  f"{fmt_time(cal.latency)} and bandwidth {cal.bandwidth / 1e9:.2f} GB/s (from dist.all_reduce of "
                  f"{fmt_bytes(cal.messages[0])} and {fmt_bytes(cal.messages[1])}). The collectives on "
                  f"{fmt_bytes(cal.messages[1])}: {collectives} (broadcast: each rank's 1/N in turn).", ""]
    lines += ["| nb | time(a) / time(b) | a: step | b: step | measured | simulated, calibrated | "
              "simulated, H100 model |", "|---|---|---|---|---|---|---|"]
    for p in pairs:
        lines.append(f"| {p.pair.notebook} | {p.pair.what} (`{p.pair.a.name}` / `{p.pair.b.name}`) | "
                     f"{fmt_time(p.a.median)} | {fmt_time(p.b.median)} | **{p.measured:.2f}** | {p.predicted:.2f} | "
                     f"{p.predicted_h100:.2f} |")
    return "\n".join(lines)


def sim_speed_table(figures: list[speed.Figure], rings: list[speed.RingScale]) -> str:
    lines = []
    if figures:
        runs = len(next(iter(figures[0].per_checkout.values())))
        lines += [f"Simulator speed, CPU seconds, median (min-max) of {_n(runs, 'fresh process', 'fresh processes')} "
                  f"per checkout (python -m bench.sim_speed; checks with seed 0, no figures):", "",
                  speed.table(figures), ""]
    if rings:
        lines += ["| one ring all-reduce, 256 floats per rank | ranks | CPU time |", "|---|---|---|"]
        lines += [f"| {r.floats:,} floats | {r.ranks} | {fmt_time(r.seconds)} |" for r in rings]
    return "\n".join(lines).strip()
