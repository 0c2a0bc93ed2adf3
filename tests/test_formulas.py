"""lib.analytic.formulas against the numbers its sources publish, to the rounding each source prints.

Where a number was checked against a quotation of the source rather than the source itself,
or worked out by hand, the comment says so.
"""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.analytic.formulas import (activation_bytes_per_layer, bubble_fraction, bus_bandwidth, expert_capacity,
                          flops_per_token, mfu, model_state_breakdown, model_state_bytes, training_flops,
                          zero_bubble_h1_bubble)
from lib.sim.cost import bus_factor

GB = 1e9  # the ZeRO paper's GB are decimal: 16 bytes x 7.5e9 params is its "120GB"

params = st.floats(min_value=1.0, max_value=1e13)
ranks = st.integers(min_value=2, max_value=4096)
stages = st.integers(min_value=0, max_value=3)


# ZeRO (Rajbhandari et al. 2019)

@pytest.mark.parametrize("stage, printed_gb, exact_gb", [
    (0, 120.0, 120.0),       # 16 x 7.5
    (1, 31.4, 31.40625),     # 4 x 7.5 + 12 x 7.5 / 64
    (2, 16.6, 16.640625),    # 2 x 7.5 + 14 x 7.5 / 64
    (3, 1.9, 1.875),         # 16 x 7.5 / 64
])
def test_zero_figure1_7_5b_model_on_64_gpus(stage, printed_gb, exact_gb):
    got = model_state_bytes(7.5e9, dp=64, zero_stage=stage, k=12)
    assert got == pytest.approx(exact_gb * GB, rel=1e-12)
    assert got / GB == pytest.approx(printed_gb, abs=0.05)  # Figure 1 prints one decimal


def test_zero_section_3_1_gpt2_needs_24gb_of_model_states():
    assert model_state_bytes(1.5e9) == pytest.approx(24 * GB, rel=1e-12)
    assert model_state_breakdown(1.5e9) == pytest.approx(
        {"weights": 3 * GB, "gradients": 3 * GB, "optimizer": 18 * GB}, rel=1e-12)


def test_zero_stages_approach_4x_and_8x_reduction_for_large_nd():
    # Section 5: P_os gives up to 4x, P_os+g up to 8x (K = 12) as Nd grows.
    baseline = model_state_bytes(1e9)
    assert baseline / model_state_bytes(1e9, dp=10**9, zero_stage=1) == pytest.approx(4, rel=1e-6)
    assert baseline / model_state_bytes(1e9, dp=10**9, zero_stage=2) == pytest.approx(8, rel=1e-6)


@given(params, ranks, stages, st.sampled_from([8, 12, 16]))
def test_zero_breakdown_sums_to_total(n, dp, stage, k):
    parts = model_state_breakdown(n, dp, stage, k)
    assert set(parts) == {"weights", "gradients", "optimizer"}
    assert sum(parts.values()) == model_state_bytes(n, dp, stage, k)


@given(params, stages)
def test_zero_single_rank_is_the_baseline_at_every_stage(n, stage):
    assert model_state_bytes(n, dp=1, zero_stage=stage) == pytest.approx(16 * n, rel=1e-12)


@given(params, ranks)
def test_zero_each_stage_saves_more_and_stage3_divides_everything(n, dp):
    by_stage = [model_state_bytes(n, dp, stage) for stage in range(4)]
    assert by_stage == sorted(by_stage, reverse=True) and len(set(by_stage)) == 4
    assert by_stage[0] == pytest.approx(16 * n, rel=1e-12)
    assert by_stage[3] == pytest.approx(16 * n / dp, rel=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    (dict(zero_stage=4), "zero_stage"),
    (dict(zero_stage=-1), "zero_stage"),
    (dict(dp=0), "dp"),
    (dict(dp=2.5), "dp"),
])
def test_zero_rejects_bad_stage_and_degree(kwargs, message):
    with pytest.raises(ValueError, match=message):
        model_state_bytes(1e9, **kwargs)
    with pytest.raises(ValueError, match=message):
        model_state_breakdown(1e9, **kwargs)


# Activation memory (Korthikanti et al. 2022, Table 2), GPT-3 175B as in their Table 3

GPT3 = dict(s=2048, b=1, h=12288, a=96)
SBH = 2048 * 1 * 12288  # 25,165,824


def test_activation_gpt3_175b_by_hand():
    # 5as/h = 5 x 96 x 2048 / 12288 = 80, so one layer keeps sbh(34 + 80) bytes without parallelism.
    assert activation_bytes_per_layer(**GPT3) == 114 * SBH == 2_868_903_936
    # t = 8: TP keeps sbh(10 + 3 + 10); TP + SP sbh(4.25 + 10); TP + SP + selective 34sbh/8.
    assert activation_bytes_per_layer(**GPT3, t=8) == 23 * SBH
    assert activation_bytes_per_layer(**GPT3, t=8, sequence_parallel=True) == 14.25 * SBH
    assert activation_bytes_per_layer(**GPT3, t=8, sequence_parallel=True,
                                      recompute="selective") == 34 * SBH / 8 == 106_954_752
    assert activation_bytes_per_layer(**GPT3, t=8, recompute="selective") == 13 * SBH


