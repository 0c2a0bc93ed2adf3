"""Notebook 01's pictures: where a model's bytes go, drawn before the puzzles that count them (no counts drawn)."""

from __future__ import annotations

from lib.viz.diagram import Box, Op, flow_figure

PARAMETER = "#4C72B0"
STATE = {"bf16 weight": "#4C72B0", "bf16 gradient": "#55A868", "fp32 master weight": "#8172B3",
         "fp32 Adam m": "#C44E52", "fp32 Adam v": "#DD8452"}


def parameters_picture():
    """TinyGPT's parameter tensors in the order the forward pass meets them, each with its shape."""
    p = dict(colour=PARAMETER)
    items = [Box("tok", "[vocab, h]", **p), Box("pos", "[seq, h]", **p), Op("×layers", "each block:"),
             Box("ln1", "weight [h]\n(bias [h])", width=0.5, **p),
             Box("qkv", "[h + 2·kv, h]\n(bias)", width=0.9, height=1.1, **p),
             Box("proj", "[h, h]\n(bias)", **p), Box("ln2", "weight [h]\n(bias [h])", width=0.5, **p),
             Box("fc1", "[4h, h]\n(bias)", height=1.3, width=0.6, **p),
             Box("fc2", "[h, 4h]\n(bias)", width=1.3, height=0.6, **p),
             Op("end"), Box("ln_f", "weight [h]\n(bias [h])", width=0.5, **p),
             Box("head", "[vocab, h], no bias\ntied: it IS tok", **p)]
    return flow_figure(items, ranks=1, per_row=6,
                       title="TinyGPT's parameters: kv = kv_heads · h/heads (kv = h without grouped-query attention); "
                             "(bias): only when config.bias",
                       legend=["blue: a parameter tensor"])


def training_state_picture():
    """What mixed-precision Adam keeps for each parameter between two steps, each box as wide as its dtype."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from lib.viz.contrast import text_colour

    fig, ax = plt.subplots(figsize=(9, 2.0))
    x = 0.0
    for label, colour in STATE.items():
        width = 1.0 if label.startswith("bf16") else 2.0
        ax.add_patch(Rectangle((x, 0), width, 1, facecolor=colour, edgecolor="white", linewidth=2))
        ax.text(x + width / 2, 0.5, label.replace(" ", "\n", 1), ha="center", va="center", color=text_colour(colour),
                fontsize=9)
        x += width
    ax.text(x + 0.3, 0.5, "activations: made in forward,\nfreed by backward\n(puzzle 3)", va="center", fontsize=8.5,
            color="0.3")
    ax.set_xlim(-0.1, x + 3.2)
    ax.set_ylim(-0.15, 1.4)
    ax.axis("off")
    ax.set_title("what one parameter leaves in memory from one step to the next (each box as wide as its dtype)",
                 fontsize=10)
    fig.tight_layout()
    plt.close(fig)
    return fig


def block_activations_picture():
    """One block's forward pass (Block in lib/models.py), with every tensor autograd keeps for backward outlined."""
    kept = dict(saved=True)
    items = [Box("x", "[b, s, h]", **kept), Op("LN"), Box("", "[b, s, h]", **kept), Op("qkv"),
             Box("Q, K", "[b, a, s, h/a]\neach", **kept), Op("QKᵀ"), Op("softmax"),
             Box("weights", "[b, a, s, s]", width=1.1, **kept), Op("drop", "mask: 1 byte\nper element"),
             Box("", "[b, a, s, s]", width=1.1, **kept), Box("V", "[b, a, s, h/a]", **kept),
             Op("@V"), Box("", "[b, s, h]", **kept), Op("proj"), Op("drop", "mask"), Op("+"),
             Box("x'", "[b, s, h]", **kept), Op("LN"), Box("", "[b, s, h]", **kept), Op("fc1"),
             Box("", "[b, s, 4h]", width=1.5, **kept), Op("GeLU"), Box("", "[b, s, 4h]", width=1.5, **kept),
             Op("fc2"), Op("drop", "mask"), Op("+")]
    return flow_figure(items, ranks=1, per_row=9,
                       title="one block's forward (bf16, dropout 0.1): the outlined tensors are what autograd keeps",
                       legend=["each dropout also keeps its mask", "LayerNorms keep a mean and 1/std",
                               "per token (fp32): ignore them"])


HOST = "#E5D8BD"          # a tensor in host memory


def checkpointing_picture():
    """Activation checkpointing: only each block's input is kept; a block's activations are rebuilt in backward."""
    kept, block = dict(saved=True), "keeps nothing;\nrun again in backward"
    items = [Box("tokens", "[b, s]"), Op("embed"), Box("x₀", "[b, s, h]", **kept), Op("block 0", block),
             Box("x₁", "[b, s, h]", **kept), Op("block 1", block), Box("x₂", "[b, s, h]", **kept), Op("…"),
             Op("head\nloss", "keeps its own"), Box("loss", "a scalar")]
    return flow_figure(items, ranks=1, title="checkpointing: forward keeps each block's input only; backward reruns "
                                             "one block at a time to rebuild its activations")


def accumulation_picture(k: int = 4):
    """Gradient accumulation: k micro-batches, one after the other, each adding its gradients into p.grad."""
    items = []
    for i in range(k):
        items += [Box(f"micro-batch {i}", "[b/k, s]", width=1.2), Op("fwd +\nbwd", "loss / k")]
    items.append(Box("p.grad", "+= each time", colour=PARAMETER))
    return flow_figure(items, ranks=1, per_row=2 * k + 1,
                       title="gradient accumulation: one micro-batch's activations at a time; "
                             "backward adds into p.grad")


def offload_picture():
    """ZeRO-Offload on one device: gradients go to host memory, Adam runs there, updates come back."""
    host = dict(colour=HOST)
    items = [Box("weights", "device", colour=PARAMETER), Op("fwd +\nbwd"), Box("p.grad", "device", colour=PARAMETER),
             Op("PCIe", "p.grad.to(host)", comm=True), Box("m, v", "host memory", **host), Op("Adam", "on the host"),
             Box("update", "host memory", **host), Op("PCIe", ".to(device)", comm=True),
             Box("weights", "p -= update", colour=PARAMETER)]
    return flow_figure(items, ranks=1, title="optimizer offload: the device runs forward and backward; Adam's state "
                                             "and step live in host memory (sand)")
