"""Notebook 06's pictures of lib.planner: published runs against the estimate, one plan's memory and step time as
stacked bars, a space of plans as points, and a configuration explorer over them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

from lib.planner import (A100_80GB, GPU, H100_80GB, Cluster, Estimate, Model, Plan, PlanError, PublishedRun,
                         best_plan, comparison, estimate, memory_breakdown, plans)
from lib.units import fmt_bytes, fmt_time
from lib.viz.widgets import live_box, slider_options

MEMORY_PARTS = {"weights": "#4C72B0", "gradients": "#55A868", "optimizer": "#C44E52", "activations": "#8172B3"}
TIME_PARTS = {"compute": "#4C72B0", "memory_bound": "#64B5CD", "tp": "#55A868", "cp": "#CCB974", "pp": "#DD8452",
              "bubble": "#BBBBBB", "dp": "#8172B3"}
TIME_LABELS = {"compute": "matmuls", "memory_bound": "element-wise (HBM)", "tp": "TP all-reduces",
               "cp": "CP gathers", "pp": "PP sends", "bubble": "pipeline bubble", "dp": "DP, exposed"}

# Models for the explorer and the notebook's table of common configurations, as their papers give them: Llama 2
# (Touvron et al. 2023, Table 1 and the released configs: SwiGLU widths, 70B's 8 key/value heads); GPT-3 175B
# (Brown et al. 2020, Table 2.1); PaLM 540B (Chowdhery et al. 2022, Table 1 and section 2: SwiGLU 4·d wide, heads
# of 256 whatever d is, one key/value head, no biases, shared input and output embeddings; 540.35B parameters).
LLAMA = dict(seq=4096, vocab=32000, block="llama", tied=False)
MODELS = {
    "Llama 2 7B": Model(layers=32, hidden=4096, heads=32, ffn=11008, **LLAMA),
    "Llama 2 13B": Model(layers=40, hidden=5120, heads=40, ffn=13824, **LLAMA),
    "Llama 2 70B": Model(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, **LLAMA),
    "GPT-3 175B": Model(layers=96, hidden=12288, heads=96, seq=2048, vocab=50257),
    "PaLM 540B": Model(layers=118, hidden=18432, heads=48, kv_heads=1, head_dim=256, ffn=73728, seq=2048,
                       vocab=256000, block="llama", tied=True),
}
GPUS = {"H100 80GB": H100_80GB, "A100 80GB": A100_80GB}


def published_table(runs: Optional[Iterable[PublishedRun]] = None) -> str:
    """The published runs next to the estimate, one line each: what the paper reports, what lib.planner says, the
    efficiency the row implies, and whether the GPU's efficiency was fitted on it or it was held out."""
    rows = comparison() if runs is None else comparison(runs)
    lines = [f"{'run':<40} {'metric':<15} {'published':>10} {'estimated':>10} {'error':>7} {'implied eff.':>12}  role"]
    for r in rows:
        if r["metric"] == "mfu":
            pub, est, what = f"{r['published']:.0%}", f"{r['estimated']:.1%}", "MFU"
        else:
            pub, est, what = f"{r['published'] / 1e12:.0f}", f"{r['estimated'] / 1e12:.1f}", "TFLOP/s per GPU"
        lines.append(f"{r['run']:<40} {what:<15} {pub:>10} {est:>10} {r['error']:>+7.1%} "
                     f"{r['implied efficiency']:>12.2f}  {r['role']}")
    return "\n".join(lines)


def plan_figure(e: Estimate, cluster: Cluster, title: str = ""):
    """Two stacked bars: memory per GPU (first stage) against the GPU's capacity, and a step's seconds by cause."""
    import matplotlib.pyplot as plt

    fig, (mem, time) = plt.subplots(1, 2, figsize=(10, 3.4), layout="constrained")
    _memory_stacks(mem, [e.breakdown.memory], cluster.gpu, width=0.5)
    mem.set_xlim(-0.6, 1.2)
    mem.set_xticks([])
    mem.set_ylabel("GiB per GPU (first pipeline stage)")
    mem.set_title(f"memory: {fmt_bytes(e.memory)} {'fits' if e.fits else 'does NOT fit'}")
    mem.legend(frameon=False, fontsize="small", loc="upper right")
    left = 0.0
    for part, colour in TIME_PARTS.items():
        value = e.breakdown.time.get(part, 0.0)
        if value > 0:
            time.barh(0, value, left=left, color=colour, label=TIME_LABELS[part], height=0.5)
            left += value
    time.set_yticks([])
    time.set_xlabel("seconds per step")
    time.set_title(f"step {fmt_time(e.step_time)}: MFU {e.mfu:.1%}, HFU {e.hfu:.1%}")
    time.legend(frameon=False, fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4)
    if title:
        fig.suptitle(title)
    plt.close(fig)
    return fig


