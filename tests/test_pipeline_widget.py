"""The schedule explorer draws GPipe, 1F1B, interleaved 1F1B and ZB-H1 from their orders, with the papers'
bubbles; 1F1B and ZB-H1 refuse m < p with a clear error, in the widget and in the reference solutions; ZB-H1's
order is torch.distributed.pipelining's."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import puzzles.pipeline as P  # noqa: E402
import solutions.pipeline as S  # noqa: E402
from lib.errors import RankFailed  # noqa: E402
from lib.analytic.formulas import bubble_fraction, zero_bubble_h1_bubble  # noqa: E402
from lib.sim import run  # noqa: E402
from lib.analytic.schedules import ScheduleError, Step, bubble_of, peak_in_flight, play, schedule_orders  # noqa: E402
from lib.viz.pipeline import draw_schedule, schedule_explorer  # noqa: E402


@pytest.mark.parametrize("name,p,m,v", [("gpipe", 4, 8, 1), ("gpipe", 3, 2, 1), ("1f1b", 4, 8, 1),
                                        ("1f1b", 2, 5, 1), ("1f1b", 8, 8, 1), ("interleaved", 4, 8, 2),
                                        ("interleaved", 4, 12, 3), ("interleaved", 2, 6, 2)])
@pytest.mark.parametrize("ratio", [1.0, 2.0, 3.5])
def test_bubble_of_every_schedule_is_the_formula(name, p, m, v, ratio):
    slots = play(schedule_orders(name, p, m, v), v, 1.0, ratio)
    assert bubble_of(slots) == pytest.approx(bubble_fraction(p, m, v))
    assert max(s.end for s in slots) == pytest.approx((m * v + p - 1) * (1 + ratio) / v)


def test_every_micro_batch_runs_forward_then_backward_once_on_every_stage():
    for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
        orders = schedule_orders(name, 4, 8, v)
        for order in orders:
            assert sorted((w.kind, w.chunk, w.mb) for w in order) == sorted(
                (k, c, j) for k in "FB" for c in range(v) for j in range(8))


def test_memory_gpipe_holds_m_and_1f1b_holds_p_minus_r():
    assert peak_in_flight(schedule_orders("gpipe", 4, 8)) == [8] * 4
    assert peak_in_flight(schedule_orders("1f1b", 4, 8)) == [4, 3, 2, 1]
    assert peak_in_flight(schedule_orders("1f1b", 4, 32)) == [4, 3, 2, 1]


def test_an_order_that_waits_forever_is_reported():
    orders = [[Step("B", 0, 0), Step("F", 0, 0)], [Step("F", 0, 0), Step("B", 0, 0)]]
    with pytest.raises(ScheduleError, match="waits forever"):
        play(orders)


@pytest.mark.parametrize("name,p,m,v,words", [("1f1b", 4, 3, 1, "m=3 < p=4"), ("interleaved", 4, 6, 2, "multiple of p"),
                                              ("gpipe", 4, 8, 2, "v must be 1")])
def test_refused_settings_say_why(name, p, m, v, words):
    with pytest.raises(ScheduleError, match=words):
        schedule_orders(name, p, m, v)
    state = draw_schedule(name, p, m, v)
    assert state.fig is None and words in state.readout


def test_one_f_one_b_with_too_few_micro_batches_is_a_clear_error_not_a_hang():
    case = P.one_f_one_b.make_case(__import__("random").Random(0), 4)
    stages, batch, targets, _ = case.args
    with pytest.raises(RankFailed, match=r"needs at least as many micro-batches as stages: m=2 < p=4"):
        run(S.one_f_one_b, 4, stages, batch, targets, 2, cost=case.cost)


def test_explorer_redraws_and_reports_the_bubble():
    box = schedule_explorer()
    s = box.state
    assert s.bubble == pytest.approx(bubble_fraction(4, 8)) and s.in_flight == [4, 3, 2, 1]
    assert "0.375" in s.readout and s.fig.number not in plt.get_fignums()
    box.controls["schedule"].value = "interleaved"
    assert s.bubble == pytest.approx(bubble_fraction(4, 8, 2))
    box.controls["m"].value = 16
    assert s.bubble == pytest.approx(bubble_fraction(4, 16, 2))
    box.controls["schedule"].value = "gpipe"
    assert s.in_flight == [16] * 4 and s.bubble == pytest.approx(bubble_fraction(4, 16))
    box.controls["schedule"].value = "1f1b"
    box.controls["m"].value = 2
    assert s.fig is None and "m=2 < p=4" in s.readout


def test_simulated_bubble_of_the_solutions_is_the_formula():
    for puzzle, fn in ((P.gpipe, S.gpipe), (P.one_f_one_b, S.one_f_one_b)):
        for p in (2, 4):
            case = puzzle.make_case(__import__("random").Random(1), p)
            result = run(fn, p, *case.args, cost=case.cost)
            assert P.measured_bubble(result) == pytest.approx(bubble_fraction(p, case.args[3]), rel=P.CLOSE)
            _assert_time_is_the_played_schedule(result, case, "gpipe" if fn is S.gpipe else "1f1b")


def _assert_time_is_the_played_schedule(result, case, schedule, v=1):
    """The run takes the schedule played with each stage's measured times, plus the boundary copies the
    budget allows for: no more, and never less."""
    stages, batch, targets, m = case.args
    order = [s for i in range(v) for s in (stages.values if v == 1 else [r[i] for r in stages.values])]
    step = P.schedule_step_time(schedule, order, batch[:len(batch) // m], targets[:len(targets) // m], m, v,
                                split=schedule == "zb-h1")
    (budget,) = [b for b in case.budgets if b.metric == "time"]
    assert step <= result.time <= budget.limit


def test_interleaved_with_m_not_a_multiple_of_p_is_a_clear_error_not_a_hang():
    case = P.interleaved_1f1b.make_case(__import__("random").Random(0), 4)
    chunks, batch, targets, _ = case.args
    with pytest.raises(RankFailed, match=r"m=6 must be a multiple of p=4"):
        run(S.interleaved_1f1b, 4, chunks, batch[:48], targets[:48], 6, cost=case.cost)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_simulated_bubble_of_interleaved_is_the_formula_and_the_explorer_agrees(p):
    case = P.interleaved_1f1b.make_case(__import__("random").Random(2), p)
    chunks, _, _, m = case.args
    v = len(chunks.values[0])
    result = run(S.interleaved_1f1b, p, *case.args, cost=case.cost)
    assert P.measured_bubble(result) == pytest.approx(bubble_fraction(p, m, v), rel=P.CLOSE)
    _assert_time_is_the_played_schedule(result, case, "interleaved", v)
    assert bubble_of(play(schedule_orders("interleaved", p, m, v), v)) == pytest.approx(bubble_fraction(p, m, v))


# ---- ZB-H1 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("p,m", [(2, 2), (2, 5), (3, 7), (4, 4), (4, 8), (5, 13), (8, 8)])
@pytest.mark.parametrize("t_f,t_b,t_w", [(1.0, 1.0, 1.0), (1.0, 1.5, 1.0), (1.0, 2.0, 0.5), (2.0, 1.0, 1.0)])
def test_zb_h1_timeline_is_the_papers_formula_while_w_is_no_longer_than_f_and_b(p, m, t_f, t_b, t_w):
    slots = play(schedule_orders("zb-h1", p, m), 1, t_f, t_b + t_w, t_w=t_w)
    assert bubble_of(slots) == pytest.approx(zero_bubble_h1_bubble(p, m, t_f, t_b, t_w))
    assert max(s.end for s in slots) == pytest.approx(m * (t_f + t_b + t_w) + (p - 1) * (t_f + t_b - t_w))


def test_zb_h1_has_a_third_of_1f1bs_bubble_and_its_peak_memory():
    one = play(schedule_orders("1f1b", 4, 8), 1, 1.0, 2.0)
    zb = play(schedule_orders("zb-h1", 4, 8), 1, 1.0, 2.0)
    assert bubble_of(zb) == pytest.approx(bubble_of(one) / 3)
    assert peak_in_flight(schedule_orders("zb-h1", 4, 8)) == [4] * 4     # every rank at 1F1B's rank-0 peak
    assert max(peak_in_flight(schedule_orders("zb-h1", 6, 20))) == max(peak_in_flight(schedule_orders("1f1b", 6, 20)))


def test_a_w_longer_than_a_forward_no_longer_hides_in_the_gaps():
    slots = play(schedule_orders("zb-h1", 4, 8), 1, 1.0, 3.0)            # B = W = 1.5 forwards
    assert bubble_of(slots) > zero_bubble_h1_bubble(4, 8, 1.0, 1.5, 1.5)
    assert "does not describe" in draw_schedule("zb-h1", 4, 8, ratio=3.0).readout


def test_zb_h1_runs_every_micro_batch_forward_input_gradient_weight_gradient_once_in_that_order():
    for order in schedule_orders("zb-h1", 5, 9):
        assert sorted((w.kind, w.mb) for w in order) == sorted((k, j) for k in "FBW" for j in range(9))
        position = {(w.kind, w.mb): i for i, w in enumerate(order)}
        assert all(position["F", j] < position["B", j] < position["W", j] for j in range(9))


def _torch_zero_bubble_orders(dist, p, ms):
    """ScheduleInterleavedZeroBubble's order with one stage per rank, as (kind, micro-batch) per rank."""
    import torch
    import torch.nn.functional as F
    from torch.distributed import pipelining

    kinds = {"FORWARD": "F", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W"}
    orders = {}
    for m in ms:
        stage = pipelining.PipelineStage(torch.nn.Linear(4, 4), dist.get_rank(), p, torch.device("cpu"))
        schedule = pipelining.ScheduleInterleavedZeroBubble([stage], n_microbatches=m, loss_fn=F.mse_loss)
        orders[m] = [[(kinds[a.computation_type.name], a.microbatch_index) for a in schedule.pipeline_order[r]
                      if a is not None] for r in range(p)]
    return orders


@pytest.mark.parametrize("p,ms", [(2, (2, 3, 4, 6)), (3, (3, 5, 6, 8)), (4, (4, 7, 8, 10))])
def test_zb_h1_order_is_torch_pipelinings_interleaved_zero_bubble_with_one_stage_per_rank(p, ms):
    from lib.real.launch import launch

    theirs = launch(_torch_zero_bubble_orders, p, p, ms)[0]
    for m in ms:
        assert [[(w.kind, w.mb) for w in order] for order in schedule_orders("zb-h1", p, m)] == theirs[m]


def test_zero_bubble_with_too_few_micro_batches_is_a_clear_error_not_a_hang():
    with pytest.raises(ScheduleError, match="m=3 < p=4"):
        schedule_orders("zb-h1", 4, 3)
    case = P.zero_bubble.make_case(__import__("random").Random(0), 4)
    stages, batch, targets, _ = case.args
    with pytest.raises(RankFailed, match=r"needs at least as many micro-batches as stages: m=2 < p=4"):
        run(S.zero_bubble, 4, stages, batch, targets, 2, cost=case.cost)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_simulated_bubble_of_zero_bubble_is_the_formula_and_a_third_of_1f1bs(p):
    case = P.zero_bubble.make_case(__import__("random").Random(3), p)
    m = case.args[3]
    zb, one = run(S.zero_bubble, p, *case.args, cost=case.cost), run(S.one_f_one_b, p, *case.args, cost=case.cost)
    assert P.measured_bubble(zb) == pytest.approx(zero_bubble_h1_bubble(p, m), rel=P.CLOSE)
    assert P.measured_bubble(zb) == pytest.approx(P.measured_bubble(one) / 3, rel=P.CLOSE)
    _assert_time_is_the_played_schedule(zb, case, "zb-h1")


def test_split_stage_times_are_the_full_backward_cut_into_input_and_weight_gradients():
    case = P.zero_bubble.make_case(__import__("random").Random(0), 3)
    stage, micro = case.args[0].values[1], case.args[1][:P.MICRO]
    t_f, t_in, t_w = P.split_stage_times(stage, micro)
    assert t_in + t_w == pytest.approx(P.stage_times(stage, micro)[1])
    assert t_f == pytest.approx(t_in) and t_in == pytest.approx(t_w)   # one matmul each per Linear


def test_explorer_draws_zb_h1_with_the_zero_bubble_formula():
    box = schedule_explorer()
    box.controls["schedule"].value = "zb-h1"
    s = box.state
    assert s.bubble == pytest.approx(zero_bubble_h1_bubble(4, 8)) and s.in_flight == [4] * 4
    assert "Qi et al." in s.readout and "weight gradient" in s.readout
    box.controls["m"].value = 3
    assert s.fig is None and "m=3 < p=4" in s.readout
