"""Pictures for notebook 08: attention's score matrix in tiles, K/V blocks going round the ring, a ring step's
compute against its transfer, the causal work of each rank under the contiguous and the zigzag splits, and an
explorer of memory and time per rank. Every number comes from lib.analytic.context_parallel and lib.sim.cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from lib.analytic.context_parallel import (LINKS, Shard, block_times, min_tokens_to_overlap, ring_memory,
                                           ring_or_ulysses, ring_time, scores_bytes, ulysses_fits, ulysses_time,
                                           with_links)
from lib.sim.cost import CostModel
from lib.units import fmt_bytes, fmt_time
from lib.viz.widgets import live_box, slider_options

RANK_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")
COMPUTE, TRANSFER = "#4C72B0", "#DD8452"


def _colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def tiles_figure(blocks: int = 6, causal: bool = False, row: Optional[int] = None):
    """The s × s scores cut into blocks × blocks tiles: blockwise attention holds one tile at a time, walking the
    tiles of one row of query blocks left to right; with a causal mask the tiles above the diagonal are skipped."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from lib.viz.contrast import text_colour

    row = blocks // 2 if row is None else row
    fig, ax = plt.subplots(figsize=(3.6, 3.4), layout="constrained")
    for i in range(blocks):
        for j in range(blocks):
            skipped = causal and j > i
            colour = "white" if skipped else ("#C7D5EA" if i != row else COMPUTE)
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=colour, edgecolor="grey", hatch="//" if skipped else None))
            if i == row and not skipped:
                ax.text(j + 0.5, i + 0.5, str(j + 1), ha="center", va="center", color=text_colour(colour), fontsize=9)
            if causal and i == j:
                ax.plot([j, j + 1], [i, i + 1], color="black", linewidth=1)
    ax.set(xlim=(0, blocks), ylim=(blocks, 0), xticks=[], yticks=[], xlabel="keys, in blocks",
           ylabel="queries, in blocks", aspect="equal")
    ax.set_title(("causal: " if causal else "") + "one tile at a time, merged in order", fontsize=10)
    plt.close(fig)
    return fig


def ring_figure(n: int = 4):
    """Which rank's K/V block each rank holds at each step: rank r's block moves to rank r+1 every step."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from lib.viz.contrast import text_colour

    fig, ax = plt.subplots(figsize=(1.1 * n + 1.6, 0.55 * n + 1.0), layout="constrained")
    for step in range(n):
        for rank in range(n):
            owner = (rank - step) % n
            ax.add_patch(Rectangle((step, rank), 0.9, 0.8, facecolor=_colour(owner), alpha=0.85))
            ax.text(step + 0.45, rank + 0.4, f"K/V {owner}", ha="center", va="center",
                    color=text_colour(_colour(owner), 0.85), fontsize=8)
            if step < n - 1:
                ax.annotate("", xy=(step + 1, (rank + 1) % n + 0.4), xytext=(step + 0.9, rank + 0.4),
                            arrowprops=dict(arrowstyle="->", color="grey", alpha=0.6))
    ax.set(xlim=(-0.1, n), ylim=(n, -0.2), xticks=[s + 0.45 for s in range(n)], xticklabels=range(n),
           yticks=[r + 0.4 for r in range(n)], yticklabels=[f"rank {r}" for r in range(n)], xlabel="step")
    ax.set_title(f"ring attention on {n} ranks: queries stay, K/V blocks move right", fontsize=10)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    plt.close(fig)
    return fig


def overlap_figure(shard: Shard, n: int, cost: Optional[CostModel] = None, title: str = ""):
    """One rank's ring steps from the cost model: compute then transfer in turn (top), and each transfer
    running behind the compute of the block before it (bottom)."""
    import matplotlib.pyplot as plt

    cost = cost or CostModel()
    compute, transfer = block_times(shard, cost)
    compute, transfer = compute * 1e3, transfer * 1e3         # drawn in ms
    fig, ax = plt.subplots(figsize=(8, 2.4), layout="constrained")
    bars = dict(edgecolor="white", linewidth=1)
    t = 0.0
    for step in range(n):                                    # serial: compute, then send the block on
        ax.barh(1, compute, left=t, height=0.35, color=COMPUTE, **bars)
        t += compute
        if step < n - 1:
            ax.barh(1, transfer, left=t, height=0.35, color=TRANSFER, **bars)
            t += transfer
    t = 0.0
    for step in range(n):                                    # overlapped: the next block travels meanwhile
        if step < n - 1:
            ax.barh(-0.2, transfer, left=t, height=0.3, color=TRANSFER, **bars)
        ax.barh(0.2, compute, left=t, height=0.3, color=COMPUTE, **bars)
        t += max(compute, transfer) if step < n - 1 else compute
    ax.set_yticks([1, 0], ["one after the other", "overlapped"])
    ax.set_xlabel("ms")
    fig.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=COMPUTE), plt.Rectangle((0, 0), 1, 1, color=TRANSFER)],
               labels=[f"a block's attention, {fmt_time(compute / 1e3)}",
                       f"a K/V block's transfer, {fmt_time(transfer / 1e3)}"],
               loc="outside lower center", ncol=2, frameon=False, fontsize=8)
    ax.set_title(title or f"N = {n}, {shard.tokens:,} tokens per rank, {shard.heads} heads of {shard.head_dim}: "
                          f"{fmt_time(ring_time(shard, n, cost, overlap=False))} one after the other, "
                          f"{fmt_time(ring_time(shard, n, cost))} overlapped", fontsize=10)
    plt.close(fig)
    return fig


def causal_tiles(n: int, zigzag: bool) -> dict[int, list[tuple[int, int]]]:
    """The (query chunk, key chunk) tiles of a causal mask over 2N chunks that each rank computes: ranks hold
    chunks 2r and 2r+1 (contiguous) or r and 2N-1-r (zigzag); a tile is computed when key chunk <= query chunk."""
    owned = {r: ((r, 2 * n - 1 - r) if zigzag else (2 * r, 2 * r + 1)) for r in range(n)}
    return {r: [(qc, kc) for qc in owned[r] for kc in range(qc + 1)] for r in range(n)}


def causal_split_figure(n: int = 4):
    """The causal tiles over 2N chunks coloured by the rank that computes them, contiguous split (left) and
    zigzag (right), with each rank's count of tiles (a diagonal tile counted as half)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.8), layout="constrained")
    for ax, zigzag in zip(axes, (False, True)):
        tiles = causal_tiles(n, zigzag)
        for rank, mine in tiles.items():
            for qc, kc in mine:
                ax.add_patch(Rectangle((kc, qc), 1, 1, facecolor=_colour(rank), edgecolor="white"))
        work = [sum(0.5 if qc == kc else 1.0 for qc, kc in tiles[r]) for r in range(n)]
        ax.set(xlim=(0, 2 * n), ylim=(2 * n, 0), aspect="equal", xticks=[], yticks=[], xlabel="key chunks",
               ylabel="query chunks")
        name = "zigzag: rank r holds chunks r and 2N-1-r" if zigzag else "contiguous: rank r holds chunks 2r, 2r+1"
        ax.set_title(f"{name}\ntiles per rank: {', '.join(f'{w:g}' for w in work)}", fontsize=9)
    fig.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=_colour(r)) for r in range(n)],
               labels=[f"rank {r}" for r in range(n)], loc="outside right center", frameon=False, fontsize=8)
    plt.close(fig)
    return fig


