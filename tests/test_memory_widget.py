"""The memory calculator adds up lib.analytic.formulas per device, and its widget and figure show what they claim."""

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lib.analytic.formulas import activation_bytes_per_layer  # noqa: E402
from lib.viz.memory import (COMPONENT_LABELS, PRESETS, Model, memory_calculator, memory_figure,  # noqa: E402
                            memory_per_device)

GB = 1e9  # decimal, as the ZeRO paper's "120GB" for 16 bytes x 7.5e9 parameters
GIB = 2**30  # what the calculator prints and draws (lib.units' convention)
ZERO_7_5B = Model("ZeRO's 7.5B", 7.5e9, layers=32, hidden=4096, heads=32)
LLAMA_7B = PRESETS["LLaMA-2 7B"]
S, B, H, A, L = 2048, 1, LLAMA_7B.hidden, LLAMA_7B.heads, LLAMA_7B.layers


def model_states(parts: dict) -> float:
    return parts["weights"] + parts["gradients"] + parts["optimizer"]


def readout_total(readout: str) -> float:
    ((value, unit),) = re.findall(r"^\s+total\s+([\d,.]+) ([GT]iB)", readout, flags=re.M)
    return float(value.replace(",", "")) * {"GiB": GIB, "TiB": 1024 * GIB}[unit]


@pytest.mark.parametrize("stage, printed_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_figure1_7_5b_model_on_64_gpus(stage, printed_gb):
    parts = memory_per_device(ZERO_7_5B, zero_stage=stage, dp=64)
    assert set(parts) == {"weights", "gradients", "optimizer", "activations"}
    assert model_states(parts) / GB == pytest.approx(printed_gb, abs=0.05)    # Figure 1 prints one decimal
    # Activations do not depend on ZeRO: it shards model states only.
    assert parts["activations"] == memory_per_device(ZERO_7_5B, dp=64)["activations"]


def test_tp_and_pp_shard_the_parameters_before_zero():
    full = memory_per_device(ZERO_7_5B, zero_stage=1, dp=64)
    sharded = memory_per_device(ZERO_7_5B, zero_stage=1, dp=64, tp=2, pp=4)
    for part in ("weights", "gradients", "optimizer"):
        assert sharded[part] == pytest.approx(full[part] / 8, rel=1e-12)


def test_doubling_the_micro_batch_doubles_activations_only():
    one = memory_per_device(LLAMA_7B, micro_batch=1)
    two = memory_per_device(LLAMA_7B, micro_batch=2)
    assert two["activations"] == pytest.approx(2 * one["activations"], rel=1e-12)
    assert model_states(two) == model_states(one)


def test_full_recomputation_keeps_2sbh_per_layer():
    parts = memory_per_device(LLAMA_7B, seq=S, micro_batch=B, recompute="full")
    assert parts["activations"] == pytest.approx(2 * S * B * H * L, rel=1e-12)
    kept = memory_per_device(LLAMA_7B, seq=S, micro_batch=B)["activations"]
    assert kept == pytest.approx(S * B * H * (34 + 5 * A * S / H) * L, rel=1e-12)     # Korthikanti Table 2
    assert parts["activations"] < kept / 50


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tp_with_sequence_parallel_divides_the_34sbh_term_by_t(t):
    alone = memory_per_device(LLAMA_7B, recompute="selective")["activations"]
    assert alone == pytest.approx(34 * S * B * H * L, rel=1e-12)
    sp = memory_per_device(LLAMA_7B, tp=t, sequence_parallel=True, recompute="selective")["activations"]
    assert sp == pytest.approx(alone / t, rel=1e-12)
    tp_only = memory_per_device(LLAMA_7B, tp=t, recompute="selective")["activations"]
    assert tp_only == pytest.approx((10 + 24 / t) * S * B * H * L, rel=1e-12)      # norms, dropouts replicated


@pytest.mark.parametrize("pp", [1, 2, 4, 8])
def test_first_1f1b_stage_holds_every_layer_worth_of_activations(pp):
    # L/p layers per stage times p micro-batches in flight (Korthikanti et al. 2022, section 4.2.3).
    parts = memory_per_device(LLAMA_7B, pp=pp)
    assert parts["activations"] == pytest.approx(L * activation_bytes_per_layer(S, B, H, A), rel=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    (dict(pp=3), "pp=3 .* 32 layers"), (dict(tp=3), "tp=3 .* 32 attention heads"), (dict(pp=0), "pp=0"),
    (dict(zero_stage=4), "zero_stage"), (dict(recompute="some"), "recompute"),
])
def test_impossible_configurations_say_why(kwargs, message):
    with pytest.raises(ValueError, match=message):
        memory_per_device(LLAMA_7B, **kwargs)


