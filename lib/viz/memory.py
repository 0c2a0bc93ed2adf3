"""Where the memory of training goes, per device: model states (ZeRO) plus activations (Korthikanti et al.).

Every byte here comes from `lib.analytic.formulas`; this module only picks the arguments, adds up and draws.
Bytes in GiB (lib.units): the ZeRO paper's "120GB" for 16 bytes × 7.5e9 parameters is decimal, 111.76 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from lib.analytic.formulas import RECOMPUTE, ZERO_STAGES, activation_bytes_per_layer, model_state_breakdown
from lib.units import fmt_bytes
from lib.viz.widgets import live_box, slider_options

GIB = 2**30
# An H100's 80 GB of HBM3 are binary, 80 GiB (nvidia-smi shows 81,559 MiB usable); CUDA context, buffers and
# fragmentation eat a few of them.
H100_BYTES = 80 * GIB
COMPONENTS = ("weights", "gradients", "optimizer", "activations")
COMPONENT_LABELS = {"weights": "weights (16-bit)", "gradients": "gradients (16-bit)",
                    "optimizer": "optimizer state", "activations": "activations"}
COLOURS = {"weights": "#4C72B0", "gradients": "#55A868", "optimizer": "#C44E52", "activations": "#8172B2"}


@dataclass(frozen=True)
class Model:
    """A dense transformer's size: parameters, layers L, hidden size h, attention heads a."""

    name: str
    n_params: float
    layers: int
    hidden: int
    heads: int


# Nominal sizes as the papers name them. GPT-3: Brown et al. 2020, Table 2.1 (its 1.3B lists 24 heads).
# LLaMA-2: Touvron et al. 2023; its SwiGLU MLP and the 70B's grouped-query attention differ from the
# GPT layer Korthikanti et al. count, so their activations here are estimates.
PRESETS = {m.name: m for m in (
    Model("GPT-3 125M", 125e6, 12, 768, 12),
    Model("GPT-3 1.3B", 1.3e9, 24, 2048, 24),
    Model("LLaMA-2 7B", 7e9, 32, 4096, 32),
    Model("LLaMA-2 13B", 13e9, 40, 5120, 40),
    Model("LLaMA-2 70B", 70e9, 80, 8192, 64),
    Model("GPT-3 175B", 175e9, 96, 12288, 96),
)}

# Optimizer bytes per parameter K on top of 16-bit weights and gradients (lib.analytic.formulas' 2 + 2 + K form).
PRECISIONS = {
    "mixed-precision Adam (fp32 master, m, v): 2+2+12 B/param": 12,
    "bf16 Adam, fp32 m and v, no master copy: 2+2+8 B/param": 8,
    "bf16 Adam, bf16 m and v, no master copy: 2+2+4 B/param": 4,
}

Breakdown = Mapping[str, float]


def in_flight_micro_batches(pp: int) -> int:
    """Micro-batches whose activations the first pipeline stage holds at peak under 1F1B: p (given m >= p).

    Sources: Narayanan et al. 2021, section 2.2.1; Korthikanti et al. 2022, section 4.2.3.
    """
    return pp


