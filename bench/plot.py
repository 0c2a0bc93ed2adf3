"""The benchmark's picture: ours against PyTorch's per row, and all-reduce bus bandwidth against message size."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.figure import Figure

if TYPE_CHECKING:
    from bench.report import Report

OURS, THEIRS = "#1f77b4", "#ff7f0e"


def _errors(timings) -> list[list[float]]:
    """Matplotlib's asymmetric error bars, in ms: from each median down to its min and up to its max."""
    return [[(t.median - t.min) * 1e3 for t in timings], [(t.max - t.median) * 1e3 for t in timings]]


def draw(report: "Report", path: Path) -> None:
    rows = report.rows
    ring = [r for r in rows if r.message_bytes is not None]
    fig = Figure(figsize=(14 if ring else 8, 0.55 * len(rows) + 1.8))
    axes = fig.subplots(1, 2 if ring else 1, gridspec_kw={"width_ratios": [3, 2]} if ring else None, squeeze=False)
    ax = axes[0][0]
    y = list(range(len(rows)))[::-1]
    ours, theirs = [r.ours for r in rows], [r.theirs for r in rows]
    ax.barh([v + 0.2 for v in y], [t.median * 1e3 for t in ours], 0.4, xerr=_errors(ours), color=OURS,
            label="ours (reference solution)", capsize=2)
    ax.barh([v - 0.2 for v in y], [t.median * 1e3 for t in theirs], 0.4, xerr=_errors(theirs), color=THEIRS,
            label="PyTorch's own", capsize=2)
    ax.set_yticks(y, [f"{r.row.notebook} {r.row.title}" for r in rows])
    ax.set_xscale("log")
    ax.set_xlabel("time per step, slowest rank (ms; bar = median, whiskers = min-max)")
    right = max(t.max for t in ours + theirs) * 1e3
    for v, r in zip(y, rows):
        mark = "" if r.meets is None else ("  ✓" if r.meets else f"  (target ≤ {r.row.target:g})")
        ax.text(right * 1.3, v, f"{r.ratio:.2f}×{mark}", va="center", fontsize=9)
    ax.set_xlim(right=right * 6)
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1), ncol=2, fontsize=8, frameon=False)
    ax.text(1, 1.01, "ours / PyTorch's", transform=ax.transAxes, ha="right", va="bottom", fontsize=9)
    if ring:
        bx = axes[0][1]
        sizes = [r.message_bytes for r in ring]
        for name, color, pick in (("ring_all_reduce (ours)", OURS, lambda r: r.ours),
                                  ("dist.all_reduce", THEIRS, lambda r: r.theirs)):
            bx.plot(sizes, [r.busbw(pick(r)) / 1e9 for r in ring], "o-", color=color, label=name)
        bx.set_xscale("log", base=2)
        bx.set_xticks(sizes, [_size(n) for n in sizes])
        bx.set_xlabel("message size")
        bx.set_ylabel("bus bandwidth (GB/s), median")
        bx.set_title(f"all-reduce on {ring[0].world} ranks")
        bx.grid(alpha=0.3)
        bx.legend(fontsize=8)
    m, s = report.machine, report.settings
    where = ", ".join(m["gpus"]) if m["gpus"] else f"{m['cpu']}, {m['cores']} cores, no GPU"
    fig.suptitle(f"{where}: {s['world']} {s['backend']} ranks, torch {m['torch']}"
                 + (" (quick run)" if s["quick"] else ""), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n // 2**10} KiB" if n >= 2**10 else f"{n} B"
