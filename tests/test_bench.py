"""The benchmarks keep working and compare like with like. No test here asserts a timing."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import check_times
from bench.rows import PAIRS, ROWS
from bench.runner import alpha_beta
from bench.sim_speed import FIGURES, Figure, table
from bench.timing import Steps, Timing
from lib import launch

ROOT = Path(__file__).resolve().parents[1]


def test_steps_time_each_step_from_taking_one_item_to_taking_the_next():
    steps = Steps(["a", "b", "c"])
    assert [item for item in steps] == ["a", "b", "c"]
    assert len(steps.marks) == 4 and len(steps.durations()) == 3
    assert all(d >= 0 for d in steps.durations())


def test_a_step_counts_at_the_pace_of_the_slowest_rank():
    # two launches, two ranks each, three steps: the slowest rank differs from step to step
    runs = [[[1.0, 5.0, 2.0], [3.0, 1.0, 2.0]],
            [[4.0, 1.0, 1.0], [1.0, 6.0, 1.0]]]
    t = Timing.slowest_rank(runs)
    assert (t.median, t.min, t.max, t.samples) == (3.5, 1.0, 6.0, 6)


def test_calibration_recovers_latency_and_bandwidth_of_the_ring_model():
    world, latency, bandwidth = 4, 2e-3, 0.5e9

    def ring(size: int) -> float:
        return 2 * (world - 1) * latency + 2 * (world - 1) / world * size / bandwidth
    fitted = alpha_beta(world, 2**10, ring(2**10), 2**22, ring(2**22))
    assert fitted == pytest.approx((latency, bandwidth), rel=1e-9)
    # noise can make the big message look no slower than the small one: both stay positive and finite
    noisy = alpha_beta(world, 2**10, 5e-3, 2**20, 4e-3)
    assert all(0 < v < math.inf for v in noisy)


def test_the_speed_table_has_a_column_per_checkout_and_their_ratio():
    figure = Figure("a check, warm", "k", {"main": [0.2, 0.1, 0.3], "old": [0.4, 0.5, 0.4]})
    lines = table([figure]).splitlines()
    assert lines[0] == "| what | main | old | main / old |"
    assert lines[2] == "| a check, warm | 200.0 ms (100.0-300.0) | 400.0 ms (400.0-500.0) | 0.50× |"


def test_check_times_update_only_their_part_of_a_results_file(tmp_path):
    stem = tmp_path / "machine"
    stem.with_suffix(".json").write_text(json.dumps({"rows": [1], "check_times": []}))
    stem.with_suffix(".md").write_text(f"Measured on X.\n\n| rows |\n\n{check_times.TABLE_TITLE} old\n| old |\n")
    timed = [check_times.CheckTime("02_data_parallel", "ring_all_reduce", 1.5, 0.5, 1.25, 0.25)]
    check_times.update(stem, timed)
    assert json.loads(stem.with_suffix(".json").read_text()) == {"rows": [1], "check_times": [timed[0].as_dict()]}
    md = stem.with_suffix(".md").read_text()
    assert md.startswith("Measured on X.\n\n| rows |\n\n") and "old" not in md
    assert "| 02_data_parallel | `ring_all_reduce` | 1.50 s | 1.25 s | 0.50 s | 0.25 s |" in md


def _named(value) -> dict:
    """What a side returned, as {name: tensor}: a module's parameters, or the dict it gave."""
    if isinstance(value, torch.nn.Module):
        return {n: p.detach() for n, p in value.named_parameters()}
    return dict(value)


def _both_sides(dist, comparisons):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for a, b, inputs in comparisons:
        out.append([_named(fn(dist, *inputs(world, rank, 2))) for fn in (a, b)])
    return out


@pytest.mark.slow
def test_both_sides_of_every_row_and_pair_do_the_same_work():
    """Same model, same data, same steps: after two steps at the quick size, ours and PyTorch's agree (and the
    two schedules of a pair agree where they share their inputs)."""
    cases = [(r.key, r.ours, r.theirs) for r in ROWS]
    cases += [(p.what, p.a, p.b) for p in PAIRS if p.a.setup is p.b.setup]
    comparisons = [(a.fn, b.fn, a.setup.inputs(quick=True)) for _, a, b in cases]
    per_rank = launch(_both_sides, 2, comparisons, timeout=600)
    for rank, results in enumerate(per_rank):
        for (name, a, b), (ours, theirs) in zip(cases, results):
            assert ours.keys() == theirs.keys(), f"{name}: {a.name} and {b.name} return different things"
            for key in ours:
                torch.testing.assert_close(ours[key], theirs[key], rtol=1e-4, atol=1e-5,
                                           msg=lambda m, where=f"{name}, rank {rank}, {key}: {a.name} vs {b.name}":
                                           f"{where}: {m}")


@pytest.mark.slow
def test_quick_run_prints_the_tables_and_writes_json_markdown_and_plot(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "bench", "--quick", "--world", "2", "--repeats", "1", "--steps", "1",
                           "--out", str(tmp_path), "--machine", "test-machine"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| nb | row |" in done.stdout and "ours / PyTorch" in done.stdout
    report = json.loads((tmp_path / "test-machine.json").read_text())
    assert (tmp_path / "test-machine.md").read_text().startswith("Measured on")
    assert (tmp_path / "test-machine.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["settings"]["world"] == 2 and report["settings"]["quick"] is True

    rows = {r["key"]: r for r in report["rows"]}
    assert list(rows) == [r.key for r in ROWS if r.quick]
    for r in rows.values():
        ours, theirs = r["ours_time"], r["theirs_time"]
        assert 0 < ours["min_s"] <= ours["median_s"] <= ours["max_s"]
        assert 0 < theirs["min_s"] <= theirs["median_s"] <= theirs["max_s"]
        assert math.isclose(r["ratio"], ours["median_s"] / theirs["median_s"])
    # bytes come from the simulated run of our algorithm: a ring all-reduce sends 2(N-1)/N of the message per rank
    # (the whole message on 2 ranks), and data parallelism all-reduces every gradient once per step
    for r in rows.values():
        if r["message_bytes"] is not None:
            assert r["bytes_sent_per_rank_per_step"] == r["message_bytes"]
            assert r["busbw_ours"] > 0 and r["busbw_theirs"] > 0
    ddp = next(row for row in ROWS if row.key == "ddp")
    model = ddp.ours.setup.inputs(quick=True)(2, 0, 1)[0]
    assert rows["ddp"]["bytes_sent_per_rank_per_step"] == sum(p.nbytes for p in model.parameters())

    fidelity = report["fidelity"]
    assert [p["what"] for p in fidelity["pairs"]] == [p.what for p in PAIRS]
    for p in fidelity["pairs"]:
        assert all(p[k] > 0 and math.isfinite(p[k]) for k in ("measured_ratio", "predicted_ratio",
                                                               "predicted_ratio_h100"))
    assert fidelity["calibration"]["flops_per_s"] > 0 and fidelity["calibration"]["bandwidth_bytes_per_s"] > 0
    assert [c["puzzle"] for c in report["check_times"]] == ["ring_all_reduce"]
    assert all(c[k] > 0 for c in report["check_times"] for k in ("first_s", "warm_s", "first_cpu_s", "warm_cpu_s"))
    assert [r["ranks"] for r in report["ring_scaling"]] == [8]
    speed = {s["key"]: s["samples_s"]["this checkout"] for s in report["sim_speed"]}
    assert speed.keys() == {key for _, key in FIGURES}
    assert all(len(v) == 1 and v[0] > 0 for k, v in speed.items() if k != "per_op_overhead_s")