def ulysses_figure(n: int = 4, heads: int = 8):
    """Who holds which (head, sequence chunk) before and after Ulysses' all-to-all: a sequence split becomes a
    head split, rank r keeping heads r·h/N to (r+1)·h/N of the whole sequence."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, axes = plt.subplots(1, 2, figsize=(7.5, 2.8), layout="constrained")
    for ax, after in zip(axes, (False, True)):
        for head in range(heads):
            for chunk in range(n):
                owner = head * n // heads if after else chunk
                ax.add_patch(Rectangle((chunk, head), 1, 1, facecolor=_colour(owner), edgecolor="white"))
        ax.set(xlim=(0, n), ylim=(heads, 0), xticks=[c + 0.5 for c in range(n)], xticklabels=range(n),
               yticks=[], xlabel="sequence chunk", ylabel=f"{heads} heads")
        ax.set_title("after the all-to-all: a rank per group of heads" if after else "before: a rank per chunk",
                     fontsize=9)
    fig.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=_colour(r)) for r in range(n)],
               labels=[f"rank {r}" for r in range(n)], loc="outside right center", frameon=False, fontsize=8)
    plt.close(fig)
    return fig


@dataclass
class ContextState:
    fig: Any = None
    readout: str = ""
    figures: dict[str, float] = field(default_factory=dict)


def context_parallel_explorer(seq: int = 131072, n: int = 8, heads: int = 32, head_dim: int = 128):
    """Sequence length and ring size: attention's memory per rank (scores of full attention against a ring rank's
    blocks), a ring step's compute against its transfer on NVLink or InfiniBand, and ring against Ulysses."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    slider = slider_options()
    controls = {"seq": widgets.SelectionSlider(options=[2 ** k for k in range(12, 21)], value=seq,
                                               description="sequence", **slider),
                "n": widgets.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64], value=n, description="ring size N",
                                             **slider),
                "link": widgets.Dropdown(options=sorted(LINKS), value="NVLink", description="link")}
    state = ContextState()
    cost = CostModel()

    def update() -> None:
        s, ranks, link = controls["seq"].value, controls["n"].value, controls["link"].value
        shard = Shard(tokens=s // ranks, heads=heads, head_dim=head_dim)
        scores = scores_bytes(s, heads, heads * head_dim)
        held = ring_memory(shard)
        links = with_links(cost, LINKS[link])
        compute, transfer = block_times(shard, links)
        state.figures = {"scores": scores, "ring": held, "compute": compute, "transfer": transfer,
                         "ring_time": ring_time(shard, ranks, links),
                         "ulysses_time": ulysses_time(shard, ranks, links) if ulysses_fits(shard, ranks) else None}
        fig, (left, right) = plt.subplots(1, 2, figsize=(8, 2.6), layout="constrained")
        left.bar(["scores, one device", f"ring rank, N={ranks}"], [scores / 2**30, held / 2**30],
                 color=["#C44E52", COMPUTE])
        left.set_ylabel("GiB per layer")
        left.set_yscale("log")
        right.barh(["transfer", "compute"], [transfer * 1e3, compute * 1e3], color=[TRANSFER, COMPUTE])
        right.set_xlabel("ms per ring step")
        fig.suptitle(f"one attention layer, {s:,} tokens, {heads} heads of {head_dim}, bf16, H100s", fontsize=10)
        plt.close(fig)
        state.fig = fig
        need = min_tokens_to_overlap(cost.flops_per_s, LINKS[link])
        state.readout = (f"scores of full attention: {fmt_bytes(scores)}; a ring rank holds {fmt_bytes(held)} of "
                         f"attention. A step computes in {fmt_time(compute)} and moves K/V in {fmt_time(transfer)} "
                         f"over {link}: overlap {'hides' if compute >= transfer else 'cannot hide'} the transfer "
                         f"(it needs at least {need:,.0f} tokens per rank; this ring has {s // ranks:,}).\n"
                         f"Attention forward: {ring_or_ulysses(shard, ranks, links)}")

    return live_box(list(controls.values()), controls, state, update)
