"""Published training runs the estimator must explain, and the fit of each GPU's one efficiency constant.

Each run is a configuration as its paper (or its authors' script) gives it and the throughput the paper reports.
Where the paper leaves a setting out, the comment says what we assumed. The rows marked `fits` fix their GPU's
efficiency; the others are held out of that fit. Held-out rows come from the same tables as the fitted ones (the
same clusters, code and authors), so they test the estimate between and just beyond fitted rows, not on a new
system; and the efficiency each row implies (`implied_efficiency`) is shown beside it, so that a trend the single
constant misses (it grows with model size in Megatron-LM's Table 1) stays visible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable

from lib.planner.estimate import estimate
from lib.planner.hardware import A100_80GB, GPU, H100_80GB, Cluster
from lib.planner.model import Model
from lib.planner.plan import Plan

METRICS = {"flops_per_gpu": "achieved FLOP/s per GPU, recomputation counted", "mfu": "model FLOPs utilisation"}


@dataclass(frozen=True)
class PublishedRun:
    """One published run: what ran, what the paper reports (`metric`, a field of Estimate), and whether it is one
    of the runs that fix its GPU's efficiency (`fits`) rather than one the estimate is tested against."""

    name: str
    source: str
    model: Model
    cluster: Cluster
    plan: Plan
    metric: str
    published: float
    fits: bool

    def estimated(self, gpu: GPU | None = None) -> float:
        """The estimate's value of `metric`, on this run's GPU or on `gpu` (another efficiency, say)."""
        cluster = self.cluster if gpu is None else replace(self.cluster, gpu=gpu)
        return getattr(estimate(self.model, cluster, self.plan), self.metric)

    def error(self) -> float:
        """(estimated - published) / published."""
        return self.estimated() / self.published - 1

    @property
    def role(self) -> str:
        """What the row is to the estimate: one the efficiency was fitted on, or one held out of that fit."""
        return "fitted" if self.fits else "held out"


# Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
# Table 1: GPT models, sequence 2048, vocabulary 51,200, on DGX A100 80GB nodes, full recomputation; the figure is
# the achieved teraFLOP/s per GPU, recomputation counted. Micro-batch sizes and virtual stages are not in the table:
# they come from the authors' script for it, examples/academic_paper_scripts/sc21/run_table_1.sh in NVIDIA/Megatron-LM
# at d98e8a64 (MBS, and layers per virtual stage: 76.1B 5 of 15 per stage, v=3; 145.6B 5 of 10, v=2; 310.1B 3 of 6,
# v=2; 529.6B 1 of 3, v=3), whose TP, PP, batch, layers and hidden sizes match the rows below. The 1008B row's 163
# is the abstract's 502 petaFLOP/s over 3072 GPUs.
# (name, heads, hidden, layers, tp, pp, GPUs, batch, micro-batch, v, teraFLOP/s per GPU, fits A100's efficiency)
_TABLE_1 = (
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 16, 1, 137, False),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 16, 1, 138, True),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 16, 1, 142, True),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 8, 1, 135, False),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 4, 1, 138, True),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 2, 3, 140, True),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 2, 2, 148, False),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 1, 2, 155, True),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 1, 3, 163, True),
    ("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 1, 1, 163, False),
)
MEGATRON_2021 = tuple(
    PublishedRun(name=f"Megatron-LM GPT {name}", source="Narayanan et al. 2021, Table 1",
                 model=Model(layers=layers, hidden=hidden, heads=heads, seq=2048, vocab=51200),
                 cluster=Cluster(gpu=A100_80GB, gpus=gpus, gpus_per_node=8),
                 plan=Plan(tp=tp, pp=pp, dp=gpus // (tp * pp), global_batch=batch, micro_batch=micro_batch,
                           recompute="full", virtual_stages=v),
                 metric="flops_per_gpu", published=tflops * 1e12, fits=fits)
    for name, heads, hidden, layers, tp, pp, gpus, batch, micro_batch, v, tflops, fits in _TABLE_1)


def llama3_405b(seq: int = 8192) -> Model:
    """Llama 3 405B (Dubey et al. 2024, Table 3): 126 layers, hidden 16,384, SwiGLU FFN 53,248, 128 heads of which
    8 key/value heads, vocabulary 128,256, untied output layer."""
    return Model(layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, seq=seq, vocab=128256, block="llama",
                 tied=False)


# Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4: Llama 3 405B on H100s, 16M tokens per batch, BF16 MFU.
# Section 3.3.2 gives: FSDP sharding gradients and optimizer states, the weights kept whole during a step (ZeRO-2);
# no activation checkpointing at 8K tokens (attention kept as FlashAttention keeps it: our "selective"); one block
# taken off the first and the last stage, whose first and last model chunks hold only the embedding and the output
# layer. Our reading: one block per model chunk, so 128 places over 16 stages make v = 8 virtual stages. Assumed,
# not in the paper: micro-batches of one sequence, sequence parallelism with TP, the same settings at 131,072 tokens.
# Table 4 prints DP 4 for the 131,072-token row, but TP 8 · CP 16 · PP 16 · DP 4 is 8,192 GPUs, not the row's 16,384,
# and its 16M tokens per batch at 16 sequences per DP rank need DP 8: we read DP 8.
# (name, GPUs, sequence, cp, dp, sequences per batch, MFU, fits H100's efficiency)
_TABLE_4 = (
    ("8,192 GPUs", 8192, 8192, 1, 64, 2048, 0.43, True),
    ("16,384 GPUs", 16384, 8192, 1, 128, 2048, 0.41, False),
    ("131,072-token sequences", 16384, 131072, 16, 8, 128, 0.38, True),
)
LLAMA3_405B = tuple(
    PublishedRun(name=f"Llama 3 405B, {name}", source="Dubey et al. 2024, Table 4", model=llama3_405b(seq),
                 cluster=Cluster(gpu=H100_80GB, gpus=gpus, gpus_per_node=8),
                 plan=Plan(tp=8, pp=16, dp=dp, cp=cp, global_batch=batch, micro_batch=1, recompute="selective",
                           virtual_stages=8, zero=2, sequence_parallel=True, embedding_as_layer=True),
                 metric="mfu", published=published, fits=fits)
    for name, gpus, seq, cp, dp, batch, published, fits in _TABLE_4)

PUBLISHED_RUNS = MEGATRON_2021 + LLAMA3_405B


def implied_efficiency(run: PublishedRun) -> float:
    """The efficiency at which the estimate meets the published figure (it grows with efficiency: bisection)."""
    low, high = 0.01, 2.0
    while high - low > 1e-9:
        mid = (low + high) / 2
        if run.estimated(replace(run.cluster.gpu, efficiency=mid)) < run.published:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def fitted_efficiency(runs: Iterable[PublishedRun]) -> float:
    """The geometric mean of the efficiencies the fitting runs (`fits`) imply: how a GPU's constant was chosen."""
    implied = [implied_efficiency(run) for run in runs if run.fits]
    return math.exp(sum(map(math.log, implied)) / len(implied))


def comparison(runs: Iterable[PublishedRun] = PUBLISHED_RUNS) -> list[dict]:
    """One row per run, published next to estimated, with the efficiency the row implies and its role (fitted or
    held out), for the notebook's table."""
    return [{"run": run.name, "source": run.source, "metric": run.metric, "published": run.published,
             "estimated": run.estimated(), "error": run.error(), "implied efficiency": implied_efficiency(run),
             "role": run.role} for run in runs]
