"""Pictures of notebook 10's seams, the ones only a composed trainer has: which squares a rank of one model copy adds
to the gradient's norm, how micro-batches of unequal length weigh in the step's loss, and HSDP's two steps (alone, and
as the trainer's DP axis with the update that follows them)."""

from __future__ import annotations

from lib.viz.diagram import COMM, RANK_COLOURS, WHOLE


def _finish(fig, ax, title: str, xlim: tuple, ylim: tuple):
    import matplotlib.pyplot as plt

    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    ax.set_title(title, fontsize=9.5)
    fig.tight_layout()
    plt.close(fig)          # returned, not shown twice in a notebook
    return fig


def _collective(ax, x: float, y: float, label: str, note: str) -> None:
    """The one all-reduce both seams end in, with what it carries."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x - 0.9, y - 0.35), 1.8, 0.7, boxstyle="round,pad=0.05", facecolor=COMM,
                                edgecolor="0.3"))
    ax.text(x, y, label, ha="center", va="center", fontsize=8.5, fontweight="bold")
    ax.text(x, y - 0.55, note, ha="center", va="top", fontsize=7.5, color="0.25")


def clip_norm_picture(pp: int = 2, tp: int = 2, sharded: int = 2, whole: int = 2):
    """One model copy of pp × tp ranks (TP innermost): each rank's gradients, its TP shards in its colour and the
    replicated ones in grey, filled where the rank adds their squares to the norm and empty where it leaves them
    out; then one all-reduce of the sums of squares over the copy."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(2.1 * tp + 4.4, 1.25 * pp + 1.2))
    for rank in range(pp * tp):
        stage, t = divmod(rank, tp)
        x0, y0 = 2.1 * t, 1.25 * (pp - 1 - stage)
        ax.text(x0 + 0.9, y0 + 0.75, f"rank {rank} (stage {stage}, TP {t})", ha="center", fontsize=7.5)
        for i in range(sharded + whole):
            counted = i < sharded or t == 0
            fill = RANK_COLOURS[rank % len(RANK_COLOURS)] if i < sharded else WHOLE
            ax.add_patch(Rectangle((x0 + 0.45 * i, y0), 0.38, 0.55, facecolor=fill if counted else "white",
                                   edgecolor="0.3" if counted else "0.55", linestyle="-" if counted else "--",
                                   linewidth=0.8))
        if t == tp - 1:                      # each stage's row sends its sum of squares to the all-reduce
            ax.annotate("", (2.1 * tp + 0.3, 0.6 * pp), (x0 + 1.85, y0 + 0.28),
                        arrowprops=dict(arrowstyle="->", color="0.6", linewidth=0.7))
    right = 2.1 * tp + 1.25
    _collective(ax, right, 0.6 * pp, "all-reduce Σ g²", "one number, over the\nmodel copy's pp × tp ranks")
    ax.text(right, 0.6 * pp + 0.55, "norm = √Σ; scale every g by\nmax_norm / (norm + 1e-6) if < 1",
            ha="center", va="bottom", fontsize=7.5)
    ax.text(-0.1, -0.45, "coloured: this rank's TP shard, counted · grey: replicated on every TP rank, counted "
            "on TP rank 0 · dashed: the same copy, left out", ha="left", va="top", fontsize=7.5, color="0.25")
    return _finish(fig, ax, f"clip_grad_norm: one model copy, pp = {pp}, tp = {tp}: each parameter counted once",
                   (-0.3, right + 1.1), (-0.85, 1.25 * pp + 0.1))


