"""The papers' formulas the course cites (COURSE.md section 4), each with its source.

Bytes and FLOPs are floats, never rounded: the notebooks format them (lib.units) and the
checkers compare them with measured numbers.
"""

from __future__ import annotations

import math
from fractions import Fraction

from lib.sim.cost import bus_factor

ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
BUS_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")
# What a check never takes for an answer key (lib.guard.offlimits): the formulas a notebook hands its learners, and
# the checks of an argument's range, which compute no answer (so a plan search's hundred thousand calls pay no guard).
HANDED_TO_LEARNERS = ("model_state_breakdown", "model_state_bytes", "activation_bytes_per_layer",
                      "first_stage_in_flight")
NO_ANSWER = ("_at_least", "_whole")


def _at_least(name: str, value: float, low: float) -> None:
    if not value >= low:  # also rejects NaN
        raise ValueError(f"{name} must be at least {low}, got {value!r}")


def _whole(name: str, value: int, low: int) -> None:
    try:
        whole = value == int(value)
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or value < low:
        raise ValueError(f"{name} must be a whole number of at least {low}, got {value!r}")


def model_state_breakdown(n_params: float, dp: int = 1, zero_stage: int = 0,
                          k: float = 12) -> dict[str, float]:
    """Per-device bytes of 16-bit weights, 16-bit gradients and K bytes/param of optimizer state.

    Stage 1 shards the optimizer state over the `dp` ranks, stage 2 the gradients too, stage 3 the weights too.
    Source: Rajbhandari et al. 2019, ZeRO, sections 3.1 and 5, Figure 1.
    """
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of 0, 1, 2, 3, got {zero_stage!r}")
    _whole("dp (the data-parallel degree Nd)", dp, 1)
    _at_least("n_params", n_params, 0)
    _at_least("k (optimizer bytes per parameter)", k, 0)
    return {
        "weights": 2 * n_params / (dp if zero_stage >= 3 else 1),
        "gradients": 2 * n_params / (dp if zero_stage >= 2 else 1),
        "optimizer": k * n_params / (dp if zero_stage >= 1 else 1),
    }


def model_state_bytes(n_params: float, dp: int = 1, zero_stage: int = 0, k: float = 12) -> float:
    """Per-device bytes of model states: (2+2+K)Ψ, then (2+2)Ψ + KΨ/Nd, 2Ψ + (2+K)Ψ/Nd, (2+2+K)Ψ/Nd.

    Source: Rajbhandari et al. 2019, ZeRO, section 5 and Figure 1 (K = 12 for mixed-precision Adam).
    """
    return sum(model_state_breakdown(n_params, dp, zero_stage, k).values())


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none", dropout: bool = True, flash: bool = False) -> float:
    """Bytes of 16-bit activations one transformer layer keeps for backward, per tensor-parallel rank.

    Selective recomputation drops the 5as/(ht) attention term. Full recomputation keeps only the layer
    input: Table 2 gives 2sbh; with sequence parallelism that input is the residual stream sharded along
    the sequence (Megatron-LM checkpoints the [s/t, b, h] shard), so we return 2sbh/t there.
    Source: Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, Table 2.

    The formula's modern cases. dropout=False (as today's LLMs train): the two sbh masks and the attention's
    as²b mask and 2as²b of dropped scores go, leaving sbh(32 + 2as/h) unsharded. flash=True (FlashAttention,
    Dao et al. 2022; F.scaled_dot_product_attention): no s×s matrix is kept; instead a float32 log-sum-exp per
    head and token, 4asb bytes (its dropout mask is regenerated, not kept).
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    for name, value in (("s", s), ("b", b), ("h", h), ("a", a), ("t", t)):
        _whole(name, value, 1)
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sequence_parallel else 1)
    masks = 2 if dropout else 0          # the attention output's and the MLP output's dropout masks, sbh each
    # Layer norms, dropouts and residuals (10sbh with dropout) are replicated under plain TP; SP shards them too.
    kept = (32 + masks) / t if sequence_parallel else 8 + masks + 24 / t
    if recompute == "selective":
        attention = 0.0
    elif flash:
        attention = 4 * a / (h * t)      # the float32 log-sum-exp, 4asb/t bytes
    else:
        attention = (5 if dropout else 2) * a * s / (h * t)
    return sbh * (kept + attention)


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Pipeline bubble time over ideal compute time, (p-1)/(v·m), for GPipe, 1F1B and interleaved 1F1B.

    As a share of the whole step it is (p-1)/(v·m + p-1).
    Source: Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters, section 2.2.
    """
    _whole("p (pipeline stages)", p, 1)
    _whole("m (micro-batches)", m, 1)
    _whole("v (virtual stages per device)", v, 1)
    return (p - 1) / (v * m)


