"""A device mesh in both worlds (lib.sim.mesh and torch's DeviceMesh), traffic per mesh axis (lib.sim.traffic),
and notebook 06's pictures of meshes and plans."""

import matplotlib

matplotlib.use("Agg")

import functools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from lib.real.backends import device_mesh  # noqa: E402
from lib.errors import PuzzleError, RankFailed  # noqa: E402
from lib.group_as_world import GroupAsWorld  # noqa: E402
from lib.real.launch import launch  # noqa: E402
from lib.checker.mesh import AxisBudget, MeshCase, MeshPuzzle  # noqa: E402
from lib.planner import PUBLISHED_RUNS, Cluster, H100_80GB, Plan, best_plan, check, memory_breakdown, plans  # noqa: E402
from lib.sim import run  # noqa: E402
from lib.sim.cost import bus_factor  # noqa: E402
from lib.sim.errors import CollectiveMismatch  # noqa: E402
from lib.sim.mesh import coordinates, mesh_groups  # noqa: E402
from lib.sim.traffic import OUTSIDE, SELF, MeshAxes, axis_labeller, traffic_by_axis  # noqa: E402
from lib.viz.mesh import mesh_figure  # noqa: E402
from lib.viz.planner import MODELS, PRACTICE, memory_bars, plan_explorer, plan_space_figure, published_table  # noqa: E402
from lib.viz.timeline import draw_timeline  # noqa: E402

NAMES = ("dp", "pp", "tp")


def ask_the_mesh(dist, shape, names):
    """What a learner asks a mesh: coordinates, sizes, and each dimension's group's ranks."""
    mesh = device_mesh(dist, shape, names)
    # gloo's new_group returns on a rank before its peers have connected: a rank that returned at once could close
    # its connections while a slower one still connects ("Connection closed by peer", seen once in CI under load)
    dist.barrier()
    return {"coordinate": tuple(mesh.get_coordinate()), "mesh": mesh.mesh.tolist(),
            **{n: (mesh.get_local_rank(n), mesh[n].size(), dist.get_process_group_ranks(mesh[n].get_group()))
               for n in names}}


def expected_answers(shape, names):
    grid = torch.arange(torch.tensor(shape).prod().item()).reshape(shape)
    out = []
    for rank in range(grid.numel()):
        coords = coordinates(rank, shape)
        groups = {n: next(g for g in mesh_groups(shape, d) if rank in g) for d, n in enumerate(names)}
        out.append({"coordinate": coords, "mesh": grid.tolist(),
                    **{n: (coords[d], shape[d], groups[n]) for d, n in enumerate(names)}})
    return out


@pytest.mark.parametrize("shape", [(2, 2, 2), (3, 1, 2), (1, 4, 2), (2, 3, 2)])
def test_simulated_mesh_lays_ranks_out_as_torch_does(shape):
    world = shape[0] * shape[1] * shape[2]
    assert run(ask_the_mesh, world, shape, NAMES).results == expected_answers(shape, NAMES)


def test_coordinates_and_groups_are_row_major_with_the_last_dimension_innermost():
    assert coordinates(5, (2, 2, 2)) == (1, 0, 1)
    assert mesh_groups((2, 2, 2), 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]        # TP: consecutive ranks
    assert mesh_groups((2, 2, 2), 1) == [[0, 2], [1, 3], [4, 6], [5, 7]]        # PP: stride tp
    assert mesh_groups((2, 2, 2), 0) == [[0, 4], [1, 5], [2, 6], [3, 7]]        # DP: stride pp·tp


@pytest.mark.slow
def test_the_same_function_gives_the_same_answers_on_torchs_device_mesh():
    shape, names = (2, 2), ("dp", "tp")
    real = launch(ask_the_mesh, 4, shape, names, backend="gloo")
    assert real == run(ask_the_mesh, 4, shape, names).results == expected_answers(shape, names)


