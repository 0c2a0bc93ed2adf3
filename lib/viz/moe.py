"""Notebook 07's pictures: tokens per expert against capacity, the load-balancing loss against skew, the
all-to-all's traffic between expert-parallel ranks, and the routing explorer. Counts come from lib.analytic.moe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lib.analytic.moe import capacity, dispatch_counts, routing, skewed_logits
from lib.units import fmt_bytes
from lib.viz.widgets import live_box, slider_options

KEPT, DROPPED, SECOND = "#4C72B0", "#C44E52", "#8DA0CB"


def routing_figure(tokens: int = 64, experts: int = 8, k: int = 2, capacity_factor: float = 1.25,
                   skew: float = 1.0, seed: int = 0, ax=None):
    """Tokens choosing each expert (first and second choices) against the capacity line; red above it is dropped."""
    import matplotlib.pyplot as plt

    logits = skewed_logits(tokens, experts, skew, seed)
    choices = logits.topk(k, dim=-1).indices                                    # (T, k)
    cap = capacity(tokens, experts, k, capacity_factor)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 3), layout="constrained")
    bottom = torch.zeros(experts)
    for j in range(k):
        load = torch.bincount(choices[:, j], minlength=experts).double()
        ax.bar(range(experts), load, bottom=bottom, color=KEPT if j == 0 else SECOND,
               label=["first choices", "second choices"][j] if j < 2 else None)
        bottom += load
    over = (bottom - cap).clamp(min=0)
    full = [e for e in range(experts) if over[e] > 0]
    ax.bar(full, over[full], bottom=(bottom - over)[full], color="none", edgecolor=DROPPED, hatch="///",
           label="dropped (over capacity)")
    ax.axhline(cap, color="black", linestyle="--", linewidth=1)
    ax.text(experts - 0.5, cap, f" capacity C = {cap}", va="bottom", ha="right", fontsize=9)
    r = routing(logits, k, capacity_factor)
    ax.set_xlabel("expert")
    ax.set_ylabel("tokens")
    ax.set_xticks(range(experts))
    ax.set_title(f"T={tokens}, E={experts}, k={k}, capacity factor {capacity_factor:g}, skew {skew:g}: "
                 f"{r.dropped_fraction:.0%} of choices dropped", fontsize=10)
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if fig is not None:
        plt.close(fig)
    return fig


def balance_loss_figure(experts: tuple[int, ...] = (8, 64)):
    """E·Σ f_i·P_i when a share s of the tokens (and of the probability) piles onto one expert and the rest
    spreads evenly: 1 at s = 1/E, the uniform router, and E when every token picks the same expert."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
    for e in experts:
        s = torch.linspace(0, 1, 200, dtype=torch.float64)
        rest = (1 - s) / (e - 1)
        loss = e * (s * s + (e - 1) * rest * rest)                   # f = P: E · Σ P_i²
        ax.plot(s, loss, label=f"E = {e}")
        ax.plot([1 / e], [1.0], "o", color="black")
    ax.set_yscale("log")
    ax.set_xlabel("share of tokens routed to the busiest expert")
    ax.set_ylabel("E · Σ f_i · P_i  (loss / α)")
    ax.set_title("Switch's load-balancing loss is smallest (1) for a uniform router (dots)", fontsize=10)
    ax.legend(frameon=False)
    plt.close(fig)
    return fig


def dispatch_figure(ranks: int = 4, experts: int = 8, tokens: int = 64, k: int = 2, capacity_factor: float = 1.25,
                    skew: float = 1.0, seed: int = 0):
    """Who sends how many rows to whom in the dispatch all-to-all (the combine returns them); the diagonal stays."""
    import matplotlib.pyplot as plt

    from lib.viz.contrast import text_colour

    logits = skewed_logits(tokens * ranks, experts, skew, seed).chunk(ranks)     # one router, every rank's tokens
    counts = dispatch_counts(list(logits), k, capacity_factor)
    fig, ax = plt.subplots(figsize=(4.6, 3.8), layout="constrained")
    cells = ax.imshow(counts, cmap="Blues")
    for s in range(ranks):
        for r in range(ranks):
            ax.text(r, s, f"{int(counts[s, r])}" + ("\nstays" if r == s else ""), ha="center", va="center",
                    fontsize=8, color=text_colour(cells.cmap(cells.norm(counts[s, r]))))
    ax.set_xticks(range(ranks), [f"rank {r}\nexperts {r * experts // ranks}-{(r + 1) * experts // ranks - 1}"
                                 for r in range(ranks)], fontsize=8)
    ax.set_yticks(range(ranks), [f"rank {s}" for s in range(ranks)], fontsize=8)
    ax.set_xlabel("to (the experts' rank)")
    ax.set_ylabel("from (the tokens' rank)")
    ax.set_title(f"rows in the dispatch all-to-all\n{tokens} tokens per rank, E={experts}, k={k}, "
                 f"factor {capacity_factor:g}", fontsize=9)
    plt.close(fig)
    return fig


@dataclass
class RoutingState:
    fig: Any = None
    readout: str = ""
    dropped: float = 0.0
    bytes_per_rank: float = 0.0


def routing_explorer(hidden: int = 4096, item: int = 2):
    """Experts, k, capacity factor, router skew and expert-parallel ranks: tokens per expert against capacity,
    the dropped share, and the all-to-all bytes per rank for rows of `hidden` values of `item` bytes (bf16)."""
    import ipywidgets as widgets

    slider = slider_options()
    controls = {"experts": widgets.SelectionSlider(options=[4, 8, 16, 32, 64], value=8, description="experts E",
                                                   **slider),
                "k": widgets.IntSlider(value=2, min=1, max=4, description="top-k", **slider),
                "factor": widgets.FloatSlider(value=1.25, min=0.25, max=4.0, step=0.05, description="capacity factor",
                                              **slider),
                "skew": widgets.FloatSlider(value=1.0, min=0.0, max=3.0, step=0.1, description="router skew",
                                            **slider),
                "ranks": widgets.SelectionSlider(options=[1, 2, 4, 8], value=4, description="EP ranks N", **slider)}
    state = RoutingState()
    tokens = 256

    def update() -> None:
        e, k, factor = controls["experts"].value, controls["k"].value, controls["factor"].value
        skew, n = controls["skew"].value, min(controls["ranks"].value, controls["experts"].value)
        logits = skewed_logits(tokens, e, skew)
        r = routing(logits, k, factor, ranks=n, row_bytes=hidden * item)
        state.dropped, state.bytes_per_rank = r.dropped_fraction, r.all_to_all_bytes
        state.fig = routing_figure(tokens, e, k, factor, skew)
        state.readout = (f"capacity {r.capacity} slots per expert; {r.dropped_fraction:.1%} of the {r.wanted} "
                         f"choices dropped; {r.padded_slots} padded slots an expert computes for nothing\n"
                         f"all-to-all over N = {n}: {fmt_bytes(r.all_to_all_bytes)} sent per rank per layer "
                         f"(dispatch + combine, {tokens} tokens per rank of {hidden} bf16 values)")

    return live_box(list(controls.values()), controls, state, update)
