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

from bench import activations, check_times
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
    timed = [check_times.CheckTime("02_data_parallel", "ring_all_reduce", 1.5, 0.5, 1.25, 0.25, warm_cpu_max=0.4,
                                   repeats=4)]
    check_times.update(stem, timed)
    assert json.loads(stem.with_suffix(".json").read_text()) == {"rows": [1], "check_times": [timed[0].as_dict()]}
    md = stem.with_suffix(".md").read_text()
    assert md.startswith("Measured on X.\n\n| rows |\n\n") and "old" not in md
    assert "| 02_data_parallel | `ring_all_reduce` | 1.50 s | 1.25 s | 0.50 s | 0.25 s | 0.40 s |" in md
    assert "the same check 4 times more" in md


def test_check_times_into_a_machine_not_timed_before_start_its_results(tmp_path):
    stem = tmp_path / "new-machine"
    timed = [check_times.CheckTime("02_data_parallel", "ring_all_reduce", 1.5, 0.5, 1.25, 0.25, warm_cpu_max=0.4,
                                   repeats=4)]
    check_times.update(stem, timed)
    assert json.loads(stem.with_suffix(".json").read_text()) == {"check_times": [timed[0].as_dict()]}
    assert stem.with_suffix(".md").read_text().startswith(check_times.TABLE_TITLE)
    assert "| 02_data_parallel | `ring_all_reduce` | 1.50 s | 1.25 s | 0.50 s | 0.25 s | 0.40 s |" in \
        stem.with_suffix(".md").read_text()


def test_timing_some_checks_again_keeps_the_others_rows_in_the_course_order(tmp_path):
    stem = tmp_path / "machine"
    first = [check_times.CheckTime("02_data_parallel", name, 1.0, 1.0, 1.0, 1.0, warm_cpu_max=1.0, repeats=6)
             for name in ("ring_reduce_scatter", "ring_all_reduce")]
    stem.with_suffix(".json").write_text(json.dumps({"rows": [1], "check_times": [c.as_dict() for c in first]}))
    stem.with_suffix(".md").write_text(f"Measured on X.\n\n{check_times.TABLE_TITLE} old\n")
    again = [check_times.CheckTime("01_memory", "count_parameters", 0.5, 0.5, 0.5, 0.5, warm_cpu_max=0.5, repeats=8),
             check_times.CheckTime("02_data_parallel", "ring_all_reduce", 2.0, 2.0, 2.0, 2.0, warm_cpu_max=2.0,
                                   repeats=8)]
    check_times.update(stem, again)
    rows = json.loads(stem.with_suffix(".json").read_text())["check_times"]
    assert [(r["puzzle"], r["first_s"]) for r in rows] == [("count_parameters", 0.5), ("ring_reduce_scatter", 1.0),
                                                          ("ring_all_reduce", 2.0)]
    assert "the same check 6 to 8 times more" in stem.with_suffix(".md").read_text()


def _named(value) -> dict:
    """What a side returned, as {name: tensor}: a module's parameters, or the dict it gave."""
    if isinstance(value, torch.nn.Module):
        return {n: p.detach() for n, p in value.named_parameters()}
    return dict(value)


def _both_sides(dist, comparisons):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for a, b, inputs, steps in comparisons:
        out.append([_named(fn(dist, *inputs(world, rank, steps))) for fn in (a, b)])
    return out


def _close(got: dict, want: dict, where: str) -> None:
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-5,
                                   msg=lambda m, key=key: f"{where}, {key}: {m}")


def _compare(cases: list, world: int) -> None:
    """Run both sides of each case (name, ours, theirs, agrees) for two steps (two rounds where steps come in
    rounds) at the quick size on `world` real ranks. Where they compute the same thing, they agree; where they do
    not (DiLoCo and DDP), each keeps the replicas of its model equal on every rank."""
    comparisons = [(a.fn, b.fn, a.setup.inputs(quick=True), 2 * a.setup.round_size(quick=True))
                   for _, a, b, _ in cases]
    per_rank = launch(_both_sides, world, comparisons, timeout=600)
    for rank, results in enumerate(per_rank):
        for i, ((name, a, b, agrees), (ours, theirs)) in enumerate(zip(cases, results)):
            assert ours.keys() == theirs.keys(), f"{name}: {a.name} and {b.name} return different things"
            if agrees:
                _close(ours, theirs, f"{name}, rank {rank}: {a.name} vs {b.name}")
            else:
                first_ours, first_theirs = per_rank[0][i]
                _close(ours, first_ours, f"{name}: {a.name}, rank {rank} vs rank 0")
                _close(theirs, first_theirs, f"{name}: {b.name}, rank {rank} vs rank 0")


@pytest.mark.slow
def test_both_sides_of_every_row_and_pair_do_the_same_work():
    """Same model, same data, same steps: after two steps at the quick size, ours and PyTorch's agree (and the
    two schedules of a pair agree where they share their inputs)."""
    cases = [(r.key, r.ours, r.theirs, r.agrees) for r in ROWS]
    cases += [(p.what, p.a, p.b, True) for p in PAIRS if p.a.setup is p.b.setup]
    _compare(cases, 2)


@pytest.mark.slow
def test_the_2d_row_agrees_on_a_real_2x2_mesh():
    """On 2 ranks notebook 06's mesh is (dp, tp) = (1, 2); on 4 both axes have 2 ranks, as in the benchmark."""
    row = next(r for r in ROWS if r.key == "tp-dp")
    assert row.ours.setup.inputs(quick=True)(4, 0, 1)[3:5] == (2, 2)
    _compare([(row.key, row.ours, row.theirs, row.agrees)], 4)