def memory_per_device(model: Model, *, k: float = 12, zero_stage: int = 0, dp: int = 1, tp: int = 1,
                      pp: int = 1, seq: int = 2048, micro_batch: int = 1, sequence_parallel: bool = False,
                      recompute: str = "none") -> dict[str, float]:
    """Bytes on one device of the busiest (first) pipeline stage: weights, gradients, optimizer, activations.

    Each device's TP×PP shard holds n_params/(tp·pp) parameters, which ZeRO then shards over dp; activations are
    L/pp layers per stage times `in_flight_micro_batches(pp)` micro-batches. Embeddings get no special treatment.
    """
    for name, degree, count, what in (("tp", tp, model.heads, "attention heads"), ("pp", pp, model.layers, "layers")):
        if not (degree == int(degree) >= 1 and count % degree == 0):
            raise ValueError(f"{name}={degree!r} must be a whole number that divides the {count} {what} of "
                             f"{model.name}; pick another {name}")
    states = model_state_breakdown(model.n_params / (tp * pp), dp=dp, zero_stage=zero_stage, k=k)
    per_layer = activation_bytes_per_layer(seq, micro_batch, model.hidden, model.heads, t=tp,
                                           sequence_parallel=sequence_parallel, recompute=recompute)
    return {**states, "activations": per_layer * (model.layers // pp) * in_flight_micro_batches(pp)}


def fmt_params(n: float) -> str:
    """A parameter count as papers write it: 125M, 1.3B, 70B."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def memory_figure(breakdowns: Union[Breakdown, Sequence[Breakdown]], labels: Optional[Sequence[str]] = None,
                  device_bytes: float = H100_BYTES, device_name: str = "H100", title: str = ""):
    """Stacked bars of per-device memory in GiB, one bar per breakdown, with the device's memory as a line."""
    import matplotlib.pyplot as plt
    import numpy as np

    if isinstance(breakdowns, Mapping):
        breakdowns = [breakdowns]
    labels = list(labels) if labels is not None else [f"config {i + 1}" for i in range(len(breakdowns))]
    if len(labels) != len(breakdowns):
        raise ValueError(f"got {len(labels)} labels for {len(breakdowns)} breakdowns; give one label per bar")
    x = np.arange(len(breakdowns))
    totals = np.array([sum(b.get(c, 0.0) for c in COMPONENTS) for b in breakdowns]) / GIB
    cap = device_bytes / GIB
    fig, ax = plt.subplots(figsize=(max(6.4, 1.3 * len(breakdowns) + 3.6), 4.2), layout="constrained")
    bottom = np.zeros(len(breakdowns))
    for c in COMPONENTS:
        gb = np.array([b.get(c, 0.0) for b in breakdowns]) / GIB
        ax.bar(x, gb, 0.6, bottom=bottom, color=COLOURS[c], label=COMPONENT_LABELS[c])
        bottom += gb
    top = max(totals.max(initial=0.0), cap) * 1.15
    for xi, total in zip(x, totals):
        ax.text(xi, total + 0.01 * top, f"{total:,.1f} GiB", ha="center", va="bottom", fontsize="small",
                color="#B00020" if total > cap else "black")
    line = ax.axhline(cap, color="0.2", linestyle="--", linewidth=1.2, label=f"{device_name} memory ({cap:g} GiB)")
    ax.text(0.99, cap, f"{device_name}: {cap:g} GiB", transform=ax.get_yaxis_transform(), ha="right", va="bottom",
            fontsize="small", color="0.2", bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
    ax.set_xlim(-0.6, len(breakdowns) - 0.4)
    ax.set_ylim(0, top)
    ax.set_xticks(x)
    ax.set_xticklabels(labels)
    ax.set_ylabel("memory per device (GiB)")
    ax.grid(True, axis="y", alpha=0.3)
    by_label = dict(zip(*ax.get_legend_handles_labels()[::-1]))
    order = [COMPONENT_LABELS[c] for c in reversed(COMPONENTS)] + [line.get_label()]   # as stacked, then the line
    ax.legend([by_label[n] for n in order], order, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if title:
        ax.set_title(title)
    plt.close(fig)          # returned, not shown twice in a notebook
    return fig


@dataclass
class MemoryState:
    """The last redraw: the figure (None for an impossible configuration), the readout, the breakdown in bytes."""

    fig: Any = None
    readout: str = ""
    breakdown: Optional[dict[str, float]] = None


def _readout(model: Model, precision: str, config: dict[str, Any], parts: dict[str, float],
             device_bytes: float) -> str:
    tp, pp = config["tp"], config["pp"]
    total, cap = sum(parts.values()), f"{device_bytes / GIB:g} GiB"
    stage_layers, in_flight = model.layers // pp, in_flight_micro_batches(pp)
    per_layer = parts["activations"] / (stage_layers * in_flight)
    sp = ", sequence parallel" if config["sequence_parallel"] else ""
    verdict = (f"fits in {cap} (H100), {fmt_bytes(device_bytes - total)} to spare" if total <= device_bytes
               else f"does NOT fit in {cap} (H100): {fmt_bytes(total - device_bytes)} over")
    rows = [("weights", ""), ("gradients", ""), ("optimizer", f"K = {config['k']:g} bytes per parameter"),
            ("activations", f"{stage_layers} layers/stage × {in_flight} micro-batch{'es' if in_flight > 1 else ''} "
                            f"in flight (1F1B) × "
                            f"{fmt_bytes(per_layer)}; s={config['seq']}, b={config['micro_batch']}, "
                            f"recompute {config['recompute']}{sp}")]
    return "\n".join([
        f"{model.name} (L={model.layers}, h={model.hidden}, a={model.heads}), {precision}",
        f"each device holds {fmt_params(model.n_params)} / (TP {tp} × PP {pp}) = "
        f"{fmt_params(model.n_params / (tp * pp))} parameters, ZeRO-{config['zero_stage']} over DP {config['dp']}",
        *(f"  {name:<12}{fmt_bytes(parts[name]):>12}   {note}".rstrip() for name, note in rows),
        f"  {'total':<12}{fmt_bytes(total):>12}   {verdict}",
    ])


def memory_calculator(model: str = "LLaMA-2 7B", device_bytes: float = H100_BYTES):
    """Model, precision, ZeRO stage, DP/TP/PP, sequence, micro-batch and recomputation over `memory_figure`."""
    import ipywidgets as widgets

    slider = slider_options(width="420px", label_width="120px")
    wide = dict(style={"description_width": "120px"}, layout=widgets.Layout(width="560px"))
    powers = lambda lo, hi: [2 ** i for i in range(lo, hi + 1)]   # noqa: E731
    controls = {
        "model": widgets.Dropdown(options=[(f"{n} (L={m.layers}, h={m.hidden}, a={m.heads})", n)
                                           for n, m in PRESETS.items()], value=model, description="model", **wide),
        "precision": widgets.Dropdown(options=list(PRECISIONS), description="precision", **wide),
        "zero_stage": widgets.ToggleButtons(options=list(ZERO_STAGES), value=0, description="ZeRO stage",
                                            tooltips=["nothing sharded", "optimizer state sharded",
                                                      "+ gradients sharded", "+ weights sharded"],
                                            style={"description_width": "120px", "button_width": "60px"}),
        "recompute": widgets.ToggleButtons(options=list(RECOMPUTE), value="none", description="recompute",
                                           tooltips=["keep every activation",
                                                     "recompute attention scores (as FlashAttention does)",
                                                     "keep only each layer's input"],
                                           style={"description_width": "120px", "button_width": "80px"}),
        "sequence_parallel": widgets.Checkbox(value=False, description="sequence parallel (with TP)",
                                              style={"description_width": "120px"}),
        "dp": widgets.SelectionSlider(options=powers(0, 10), value=8, description="DP degree", **slider),
        "tp": widgets.SelectionSlider(options=powers(0, 3), value=1, description="TP degree", **slider),
        "pp": widgets.SelectionSlider(options=powers(0, 5), value=1, description="PP degree", **slider),
        "seq": widgets.SelectionSlider(options=powers(8, 15), value=2048, description="sequence length", **slider),
        "micro_batch": widgets.SelectionSlider(options=powers(0, 5), value=1, description="micro-batch", **slider),
    }
    state = MemoryState()

    def update() -> None:
        chosen = PRESETS[controls["model"].value]
        precision = controls["precision"].value
        config = {name: controls[name].value for name in controls if name not in ("model", "precision")}
        config["k"] = PRECISIONS[precision]
        try:
            parts = memory_per_device(chosen, **config)
        except ValueError as err:
            state.fig, state.breakdown, state.readout = None, None, str(err)
            return
        state.breakdown = parts
        state.readout = _readout(chosen, precision.split(":")[0], config, parts, device_bytes)
        label = f"ZeRO-{config['zero_stage']}\nDP {config['dp']} · TP {config['tp']} · PP {config['pp']}"
        state.fig = memory_figure(parts, [label], device_bytes=device_bytes,
                                  title=f"{chosen.name}: one device of the first pipeline stage")

    left = widgets.VBox([controls[n] for n in ("model", "precision", "zero_stage", "recompute", "sequence_parallel")])
    right = widgets.VBox([controls[n] for n in ("dp", "tp", "pp", "seq", "micro_batch")])
    return live_box([widgets.HBox([left, right])], controls, state, update)
