"""Notebook 04's explorer: what tensor parallelism sends per layer, and how long that takes on NVLink
inside a node against InfiniBand across nodes. Every time comes from lib.sim.cost."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from lib.sim.cost import CostModel
from lib.units import fmt_bytes, fmt_time
from lib.viz.widgets import live_box, slider_options

# (hidden h, sequence s, heads a, layers) of models whose papers give them.
MODELS = {
    "GPT-3 175B (h 12288, s 2048)": (12288, 2048, 96, 96),        # Brown et al. 2020, Table 2.1
    "Llama 2 70B (h 8192, s 4096)": (8192, 4096, 64, 80),         # Touvron et al. 2023, Table 1 and appendix
    "Llama 2 7B (h 4096, s 4096)": (4096, 4096, 32, 32),
    "GPT-2 small (h 768, s 1024)": (768, 1024, 12, 12),            # Radford et al. 2019
}
DEGREES = (1, 2, 4, 8, 16, 32, 64)
ACTIVATION_BYTES = 2          # bf16
COLLECTIVES_PER_LAYER = 4     # attention and MLP: g forward + f backward each (or their SP pairs)


def tp_bytes_per_layer(s: int, b: int, h: int, t: int) -> float:
    """Bytes one rank sends per layer, forward and backward: four all-reduces of s·b·h bf16 activations,
    2(t-1)/t of the data each (sequence parallelism sends the same as all-gather + reduce-scatter)."""
    if t <= 1:
        return 0.0
    return COLLECTIVES_PER_LAYER * 2 * (t - 1) / t * s * b * h * ACTIVATION_BYTES


def tp_layer_times(s: int, b: int, h: int, t: int, cost: Optional[CostModel] = None) -> dict[str, float]:
    """Per layer: communication time with the t ranks inside one node (NVLink) and one per node
    (InfiniBand), and the compute time of forward + backward (3 × 2 × (12·s·b·h² + 2·b·s²·h) FLOPs / t)."""
    cost = cost or CostModel()
    message = s * b * h * ACTIVATION_BYTES
    in_node = cost.with_(ranks_per_node=max(t, cost.ranks_per_node))
    across = cost.with_(ranks_per_node=1)
    flops = 3 * 2 * (12 * s * b * h * h + 2 * b * s * s * h) / t
    return {"nvlink": COLLECTIVES_PER_LAYER * in_node.collective_time("all_reduce", message, range(t)),
            "infiniband": COLLECTIVES_PER_LAYER * across.collective_time("all_reduce", message, range(t)),
            "compute": cost.compute_time(flops)}


@dataclass
class TPState:
    """The last redraw: the figure, the readout, the bytes and times per layer at the chosen degree."""

    fig: Any = None
    readout: str = ""
    bytes_per_layer: float = 0.0
    times: dict[str, float] = field(default_factory=dict)


def tp_figure(s: int, b: int, h: int, t: int, cost: Optional[CostModel] = None, title: str = ""):
    """Communication per layer on NVLink and on InfiniBand, and compute per layer, against the TP degree."""
    import matplotlib.pyplot as plt

    rows = {d: tp_layer_times(s, b, h, d, cost) for d in DEGREES}
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for key, label, colour in (("nvlink", "communication, NVLink (one node)", "#4C72B0"),
                               ("infiniband", "communication, InfiniBand (one rank per node)", "#C44E52"),
                               ("compute", "compute (forward + backward)", "#55A868")):
        xs = [d for d in DEGREES if d > 1 or key == "compute"]
        ax.plot(xs, [rows[d][key] * 1e3 for d in xs], marker="o", label=label, color=colour)
    ax.axvline(t, color="grey", linestyle=":", label=f"t = {t}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tensor-parallel degree t")
    ax.set_ylabel("ms per layer")
    ax.set_title(title or f"s={s}, b={b}, h={h}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig


def tp_explorer(cost: Optional[CostModel] = None):
    """Model, micro-batch and TP degree controls over the bytes and time of TP communication per layer."""
    import ipywidgets as widgets

    cost = cost or CostModel()
    slider = slider_options()
    controls = {
        "model": widgets.Dropdown(options=list(MODELS), value=list(MODELS)[0], description="model",
                                  style={"description_width": "110px"}, layout=widgets.Layout(width="480px")),
        "b": widgets.IntSlider(value=1, min=1, max=16, description="micro-batch b", **slider),
        "t": widgets.SelectionSlider(options=DEGREES, value=8, description="TP degree t", **slider),
    }
    state = TPState()

    def update() -> None:
        h, s, _a, layers = MODELS[controls["model"].value]
        b, t = controls["b"].value, controls["t"].value
        state.bytes_per_layer = tp_bytes_per_layer(s, b, h, t)
        state.times = tp_layer_times(s, b, h, t, cost)
        tm = state.times
        state.readout = "\n".join([
            f"t = {t}: each rank sends {fmt_bytes(state.bytes_per_layer)} per layer "
            f"(4 all-reduces of s·b·h = {fmt_bytes(s * b * h * ACTIVATION_BYTES)} in bf16), "
            f"{fmt_bytes(state.bytes_per_layer * layers)} per step over {layers} layers.",
            f"  inside one node (NVLink {cost.intra_node_bandwidth / 1e9:.0f} GB/s): "
            f"{fmt_time(tm['nvlink'])} per layer",
            f"  across nodes (InfiniBand {cost.inter_node_bandwidth / 1e9:.0f} GB/s): "
            f"{fmt_time(tm['infiniband'])} per layer",
            f"  compute per layer at {cost.flops_per_s / 1e12:.0f} TFLOP/s: {fmt_time(tm['compute'])}",
        ])
        state.fig = tp_figure(s, b, h, t, cost, title=controls["model"].value)

    return live_box([controls["model"], controls["b"], controls["t"]], controls, state, update)


# ---- the pictures before the puzzles: how each layer is split, and where f and g sit --------------------------
F_NOTE, G_NOTE = "fwd: identity\nbwd: all-reduce", "fwd: all-reduce\nbwd: identity"
AG_NOTE, RS_NOTE = "fwd: all-gather\nbwd: reduce-scatter", "fwd: reduce-scatter\nbwd: all-gather"


def _tp_items(kind: str) -> tuple[list, str]:
    from lib.viz.diagram import Box, Op

    x, f, g = Box("X", "[s, b, h]"), Op("f", F_NOTE, comm=True), Op("g", G_NOTE, comm=True)
    pictures = {
        "column": ([x, f, Op("$XA_r^T$"), Box("$A_r$", "[out/N, in]\nrows of A", "rows", 0.8, 1.2), Op("="),
                    Box("$Y_r$", "[s, b, out/N]", "cols")],
                   "column-parallel: rank r holds rows $A_r$ of the weight and computes its slice of the outputs"),
        "row": ([Box("$X_r$", "[s, b, in/N]", "cols"), Op("$X_rA_r^T$"),
                 Box("$A_r$", "[out, in/N]\ncolumns of A", "cols", 1.2, 0.8), Op("="),
                 Box("partial Y", "a partial sum\non each rank", "rows", 1.0, 0.9), g, Box("Y", "[s, b, out]")],
                "row-parallel: rank r holds columns $A_r$ and the matching input slice; g sums the partial outputs"),
        "mlp": ([x, f, Box("fc1", "[4h/N, h]\ncolumn-parallel", "rows", 0.8, 1.2), Op("GeLU"),
                 Box("", "[s, b, 4h/N]", "cols"), Box("fc2", "[h, 4h/N]\nrow-parallel", "cols", 1.2, 0.8), g,
                 Box("Y", "[s, b, h]")],
                "the Megatron MLP: f, column-parallel fc1, GeLU on each rank's slice, row-parallel fc2, g"),
        "attention": ([x, f, Box("qkv", "[3h/N, h]\nthis rank's heads", "rows", 0.8, 1.2),
                       Op("attn", "a/N heads\nper rank"), Box("", "[s, b, h/N]", "cols"),
                       Box("proj", "[h, h/N]\nrow-parallel", "cols", 1.2, 0.8), g, Box("Y", "[s, b, h]")],
                      "attention split by heads: column-parallel qkv (whole heads per rank), row-parallel proj"),
        "sequence": ([Box("X", "[s, b, h] by token:\nrank r has s/N", "rows"), Op("LN"), Op("AG", AG_NOTE, comm=True),
                      Box("fc1", "column-parallel", "rows", 0.8, 1.2), Op("GeLU"),
                      Box("fc2", "row-parallel", "cols", 1.2, 0.8), Op("RS", RS_NOTE, comm=True),
                      Box("+ X", "[s/N, b, h]\non each rank", "rows")],
                     "sequence parallelism: LayerNorm and residual on this rank's tokens; "
                     "AG replaces f, RS replaces g"),
        "vocab": ([Box("tokens", "[s, b]"), Box("$E_r$", "[V/N, h]\nembedding rows", "rows", 0.8, 1.2),
                   Op("g", "zeros for tokens\nother ranks own", comm=True), Box("x", "[s, b, h]"),
                   Box("$W_r$", "[V/N, h]\nhead rows", "rows", 0.8, 1.2),
                   Box("logits$_r$", "[s, b, V/N]\nnever gathered", "cols"),
                   Op("max", "all-reduce\n[s, b]", comm=True), Op("Σ exp", "all-reduce\n[s, b]", comm=True),
                   Op("z_t", "all-reduce\n[s, b]", comm=True), Box("loss", "a scalar")],
                  "vocabulary-parallel: each rank owns V/N rows of the embedding and of the head"),
    }
    if kind not in pictures:
        raise ValueError(f"no picture {kind!r}; pick one of {', '.join(pictures)}")
    return pictures[kind]


def tp_picture(kind: str, ranks: int = 4):
    """How a layer is split over `ranks` tensor-parallel ranks and where f and g (or their sequence-parallel
    pair) sit: kind is column, row, mlp, attention, sequence or vocab."""
    from lib.viz.diagram import flow_figure

    items, title = _tp_items(kind)
    return flow_figure(items, ranks, f"{title} (N = {ranks})")