def test_activation_full_recompute_keeps_the_layer_input():
    assert activation_bytes_per_layer(**GPT3, recompute="full") == 2 * SBH
    assert activation_bytes_per_layer(**GPT3, t=8, recompute="full") == 2 * SBH
    # Our choice (see the docstring): under SP the stored input is the sequence shard.
    assert activation_bytes_per_layer(**GPT3, t=8, sequence_parallel=True, recompute="full") == 2 * SBH / 8


@pytest.mark.parametrize("a, h, saved", [(96, 12288, 0.70), (128, 20480, 0.65)])
def test_selective_recompute_saves_70_percent_for_gpt3_and_65_for_mt_nlg(a, h, saved):
    # Section 4.2 quotes these savings (read here through a secondary summary, not the paper itself);
    # the ratio is 5as/h / (34 + 5as/h): 80/114 for GPT-3, 64/98 for MT-NLG 530B (s = 2048 for both).
    for t, sp in [(1, False), (8, True)]:
        full = activation_bytes_per_layer(2048, 1, h, a, t=t, sequence_parallel=sp)
        kept = activation_bytes_per_layer(2048, 1, h, a, t=t, sequence_parallel=sp, recompute="selective")
        assert 1 - kept / full == pytest.approx(saved, abs=0.005)


@given(st.integers(1, 8192), st.integers(1, 64), st.integers(1, 512), st.integers(1, 128),
       st.sampled_from(["none", "selective", "full"]))
def test_activation_relations_hold_for_any_shape(s, b, head_dim, a, recompute):
    h = head_dim * a
    one = activation_bytes_per_layer(s, b, h, a, recompute=recompute)
    assert activation_bytes_per_layer(s, b, h, a, t=1, sequence_parallel=True, recompute=recompute) == one
    for t in (2, 4, 8):
        tp = activation_bytes_per_layer(s, b, h, a, t=t, recompute=recompute)
        sp = activation_bytes_per_layer(s, b, h, a, t=t, sequence_parallel=True, recompute=recompute)
        assert sp == pytest.approx(one / t, rel=1e-12)  # TP + SP divides everything by t
        assert sp <= tp <= one
    none, selective, full = (activation_bytes_per_layer(s, b, h, a, t=4, recompute=r)
                             for r in ("none", "selective", "full"))
    assert none - selective == pytest.approx(5 * a * s * s * b / 4, rel=1e-9)  # the 5as^2b/t attention term
    assert full <= selective < none


@pytest.mark.parametrize("kwargs, message", [
    (dict(recompute="some"), "recompute"),
    (dict(t=0), "t"),
    (dict(s=0), "s"),
])
def test_activation_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        activation_bytes_per_layer(**{**GPT3, **kwargs})


# Pipeline bubble (Narayanan et al. 2021, section 2.2)

def test_bubble_examples():
    assert bubble_fraction(4, 8) == 3 / 8
    assert bubble_fraction(4, 8, v=2) == 3 / 16
    assert bubble_fraction(1, 8) == 0.0


@given(st.integers(1, 64), st.integers(1, 512), st.integers(1, 8))
def test_bubble_shrinks_with_micro_batches_and_virtual_stages(p, m, v):
    f = bubble_fraction(p, m, v)
    assert bubble_fraction(p, m + 1, v) <= f and bubble_fraction(p, m, v + 1) <= f
    assert bubble_fraction(p + 1, m, v) > f
    # As a share of the whole step: (p-1)/(v·m + p-1), the form notebook 05 measures.
    assert f / (1 + f) == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("args", [(0, 8), (4, 0), (4, 8, 0), (4, 2.5)])
def test_bubble_rejects_bad_arguments(args):
    with pytest.raises(ValueError, match="whole number"):
        bubble_fraction(*args)


def test_zero_bubble_h1_is_a_third_of_1f1b_with_equal_passes():
    # Qi et al. 2024, section 2.1: with T_F = T_B = T_W, ZB-H1's bubble is a third of 1F1B's, (p-1)/(3m).
    assert zero_bubble_h1_bubble(4, 8) == pytest.approx(bubble_fraction(4, 8) / 3)
    assert zero_bubble_h1_bubble(1, 8) == 0.0
    # In general (p-1)(T_F+T_B-T_W) over m(T_F+T_B+T_W): W hides in the bubble, F and B do not.
    assert zero_bubble_h1_bubble(4, 8, 1.0, 2.0, 0.5) == pytest.approx(3 * 2.5 / (8 * 3.5))