def mean_loss_picture(tokens: tuple = ((32, 16), (16, 16))):
    """Each DP rank's micro-batches as bars as long as their token counts, each with its mean loss ℓ: the step's
    loss weighs a micro-batch by its tokens, through one all-reduce of (Σ ℓ·n, Σ n)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    scale = 3.0 / max(sum(row) for row in tokens)
    fig, ax = plt.subplots(figsize=(7.6, 0.9 * len(tokens) + 1.3))
    for rank, row in enumerate(tokens):
        y, x = 0.9 * (len(tokens) - 1 - rank), 0.0
        ax.text(-0.1, y + 0.25, f"DP rank {rank}", ha="right", va="center", fontsize=8)
        for j, n in enumerate(row):
            ax.add_patch(Rectangle((x, y), n * scale, 0.5, facecolor=RANK_COLOURS[rank % len(RANK_COLOURS)],
                                   edgecolor="white", linewidth=1.5))
            ax.text(x + n * scale / 2, y + 0.25, f"ℓ{rank}{j}\n{n} tokens", ha="center", va="center", fontsize=7.5,
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
            x += n * scale
        ax.annotate("", (4.0, 0.45 * (len(tokens) - 1) + 0.25), (x + 0.1, y + 0.25),
                    arrowprops=dict(arrowstyle="->", color="0.6", linewidth=0.7))
    middle = 0.45 * (len(tokens) - 1) + 0.25
    _collective(ax, 4.9, middle, "all-reduce", "(Σ ℓ·n, Σ n): two numbers")
    ax.text(6.2, middle, "loss =\nΣ ℓ·n / Σ n", ha="left", va="center", fontsize=8.5)
    return _finish(fig, ax, "mean_loss: each micro-batch weighs as many tokens as it holds (bar length: its tokens)",
                   (-1.2, 7.3), (-0.6, 0.9 * len(tokens)))


def hsdp_picture(nodes: int = 2, per_node: int = 4, trainer: bool = False):
    """HSDP's two steps on a (replicate, shard) mesh: each node's ranks in a row, each rank coloured by the shard
    it keeps; a reduce-scatter inside each node, then an all-reduce across nodes among the ranks of one colour.
    `trainer`: as the trainer's DP axis, with what runs where after them (Adam on the shard, the node's all-gather)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Rectangle

    fig, ax = plt.subplots(figsize=(1.5 * per_node + 3.2, 1.3 * nodes + 1.3))
    for node in range(nodes):
        y = 1.3 * (nodes - 1 - node)
        ax.add_patch(FancyBboxPatch((-0.15, y - 0.2), 1.5 * per_node - 0.1, 0.95, boxstyle="round,pad=0.03",
                                    facecolor="none", edgecolor="0.55", linestyle="--", linewidth=0.8))
        inside = ("your hsdp_gradients:\nreduce-scatter;\nthen the trainer: Adam\non the shard, all-gather\n"
                  "(shard group)" if trainer else "reduce-scatter\n(shard group)")
        ax.text(1.5 * per_node - 0.1, y + 0.28, f"node {node}\n{inside}", ha="left", va="center", fontsize=7.5,
                color="0.25")
        for i in range(per_node):
            rank, x = node * per_node + i, 1.5 * i
            ax.add_patch(Rectangle((x, y), 1.1, 0.55, facecolor=RANK_COLOURS[i % len(RANK_COLOURS)],
                                   edgecolor="0.3", linewidth=0.8))
            ax.text(x + 0.55, y + 0.28, f"{'DP rank' if trainer else 'rank'} {rank}\nshard {i}", ha="center",
                    va="center", fontsize=7.5)
    for i in range(per_node):                  # the replicate groups: one per shard index, across the nodes
        x = 1.5 * i + 0.55
        ax.plot([x, x], [0.55, 1.3 * (nodes - 1)], color=COMM, linewidth=3, zorder=0)
    ax.text(-0.3, 0.65 * (nodes - 1) + 0.28, "all-reduce\nacross nodes\n(replicate group):\nshard bytes only",
            ha="right", va="center", fontsize=7.5, color="0.25")
    title = (f"HSDP as the trainer's DP axis, {nodes} nodes × {per_node}: each rank updates its shard, one colour"
             if trainer else f"hsdp_gradients on a (replicate, shard) = ({nodes}, {per_node}) mesh: one colour, one "
             "shard")
    return _finish(fig, ax, title, (-2.2, 1.5 * per_node + (2.2 if trainer else 1.4)), (-0.4, 1.3 * nodes))