@pytest.mark.parametrize("call, words", [
    (lambda mesh: mesh.size("tp"), "takes a dimension's index"),
    (lambda mesh: mesh.get_group(), "name the dimension"),
    (lambda mesh: mesh["tp", "dp"], "ascending order"),
    (lambda mesh: mesh["ep"], "Valid mesh_dim_names"),
    (lambda mesh: mesh.get_local_rank("ep"), "this mesh's dimensions are"),
])
def test_simulated_mesh_refuses_what_torch_refuses(call, words):
    def use(dist):
        call(device_mesh(dist, (2, 2), ("dp", "tp")))
    with pytest.raises(PuzzleError, match=words):
        run(use, 4)


def test_a_mesh_that_does_not_cover_the_world_is_refused():
    with pytest.raises(PuzzleError, match="multiply to the world size"):
        run(lambda dist: device_mesh(dist, (2, 3), ("dp", "tp")), 4)


def _mesh_of_six(dist):
    return device_mesh(dist, (2, 3), ("dp", "tp"))


def _mesh_of_four_over_a_pair(dist):
    return device_mesh(GroupAsWorld(dist, dist.new_group([0, 1]), [0, 1]), (4,))


@pytest.mark.slow
@pytest.mark.parametrize("fn", [_mesh_of_six, _mesh_of_four_over_a_pair])
def test_a_mesh_that_does_not_cover_the_world_is_refused_in_the_same_words_on_real_processes(fn):
    # torch's own words were a reshape's ("shape '[4]' is invalid for input of size 2") over a group seen as the world
    with pytest.raises(RankFailed, match=r"ValueError: rank \d asked for a device mesh of shape .*multiply to the "
                                         r"world size, 2\."):
        launch(fn, 2, backend="gloo", timeout=60)


def test_ranks_creating_only_their_own_groups_end_with_a_clear_error():
    def only_my_groups(dist):
        rank = dist.get_rank()
        for ranks in ([0, 1], [2, 3]):
            if rank in ranks:                  # the classic mistake: members only
                dist.new_group(ranks)
    with pytest.raises(CollectiveMismatch, match=r"new_group call #1 asks for ranks \[2, 3\], but another rank's"):
        run(only_my_groups, 4)


def test_a_rank_skipping_its_last_new_group_call_is_named():
    def skip_the_last(dist):
        rank = dist.get_rank()
        dist.new_group([0, 1])
        if rank < 2:
            dist.new_group([2, 3])
        dist.all_reduce(torch.ones(1))
    with pytest.raises(CollectiveMismatch, match=r"rank\(s\) 2 \(1\), 3 \(1\) made fewer new_group calls"):
        run(skip_the_last, 4)


def talk_on_every_axis(dist):
    """An all-reduce over TP, one message along PP, an all-reduce over DP and one over the whole world."""
    mesh = device_mesh(dist, (2, 2, 2), NAMES)
    x = torch.ones(16, dtype=torch.float64)
    dist.all_reduce(x, group=mesh["tp"].get_group())
    stages = dist.get_process_group_ranks(mesh["pp"].get_group())
    if mesh.get_local_rank("pp") == 0:
        dist.send(x, stages[1])
    else:
        dist.recv(x, stages[0])
    dist.all_reduce(x, group=mesh["dp"].get_group())
    dist.all_reduce(x)


def test_traffic_is_charged_to_the_axis_it_travelled_on():
    axes = MeshAxes((2, 2, 2), NAMES)
    result = run(talk_on_every_axis, 8)
    traffic = traffic_by_axis(result.trace, axes)
    ring = bus_factor("all_reduce", 2) * 16 * 8
    for rank, per_axis in enumerate(traffic):
        first_stage = coordinates(rank, (2, 2, 2))[1] == 0
        assert per_axis["tp"].sent == per_axis["dp"].sent == ring
        assert per_axis["tp"].ops == per_axis["dp"].ops == {"all_reduce": 1}
        assert (per_axis["pp"].sent, per_axis["pp"].received) == ((128, 0) if first_stage else (0, 128))
        assert per_axis[OUTSIDE].ops == {"all_reduce": 1}                # the world is no axis's group
        assert per_axis[SELF].ops == {}