def zero_bubble_h1_bubble(p: int, m: int, t_f: float = 1.0, t_b: float = 1.0, t_w: float = 1.0) -> float:
    """ZB-H1's bubble time over ideal compute time: (p-1)(t_F+t_B-t_W) / (m(t_F+t_B+t_W)), (p-1)/(3m) when the
    three are equal, a third of 1F1B's.

    t_b is the input-gradient part of backward (B) and t_w the weight-gradient part (W); 1F1B's bubble is
    (p-1)(t_F+t_B+t_W). ZB-H1's timeline (lib.viz.pipeline) takes exactly this while t_W <= t_F and t_W <= t_B, with
    m >= p as in 1F1B; a W longer than those can no longer hide in the gaps, and the bubble grows.
    Source: Qi et al. 2024, Zero Bubble Pipeline Parallelism (ICLR), section 2.1.
    """
    _whole("p (pipeline stages)", p, 1)
    _whole("m (micro-batches)", m, 1)
    for name, t in (("t_f", t_f), ("t_b", t_b), ("t_w", t_w)):
        _at_least(name, t, 0.0)
    work = t_f + t_b + t_w
    if work == 0:
        raise ValueError("t_f + t_b + t_w must be positive")
    return (p - 1) * (t_f + t_b - t_w) / (m * work)


def training_flops(n_params: float, n_tokens: float) -> float:
    """Training FLOPs of a dense transformer, 6ND: 2ND forward and 4ND backward.

    Source: Chowdhery et al. 2022, PaLM, appendix B (also Kaplan et al. 2020, section 2.1).
    """
    _at_least("n_params", n_params, 0)
    _at_least("n_tokens", n_tokens, 0)
    return 6 * n_params * n_tokens


def flops_per_token(n_params: float, n_layers: int, hidden: int, seq: int) -> float:
    """Model FLOPs per trained token, 6N + 12·L·H·S, with attention scores counted in full (no causal halving).

    `hidden` is the attention width, heads × head size (PaLM's H·Q): d_model for most models, not for PaLM.
    Source: Chowdhery et al. 2022, PaLM, appendix B.
    """
    _at_least("n_params", n_params, 0)
    for name, value in (("n_layers", n_layers), ("hidden", hidden), ("seq", seq)):
        _whole(name, value, 0)
    return 6 * n_params + 12 * n_layers * hidden * seq


def mfu(tokens_per_s: float, flops_per_token: float, n_devices: int, peak_flops: float) -> float:
    """Model FLOPs utilization: model FLOPs per second achieved over the devices' peak FLOPs per second.

    Recomputed FLOPs do not count (that is hardware FLOPs utilization).
    Source: Chowdhery et al. 2022, PaLM, Table 3 and appendix B.
    """
    _at_least("tokens_per_s", tokens_per_s, 0)
    _at_least("flops_per_token", flops_per_token, 0)
    _whole("n_devices", n_devices, 1)
    if not peak_flops > 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops!r}")
    return tokens_per_s * flops_per_token / (n_devices * peak_flops)


