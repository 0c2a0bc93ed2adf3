"""Pictures for notebook 02, drawn before its puzzles: what every rank holds after each step of a ring collective,
a data-parallel step, and its backward with and without buckets all-reduced while it runs.

The ring pictures show one schedule (each rank sends to rank + 1), step by step: which chunk moves is visible,
the index arithmetic is the learner's to write.
"""

from __future__ import annotations

from typing import Sequence

from lib.viz.diagram import COMM, RANK_COLOURS, Box, Op, flow_figure

PHASES = ("reduce-scatter", "all-gather")
LAYER = "#4C72B0"         # a layer's backward, in the bucket picture


def ring_states(n: int, phases: Sequence[str]) -> list[tuple[list[list[int]], list[int]]]:
    """Per column of the picture: (held, sent). held[r][c] is what rank r holds of chunk c: for a reduce-scatter the
    number of ranks summed into it, for an all-gather 1 (has it, from its owner) or 0; sent[r] is the chunk rank r
    sends to rank r + 1 in the next step (-1 after the last). Rank r ends a reduce-scatter with chunk r summed."""
    unknown = set(phases) - set(PHASES)
    if unknown or not phases:
        raise ValueError(f"phases must be some of {PHASES}, got {list(phases)}")
    columns = []
    if phases[0] == "reduce-scatter":
        held = [[1] * n for _ in range(n)]
        for step in range(n - 1):
            sent = [(r - step - 1) % n for r in range(n)]
            columns.append(([row[:] for row in held], sent))
            for r in range(n):
                held[(r + 1) % n][sent[r]] += held[r][sent[r]]
        if "all-gather" in phases:       # the all-gather starts from the summed chunks; the partial sums are spent
            held = [[n if c == r else 0 for c in range(n)] for r in range(n)]
    else:
        held = [[1 if c == r else 0 for c in range(n)] for r in range(n)]
    if "all-gather" in phases:
        for step in range(n - 1):
            sent = [(r - step) % n for r in range(n)]
            columns.append(([row[:] for row in held], sent))
            for r in range(n):
                held[(r + 1) % n][sent[r]] = held[r][sent[r]]
    columns.append((held, [-1] * n))
    return columns


def ring_collective_figure(n: int = 4, phases: Sequence[str] = ("reduce-scatter",)):
    """Ranks as rows, steps as columns: each rank's N chunks (shade: how many ranks' values are summed in it, or
    whether it arrived yet), the chunk it sends to its right neighbour next outlined in the communication colour."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Rectangle

    from lib.viz.contrast import text_colour

    columns = ring_states(n, phases)
    summing = "reduce-scatter" in phases
    fig, ax = plt.subplots(figsize=(1.0 + 0.42 * n * len(columns) + 0.3 * len(columns), 0.55 * n + 1.1))
    width = n + 1.2
    for j, (held, sent) in enumerate(columns):
        x0 = j * width
        for r in range(n):
            y = n - 1 - r
            for c in range(n):
                share = held[r][c] / (n if summing else 1)
                base = to_rgb(RANK_COLOURS[c % len(RANK_COLOURS)])
                fill = tuple(1 - share * (1 - v) for v in base) if held[r][c] else (1, 1, 1)
                outline = sent[r] == c
                ax.add_patch(Rectangle((x0 + c, y), 0.92, 0.8, facecolor=fill,
                                       edgecolor=COMM if outline else "0.6", linewidth=2.4 if outline else 0.6))
                if summing and held[r][c]:
                    ax.text(x0 + c + 0.46, y + 0.4, str(held[r][c]), ha="center", va="center", fontsize=7,
                            color=text_colour(fill))
        label = "start" if j == 0 else f"after step {j}"
        ax.text(x0 + n / 2, n + 0.15, label, ha="center", va="bottom", fontsize=8)
    for r in range(n):
        ax.text(-0.3, n - 1 - r + 0.4, f"rank {r}", ha="right", va="center", fontsize=8)
    what = " then ".join(phases)
    note = ("numbers: how many ranks' values are summed in the chunk" if summing
            else "filled: the rank holds that chunk, in its owner's colour")
    ax.set_title(f"ring {what}, N = {n}: each rank's {n} chunks after every step; outlined: the chunk it sends to "
                 f"rank + 1 next\n({note})", fontsize=9)
    ax.set_xlim(-1.6, len(columns) * width)
    ax.set_ylim(-0.2, n + 0.7)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout()
    plt.close(fig)          # returned, not shown twice in a notebook
    return fig


def data_parallel_picture(ranks: int = 4):
    """One data-parallel step: a shard of the batch per rank, the same model everywhere, gradients made equal."""
    items = [Box("batch", "[B, ...]\na shard per rank", "rows"), Box("model", "a full copy\non every rank"),
             Op("fwd\n+ bwd"), Box("grads$_r$", "whole, from rank r's\nshard: differ by rank", colour="#C9D3E6"),
             Op("Σ", "all-reduce", comm=True), Op("÷ N"), Box("grads", "the whole batch's,\nequal everywhere"),
             Op("step"), Box("model", "still equal\neverywhere")]
    return flow_figure(items, ranks, f"data parallelism (N = {ranks}): the mean of the ranks' gradients is the "
                                     "whole batch's gradient")


def bucket_overlap_figure(layers: int = 6, per_bucket: int = 2):
    """Backward, last layer first, and the gradients' all-reduce: after backward (puzzle 5), or a bucket at a time,
    each launched as soon as its layers' gradients are final, while backward goes on (puzzle 6)."""
    import matplotlib.pyplot as plt

    from lib.viz.contrast import text_colour

    compute, talk = 1.0, 0.8 * per_bucket              # one layer's backward; one bucket's all-reduce
    fig, axes = plt.subplots(2, 1, figsize=(7.5, 2.8), sharex=True)
    plans = {"one all-reduce after backward": [(layers * compute, layers / per_bucket * talk)],
             f"a bucket of {per_bucket} layers all-reduced as soon as it is full": [
                 ((b + 1) * per_bucket * compute, talk) for b in range(layers // per_bucket)]}
    for ax, (title, sends) in zip(axes, plans.items()):
        for i in range(layers):
            ax.barh(1, compute * 0.96, left=i * compute, color=LAYER)
            ax.text(i * compute + 0.48, 1, f"L{layers - i}", ha="center", va="center", fontsize=7,
                    color=text_colour(LAYER))
        free = 0.0
        for ready, length in sends:
            start = max(ready, free)
            ax.barh(0, length * 0.97, left=start, color=COMM)
            free = start + length
        ax.set_yticks([0, 1], ["network", "backward"])
        ax.set_title(f"{title}: done at {free:.1f} layer-times", fontsize=9)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1].set_xlabel("time, in one layer's backward")
    fig.tight_layout()
    plt.close(fig)
    return fig