@pytest.mark.parametrize("args", [(0, 8), (4, 0), (4, 8, -1.0, 1.0, 1.0), (4, 8, 0.0, 0.0, 0.0)])
def test_zero_bubble_rejects_bad_arguments(args):
    with pytest.raises(ValueError):
        zero_bubble_h1_bubble(*args)


# FLOPs and MFU (PaLM, Chowdhery et al. 2022)

def test_training_flops_gpt3():
    # GPT-3 (Brown et al. 2020) Table D.1: 174,600M parameters, 300B tokens, 3.14E+23 FLOPs.
    assert training_flops(174.6e9, 300e9) == pytest.approx(3.14e23, abs=0.005e23)


def test_palm_540b_mfu_is_46_2_percent():
    # PaLM 540B: 540.35B parameters, 118 layers, 48 heads of size 256, sequence 2048 (Table 1);
    # 238.3K tokens/s on 6144 TPU v4 chips at 275 TFLOP/s gives 46.2% MFU (Table 3, appendix B).
    per_token = flops_per_token(540.35e9, 118, 48 * 256, 2048)
    assert per_token == 6 * 540.35e9 + 12 * 118 * 12288 * 2048
    assert mfu(238.3e3, per_token, 6144, 275e12) == pytest.approx(0.462, abs=0.0005)
    # PaLM's d_model is 18432, wider than heads x head size; using it would print 46.5%.
    wrong = flops_per_token(540.35e9, 118, 18432, 2048)
    assert mfu(238.3e3, wrong, 6144, 275e12) > 0.4645


@given(st.floats(1e6, 1e12), st.integers(1, 128), st.integers(64, 32768), st.integers(128, 131072))
def test_flops_per_token_is_6n_plus_attention(n, layers, hidden, seq):
    per_token = flops_per_token(n, layers, hidden, seq)
    assert per_token == pytest.approx(training_flops(n, 1) + 12 * layers * hidden * seq, rel=1e-12)
    assert flops_per_token(n, 0, hidden, seq) == training_flops(n, 1)


def test_mfu_is_one_at_peak():
    assert mfu(1e3, 1e9, 4, 2.5e11) == 1.0
    with pytest.raises(ValueError, match="peak_flops"):
        mfu(1e3, 1e9, 4, 0)
    with pytest.raises(ValueError, match="n_devices"):
        mfu(1e3, 1e9, 0, 1e12)


# Bus bandwidth (nccl-tests doc/PERFORMANCE.md)

def test_bus_bandwidth_examples():
    assert bus_bandwidth(100e9, 8, "all_reduce") == pytest.approx(100e9 * 14 / 8, rel=1e-15)
    assert bus_bandwidth(100e9, 8, "all_gather") == pytest.approx(100e9 * 7 / 8, rel=1e-15)
    assert bus_bandwidth(100e9, 8, "broadcast") == 100e9


@given(st.floats(0, 1e12), st.integers(1, 1024),
       st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"]))
def test_bus_bandwidth_uses_the_simulators_factors(algbw, n, op):
    assert bus_bandwidth(algbw, n, op) == algbw * bus_factor(op, n)


def test_bus_bandwidth_rejects_unknown_ops():
    for op in ("barrier", "allreduce"):
        with pytest.raises(ValueError, match="op must be one of"):
            bus_bandwidth(1e9, 8, op)


# Expert capacity (Switch Transformer, Fedus et al. 2021, section 2.2)

def test_expert_capacity_rounds_up():
    # Worked by hand, not taken from the paper.
    assert expert_capacity(1024, 8, 1.25) == 160  # exact
    assert expert_capacity(10, 4, 1.0) == 3       # 2.5 -> 3
    assert expert_capacity(6, 4, 1.25) == 2       # 1.875 -> 2
    assert expert_capacity(150, 3, 1.1) == 55     # 150 / 3 * 1.1 is 55.00000000000001 in floats


@given(st.integers(0, 10**6), st.integers(1, 512), st.sampled_from([0.5, 1.0, 1.1, 1.25, 1.5, 2.0]))
def test_expert_capacity_is_the_smallest_whole_cover(tokens, experts, factor):
    c = expert_capacity(tokens, experts, factor)
    need = tokens * factor
    assert c * experts >= need * (1 - 1e-12)
    assert (c - 1) * experts < need * (1 + 1e-12)
    if factor >= 1:
        assert c * experts >= tokens  # a perfectly balanced batch drops nothing


@pytest.mark.parametrize("args", [(10, 0, 1.0), (10, 4, 0.0), (10, 4, math.inf), (-1, 4, 1.0)])
def test_expert_capacity_rejects_bad_arguments(args):
    with pytest.raises(ValueError):
        expert_capacity(*args)