def bus_bandwidth(algbw: float, n: int, op: str) -> float:
    """nccl-tests' bus bandwidth: algorithm bandwidth (size / time) times the collective's factor over n ranks.

    On one rank nothing crosses a link and this gives 0 (nccl-tests prints algbw for broadcast and reduce).
    Source: NVIDIA nccl-tests, doc/PERFORMANCE.md; the factors live in lib.sim.cost.bus_factor.
    """
    if op not in BUS_OPS:
        raise ValueError(f"op must be one of {', '.join(BUS_OPS)}, got {op!r}")
    _whole("n (ranks)", n, 1)
    _at_least("algbw", algbw, 0)
    return algbw * bus_factor(op, n)


def expert_capacity(tokens: int, experts: int, capacity_factor: float) -> int:
    """Tokens each expert accepts, ceil(tokens / experts × capacity_factor); top-1 routing drops the rest.

    Rounded up as DeepSpeed and Megatron-LM do (flaxformer rounds to nearest, Mesh TensorFlow down) so that a
    balanced batch is never dropped at capacity_factor >= 1; in exact fractions: 150/3 × 1.1 is 55, floats give 56.
    Source: Fedus et al. 2021, Switch Transformers, section 2.2.
    """
    _whole("tokens", tokens, 0)
    _whole("experts", experts, 1)
    if not (capacity_factor > 0 and math.isfinite(capacity_factor)):
        raise ValueError(f"capacity_factor must be a positive number, got {capacity_factor!r}")
    return math.ceil(Fraction(int(tokens), int(experts)) * Fraction(str(capacity_factor)))


def recompute_flops_per_token(block_params: float, n_layers: int, hidden: int, seq: int, recompute: str) -> float:
    """FLOPs per token that recomputation adds to the model's 6N + 12·L·H·S (the hardware FLOPs minus the model's).

    Full recomputation runs every block's forward again: 2 FLOPs per block weight plus the attention scores
    and their weighted sum, 4·L·H·S; selective recomputation reruns only that attention core, 4·L·H·S.
    `block_params` counts the weights of the blocks' matrix multiplications; `hidden` is heads × head size.
    Source: Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, section 5
    (selective recomputation); its end-to-end results report MFU and HFU side by side.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    _at_least("block_params", block_params, 0)
    for name, value in (("n_layers", n_layers), ("hidden", hidden), ("seq", seq)):
        _whole(name, value, 0)
    attention = 4 * n_layers * hidden * seq
    return {"none": 0.0, "selective": attention, "full": 2 * block_params + attention}[recompute]


def megatron_flops_per_iteration(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs of one training iteration of a GPT with full recomputation, 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)).

    This is what Megatron-LM divides by time to report "teraFLOP/s per GPU": the hardware FLOPs, four forward
    passes' worth for the blocks (forward, recomputed forward, backward twice) and three for the logits.
    Source: Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters, section 5.1
    (equation 3).
    """
    for name, value in (("batch", batch), ("seq", seq), ("layers", layers), ("hidden", hidden), ("vocab", vocab)):
        _whole(name, value, 1)
    return 96 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def first_stage_in_flight(p: int, m: int, v: int = 1) -> float:
    """Micro-batches whose activations the first pipeline stage holds at its peak, counted in whole stages
    (L/p layers each): min(p, m) under 1F1B; the interleaved schedule's warm-up raises p to p + (p-1)/v.

    Interleaved: (v-1)·p + 2(p-1) + 1 chunks of L/(p·v) layers in flight, the factor 1 + (p-1)/(p·v) on p.
    Sources: Narayanan et al. 2021, section 2.2.1 (1F1B keeps at most p); Korthikanti et al. 2022,
    section 4.2.3 (the interleaved factor).
    """
    _whole("p (pipeline stages)", p, 1)
    _whole("m (micro-batches)", m, 1)
    _whole("v (virtual stages per device)", v, 1)
    return float(min(m, p if v == 1 else p + (p - 1) / v))