def _tp_then_pp(dist, tp_op="all_reduce", tp_calls=1, world=False):
    """TP collectives and one PP message on a (2, 2, 2) mesh, and an all-reduce over the world if asked."""
    mesh = device_mesh(dist, (2, 2, 2), NAMES)
    x = torch.ones(16, dtype=torch.float64)
    for _ in range(tp_calls):
        if tp_op == "all_reduce":
            dist.all_reduce(x, group=mesh["tp"].get_group())
        else:
            dist.all_gather([torch.empty_like(x) for _ in range(2)], x, group=mesh["tp"].get_group())
    stages = dist.get_process_group_ranks(mesh["pp"].get_group())
    if mesh.get_local_rank("pp") == 0:
        dist.send(x, stages[1])
    else:
        dist.recv(x, stages[0])
    if world:
        dist.all_reduce(x)


@pytest.mark.parametrize("kwargs, words", [
    ({}, None),
    ({"world": True}, "the answer is right, but rank 0 called all_reduce on WORLD, which is none of its mesh groups "
                      "(DP [0, 4], PP [0, 2], TP [0, 1]): every communication of a composed step"),
    ({"tp_op": "all_gather"}, "rank 0 used all_gather on the TP axis, which carries all_reduce only here: one "
                              "all-reduce.\n(Cases from seed 0: P.mesh_rules.check(fn, seed=0) replays them.)\n"
                              "Hint: reduce once"),
    ({"tp_calls": 2}, "rank 0 sent 256 B on the TP axis, over the budget of 128 B: one all-reduce."),
])
def test_a_mesh_case_judges_traffic_outside_its_groups_and_per_axis(kwargs, words):
    axes = MeshAxes((2, 2, 2), NAMES)
    budget = AxisBudget("tp", bus_factor("all_reduce", 2) * 16 * 8, "one all-reduce", frozenset({"all_reduce"}),
                        hint="reduce once")
    puzzle = MeshPuzzle("mesh_rules", "00_test", lambda rng, n: MeshCase(n, (), [None] * n, "a (2, 2, 2) mesh",
                                                                         axes=axes, axis_budgets=[budget]),
                        world_sizes=(8,))
    outcome = puzzle.evaluate(functools.partial(_tp_then_pp, **kwargs), seed=0)
    assert outcome.ok is (words is None) and (words is None or words in outcome.message), outcome.message


def test_a_group_of_one_rank_belongs_to_no_axis():
    def alone(dist):
        mesh = device_mesh(dist, (2, 1, 1), NAMES)
        dist.all_reduce(torch.ones(1), group=mesh["tp"].get_group())
    traffic = traffic_by_axis(run(alone, 2).trace, MeshAxes((2, 1, 1), NAMES))
    assert all(t[SELF].ops == {"all_reduce": 1} and not t["tp"].ops and not t["pp"].ops for t in traffic)


def test_timeline_colours_communication_by_axis():
    axes = MeshAxes((2, 2, 2), NAMES)
    result = run(talk_on_every_axis, 8)
    fig = draw_timeline(result.trace, 8, kind_of=axis_labeller(axes))
    labels = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
    assert {"TP", "PP", "DP", "outside the mesh"} <= labels


def test_mesh_figure_draws_one_panel_per_axis_and_every_rank():
    fig = mesh_figure((2, 2, 2), NAMES, colour_by=("tp", "dp"), ranks_per_node=4)
    assert len(fig.axes) == 2
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == 8 and texts[5].startswith("rank 5 (node 1)\ndp1 pp0 tp1")


def test_published_table_has_a_row_per_run_with_its_error():
    lines = published_table().splitlines()
    assert len(lines) == 1 + len(PUBLISHED_RUNS)
    for run_, line in zip(PUBLISHED_RUNS, lines[1:]):
        assert line.startswith(run_.name) and f"{run_.error():+.1%}" in line


def test_practitioners_plans_split_their_models_evenly():
    for name, gpus, batch, plan in PRACTICE:
        assert plan.gpus == gpus and plan.global_batch == batch
        check(MODELS[name], Cluster(gpu=H100_80GB, gpus=gpus, gpus_per_node=8), plan)