def test_one_call_marks_a_step_at_its_last_collective_or_spreads_a_round_over_its_steps():
    from bench.timing import _marks

    # 2 collectives a step: a step ends with its second
    assert _marks(0.0, [1.0, 2.0, 3.0, 5.0], 2) == [0.0, 2.0, 5.0]
    # one collective every 2 steps: each round's time split evenly
    assert _marks(0.0, [4.0, 6.0], 4) == [0.0, 2.0, 4.0, 5.0, 6.0]
    with pytest.raises(ValueError, match="3 steps made 2 communication calls"):
        _marks(0.0, [1.0, 2.0], 3)


def test_a_round_counts_as_one_sample_its_mean_step():
    from bench.timing import per_round

    assert per_round([1.0, 3.0, 2.0, 2.0, 9.0], 2) == [2.0, 2.0]
    assert per_round([1.0, 3.0], 1) == [1.0, 3.0]


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
    # DiLoCo all-reduces the whole model once per round of H steps; on 2 ranks notebook 06's mesh is (dp, tp) =
    # (1, 2), so a step sends g's all-reduce of the output alone (rows × hidden floats)
    diloco = next(row for row in ROWS if row.key == "diloco")
    model, _, inner_steps, *_ = diloco.ours.setup.inputs(quick=True)(2, 0, 1)
    assert rows["diloco"]["bytes_sent_per_rank_per_step"] == sum(p.nbytes for p in model.parameters()) / inner_steps
    mesh = next(row for row in ROWS if row.key == "tp-dp").ours.setup.quick
    assert rows["tp-dp"]["bytes_sent_per_rank_per_step"] == mesh["rows"] * mesh["hidden"] * 4

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


def test_rows_measured_apart_merge_into_earlier_results_and_keep_the_rest(tmp_path):
    from bench.report import Report, merge_rows
    from bench.runner import RowResult

    def result(key: str, seconds: float) -> RowResult:
        row = next(r for r in ROWS if r.key == key)
        return RowResult(row, Timing(seconds, seconds, seconds, 1), Timing(1.0, 1.0, 1.0, 1), 4, None, 8.0)

    settings = {"world": 4, "backend": "gloo", "quick": False, "repeats": 3, "steps": 3, "warmup": 1}
    info = {"name": "m", "cpu": "X", "cores": 2, "gpus": [], "torch": "t", "python": "p", "os": "o",
            "load_average": [9.0, 9.0, 9.0]}
    earlier = Report(info, settings, rows=[result("diloco", 3.0), result("ddp", 2.0)])
    earlier.write(tmp_path)
    stem = tmp_path / "m"
    stem.with_suffix(".md").write_text(stem.with_suffix(".md").read_text() + "\nthe next part\n")
    merge_rows(stem, Report(info, settings, rows=[result("diloco", 0.5), result("tp-dp", 1.5)]))

    data = json.loads(stem.with_suffix(".json").read_text())
    assert [(r["key"], r["ratio"]) for r in data["rows"]] == [("ddp", 2.0), ("tp-dp", 1.5), ("diloco", 0.5)]
    assert "measured_apart" in data["rows"][1] and "measured_apart" not in data["rows"][0]
    md = stem.with_suffix(".md").read_text()
    assert md.count("| 09 |") == 1 and "**0.50×**" in md and "**3.00×**" not in md and "**2.00×**" in md
    assert md.rstrip().endswith("the next part")
    assert stem.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="would not compare"):
        merge_rows(stem, Report(info, {**settings, "world": 2}, rows=[result("diloco", 0.5)]))


def test_the_activation_table_measures_every_variant_against_the_formula(capsys):
    text = activations.main(["--device", "cpu"])
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == len(activations.CPU_SHAPES) * len(activations.VARIANTS)
    for row in rows:                                    # saved / formula, but where the CPU keeps the s×s scores
        dropout, flash, ratio = row[4], row[5], float(row[8])
        assert 1.0 <= ratio < 1.01 or (flash == "yes" and dropout != "0")
    assert "falls back to the s×s math kernel" in text and text in capsys.readouterr().out


def test_the_engines_digest_is_the_same_for_the_same_seed_and_moves_with_what_a_check_measures():
    """bench.sim_speed --digest: equal digests say a change of the engine moved nothing a check judges."""
    from bench.sim_speed import digest
    from lib.sim import runtime
    one, result = [("data_parallel", "ring_all_reduce")], runtime.Runtime.result
    first = digest(one, seed=0)
    assert runtime.Runtime.result is result                                  # the hook is taken off
    assert first["runs"] >= 2 and digest(one, seed=0) == first
    assert digest(one, seed=1)["sha256"] != first["sha256"]                    # other cases, other runs
    from lib.sim.cost import CostModel
    p2p_time = CostModel.p2p_time

    def slower(self, nbytes, src, dst):         # every message a picosecond longer (the meters' invariants still hold)
        return p2p_time(self, nbytes, src, dst) + 1e-12
    CostModel.p2p_time = slower
    try:
        assert digest(one, seed=0)["sha256"] != first["sha256"]
    finally:
        CostModel.p2p_time = p2p_time
    assert digest(one, seed=0) == first
