"""What a plan costs: seconds per step, bytes per GPU, and the utilisation they imply.

The formulas come from `lib.analytic.formulas` (FLOPs, activations, ZeRO, the bubble) and `lib.sim.cost` (collectives);
this module decides which terms a plan pays and adds them up.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from lib.analytic.formulas import (activation_bytes_per_layer, bubble_fraction, first_stage_in_flight,
                                   model_state_breakdown)
from lib.planner.hardware import GPU, Cluster
from lib.planner.model import Model
from lib.planner.plan import Plan, check, stages

BYTES = 2               # 16-bit weights, gradients and activations (bf16 or fp16)
OPTIMIZER_BYTES = 12    # mixed-precision Adam: fp32 master weights, momentum and variance (ZeRO's K)


@dataclass(frozen=True)
class Breakdown:
    """Where a step's seconds and a GPU's bytes go; each dictionary sums to the total it explains."""

    time: dict[str, float]     # seconds per step: compute, memory_bound, tp, cp, pp, bubble, dp (exposed)
    memory: dict[str, float]   # bytes on a first-stage GPU: weights, gradients, optimizer, activations


@dataclass(frozen=True)
class Estimate:
    """What `estimate` predicts for one training step of `plan`."""

    plan: Plan
    step_time: float           # seconds per optimizer step
    memory: float              # peak bytes on a GPU of the first pipeline stage
    fits: bool                 # memory <= the GPU's memory
    mfu: float                 # model FLOPs per second over the GPUs' peak (PaLM): recomputation not counted
    hfu: float                 # the same with recomputation: Megatron-LM 2021's "teraFLOP/s per GPU" over peak
    tokens_per_second: float
    model_flops: float         # per step
    hardware_flops: float      # per step, recomputation included
    breakdown: Breakdown = field(repr=False)

    @property
    def flops_per_gpu(self) -> float:
        """Achieved hardware FLOP/s per GPU, as Narayanan et al. 2021 (Table 1) report teraFLOP/s per GPU."""
        return self.hardware_flops / (self.step_time * self.plan.gpus)


def estimate(model: Model, cluster: Cluster, plan: Plan) -> Estimate:
    """Step time, memory per GPU and utilisation of `plan`; PlanError if it does not split evenly."""
    check(model, cluster, plan)
    time, memory = step_time_breakdown(model, cluster, plan), memory_breakdown(model, plan)
    step, tokens, total = sum(time.values()), plan.global_batch * model.seq, sum(memory.values())
    model_flops = tokens * model.flops_per_token
    hardware_flops = tokens * model.hardware_flops_per_token(plan.recompute)
    peak = cluster.gpus * cluster.gpu.peak_flops
    return Estimate(plan=plan, step_time=step, memory=total, fits=total <= cluster.gpu.memory,
                    mfu=model_flops / (step * peak), hfu=hardware_flops / (step * peak),
                    tokens_per_second=tokens / step, model_flops=model_flops, hardware_flops=hardware_flops,
                    breakdown=Breakdown(time=time, memory=memory))


def step_time_breakdown(model: Model, cluster: Cluster, plan: Plan) -> dict[str, float]:
    """Seconds per step. The slowest stage runs m micro-batches, each its matmuls at the GPU's sustained rate, its
    element-wise work at HBM speed and its TP, CP and PP messages (none overlapped); the pipeline bubble adds
    (p-1)/(v·m) of that (notebook 05); then the data-parallel traffic that backward could not hide."""
    blocks, last = max(stages(model, plan), key=lambda stage: _stage_flops(model, plan, *stage))
    per_micro_batch = {
        "compute": cluster.cost.compute_time(_stage_flops(model, plan, blocks, last)),
        "memory_bound": blocks * _memory_bound_time(model, plan, cluster.gpu),
        "tp": blocks * _tp_time(model, cluster, plan),
        "cp": blocks * _cp_time(model, cluster, plan),
        "pp": _pp_time(model, cluster, plan),
    }
    m = plan.micro_batches
    time = {part: m * seconds for part, seconds in per_micro_batch.items()}
    time["bubble"] = sum(time.values()) * bubble_fraction(plan.pp, m, plan.virtual_stages)
    time["dp"] = _exposed_dp_time(model, cluster, plan, per_micro_batch["compute"])
    return time


def memory_breakdown(model: Model, plan: Plan) -> dict[str, float]:
    """Bytes on a GPU of the first pipeline stage: its share of the model states, ZeRO sharding them over the
    dp·cp ranks that hold copies (Rajbhandari et al. 2019), and its blocks' activations for the micro-batches in
    flight (Korthikanti et al. 2022). ZeRO-3 also holds two blocks' gathered weights and one block's gradients.

    Not counted: the logits (on the last stage), the working memory of a block being recomputed, the framework's
    buffers. The activation terms are the GPT block's, used for llama blocks too.
    """
    states = model_state_breakdown(_first_stage_params(model, plan), dp=plan.dp * plan.cp, zero_stage=plan.zero,
                                   k=OPTIMIZER_BYTES)
    if plan.zero == 3:      # gathered for the block computing and the one prefetched; its gradients until scattered
        block = BYTES * model.layer_params / plan.tp
        states = {**states, "weights": states["weights"] + 2 * block, "gradients": states["gradients"] + block}
    in_flight = first_stage_in_flight(plan.pp, plan.micro_batches, plan.virtual_stages)
    blocks = stages(model, plan)[0][0]
    return {**states, "activations": blocks * _layer_activation_bytes(model, plan) * in_flight}


# One micro-batch on one GPU

def _stage_flops(model: Model, plan: Plan, blocks: int, last: bool) -> float:
    """Hardware FLOPs of one micro-batch on a GPU of a stage: its blocks, and the output layer on the last."""
    tokens = model.seq * plan.micro_batch / (plan.tp * plan.cp)
    return tokens * (blocks * model.layer_flops_per_token(plan.recompute) + (model.head_flops_per_token if last else 0))


def _layer_activation_bytes(model: Model, plan: Plan) -> float:
    """Korthikanti et al.'s bytes one block keeps for a micro-batch, for the s/cp tokens of a CP rank; each of
    its queries still scores all s keys, so the attention term (5as²b/t) grows back by cp."""
    def kept(recompute: str) -> float:
        return activation_bytes_per_layer(model.seq // plan.cp, plan.micro_batch, model.hidden, model.heads,
                                          t=plan.tp, sequence_parallel=plan.sequence_parallel, recompute=recompute)
    scores = kept("none") - kept("selective") if plan.recompute == "none" else 0.0
    return kept(plan.recompute) + (plan.cp - 1) * scores


def _memory_bound_time(model: Model, plan: Plan, gpu: GPU) -> float:
    """One block's element-wise work (norms, softmax, GELU, dropout, residuals) at HBM speed. A coarse count: each
    tensor Korthikanti et al. list is written and read once forward, read and its gradient written and read once
    backward, and written and read again when the forward is recomputed. The attention scores reach HBM unless
    recompute is "selective", which also stands for FlashAttention (neither ever stores them)."""
    materialised = _layer_activation_bytes(
        model, replace(plan, recompute="selective" if plan.recompute == "selective" else "none"))
    passes = 2 + 3 + (2 if plan.recompute == "full" else 0)
    return passes * materialised / gpu.hbm


def _tp_time(model: Model, cluster: Cluster, plan: Plan) -> float:
    """One block's TP all-reduces of its [s/cp, b, h] activations: two forward, two backward, two more when the
    forward is recomputed (Shoeybi et al. 2019, section 3). Sequence parallelism swaps each for an all-gather and
    a reduce-scatter moving the same bytes (Korthikanti et al. 2022, section 4.2.2)."""
    count = 6 if plan.recompute == "full" else 4
    nbytes = BYTES * (model.seq // plan.cp) * plan.micro_batch * model.hidden
    return count * cluster.collective_time("all_reduce", nbytes, plan.tp, plan.tp)


def _cp_time(model: Model, cluster: Cluster, plan: Plan) -> float:
    """One block's context parallelism as Llama 3 runs it (section 3.3.2): all-gather the whole sequence's keys and
    values forward (again when recomputing), reduce-scatter their gradients backward."""
    nbytes = BYTES * model.seq * plan.micro_batch * 2 * model.kv_width / plan.tp
    group = (plan.cp, cluster.ranks_per_node(range(0, plan.tp * plan.cp, plan.tp)))
    gathers = 2 if plan.recompute == "full" else 1
    return (gathers * cluster.collective_time("all_gather", nbytes, *group)
            + cluster.collective_time("reduce_scatter", nbytes, *group))


def _pp_time(model: Model, cluster: Cluster, plan: Plan) -> float:
    """One micro-batch's point-to-point messages on a stage: the activation forward and its gradient backward for
    each of the v chunks, each TP rank sending its 1/t share (Narayanan et al. 2021, section 4.1)."""
    if plan.pp == 1:
        return 0.0
    nbytes = BYTES * (model.seq // plan.cp) * plan.micro_batch * model.hidden / plan.tp
    return 2 * plan.virtual_stages * cluster.cost.p2p_time(nbytes, 0, plan.tp * plan.cp)


# Once per step

def _first_stage_params(model: Model, plan: Plan) -> float:
    """Parameters on a first-stage GPU: its blocks and the embedding (the whole model when pp = 1), over tp."""
    params = stages(model, plan)[0][0] * model.layer_params + model.embedding_params
    return (params + (model.head_params if plan.pp == 1 else 0)) / plan.tp


def _exposed_dp_time(model: Model, cluster: Cluster, plan: Plan, compute_per_micro_batch: float) -> float:
    """The data-parallel traffic of a step that overlap cannot hide.

    ZeRO-0 all-reduces the 16-bit gradients; stages 1 and 2 reduce-scatter them and all-gather the updated weights
    (the same bytes); stage 3 reduce-scatters them and all-gathers each block's weights before its forward and its
    backward in every micro-batch, 1.5 times the bytes with one micro-batch (Rajbhandari et al. 2019, section 7).
    Gradients are final only in the last micro-batch's backward, all they can hide behind; stage 3 prefetches its
    gathers behind the compute of every micro-batch.
    """
    if plan.dp * plan.cp == 1:
        return 0.0
    ranks = (c * plan.tp + d * plan.tp * plan.cp * plan.pp for d in range(plan.dp) for c in range(plan.cp))
    group = (plan.dp * plan.cp, cluster.ranks_per_node(ranks))    # every rank holding a copy of these weights
    nbytes = BYTES * _first_stage_params(model, plan)
    if plan.zero == 0:
        total = cluster.collective_time("all_reduce", nbytes, *group)
    elif plan.zero < 3:
        total = (cluster.collective_time("reduce_scatter", nbytes, *group)
                 + cluster.collective_time("all_gather", nbytes, *group))
    else:
        blocks = stages(model, plan)[0][0]
        gathers = 2 * plan.micro_batches * blocks
        total = (cluster.collective_time("reduce_scatter", nbytes, *group)
                 + gathers * cluster.collective_time("all_gather", nbytes / blocks, *group))
    per_token = model.hardware_flops_per_token(plan.recompute)
    backward = 1 - model.flops_per_token / 3 / per_token       # the FLOPs after a micro-batch's forward
    hidden_behind = compute_per_micro_batch * (plan.micro_batches if plan.zero == 3 else backward)
    return max(0.0, total - hidden_behind)
