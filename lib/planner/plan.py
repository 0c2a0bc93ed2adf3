"""A parallel plan: how a model's training step is split over a cluster, and the checks that it splits evenly.

Ranks sit on a (dp, pp, cp, tp) mesh with TP innermost and DP outermost, the order of Llama 3 (Dubey et al.
2024, section 3.3.2: [TP, CP, PP, DP] from the innermost): rank = ((d·pp + p)·cp + c)·tp + t. Megatron-LM and
torchtitan also keep TP innermost but put the pipeline outermost: Megatron-LM's default order is "tp-cp-ep-dp-pp"
(megatron/core/parallel_state.py, initialize_model_parallel, at d98e8a64), torchtitan's mesh is ("pp",
"dp_replicate", "dp_shard", "cp", "tp") (torchtitan/distributed/parallel_dims.py at b5bcd76c). TP groups are
consecutive ranks inside a node; PP and DP groups cross nodes once tp·cp fills one.
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.analytic.formulas import RECOMPUTE, ZERO_STAGES
from lib.planner.errors import PlanError, divisors, positive
from lib.planner.hardware import Cluster
from lib.planner.model import Model


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Degrees of tensor (tp), pipeline (pp), data (dp) and context (cp) parallelism, and how a step runs.

    global_batch: sequences per step, run as micro-batches of `micro_batch` sequences on each data-parallel rank.
    recompute: "none", "selective" (the attention core is recomputed, its s² scores never stored: what FlashAttention
    does too) or "full" (Korthikanti et al. 2022). virtual_stages: model chunks per pipeline rank (interleaved 1F1B).
    zero: the ZeRO stage over the data-parallel ranks. sequence_parallel: Megatron-LM's, shards what TP leaves
    replicated. embedding_as_layer: the embedding and the output layer each take a block's place in the pipeline split
    (Llama 3, section 3.3.2).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    global_batch: int
    micro_batch: int = 1
    recompute: str = "none"
    virtual_stages: int = 1
    zero: int = 0
    cp: int = 1
    sequence_parallel: bool = False
    embedding_as_layer: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def micro_batches(self) -> int:
        """m: the micro-batches each pipeline runs per step."""
        return self.global_batch // (self.dp * self.micro_batch)

    def __str__(self) -> str:
        extras = [f"CP{self.cp}" * (self.cp > 1), f"v{self.virtual_stages}" * (self.virtual_stages > 1),
                  "SP" * self.sequence_parallel]
        return " ".join([f"TP{self.tp} PP{self.pp} DP{self.dp}", *filter(None, extras), f"ZeRO-{self.zero}",
                         f"micro-batch {self.micro_batch}", f"recompute {self.recompute}"])


def check(model: Model, cluster: Cluster, plan: Plan) -> None:
    """Raise PlanError, saying what to change, unless `plan` splits this model on this cluster evenly."""
    for name in ("tp", "pp", "dp", "cp", "global_batch", "micro_batch", "virtual_stages"):
        positive(name, getattr(plan, name))
    if plan.recompute not in RECOMPUTE:
        raise PlanError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {plan.recompute!r}")
    if plan.zero not in ZERO_STAGES:
        raise PlanError(f"zero must be a ZeRO stage, 0, 1, 2 or 3, got {plan.zero!r}")
    _check_cluster(cluster, plan)
    if model.heads % plan.tp:
        raise PlanError(f"tp={plan.tp} must divide the model's {model.heads} attention heads (a TP rank computes "
                        f"whole heads); choose tp among {_tp_choices(model, cluster)}")
    _check_layers(model, plan)
    if plan.global_batch % (plan.dp * plan.micro_batch):
        raise PlanError(f"global_batch={plan.global_batch} sequences do not split into micro-batches of "
                        f"{plan.micro_batch} on each of dp={plan.dp} ranks: dp·micro_batch = "
                        f"{plan.dp * plan.micro_batch} must divide it; change global_batch, dp or micro_batch")
    if model.seq % plan.cp:
        raise PlanError(f"cp={plan.cp} must divide the sequence length {model.seq}: each CP rank takes an equal part")


def _tp_choices(model: Model, cluster: Cluster) -> list[int]:
    """Degrees that divide both the heads and a node."""
    return [t for t in divisors(model.heads, cluster.gpus_per_node) if cluster.gpus_per_node % t == 0]


def _check_cluster(cluster: Cluster, plan: Plan) -> None:
    if plan.gpus != cluster.gpus:
        model_parallel = plan.tp * plan.cp * plan.pp
        fix = (f"dp={cluster.gpus // model_parallel} fills it" if cluster.gpus % model_parallel == 0 else
               f"tp·cp·pp = {model_parallel} does not divide {cluster.gpus}: change tp, cp or pp")
        raise PlanError(f"the plan uses tp·cp·pp·dp = {plan.tp}·{plan.cp}·{plan.pp}·{plan.dp} = {plan.gpus} GPUs but "
                        f"the cluster has {cluster.gpus}; {fix}")
    if cluster.gpus_per_node % plan.tp:
        raise PlanError(f"tp={plan.tp} would put tensor parallelism across nodes: it talks at every layer and "
                        f"needs NVLink, so tp must divide the {cluster.gpus_per_node} GPUs of a node; move the rest "
                        f"to pp or dp")


def _check_layers(model: Model, plan: Plan) -> None:
    chunks, slots = plan.pp * plan.virtual_stages, layer_slots(model, plan.embedding_as_layer)
    if plan.virtual_stages > 1 and plan.pp == 1:
        raise PlanError("virtual_stages > 1 interleaves pipeline stages: it needs pp > 1")
    if slots % chunks:
        what = (f"{model.layers} layers + the embedding + the output layer" if plan.embedding_as_layer
                else f"{model.layers} layers")
        raise PlanError(f"the {what} do not split evenly into pp·virtual_stages = {plan.pp}·{plan.virtual_stages} = "
                        f"{chunks} model chunks; choose pp·virtual_stages among {divisors(slots, slots)}")
    if plan.embedding_as_layer and plan.pp > 1 and slots // plan.pp < 2:
        raise PlanError("with embedding_as_layer the first and last stages would hold no block; use fewer stages")


# Which blocks sit on which stage

def layer_slots(model: Model, embedding_as_layer: bool) -> int:
    """Places the pipeline split deals out: the blocks, and the embedding and output layer when they count."""
    return model.layers + (2 if embedding_as_layer else 0)


def stages(model: Model, plan: Plan) -> list[tuple[int, bool]]:
    """(blocks, holds the output layer) for the first stage, a middle one and the last, those that exist."""
    if plan.pp == 1:
        return [(model.layers, True)]
    per_stage = layer_slots(model, plan.embedding_as_layer) // plan.pp
    ends = per_stage - (1 if plan.embedding_as_layer else 0)   # the embedding or the output layer took a place
    return [(ends, False), *([(per_stage, False)] if plan.pp > 2 else []), (ends, True)]
