"""The pictures drawn before puzzles and the scaled timelines drawn after them."""

import importlib
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

import lib.checker.puzzle  # noqa: E402
import puzzles  # noqa: E402
from lib.sim.cost import CostModel  # noqa: E402
from lib.viz.anatomy import block_activations_picture, parameters_picture, training_state_picture  # noqa: E402
from lib.viz.data_parallel import bucket_overlap_figure, ring_collective_figure, ring_states  # noqa: E402
from lib.viz.diagram import RANK_COLOURS, SAVED, Box, Op, flow_figure  # noqa: E402
from lib.viz.tensor_parallel import tp_picture  # noqa: E402
from lib.viz.timeline import at_scale  # noqa: E402
from lib.viz.zero import zero_ranks_figure  # noqa: E402


def _colours(fig) -> list:
    return [matplotlib.colors.to_hex(p.get_facecolor()) for p in fig.axes[0].patches
            if isinstance(p, Rectangle) and p.get_fill()]


def test_a_split_box_has_one_slice_per_rank_and_a_saved_box_is_outlined():
    fig = flow_figure([Box("A", split="rows"), Op("g", comm=True), Box("Y", saved=True)], ranks=3)
    colours = _colours(fig)
    assert [c for c in colours if c in [x.lower() for x in RANK_COLOURS]] == [x.lower() for x in RANK_COLOURS[:3]]
    edges = [matplotlib.colors.to_hex(p.get_edgecolor()) for p in fig.axes[0].patches]
    assert SAVED.lower() in edges
    assert fig.number not in plt.get_fignums()               # closed: a notebook shows it once


@pytest.mark.parametrize("kind", ["column", "row", "mlp", "attention", "sequence", "vocab"])
def test_every_tensor_parallel_picture_names_its_communication(kind):
    fig = tp_picture(kind, ranks=4)
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert any(op in texts for op in ("f", "g", "AG", "all-reduce"))
    assert "N = 4" in fig.axes[0].get_title()


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_ring_pictures_follow_a_ring_that_ends_where_the_puzzles_ask(n):
    scatter = ring_states(n, ["reduce-scatter"])
    assert len(scatter) == n                                   # the start and N-1 steps
    assert all(scatter[-1][0][r][r] == n for r in range(n))    # rank r: chunk r, summed over every rank
    for (held, sent), (after, _) in zip(scatter, scatter[1:]):
        for r in range(n):                                     # the right neighbour adds what it was sent
            right, c = (r + 1) % n, sent[r]
            assert after[right][c] == held[right][c] + held[r][c]
    gather = ring_states(n, ["all-gather"])
    assert gather[0][0] == [[int(c == r) for c in range(n)] for r in range(n)]
    assert all(held[r][sent[r]] for held, sent in gather[:-1] for r in range(n))     # a rank sends what it has
    assert gather[-1][0] == [[1] * n for _ in range(n)]
    both = ring_states(n, ["reduce-scatter", "all-gather"])
    assert len(both) == 2 * (n - 1) + 1 and both[-1][0] == [[n] * n for _ in range(n)]
    with pytest.raises(ValueError, match="phases"):
        ring_states(n, ["broadcast"])


def test_ring_and_bucket_pictures_draw_and_close():
    fig = ring_collective_figure(4, ["all-gather"])
    assert "all-gather" in fig.axes[0].get_title() and fig.number not in plt.get_fignums()
    fig = bucket_overlap_figure(layers=6, per_bucket=2)
    done = [float(re.search(r"done at ([0-9.]+)", ax.get_title()).group(1)) for ax in fig.axes]
    assert done[1] < done[0]                                   # buckets finish before one all-reduce after backward


def test_unknown_tensor_parallel_picture_says_which_exist():
    with pytest.raises(ValueError, match="column"):
        tp_picture("diagonal")


@pytest.mark.parametrize("stage, held", [(0, 3 * 4), (1, 2 * 4 + 1), (2, 4 + 2), (3, 3)])
def test_zero_picture_fills_what_rank_0_keeps(stage, held):
    fig = zero_ranks_figure(stage, ranks=4)
    filled = [p for p in fig.axes[0].patches if matplotlib.colors.to_hex(p.get_facecolor()) != "#ffffff"]
    assert len(filled) == 4 * held                          # each rank holds the same number of shards


def test_offload_picture_puts_the_optimizer_in_host_memory():
    fig = zero_ranks_figure(2, offload=True)
    assert "offload" in fig.axes[0].get_title()
    assert sum("host memory" in t.get_text() for t in fig.axes[0].texts) == 4


def test_notebook_01_pictures_draw_no_byte_counts():
    for fig in (parameters_picture(), training_state_picture(), block_activations_picture()):
        texts = " ".join(t.get_text() for t in fig.axes[0].texts)
        assert not re.search(r"\d+ ?(B|bytes)\b", texts), texts