def test_plan_explorer_estimates_the_chosen_plan_and_explains_one_that_does_not_split():
    box = plan_explorer()
    e = box.state.estimate
    assert e is not None and (e.plan.tp, e.plan.pp, e.plan.dp) == (8, 2, 4)
    assert f"MFU {e.mfu:.1%}" in box.state.readout
    box.controls["pp"].value = 64                       # 8 · 64 GPUs on a 64-GPU cluster
    assert box.state.estimate is None and box.state.fig is None
    assert "does not split" in box.state.readout
    box.controls["pp"].value = 1
    assert box.state.estimate.plan.dp == 8


def test_plan_space_figure_draws_every_plan_and_rings_the_fastest_that_fits():
    model, cluster = MODELS["Llama 2 7B"], Cluster(gpu=H100_80GB, gpus=8, gpus_per_node=8)
    fig, best = plan_space_figure(model, cluster, 32), best_plan(model, cluster, 32, virtual_stages=[1])
    *points, ring = fig.axes[0].collections
    assert sum(len(c.get_offsets()) for c in points) == len(list(plans(model, cluster, 32, virtual_stages=[1])))
    assert ring.get_offsets().tolist() == [[best.memory / 2**30, best.tokens_per_second]]
    hollow = [c for c in points if "does not fit" in c.get_label()]
    assert all(x > cluster.gpu.memory / 2**30 for c in hollow for x, _ in c.get_offsets())


def test_memory_bars_stack_each_plans_four_terms_against_the_gpu():
    model = MODELS["Llama 2 13B"]
    chosen = [Plan(dp=16, global_batch=64), Plan(tp=2, pp=2, dp=4, global_batch=64, zero=3, recompute="selective")]
    ax = memory_bars(model, chosen, H100_80GB).axes[0]
    for x, plan in enumerate(chosen):
        stack = [bar for bar in ax.patches if abs(bar.get_x() + bar.get_width() / 2 - x) < 1e-9]
        gib = [v / 2**30 for v in memory_breakdown(model, plan).values()]      # weights, gradients, optimizer, ...
        assert [b.get_height() for b in stack] == pytest.approx(gib)
    assert ax.lines[0].get_ydata()[0] == H100_80GB.memory / 2**30
    assert [t.get_text() for t in ax.get_xticklabels()][1].startswith("TP2 PP2 DP4")


# ---- a composed step at a cluster's proportions (notebook 06, MeshPuzzle.at_scale) --------------------------------

def test_a_timeline_of_a_large_mesh_draws_rank_0_and_its_first_peers_along_each_axis():
    from lib.checker.mesh import rows_to_show
    assert rows_to_show(MeshAxes((8, 4, 8), NAMES)) == [0, 1, 2, 3, 8, 16, 24, 32, 64, 96]
    assert rows_to_show(MeshAxes((2, 2), ("dp", "tp"))) == [0, 1, 2]


def test_draw_timeline_draws_only_the_ranks_asked_for_in_their_order():
    def ring(dist):
        x = torch.ones(4)
        dist.all_reduce(x)
        return x
    result = run(ring, 6)
    full = draw_timeline(result.trace, 6)
    some = draw_timeline(result.trace, 6, ranks=[0, 4, 5])
    labels = [t.get_text() for t in some.axes[0].get_yticklabels()]
    assert labels == ["rank 0", "rank 4", "rank 5"]
    assert len(some.axes[0].collections[0].get_paths()) == len(full.axes[0].collections[0].get_paths()) // 2
    assert some.axes[0].get_xlim() == full.axes[0].get_xlim()        # the whole run's time, however few rows