def _memory_stacks(ax, breakdowns: list[dict[str, float]], gpu: GPU, width: float) -> None:
    """One stacked bar of GiB per breakdown (weights, gradients, optimizer, activations), and the GPU's capacity."""
    for x, breakdown in enumerate(breakdowns):
        bottom = 0.0
        for part, colour in MEMORY_PARTS.items():
            value = breakdown.get(part, 0.0) / 2**30
            ax.bar(x, value, bottom=bottom, color=colour, label=part if x == 0 else None, width=width)
            bottom += value
    ax.axhline(gpu.memory / 2**30, color="black", linestyle="--", linewidth=1)
    ax.text(len(breakdowns) - 1 + width / 2 + 0.05, gpu.memory / 2**30, f" {gpu.name}", va="bottom", fontsize="small")


def memory_bars(model: Model, plans: Sequence[Plan], gpu: GPU, title: str = ""):
    """What a GPU of the first pipeline stage holds under each plan, the four terms of lib.planner's memory model
    stacked (memory_breakdown), against the GPU's capacity: how ZeRO, TP, PP and recomputation each shrink it."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(min(12, 2.2 + 1.6 * len(plans)), 3.8), layout="constrained")
    _memory_stacks(ax, [memory_breakdown(model, plan) for plan in plans], gpu, width=0.6)
    ax.set_xticks(range(len(plans)), [_short(plan) for plan in plans], fontsize="small")
    ax.set_ylabel("GiB per GPU (first pipeline stage)")
    ax.set_title(title or "memory per GPU of each plan")
    ax.legend(frameon=False, fontsize="small", loc="center left", bbox_to_anchor=(1, 0.5))
    plt.close(fig)
    return fig


def _short(plan: Plan) -> str:
    """A plan on two lines, for a bar's label."""
    return (f"TP{plan.tp} PP{plan.pp} DP{plan.dp}{' SP' * plan.sequence_parallel}\nZeRO-{plan.zero}, "
            f"b={plan.micro_batch}, {plan.recompute}")


RECOMPUTE_COLOURS = {"none": "#4C72B0", "selective": "#55A868", "full": "#C44E52"}


def plan_space_figure(model: Model, cluster: Cluster, global_batch: int, title: str = ""):
    """Every plan of notebook 06's search space as a point, memory per GPU against tokens per second, the GPU's
    capacity as a line and the fastest plan left of it ringed: what choose_plan searches, drawn."""
    import matplotlib.pyplot as plt

    found = [estimate(model, cluster, plan) for plan in plans(model, cluster, global_batch, virtual_stages=[1])]
    best = best_plan(model, cluster, global_batch, virtual_stages=[1])
    fig, ax = plt.subplots(figsize=(9, 4), layout="constrained")
    for recompute, colour in RECOMPUTE_COLOURS.items():
        for fits in (True, False):
            points = [e for e in found if e.plan.recompute == recompute and e.fits == fits]
            ax.scatter([e.memory / 2**30 for e in points], [e.tokens_per_second for e in points], s=14,
                       facecolors=colour if fits else "none", edgecolors=colour, linewidths=0.6,
                       alpha=0.85 if fits else 0.35,
                       label=f"recompute {recompute}" + ("" if fits else ", does not fit"))
    ax.margins(y=0.15)
    ax.axvline(cluster.gpu.memory / 2**30, color="black", linestyle="--", linewidth=1)
    ax.text(cluster.gpu.memory / 2**30, ax.get_ylim()[0], f" {cluster.gpu.name}", va="bottom", fontsize="small")
    ax.scatter([best.memory / 2**30], [best.tokens_per_second], s=160, facecolors="none", edgecolors="black")
    ax.annotate(f"the fastest that fits: {best.plan}", (best.memory / 2**30, best.tokens_per_second),
                xytext=(10, 8), textcoords="offset points", fontsize="small")
    ax.set_xscale("log")
    ax.set_xlabel("GiB per GPU (first pipeline stage)")
    ax.set_ylabel("tokens per second")
    ax.set_title(title or f"{len(found)} plans on {cluster.gpus} × {cluster.gpu.name}, batch {global_batch}")
    ax.legend(frameon=False, fontsize="small", loc="center left", bbox_to_anchor=(1, 0.5))
    plt.close(fig)
    return fig


@dataclass
class PlanState:
    """The explorer's last redraw: the figure, the readout, the estimate (None when the plan does not split)."""

    fig: Any = None
    readout: str = ""
    estimate: Optional[Estimate] = None


