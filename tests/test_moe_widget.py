"""Notebook 07's counts (lib.analytic.moe) agree with the puzzles' per-token references, and the routing explorer
redraws
from them when a control changes."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from lib.analytic.moe import capacity, dispatch_counts, routing, skewed_logits  # noqa: E402
from lib.viz.moe import routing_explorer  # noqa: E402
from puzzles.moe import capacity_reference, route_reference  # noqa: E402


@pytest.mark.parametrize("k, factor, skew", [(1, 0.5, 0.0), (2, 1.25, 1.0), (2, 2.0, 2.0), (1, 1.0, 0.5)])
def test_counts_equal_the_per_token_reference(k, factor, skew):
    logits = skewed_logits(48, 6, skew, seed=3)
    tokens, _ = route_reference(logits, k, factor)
    r = routing(logits, k, factor)
    assert r.capacity == tokens.shape[1] == capacity(48, 6, k, factor)
    assert r.kept == int((tokens >= 0).sum()) and r.padded_slots == int((tokens < 0).sum())


def test_the_smallest_capacity_keeps_its_drop_budget_and_one_less_breaks_it():
    logits = skewed_logits(64, 8, 1.0, seed=1)
    cap, padded = capacity_reference(logits, 2, 0.05)
    at = routing(logits, 2, cap * 8 / (2 * 64))
    below = routing(logits, 2, (cap - 1) * 8 / (2 * 64))
    assert at.capacity == cap and at.padded_slots == padded
    assert at.dropped_fraction <= 0.05 < below.dropped_fraction


def test_dispatch_counts_are_the_kept_pairs_by_destination():
    logits = list(skewed_logits(4 * 16, 8, 1.0, seed=2).chunk(4))
    counts = dispatch_counts(logits, 2, 1.0)
    for s, rank_logits in enumerate(logits):
        tokens, _ = route_reference(rank_logits, 2, 1.0)
        kept = (tokens >= 0).sum(1)                                     # (E,)
        assert torch.equal(counts[s], kept.view(4, 2).sum(1))


def test_the_explorer_redraws_with_more_drops_below_capacity():
    box = routing_explorer()
    fig, dropped = box.state.fig, box.state.dropped
    box.controls["factor"].value = 0.5
    assert box.state.fig is not fig and box.state.dropped > dropped
    box.controls["ranks"].value = 1
    assert box.state.bytes_per_rank == 0 and "0 B sent" in box.state.readout