def test_axis_rows_give_each_axis_its_busiest_rank_its_mean_and_its_link():
    from lib.checker.mesh import axis_rows
    from lib.sim import CostModel
    axes = MeshAxes((2, 4), ("dp", "tp"))

    def step(dist):
        mesh = device_mesh(dist, (2, 4), ("dp", "tp"))
        x = torch.ones(64, dtype=torch.float64)
        dist.all_reduce(x, group=mesh["tp"].get_group())
        if mesh.get_local_rank("tp") == 0:                          # only the first TP rank of each DP replica
            dist.all_reduce(x, group=mesh["dp"].get_group())
        return x
    cost = CostModel(ranks_per_node=4)
    result = run(step, 8, cost=cost)
    rows = dict((r[0], r[1:]) for r in axis_rows(traffic_by_axis(result.trace, axes), axes, cost))
    tp_sent = bus_factor("all_reduce", 4) * 512
    assert rows["TP"][:2] == (pytest.approx(tp_sent), pytest.approx(tp_sent))
    assert rows["TP"][2] == "inside one node (450 GB/s)" and rows["TP"][3] == pytest.approx(tp_sent / 450e9)
    dp_sent = bus_factor("all_reduce", 2) * 512
    assert rows["DP"][:2] == (pytest.approx(dp_sent), pytest.approx(dp_sent / 4))
    assert rows["DP"][2] == "across 2 nodes (50 GB/s)"


def test_train_3d_at_scale_passes_the_reference_and_pictures_a_few_ranks(capsys):
    import puzzles.three_d as P
    import solutions.three_d as S
    result = P.train_3d.at_scale(S.train_3d, 32, shape=(4, 2, 4), steps=1, show=False)
    out = capsys.readouterr().out
    assert result is not None and result.world_size == 32
    assert out.startswith("✓ train_3d is right at N=32 ((dp, pp, tp) = (4, 2, 4)")
    assert "sent on the TP axis at N=32" in out and "1 SGD step)" in out
    from lib.checker.puzzle import Outcome, PASSED
    case = P.train_3d.make_case(__import__("random").Random(0), 32, shape=(4, 2, 4), steps=1)
    timeline, bars, _memory = P.train_3d.picture(Outcome(PASSED, "", result, case))
    assert [t.get_text() for t in timeline.axes[0].get_yticklabels()] == \
        ["rank 0", "rank 1", "rank 2", "rank 3", "rank 4", "rank 8", "rank 16", "rank 24"]
    assert [t.get_text() for t in bars.axes[0].get_yticklabels()] == ["DP", "PP", "TP"]


def test_train_3d_at_scale_says_what_only_a_larger_mesh_shows(capsys):
    """A `2` where the TP degree belongs passes the check (its meshes have tp = 2) and fails at tp = 4."""
    import puzzles.three_d as P
    import solutions.three_d as S
    from lib.checker.puzzle import CheckFailed

    def two_way_tp(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
        return S.train_3d(dist, stage, tokens, targets, dp * tp // 2, pp, 2, m, steps, lr)
    assert P.train_3d.check(two_way_tp, seed=0, show=False, strict=False)
    assert P.train_3d.at_scale(two_way_tp, 16, shape=(2, 2, 4), steps=1, show=False, strict=False) is None
    out = capsys.readouterr().out
    assert "✗ train_3d failed at N=16 ((dp, pp, tp) = (2, 2, 4)" in out
    assert "a 2 where a degree belongs" in out
    with pytest.raises(CheckFailed):
        P.train_3d.at_scale(two_way_tp, 16, shape=(2, 2, 4), steps=1, show=False, strict=True)


def test_train_3d_at_scale_waits_for_an_answer(capsys):
    import puzzles.three_d as P
    from lib.checker.puzzle import NotSolved

    def train_3d(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
        raise NotImplementedError
    assert P.train_3d.at_scale(train_3d, 16, shape=(2, 2, 4), show=False, strict=False) is None
    assert capsys.readouterr().out.startswith("○ train_3d is not solved yet")
    with pytest.raises(NotSolved):
        P.train_3d.at_scale(train_3d, 16, shape=(2, 2, 4), show=False, strict=True)

    def helper_unwritten(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):       # its own stub, one level down
        def forward():
            raise NotImplementedError
        return forward()
    assert P.train_3d.at_scale(helper_unwritten, 16, shape=(2, 2, 4), show=False, strict=False) is None
    assert capsys.readouterr().out.startswith("○ train_3d is not solved yet")
    with pytest.raises(ValueError, match="has 16 ranks, not 8"):
        P.train_3d.make_case(__import__("random").Random(0), 8, shape=(2, 2, 4))