def plan_explorer(model: str = "Llama 2 70B", gpus: int = 64, tp: int = 8, pp: int = 2, zero: int = 1,
                  global_batch: int = 1024):
    """Model, cluster and plan as controls; memory per GPU and the step's time by cause, with MFU and HFU."""
    import ipywidgets as widgets

    slider = slider_options()
    choice = {k: v for k, v in slider.items() if k != "continuous_update"}     # dropdowns take no such option
    powers = [2 ** k for k in range(0, 15)]
    controls = {
        "model": widgets.Dropdown(options=list(MODELS), value=model, description="model", **choice),
        "gpu": widgets.Dropdown(options=list(GPUS), value="H100 80GB", description="GPU", **choice),
        "gpus": widgets.SelectionSlider(options=powers[3:], value=gpus, description="GPUs", **slider),
        "batch": widgets.SelectionSlider(options=powers[6:13], value=global_batch, description="global batch",
                                         **slider),
        "tp": widgets.SelectionSlider(options=[1, 2, 4, 8], value=tp, description="TP", **slider),
        "pp": widgets.SelectionSlider(options=powers[:7], value=pp, description="PP", **slider),
        "zero": widgets.Dropdown(options=[0, 1, 2, 3], value=zero, description="ZeRO stage", **choice),
        "micro_batch": widgets.SelectionSlider(options=[1, 2, 4, 8], value=1, description="micro-batch", **slider),
        "recompute": widgets.Dropdown(options=["none", "selective", "full"], value="selective",
                                      description="recompute", **choice),
    }
    state = PlanState()

    def update() -> None:
        v = {name: w.value for name, w in controls.items()}
        cluster = Cluster(gpu=GPUS[v["gpu"]], gpus=v["gpus"], gpus_per_node=8)
        dp = v["gpus"] // (v["tp"] * v["pp"]) if v["gpus"] % (v["tp"] * v["pp"]) == 0 else 0
        try:
            if dp == 0:
                raise PlanError(f"TP·PP = {v['tp'] * v['pp']} does not divide {v['gpus']} GPUs")
            plan = Plan(tp=v["tp"], pp=v["pp"], dp=dp, global_batch=v["batch"], micro_batch=v["micro_batch"],
                        zero=v["zero"], recompute=v["recompute"])
            state.estimate = estimate(MODELS[v["model"]], cluster, plan)
        except PlanError as err:
            state.fig, state.estimate, state.readout = None, None, f"this plan does not split: {err}"
            return
        e = state.estimate
        state.fig = plan_figure(e, cluster, title=f"{v['model']} on {v['gpus']} × {v['gpu']}: {plan}")
        state.readout = (f"DP = {dp}; {plan.micro_batches} micro-batches per step; "
                         f"{e.tokens_per_second:,.0f} tokens/s; "
                         f"memory {fmt_bytes(e.memory)} per GPU; MFU {e.mfu:.1%}, HFU {e.hfu:.1%}")

    return live_box(list(controls.values()), controls, state, update)


def _quoted(tp: int, pp: int, gpus: int, batch: int, zero: int, **more) -> Plan:
    return Plan(tp=tp, pp=pp, dp=gpus // (tp * pp), global_batch=batch, zero=zero, recompute="selective", **more)


# Configurations of the kind practitioners' guides quote (model, GPUs, global batch in sequences, plan), as the
# course's issue 12 lists them, without a published source; batches and selective recomputation are ours. PaLM's row
# is not a guide's: PaLM 540B trained on 6144 TPU v4 chips with 12-way model parallelism and 256-way fully sharded
# data parallelism in each of two pods, without pipelining, rematerialising all but one activation per layer
# (Chowdhery et al. 2022, section 4). Its row here is that layout on 8-GPU nodes: model parallelism in a node (TP8),
# the rest fully sharded (ZeRO-3), no pipeline, full recomputation; the micro-batch of 4 is ours.
PRACTICE = (
    ("Llama 2 7B", 8, 512, _quoted(1, 1, 8, 512, zero=2)),
    ("Llama 2 13B", 8, 512, _quoted(2, 1, 8, 512, zero=2)),
    ("Llama 2 70B", 64, 1024, _quoted(8, 2, 64, 1024, zero=1)),
    ("Llama 2 70B", 128, 1024, _quoted(8, 2, 128, 1024, zero=0)),
    ("GPT-3 175B", 256, 1536, _quoted(8, 4, 256, 1536, zero=1)),
    ("PaLM 540B", 1024, 2048, Plan(tp=8, dp=128, global_batch=2048, micro_batch=4, zero=3, recompute="full")),
)