def test_figure_stacks_components_in_gib_under_the_h100_line():
    parts = [memory_per_device(ZERO_7_5B, zero_stage=s, dp=64) for s in range(4)]
    fig = memory_figure(parts, labels=[f"ZeRO-{s}" for s in range(4)])
    (ax,) = fig.axes
    assert len(ax.patches) == 4 * 4
    assert ax.patches[0].get_height() == pytest.approx(parts[0]["weights"] / GIB)          # 15 GB of bf16 weights
    tops = [max(p.get_y() + p.get_height() for p in ax.patches if abs(p.get_x() + p.get_width() / 2 - i) < 1e-9)
            for i in range(4)]
    assert tops == pytest.approx([sum(p.values()) / GIB for p in parts])
    (line,) = ax.get_lines()
    assert line.get_ydata()[0] == pytest.approx(80) and "80 GiB" in line.get_label()
    assert "GiB" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert set(COMPONENT_LABELS.values()) < set(legend)
    assert fig.number not in plt.get_fignums()         # closed, so a notebook shows it once


def test_figure_takes_a_single_breakdown():
    fig = memory_figure(memory_per_device(LLAMA_7B), labels=["7B"])
    assert len(fig.axes[0].patches) == 4


@pytest.fixture
def calculator():
    return memory_calculator()


def test_zero_3_at_dp_8_lowers_the_total_and_redraws(calculator):
    c, s = calculator.controls, calculator.state
    c["dp"].value = 8
    fig0, total0 = s.fig, readout_total(s.readout)
    assert total0 == pytest.approx(sum(s.breakdown.values()), rel=1e-3)
    c["zero_stage"].value = 3
    assert s.fig is not fig0 and "ZeRO-3" in s.readout
    # Model states go from 16 bytes per parameter to 16/8; activations stay.
    assert total0 - readout_total(s.readout) == pytest.approx(16 * 7e9 * (1 - 1 / 8), abs=0.01 * GIB)
    assert s.breakdown == memory_per_device(LLAMA_7B, zero_stage=3, dp=8)


def test_70b_fits_only_with_zero_3_over_64_and_full_recompute(calculator):
    c, s = calculator.controls, calculator.state
    c["model"].value = "LLaMA-2 70B"
    c["dp"].value = 1
    assert "does NOT fit in 80 GiB" in s.readout and readout_total(s.readout) > 1000 * GB
    c["zero_stage"].value = 3
    c["dp"].value = 64
    assert "does NOT fit" in s.readout               # model states fit; the activations of 80 layers do not
    c["recompute"].value = "full"
    assert "fits in 80 GiB" in s.readout and "NOT" not in s.readout
    assert readout_total(s.readout) < 80 * GIB
    assert s.fig.axes[0].get_lines()[0].get_ydata()[0] == pytest.approx(80)


def test_impossible_split_explains_instead_of_raising(calculator):
    c, s = calculator.controls, calculator.state
    c["model"].value = "GPT-3 125M"
    c["tp"].value = 8
    assert s.fig is None and s.breakdown is None
    assert "12 attention heads" in s.readout
    c["tp"].value = 4
    assert s.fig is not None and "fits" in s.readout