def test_at_scale_slows_bytes_and_flops_apart_and_keeps_latency():
    base = CostModel()
    scaled = at_scale(1000.0, 10.0, base)
    assert scaled.intra_node_bandwidth == pytest.approx(base.intra_node_bandwidth / 1000)
    assert scaled.memory_bandwidth == pytest.approx(base.memory_bandwidth / 1000)
    assert scaled.flops_per_s == pytest.approx(base.flops_per_s / 10)
    assert scaled.latency == base.latency


def test_notebook_01_later_pictures_mark_where_state_lives():
    from lib.viz.anatomy import accumulation_picture, checkpointing_picture, offload_picture

    assert "host memory" in " ".join(t.get_text() for t in offload_picture().axes[0].texts)
    assert sum("micro-batch" in t.get_text() for t in accumulation_picture(3).axes[0].texts) == 3
    edges = [matplotlib.colors.to_hex(p.get_edgecolor()) for p in checkpointing_picture().axes[0].patches]
    assert edges.count(SAVED.lower()) == 3                  # the three block inputs, nothing else


SCALED = [p for p in puzzles.ALL if p.real_scale is not None]


@pytest.mark.parametrize("puzzle", SCALED, ids=[p.name for p in SCALED])
def test_a_timeline_after_a_check_is_drawn_at_the_scale_its_title_names(puzzle, monkeypatch):
    solution = getattr(importlib.import_module(f"solutions.{puzzle.module}"), puzzle.name)
    outcome = puzzle.evaluate(solution, seed=0)
    assert outcome.ok, outcome.message
    runs, run = [], lib.checker.puzzle.run
    monkeypatch.setattr(lib.checker.puzzle, "run", lambda *a, **k: runs.append(a) or run(*a, **k))
    title = puzzle.picture(outcome, solution)[0].axes[0].get_title()
    assert "drawn as if" in title and "H100 node" in title
    # Where nothing judged read the clocks, the check ran its last case at that scale: no second run.
    timeless = outcome.case.cost is None and all(b.metric != "time" for b in outcome.case.budgets) \
        and not any(c.timed for c in outcome.case.contracts)
    assert len(runs) == (0 if timeless else 1)
    toy = puzzle.picture(outcome)[0].axes[0].get_title()           # without the function: the check's own run
    assert ("drawn as if" in toy) == timeless


def test_the_setup_cells_throwaway_figure_renders_and_leaves_no_figure_open():
    from lib.notebook.warm_up import draw_ahead

    before = plt.get_fignums()
    draw_ahead()
    assert plt.get_fignums() == before
    assert matplotlib.rcParams["text.hinting"] == matplotlib.rcParamsDefault["text.hinting"]   # scoped to the render


@pytest.mark.parametrize("pp, tp", [(2, 2), (1, 4), (3, 1)])
def test_clip_picture_fills_each_parameter_once_per_model_copy(pp, tp):
    from lib.viz.diagram import WHOLE
    from lib.viz.seams import clip_norm_picture

    fig = clip_norm_picture(pp=pp, tp=tp, sharded=2, whole=3)
    colours = _colours(fig)
    assert colours.count(WHOLE.lower()) == 3 * pp                 # a replicated gradient counted on TP rank 0 only
    assert sum(c in [x.lower() for x in RANK_COLOURS] for c in colours) == 2 * pp * tp
    assert fig.number not in plt.get_fignums()


def test_mean_loss_picture_draws_each_micro_batch_as_long_as_its_tokens():
    from lib.viz.seams import mean_loss_picture

    fig = mean_loss_picture(tokens=((32, 16), (8, 8, 8)))
    widths = [p.get_width() for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    assert widths[:5] == pytest.approx([w * widths[0] / 32 for w in (32, 16, 8, 8, 8)])


@pytest.mark.parametrize("nodes, per_node, trainer", [(2, 4, False), (3, 2, False), (2, 2, True)])
def test_hsdp_picture_colours_each_rank_by_the_shard_it_keeps(nodes, per_node, trainer):
    from lib.viz.seams import hsdp_picture

    fig = hsdp_picture(nodes=nodes, per_node=per_node, trainer=trainer)
    said = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert ("then the trainer: Adam" in said and "DP rank 0" in said) == trainer     # as the trainer's DP axis
    ranks = [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    assert len(ranks) == nodes * per_node
    colours = [matplotlib.colors.to_hex(p.get_facecolor()) for p in ranks]
    for rank, colour in enumerate(colours):            # one colour per shard index: the rank's place in its node
        assert colour == matplotlib.colors.to_hex(RANK_COLOURS[rank % per_node])
    assert len(fig.axes[0].lines) == per_node         # one replicate group per shard index, across the nodes
    assert fig.number not in plt.get_fignums()
