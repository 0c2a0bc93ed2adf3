"""lib.analytic.context_parallel's costs, lib.checker.contract's rules on real runs, and notebook 08's explorer."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lib.analytic.context_parallel import (LINKS, Shard, block_times, min_tokens_to_overlap, ring_memory,  # noqa: E402
                                  ring_or_ulysses, ring_time, scores_bytes, stand_in, ulysses_time)
from lib.checker.contract import communication_hidden, exposed_communication, flops_balanced, right, sends_to  # noqa: E402
from lib.checker.kernels import KernelRefused, refusing_kernels  # noqa: E402
from lib.analytic.formulas import activation_bytes_per_layer  # noqa: E402
from lib.sim import CostModel, run  # noqa: E402
from lib.viz.context_parallel import causal_tiles, context_parallel_explorer  # noqa: E402


def test_overlap_threshold_is_where_compute_equals_transfer():
    cost = CostModel(latency=0.0)
    for bandwidth in LINKS.values():
        c = min_tokens_to_overlap(cost.flops_per_s, bandwidth)
        link = cost.with_(intra_node_bandwidth=bandwidth)
        compute, transfer = block_times(Shard(tokens=c, heads=32, head_dim=128), link)
        assert compute == pytest.approx(transfer)
        compute, transfer = block_times(Shard(tokens=2 * c, heads=32, head_dim=128), link)
        assert compute > transfer


def test_overlap_saves_the_shorter_side_of_each_step():
    shard, cost, n = Shard(tokens=1024, heads=8, head_dim=64), CostModel(), 8
    compute, transfer = block_times(shard, cost)
    assert ring_time(shard, n, cost, overlap=False) - ring_time(shard, n, cost) == pytest.approx(
        (n - 1) * min(compute, transfer))


def test_ulysses_needs_whole_heads_and_the_verdict_names_the_faster():
    cost = CostModel()
    for n, fits in ((4, True), (32, True), (6, False), (64, False)):
        shard = Shard(tokens=2**17 // n, heads=32, head_dim=128)
        verdict = ring_or_ulysses(shard, n, cost)
        if fits:
            ring, ulysses = ring_time(shard, n, cost), ulysses_time(shard, n, cost)
            assert f"{'ring' if ring <= ulysses else 'Ulysses'} is faster" in verdict
        else:
            assert "Ulysses cannot run: 32 heads do not split over" in verdict
            with pytest.raises(ValueError, match="cannot split 32 heads"):
                ulysses_time(shard, n, cost)
    slow_link = cost.with_(intra_node_bandwidth=1e9)          # 1 GB/s: the ring's transfers outlast its compute
    assert "Ulysses is faster" in ring_or_ulysses(Shard(tokens=1024, heads=32, head_dim=128), 8, slow_link)


def test_stand_in_times_a_small_block_as_the_real_one():
    real, cost = Shard(tokens=4096, heads=32, head_dim=128), CostModel()
    small_flops, small_bytes = 12345.0, 678.0
    fake = stand_in(small_flops, small_bytes, real, cost, LINKS["NVLink"])
    assert fake.compute_time(small_flops) == pytest.approx(block_times(real, cost)[0])
    assert fake.p2p_time(small_bytes, 0, 1) == pytest.approx(block_times(real, cost)[1])


def test_scores_are_korthikantis_attention_term():
    s, b, h, a = 2048, 2, 1024, 16
    assert scores_bytes(s, a, h, b) == pytest.approx(5 * a * s * s * b)
    assert scores_bytes(s, a, h, b) > 50 * ring_memory(Shard(tokens=s // 8, heads=a, head_dim=h // a, batch=b))
    assert activation_bytes_per_layer(s, b, h, a) > scores_bytes(s, a, h, b)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_zigzag_balances_the_causal_tiles_and_covers_each_once(n):
    for zigzag in (False, True):
        tiles = causal_tiles(n, zigzag)
        every = sorted(t for mine in tiles.values() for t in mine)
        assert every == sorted((q, k) for q in range(2 * n) for k in range(q + 1))
        work = [len(mine) for mine in tiles.values()]
        assert (len(set(work)) == 1) == zigzag


def test_explorer_redraws_and_says_when_overlap_hides_the_transfer():
    box = context_parallel_explorer(seq=131072, n=8)
    assert "hides" in box.state.readout
    assert box.state.figures["ring"] < box.state.figures["scores"]
    box.controls["n"].value = 64
    box.controls["seq"].value = 4096
    assert "cannot hide" in box.state.readout
    assert "Ulysses cannot run" in box.state.readout and box.state.figures["ulysses_time"] is None


def _to(offset):
    def fn(dist, x):
        rank, n = dist.get_rank(), dist.get_world_size()
        got = torch.empty_like(x)
        w = dist.isend(x, (rank + offset) % n)
        dist.recv(got, (rank - offset) % n)
        w.wait()
        return got
    return fn


def test_ring_rule_names_the_rank_that_sent_elsewhere():
    rule = sends_to(right, "a ring talks to its right neighbour")
    assert rule.judge(run(_to(1), 4, torch.ones(3))) is None
    problem = rule.judge(run(_to(-1), 4, torch.ones(3)))
    assert "rank 0's send 1 (12 B) went to rank 3, where rank 1 belongs" in problem, problem


def test_a_partner_that_changes_each_step_is_one_rule():
    """Recursive doubling: at step k rank r talks to r ^ 2^k, which no fixed neighbour rule can say."""
    def doubling(dist, x):
        rank, step = dist.get_rank(), 0
        while 1 << step < dist.get_world_size():
            got = torch.empty_like(x)
            work = dist.isend(x, rank ^ (1 << step))
            dist.recv(got, rank ^ (1 << step))
            work.wait()
            x, step = x + got, step + 1
        return x
    rule = sends_to(lambda r, n, k: r ^ (1 << k), "recursive doubling: partner r ^ 2^k")
    assert rule.judge(run(doubling, 4, torch.ones(3))) is None
    assert "where rank 1 belongs" in rule.judge(run(_to(-1), 4, torch.ones(3)))


def test_balance_rule_measures_flops_per_rank():
    def uneven(dist, x):
        for _ in range(dist.get_rank() + 1):
            x = x @ x
        return x
    rule = flops_balanced(0.1, "equal work")
    assert rule.judge(run(lambda dist, x: x @ x, 3, torch.eye(8))) is None
    assert "unbalanced" in rule.judge(run(uneven, 3, torch.eye(8)))


def test_kernels_are_refused_in_simulation_and_out():
    q = torch.randn(1, 1, 4, 2)

    def answer(dist, q):
        return F.scaled_dot_product_attention(q, q, q)
    guarded = refusing_kernels(answer, ("_scaled_dot_product",), "the kernel is the reference")
    with pytest.raises(KernelRefused, match="_scaled_dot_product_flash_attention_for_cpu"):
        guarded(None, q)
    with pytest.raises(KernelRefused, match="the kernel is the reference"):
        run(guarded, 1, q)
    assert refusing_kernels(lambda dist, q: q @ q.transpose(-2, -1), ("_scaled_dot_product",), "")(None, q).shape \
        == (1, 1, 4, 4)


def test_hidden_rule_counts_the_time_a_rank_waits_outside_its_compute():
    cost = CostModel(intra_node_bandwidth=1e3, latency=0.0)
    result = run(_to(1), 2, torch.ones(250), cost=cost)            # 1,000 bytes at 1,000 B/s: a second's wait
    assert exposed_communication(result) == pytest.approx([1.0, 1.0], rel=1e-3)
    assert communication_hidden(2.0, "the message", "two seconds allowed").judge(result) is None
    assert "waiting on the message" in communication_hidden(0.5, "the message", "half a second").judge(result)


def test_the_race_times_both_answers_in_the_simulator_as_the_formulas_do(capsys):
    import puzzles.ring_attention as P
    import solutions.ring_attention as S
    from lib.analytic.context_parallel import ring_time, ulysses_time, with_links

    for link, tokens in (("NVLink", 16384), ("InfiniBand", 4096)):
        times = P.race_ring_and_ulysses(S.ring_attention_overlap, S.ulysses_attention, n=4, tokens=tokens, link=link)
        real, cost = Shard(tokens=tokens, heads=32, head_dim=128), with_links(CostModel(), LINKS[link])
        assert times["ring"] == pytest.approx(ring_time(real, 4, cost), rel=0.1)
        assert times["Ulysses"] == pytest.approx(ulysses_time(real, 4, cost), rel=0.1)
        winner = min(times, key=times.get)
        assert f"{winner} is faster" in capsys.readouterr().out
    assert times["Ulysses"] < times["ring"]          # a short chunk over the slow link: the ring cannot hide it

    def stub(dist, q, k, v, block):
        raise NotImplementedError
    assert P.race_ring_and_ulysses(S.ring_attention_overlap, stub) is None
    assert "solve ulysses_attention first" in capsys.readouterr().out
