"""A plan's first-stage memory measured on the course's own modules, for tiny GPTs: what `memory_breakdown` says
of real sizes, checked where a step can run.

Measured: the parameters of the first stage's bf16 modules (lib.models: the embeddings, its blocks and, with
pp = 1, the final norm and an untied head), and the bytes autograd keeps for one micro-batch in its blocks
(lib.models.Block with dropout, each recomputation mode run with torch.utils.checkpoint), less LayerNorm's mean and
1/std per token, which Korthikanti et al. leave out. Played: the micro-batches 1F1B holds on stage 0 (notebook 05's
schedule, lib.analytic.schedules). Arithmetic: ZeRO's sharding of the 16 bytes a parameter (lib.analytic.formulas) and
ZeRO-3's
gathered blocks, as the planner counts them. lib.models' block is not tensor-parallel: tp, cp and virtual stages 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lib.device import device
from lib.analytic.formulas import model_state_breakdown
from lib.checker.measure import blocks_activation_bytes, saved_activation_bytes
from lib.models import GPTConfig, TinyGPT
from lib.planner.errors import PlanError
from lib.planner.estimate import BYTES, OPTIMIZER_BYTES
from lib.planner.model import Model
from lib.planner.plan import Plan
from lib.analytic.schedules import peak_in_flight, schedule_orders

DROPOUT = 0.1               # Korthikanti et al.'s blocks drop out; any p > 0 keeps the same masks
LARGEST = 2 ** 16           # s·b·h above which a measurement would take real memory: use the formulas


@dataclass(frozen=True)
class FirstStage:
    """What was measured on a first-stage GPU, and the bytes it implies (`memory`, memory_breakdown's keys)."""

    params: int                 # of the first stage, counted in its modules
    block_params: int           # one block's
    saved_per_micro_batch: int  # bytes autograd keeps in the stage's blocks, LayerNorm statistics left out
    norm_statistics: int        # LayerNorm's mean and 1/std kept per micro-batch (left out above)
    in_flight: int              # micro-batches whose activations 1F1B holds on stage 0 at its peak
    memory: dict[str, float]


def measured_first_stage(model: Model, plan: Plan, seed: int = 0) -> FirstStage:
    """Build the first pipeline stage of `model` in bf16 and measure what a GPU of it holds under `plan`."""
    _small_enough(model, plan)
    blocks = model.layers // plan.pp
    cfg = GPTConfig(vocab=model.vocab, seq=model.seq, hidden=model.hidden, heads=model.heads, layers=blocks,
                    dropout=DROPOUT, tied=model.tied)
    where = device()
    with torch.random.fork_rng(devices=[where] if where.type == "cuda" else []):   # the caller's random state stays
        torch.manual_seed(seed)
        gpt = TinyGPT(cfg).to(device=where, dtype=torch.bfloat16)
        x = torch.randn(plan.micro_batch, model.seq, model.hidden, dtype=torch.bfloat16, device=where,
                        requires_grad=True)
        saved = blocks_activation_bytes(gpt.blocks, x, plan.recompute)
        statistics = 0 if plan.recompute == "full" else blocks * sum(
            saved_activation_bytes(lambda norm=norm: norm(x), exclude=[x, *norm.parameters()])
            for norm in (gpt.blocks[0].ln1, gpt.blocks[0].ln2))
    modules = [gpt.tok, gpt.pos, *gpt.blocks] + ([gpt.ln_f, gpt.head] if plan.pp == 1 else [])
    params = sum(p.numel() for p in {id(p): p for m in modules for p in m.parameters()}.values())
    block = sum(p.numel() for p in gpt.blocks[0].parameters())
    # With fewer micro-batches than stages, 1F1B's warm-up runs them all before the first backward: GPipe's order.
    order = "1f1b" if plan.micro_batches >= plan.pp else "gpipe"
    in_flight = peak_in_flight(schedule_orders(order, plan.pp, plan.micro_batches))[0]
    states = model_state_breakdown(params, dp=plan.dp, zero_stage=plan.zero, k=OPTIMIZER_BYTES)
    if plan.zero == 3:      # gathered for the block computing and the one prefetched; its gradients until scattered
        states = {**states, "weights": states["weights"] + 2 * BYTES * block,
                  "gradients": states["gradients"] + BYTES * block}
    per_micro_batch = saved - statistics
    return FirstStage(params=params, block_params=block, saved_per_micro_batch=per_micro_batch,
                      norm_statistics=statistics, in_flight=in_flight,
                      memory={**states, "activations": float(per_micro_batch * in_flight)})


def _small_enough(model: Model, plan: Plan) -> None:
    """PlanError unless this is a model and plan the measurement can build: lib.models' GPT on one TP rank."""
    if model.block != "gpt" or model.kv_heads_count != model.heads or model.ffn_width != 4 * model.hidden:
        raise PlanError("the measurement builds lib.models' GPT blocks: block='gpt', one key/value head per head, "
                        "ffn = 4·hidden")
    if (plan.tp, plan.cp, plan.virtual_stages) != (1, 1, 1) or plan.sequence_parallel or plan.embedding_as_layer:
        raise PlanError("the measurement runs lib.models' blocks on one GPU of a stage: tp, cp and virtual_stages 1, "
                        "no sequence parallelism, embedding_as_layer False")
    if model.layers % plan.pp:
        raise PlanError(f"pp={plan.pp} must divide the {model.layers} layers")
    if model.seq * plan.micro_batch * model.hidden > LARGEST:
        raise PlanError(f"s·b·h = {model.seq * plan.micro_batch * model.hidden:,} is beyond the {LARGEST:,} the "
                        "measurement runs: at that size use memory_breakdown, the papers' formulas")
