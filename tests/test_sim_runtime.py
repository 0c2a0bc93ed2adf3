"""The simulator's statistics and failure modes on cases computed by hand.

Bytes moved, peak memory, simulated clocks, traces, determinism, and each way a program can go
wrong: every failure must raise the right PuzzleError quickly and leave no rank thread behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import lib
import lib.sim
from lib.errors import PuzzleError, RankFailed
from lib.sim import threads
from lib.sim import CollectiveMismatch, CostModel, Deadlock, InvalidCall, SimTimeout, per_rank


def _sim_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sim-rank-") and t.is_alive()]


@pytest.fixture(autouse=True)
def no_rank_thread_left():
    """lib.sim.run joins every rank thread before it returns or raises: none may be alive afterwards, not even
    one still unwinding (at interpreter exit such a thread aborted the process with SIGABRT)."""
    yield
    assert _sim_threads() == [], "a simulated rank's thread outlived its run"


def _fails(fn, n, error, *args, limit=120.0, **kwargs) -> PuzzleError:
    """Run fn on n ranks; it must raise `error`. The error's type proves how the run was stopped (a deadlock
    detected is Deadlock, not the SimTimeout that would end it after 30 s); `limit` only guards against a hang,
    generous enough for a loaded machine."""
    start = time.monotonic()
    with pytest.raises(error) as info:
        lib.sim.run(fn, n, *args, **kwargs)
    elapsed = time.monotonic() - start
    assert elapsed < limit, f"{error.__name__} took {elapsed:.2f} s"
    assert isinstance(info.value, PuzzleError)
    return info.value


# ---- programs -----------------------------------------------------------------------------------

def ring_all_reduce(dist, x):
    """Reduce-scatter then all-gather around the ring, from isend/recv; x holds world_size equal chunks."""
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = x.chunk(n)
    buf = torch.empty_like(chunks[0])
    for step in range(n - 1):
        work = dist.isend(chunks[(rank - step) % n], right)
        dist.recv(buf, left)
        work.wait()
        chunks[(rank - step - 1) % n].add_(buf)
    for step in range(n - 1):
        work = dist.isend(chunks[(rank + 1 - step) % n], right)
        dist.recv(chunks[(rank - step) % n], left)
        work.wait()
    return x


# ---- bytes --------------------------------------------------------------------------------------

def test_ring_all_reduce_from_p2p_bytes():
    n = 4
    xs = [torch.arange(1000, dtype=torch.float32) * (r + 1) for r in range(n)]
    result = lib.sim.run(ring_all_reduce, n, per_rank(xs))
    for r in range(n):
        torch.testing.assert_close(result.results[r], sum(xs))
        assert result.stats[r].bytes_sent == 2 * (n - 1) / n * 4000 == 6000
        assert result.stats[r].bytes_received == 6000
        assert result.stats[r].calls == {"send": 2 * (n - 1), "recv": 2 * (n - 1)}


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_all_reduce_bytes_follow_the_ring(n):
    def prog(dist):
        t = torch.ones(1000)
        dist.all_reduce(t)
        return t
    result = lib.sim.run(prog, n)
    for s in result.stats:
        assert s.bytes_sent == pytest.approx(2 * (n - 1) / n * 4000, rel=1e-12)
        assert s.bytes_received == pytest.approx(2 * (n - 1) / n * 4000, rel=1e-12)
        assert s.calls == {"all_reduce": 1}
    assert all(torch.equal(t, torch.full((1000,), float(n))) for t in result.results)


def test_send_counts_bytes_on_both_sides():
    def prog(dist):
        if dist.get_rank() == 0:
            dist.send(torch.ones(10), dst=1)
        elif dist.get_rank() == 1:
            dist.recv(torch.zeros(10), src=0)
    stats = lib.sim.run(prog, 3).stats
    assert (stats[0].bytes_sent, stats[0].bytes_received) == (40, 0)
    assert (stats[1].bytes_sent, stats[1].bytes_received) == (0, 40)
    assert (stats[2].bytes_sent, stats[2].bytes_received) == (0, 0)


def test_broadcast_root_sends_the_tensor_once():
    def prog(dist):
        t = torch.full((250,), float(dist.get_rank()))
        dist.broadcast(t, src=2)
        return t
    result = lib.sim.run(prog, 4)
    assert result.stats[2].bytes_sent == 1000
    assert result.stats[2].bytes_received == 0
    assert all(torch.equal(t, torch.full((250,), 2.0)) for t in result.results)
    assert all(s.bytes_received == 1000 for s in result.stats if s.rank != 2)


# ---- peak memory --------------------------------------------------------------------------------

def test_peak_memory_by_hand():
    def prog(dist):
        a = torch.zeros(1000)          # 4000 B
        v = a.view(10, 100)            # a view: no new storage
        b = torch.ones(500)            # 2000 B, freed again
        del b
        c = a * 2                      # 4000 B more: peak 8000
        del v, c
    for s in lib.sim.run(prog, 2).stats:
        assert s.peak_memory == 8000
        assert max(m for _, m in s.memory) == 8000
        assert s.memory[-1][1] == 0          # everything freed once the rank returned


def test_views_share_one_storage():
    def prog(dist):
        x = torch.zeros(1000)
        views = [x.view(10, 100), x[::2], x[10:20], x.reshape(100, 10).t()]
        return len(views)
    assert lib.sim.run(prog, 1).stats[0].peak_memory == 4000


HIDDEN: list = []


def test_tensor_hidden_in_a_global_still_counts():
    def prog(dist):
        HIDDEN.append(torch.zeros(1000))
        for _ in range(3):
            tmp = torch.ones(100)      # 400 B that come and go
            del tmp
    try:
        s = lib.sim.run(prog, 1).stats[0]
        assert s.peak_memory == 4400
        after = [m for _, m in s.memory][1:]          # from the allocation on
        assert min(after) >= 4000, "memory dropped below the hidden tensor while it was alive"
    finally:
        HIDDEN.clear()


def test_backward_buffers_count():
    def prog(dist):
        torch.manual_seed(0)
        layer = torch.nn.Linear(64, 64)
        x = torch.randn(8, 64, requires_grad=True)
        layer(x).square().sum().backward()
        return sum(p.nbytes for p in layer.parameters())
    result = lib.sim.run(prog, 1)
    params = result.results[0]
    assert params == (64 * 64 + 64) * 4
    # parameters, their gradients (as big again), the input and its gradient
    assert result.stats[0].peak_memory >= 2 * params + 2 * 8 * 64 * 4


def test_memory_of_one_rank_does_not_leak_into_another():
    def prog(dist):
        rank = dist.get_rank()
        big = torch.zeros(262144) if rank == 0 else None      # 1 MiB, alive across the barrier
        dist.barrier()
        small = torch.zeros(25) if rank == 1 else None         # 100 B
        dist.barrier()
        return big is not None, small is not None
    stats = lib.sim.run(prog, 4).stats
    assert stats[0].peak_memory == 2**20
    assert stats[1].peak_memory == 100
    assert stats[2].peak_memory == stats[3].peak_memory == 0


# ---- clocks and traces --------------------------------------------------------------------------

def test_compute_clock_counts_every_op():
    """Two randn of 64x64 (one FLOP per element: an op without a formula) and a matmul (2·64³ FLOPs)."""
    def prog(dist):
        a, b = torch.randn(64, 64), torch.randn(64, 64)
        return a @ b
    result = lib.sim.run(prog, 2, cost=CostModel(flops_per_s=1e9))
    flops = 2 * 64**3 + 2 * 64 * 64
    for s in result.stats:
        assert s.flops == flops
        assert s.clock == pytest.approx(flops / 1e9, abs=1e-12)
    compute = [e for e in result.trace if e.op == "compute"]
    assert sorted((e.rank, e.start, e.end) for e in compute) == [(0, 0.0, pytest.approx(flops / 1e9, abs=1e-12)),
                                                                 (1, 0.0, pytest.approx(flops / 1e9, abs=1e-12))]


def test_an_op_costs_its_roofline_time():
    """max(FLOPs / peak, bytes / memory bandwidth): an add is memory-bound where memory is slow."""
    def prog(dist):
        a = torch.ones(1000)
        start = lib.sim.context.clock()
        a + a                                          # 1000 FLOPs, 12,000 bytes read and written
        return lib.sim.context.clock() - start
    fast_memory = lib.sim.run(prog, 1, cost=CostModel(flops_per_s=1e9, memory_bandwidth=1e15)).results[0]
    slow_memory = lib.sim.run(prog, 1, cost=CostModel(flops_per_s=1e9, memory_bandwidth=1e6)).results[0]
    assert fast_memory == pytest.approx(1000 / 1e9)
    assert slow_memory == pytest.approx(12000 / 1e6)


@pytest.mark.parametrize("form", ["matmul", "mv", "addr", "broadcast_sum"])
def test_a_product_costs_its_flops_however_it_is_written(form):
    """A matrix product written as mv, an outer-product update or a broadcast multiply-and-sum is not free."""
    def prog(dist):
        w, x = torch.ones(32, 16), torch.ones(16)
        start = lib.sim.context.clock()
        if form == "matmul":
            w @ x.reshape(16, 1)
        elif form == "mv":
            torch.mv(w, x)
        elif form == "addr":
            torch.zeros(32, 16).addr_(torch.ones(32), x)
        else:
            (w * x).sum(1)
        return lib.sim.context.clock() - start
    seconds = lib.sim.run(prog, 1, cost=CostModel(flops_per_s=1e9)).results[0]
    assert seconds >= 32 * 16 / 1e9          # at least one FLOP per multiply-add


def _attention_flops(dist, fused):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 8, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    start = lib.sim.context.flops()
    if fused:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    else:
        out = ((q @ k.transpose(-2, -1)) * 8 ** -0.5).softmax(-1) @ v
    forward = lib.sim.context.flops()
    out.sum().backward()
    return forward - start, lib.sim.context.flops() - forward


def test_fused_attention_on_a_cpu_costs_what_its_matmuls_do():
    """F.scaled_dot_product_attention runs one CPU kernel that torch's FLOP registry does not know: priced as the
    registry prices the GPU's fused kernels (4·b·a·s²·d forward, 2.5 times that backward), it costs what the same
    attention written out does, give or take the softmax's elementwise work."""
    fused = lib.sim.run(_attention_flops, 1, True).results[0]
    written = lib.sim.run(_attention_flops, 1, False).results[0]
    assert fused[0] == 4 * 2 * 2 * 16 * 16 * 8 and fused[1] == pytest.approx(2.5 * fused[0], rel=0.01)   # + sum's
    for f, w in zip(fused, written):
        assert 0.8 < f / w < 1.25


def test_the_host_computes_slower_than_the_device():
    def prog(dist, where):
        a = torch.ones(256, 256, device=where())
        start = lib.sim.context.clock()
        a @ a
        return lib.sim.context.clock() - start
    cost = CostModel(flops_per_s=1e9)
    on_device = lib.sim.run(prog, 1, lib.device, cost=cost).results[0]
    on_host = lib.sim.run(prog, 1, lib.host, cost=cost).results[0]
    assert on_host == pytest.approx(on_device * lib.sim.cost.HOST_COMPUTE_SLOWDOWN)


# Only the links cost time here: compute and memory are infinitely fast.
SLOW_LINKS = CostModel(intra_node_bandwidth=1e6, inter_node_bandwidth=1e5, latency=1e-3, flops_per_s=float("inf"),
                       memory_bandwidth=float("inf"))


def _send_1000_floats(dist):
    if dist.get_rank() == 0:
        dist.send(torch.ones(1000), dst=1)
    else:
        dist.recv(torch.zeros(1000), src=0)


@pytest.mark.parametrize("cost, expected", [
    (SLOW_LINKS, 1e-3 + 4000 / 1e6),                              # one node: NVLink-like
    (SLOW_LINKS.with_(ranks_per_node=1), 1e-3 + 4000 / 1e5),      # one rank per node: the network
    (SLOW_LINKS.with_(ranks_per_node=1, ranks_per_site=1, inter_site_bandwidth=1e4, inter_site_latency=0.25),
     0.25 + 4000 / 1e4),                                          # one rank per datacenter: the wide-area link
    (SLOW_LINKS.with_(ranks_per_site=2, inter_site_bandwidth=1e4, inter_site_latency=0.25),
     1e-3 + 4000 / 1e6),                                          # both in one datacenter: NVLink again
])
def test_p2p_clock_is_latency_plus_bytes_over_bandwidth(cost, expected):
    result = lib.sim.run(_send_1000_floats, 2, cost=cost)
    assert [s.clock for s in result.stats] == [pytest.approx(expected, abs=1e-12)] * 2
    assert result.time == pytest.approx(expected, abs=1e-12)
    comm = [e for e in result.trace if e.op != "compute"]
    assert [(e.rank, e.op, e.group, e.peer, e.bytes) for e in comm] == [(0, "send", "p2p", 1, 4000),
                                                                        (1, "recv", "p2p", 0, 4000)]
    for e in comm:
        assert e.start == 0.0 and e.end == pytest.approx(expected, abs=1e-12)


def _all_reduce_1000_floats(dist):
    dist.all_reduce(torch.ones(1000))


def test_a_collective_spanning_datacenters_runs_at_the_wide_area_links_speed_and_latency():
    """Two datacenters of two ranks: a group inside one keeps the node's link, the world pays the WAN's."""
    cost = SLOW_LINKS.with_(ranks_per_site=2, inter_site_bandwidth=1e4, inter_site_latency=0.25)

    def prog(dist):
        local = dist.new_group([0, 1]), dist.new_group([2, 3])
        dist.all_reduce(torch.ones(1000), group=local[dist.get_rank() // 2])
        inside = lib.sim.context.clock()
        _all_reduce_1000_floats(dist)
        return inside
    result = lib.sim.run(prog, 4, cost=cost)
    inside = 2 * 1e-3 + 1 * 4000 / 1e6                                # 2 ranks: 2 steps, (N-1)/N·2 of the bytes
    world = 2 * 3 * 0.25 + 2 * 3 / 4 * 4000 / 1e4
    assert result.results == [pytest.approx(inside, abs=1e-12)] * 4
    assert result.time == pytest.approx(inside + world, abs=1e-12)
    assert lib.sim.run(_all_reduce_1000_floats, 4, cost=SLOW_LINKS).time == pytest.approx(6e-3 + 1.5 * 4000 / 1e6)


OVERLAP = CostModel(flops_per_s=1e9, intra_node_bandwidth=4e6, latency=5e-6)
COMM = 2 * (2 - 1) * 5e-6 + 2 * (2 - 1) / 2 * 4000 / 4e6     # ring all-reduce of 4000 B on 2 ranks


def _overlap(dist, size, async_op):
    """The tensors arrive as arguments, so that the rank computes nothing but the matmul."""
    t, a, b = size
    work = dist.all_reduce(t, async_op=async_op)
    c = a @ b
    if async_op:
        work.wait()
    return t, c


@pytest.mark.parametrize("size", [64, 128])
def test_async_all_reduce_overlaps_compute(size):
    compute = 2 * size**3 / 1e9
    tensors = (torch.ones(1000), torch.randn(size, size), torch.randn(size, size))
    overlapped = lib.sim.run(_overlap, 2, tensors, True, cost=OVERLAP)
    serial = lib.sim.run(_overlap, 2, tensors, False, cost=OVERLAP)
    for s in overlapped.stats:
        assert s.clock == pytest.approx(max(compute, COMM), abs=1e-12)
    for s in serial.stats:
        assert s.clock == pytest.approx(compute + COMM, abs=1e-12)
    assert all(torch.equal(t, torch.full((1000,), 2.0)) for t, _ in overlapped.results)
    events = {(e.rank, e.op): e for e in overlapped.trace}
    for r in range(2):
        ar, comp = events[(r, "all_reduce")], events[(r, "compute")]
        assert (ar.group, ar.peer, ar.bytes) == ("WORLD", None, 4000)
        assert ar.start == 0.0 and ar.end == pytest.approx(COMM, abs=1e-12)
        assert comp.start == 0.0 and comp.end == pytest.approx(compute, abs=1e-12)


def test_timeline_and_chrome_trace(tmp_path):
    import matplotlib.figure

    result = lib.sim.run(ring_all_reduce, 4, per_rank([torch.ones(8) * r for r in range(4)]))
    fig = result.timeline(title="ring")
    assert isinstance(fig, matplotlib.figure.Figure)
    ax = fig.axes[0]
    assert len(ax.get_yticks()) == 4
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in range(4)]

    path = tmp_path / "trace.json"
    result.save_trace(path)
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == {r: f"rank {r}" for r in range(4)}
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(result.trace)
    assert {e["pid"] for e in spans} == {0, 1, 2, 3}
    assert sum(e["args"]["bytes"] for e in spans if e["name"] == "send") == sum(s.bytes_sent for s in result.stats)


# ---- determinism --------------------------------------------------------------------------------

def _noisy(dist):
    """Draws from the global RNG between communications: the draws interleave across ranks."""
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.randn(16)
    dist.all_reduce(x)
    y = torch.randn(16) + rank
    buf = torch.empty(16)
    work = dist.isend(y, (rank + 1) % n)
    dist.recv(buf, (rank - 1) % n)
    work.wait()
    z = torch.randn(32, 32) @ torch.randn(32, 32)
    keep = [torch.randn(100) for _ in range(rank + 1)]
    dist.barrier()
    return x, y, buf, z, len(keep)


def test_same_program_same_everything():
    runs = []
    for _ in range(2):
        torch.manual_seed(1234)
        runs.append(lib.sim.run(_noisy, 4))
    a, b = runs
    for ra, rb in zip(a.results, b.results):
        for ta, tb in zip(ra[:4], rb[:4]):
            assert torch.equal(ta, tb)
    assert a.stats == b.stats
    assert a.trace == b.trace
    assert not torch.equal(a.results[0][1] - 0, a.results[1][1] - 1), "ranks drew the same numbers"


# ---- failure modes ------------------------------------------------------------------------------

def test_deadlock_when_every_rank_sends_first():
    def prog(dist):
        rank, n = dist.get_rank(), dist.get_world_size()
        dist.send(torch.ones(4), dst=(rank + 1) % n)
        dist.recv(torch.zeros(4), src=(rank - 1) % n)
    message = str(_fails(prog, 4, Deadlock))
    for r in range(4):
        assert f"rank {r} waits" in message
    assert "send" in message


def test_deadlock_when_a_rank_returns_early():
    def prog(dist):
        if dist.get_rank() == 2:
            return None
        dist.all_reduce(torch.ones(3))
    message = str(_fails(prog, 3, Deadlock))
    assert "rank 2 has returned" in message
    assert "rank 0 waits in all_reduce" in message and "rank 1 waits in all_reduce" in message
    assert "returned while others still expected them" in message


@pytest.mark.parametrize("case", ["op", "shape", "dtype"])
def test_mismatched_collectives(case):
    def prog(dist):
        rank = dist.get_rank()
        if case == "op":
            t = torch.ones(4)
            if rank == 0:
                dist.all_reduce(t)
            else:
                dist.all_gather([torch.zeros(4) for _ in range(2)], t)
        elif case == "shape":
            dist.all_reduce(torch.ones(4 + rank))
        else:
            dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64))
    message = str(_fails(prog, 2, CollectiveMismatch))
    assert "rank 0" in message and "rank 1" in message


def test_isend_never_received():
    def prog(dist):
        if dist.get_rank() == 0:
            dist.isend(torch.ones(4), dst=1)
    message = str(_fails(prog, 2, CollectiveMismatch))
    assert "never received" in message and "rank 0" in message


def test_send_recv_size_mismatch():
    def prog(dist):
        if dist.get_rank() == 0:
            dist.send(torch.ones(4), dst=1)
        else:
            dist.recv(torch.zeros(5), src=0)
    _fails(prog, 2, CollectiveMismatch)


def test_send_recv_dtype_mismatch():
    def prog(dist):
        if dist.get_rank() == 0:
            dist.send(torch.ones(4), dst=1)
        else:
            dist.recv(torch.zeros(4, dtype=torch.float64), src=0)
    _fails(prog, 2, CollectiveMismatch)


def test_rank_raising_names_rank_line_and_error():
    def prog(dist):
        if dist.get_rank() == 1:
            raise ValueError("shard size 7 does not divide 10")
        dist.all_reduce(torch.ones(2))
    error = _fails(prog, 3, RankFailed)
    text = str(error)
    assert error.rank == 1
    assert isinstance(error.exception, ValueError)
    assert "ValueError: shard size 7 does not divide 10" in text
    assert 'raise ValueError("shard size 7 does not divide 10")' in text
    assert "test_sim_runtime.py" in text
    assert "lib/sim" not in text and "lib\\sim" not in text
    # Said once: the message, then the learner's frames, not the exception's line again at the traceback's end.
    assert text.count("shard size 7 does not divide 10") == 2        # the message, and the raise in the frame
    assert text.startswith("rank 1 raised ValueError: shard size 7")
    assert text.rstrip().endswith('raise ValueError("shard size 7 does not divide 10")')


def test_rank_raising_in_torch_shows_the_learners_line_and_the_error_once():
    def prog(dist):
        torch.ones(2, 3) @ torch.ones(2, 3)
    text = str(_fails(prog, 2, RankFailed))
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in text
    assert text.count("cannot be multiplied") == 1 and "torch.ones(2, 3) @ torch.ones(2, 3)" in text


def test_rank_raising_from_another_exception_says_it_once():
    def prog(dist):
        try:
            {}["shard"]
        except KeyError as e:
            raise ValueError("no such shard") from e
    text = str(_fails(prog, 2, RankFailed))
    assert text.count("no such shard") == 2 and text.rstrip().endswith('raise ValueError("no such shard") from e')


def test_a_bad_argument_inside_a_dist_call_is_invalid_call():
    def prog(dist):
        t = torch.ones(2)
        dist.all_reduce(t, op="sum")       # not a ReduceOp: a learner mistake inside a sim call
    error = _fails(prog, 2, InvalidCall)
    assert "rank 0" in str(error) and "ReduceOp.SUM" in str(error)
    assert "lib/sim" not in str(error)


def test_an_async_call_never_waited_on_is_found_in_the_rank_order_of_calls():
    def prog(dist):
        t, out = torch.ones(4), torch.empty(4 * dist.get_world_size())
        dist.all_gather_single(out, t)
        dist.all_reduce(t)
        dist.all_gather_single(out, t, async_op=True)         # issued, never waited on
    message = str(_fails(prog, 2, InvalidCall))
    assert "rank 0 returned without waiting on its all_gather_single((4,) float32), the 2nd of its 2 all_gather " \
           "calls, posted after its 1st all_reduce" in message
    assert "a prefetch of a layer done already" in message


def _spin(dist):
    if dist.get_rank() == 1:
        while True:
            pass


def _spin_with_torch(dist):
    x = torch.zeros(1)
    if dist.get_rank() == 0:
        while x.item() < 1:
            x = x * 1.0


@pytest.mark.parametrize("prog", [_spin, _spin_with_torch])
def test_endless_loop_times_out(prog):
    message = str(_fails(prog, 2, SimTimeout, timeout=1.0))
    assert "rank" in message


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/self/schedstat"),
                    reason="Linux's run-queue statistics: elsewhere a rank is judged by its CPU time alone")
def test_a_rank_starved_of_cpu_by_other_work_is_computing_not_blocked():
    """A rank thread that computes on a machine busy with other work gets little CPU but waits for it all the while;
    one that waits on a lock or an Event (tests/test_share_nothing.py) does neither. Here the thread runs at the
    lowest priority on one CPU beside a busy process: it gets about 1% of that CPU, under the 5% a computing thread
    is expected to use, and must still not count as blocked (seen in a seed sweep run with nice 19)."""
    cpu = min(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    stop, started = threading.Event(), threading.Event()

    def compute():
        os.sched_setaffinity(0, {cpu})                       # 0: this thread only
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        started.set()
        x = 0
        while not stop.is_set():
            x += 1

    thread = threading.Thread(target=compute, name="starved")
    try:
        time.sleep(0.5)                                     # the busy process is running
        thread.start()
        started.wait(10)
        watch, cpu_before, wall_before = threads.ProgressWatch(), threads.cpu_time(thread), time.monotonic()
        blocked = []
        while time.monotonic() - wall_before < threads.BLOCKED_AFTER + 1.5:
            blocked.append(watch.blocked(thread))
            time.sleep(threads.POLL)
        share = (threads.cpu_time(thread) - cpu_before) / (time.monotonic() - wall_before)
    finally:
        stop.set()
        busy.kill()
        busy.wait()
        thread.join(30)
    assert share < threads.IDLE_SHARE, f"the thread was not starved ({share:.1%} of a CPU): the test proves nothing"
    assert not any(blocked)


@pytest.mark.parametrize("case", ["non_contiguous", "send_to_self", "dst_out_of_range", "all_gather_list",
                                  "irecv_not_waited", "async_all_reduce_not_waited"])
def test_invalid_calls(case):
    def prog(dist):
        rank, n = dist.get_rank(), dist.get_world_size()
        if case == "non_contiguous":
            dist.all_reduce(torch.zeros(4, 3).t())
        elif case == "send_to_self":
            dist.send(torch.ones(2), dst=rank)
        elif case == "dst_out_of_range":
            dist.send(torch.ones(2), dst=n)
        elif case == "all_gather_list":
            dist.all_gather([torch.zeros(2) for _ in range(n - 1)], torch.ones(2))
        elif case == "irecv_not_waited":
            if rank == 0:
                dist.irecv(torch.zeros(2), src=1)
            else:
                dist.send(torch.ones(2), dst=0)
        else:
            dist.all_reduce(torch.ones(2), async_op=True)
    message = str(_fails(prog, 2, InvalidCall))
    assert "rank" in message


@pytest.mark.parametrize("catch", ["Exception", "PuzzleError", "bare"])
def test_learner_cannot_swallow_a_mismatch(catch):
    caught = PuzzleError if catch == "PuzzleError" else Exception

    def prog(dist):
        t = torch.ones(4)
        try:
            if dist.get_rank() == 0:
                dist.all_reduce(t)
            else:
                dist.all_gather([torch.zeros(4), torch.zeros(4)], t)
        except caught:
            pass
        return t

    def prog_bare(dist):
        t = torch.ones(4)
        try:
            if dist.get_rank() == 0:
                dist.all_reduce(t)
            else:
                dist.all_gather([torch.zeros(4), torch.zeros(4)], t)
        except:  # noqa: E722  (what a learner might write)
            pass
        return t
    _fails(prog_bare if catch == "bare" else prog, 2, CollectiveMismatch)


# ---- scale, arguments, device -------------------------------------------------------------------

def test_ring_all_reduce_on_64_ranks():
    n = 64
    xs = [torch.full((n * 2,), float(r)) for r in range(n)]
    result = lib.sim.run(ring_all_reduce, n, per_rank(xs))
    want = torch.full((n * 2,), float(sum(range(n))))
    assert all(torch.equal(t, want) for t in result.results)


def test_per_rank_values_and_deep_copies():
    shared = torch.zeros(3)

    def prog(dist, mine, common):
        if dist.get_rank() == 0:
            common.add_(100)
            mine.add_(1)
        dist.barrier()
        return mine.clone(), common.clone()
    mine = [torch.full((2,), float(r)) for r in range(3)]
    result = lib.sim.run(prog, 3, per_rank(mine), shared)
    assert result.results[0][0].tolist() == [1.0, 1.0]
    assert [r[0].tolist() for r in result.results[1:]] == [[1.0, 1.0], [2.0, 2.0]]
    assert result.results[0][1].tolist() == [100.0] * 3
    assert result.results[1][1].tolist() == result.results[2][1].tolist() == [0.0] * 3
    assert shared.tolist() == [0.0] * 3
    assert mine[0].tolist() == [0.0, 0.0]


def test_per_rank_needs_one_value_per_rank():
    with pytest.raises(InvalidCall):
        lib.sim.run(lambda dist, x: x, 3, per_rank([1, 2]))


def test_device_is_cpu_inside_a_simulated_rank():
    # cpu:0, so that .to(lib.device()) copies back from host memory (lib.host() is cpu:1 there)
    assert lib.sim.run(lambda dist: lib.device(), 2).results == [torch.device("cpu", 0)] * 2
    assert lib.sim.run(lambda dist: lib.host(), 2).results == [torch.device("cpu", 1)] * 2
    assert lib.device() == lib.host() == torch.device("cpu")        # outside: the real CPU


def test_a_run_that_keeps_allocating_is_stopped_with_a_clear_error():
    """A learner's loop that keeps every result must not take the kernel down: the run ends, explained."""
    def hoard(dist):
        kept = []
        while True:
            kept.append(torch.zeros(2**18))          # 1 MiB at a time, never freed
    start = time.monotonic()
    with pytest.raises(lib.sim.InvalidCall, match="simulator's limit for one rank") as info:
        lib.sim.run(hoard, 2, memory_limit=64 * 2**20)
    assert "rank 0 holds more than 0.03 GiB" in str(info.value)
    assert time.monotonic() - start < 60      # a guard against a hang, not a speed test


# ---- link times do not depend on the order the simulator matches messages in ---------------------------
def _late_and_early_sender(dist):
    """Rank 0 computes for a while, then sends to rank 1; rank 2 sends to rank 1 at once. Rank 1 posts both
    receives at t = 0, rank 0's first, so the simulator matches rank 0's message first, though it starts later."""
    rank = dist.get_rank()
    buf = torch.zeros(4)
    if rank == 0:
        a = torch.randn(64, 64)
        for _ in range(20):
            a = a @ a / 64
        dist.isend(torch.ones(4), 1).wait()
    elif rank == 2:
        dist.isend(torch.full((4,), 2.0), 1).wait()
    else:
        from_0, from_2 = dist.irecv(buf, 0), dist.irecv(torch.zeros(4), 2)
        from_2.wait()
        from_0.wait()


def test_a_message_is_not_delayed_by_one_that_starts_later():
    cost = CostModel(flops_per_s=1e9, latency=1e-6, intra_node_bandwidth=1e12, inter_node_bandwidth=1e12)
    result = lib.sim.run(_late_and_early_sender, 3, cost=cost)
    start = {e.peer: e.start for e in result.trace if e.rank == 1 and e.op == "recv"}
    assert start[2] < 1e-6 and start[0] > 100e-6          # rank 2 sends at once, rank 0 after ~10 ms of matmuls


def test_messages_sharing_a_link_still_take_turns():
    def two_to_one(dist):
        rank, big = dist.get_rank(), torch.zeros(1 << 16)
        if rank == 1:
            a, b = dist.irecv(big, 0), dist.irecv(torch.zeros(1 << 16), 2)
            a.wait()
            b.wait()
        else:
            dist.send(torch.ones(1 << 16), 1)

    cost = CostModel(latency=0.0, intra_node_bandwidth=1e9, inter_node_bandwidth=1e9)
    result = lib.sim.run(two_to_one, 3, cost=cost)
    spans = sorted((e.start, e.end) for e in result.trace if e.rank == 1 and e.op == "recv")
    assert spans[0][1] <= spans[1][0] and spans[1][0] > 0   # rank 1's incoming link carries one at a time


# ---- blocked ranks and leftover threads ------------------------------------------------------------------

_FLAG = {"ready": False}


def _sleeps_until_flag(dist):
    """Waits in a sleep loop for a flag another rank should set: only one rank runs, so it never comes."""
    if dist.get_rank() == 0:
        while not _FLAG["ready"]:
            time.sleep(0.01)
    else:
        _FLAG["ready"] = True


def test_a_rank_that_sleeps_waiting_for_another_is_reported_within_seconds():
    _FLAG["ready"] = False
    message = str(_fails(_sleeps_until_flag, 2, lib.sim.SharedMemory))
    assert "rank 0 is blocked outside dist" in message
    assert "test_sim_runtime.py" in message and "time.sleep(0.01)" in message


def test_a_rank_that_cannot_be_woken_is_named_and_nothing_hangs():
    """A raw lock cannot be interrupted: the run still ends, the error says which thread stays and why."""
    lock = threading.Lock()
    lock.acquire()

    def waits_on_a_lock(dist):
        lock.acquire()

    start = time.monotonic()
    with pytest.raises(lib.sim.SharedMemory) as info:
        lib.sim.run(waits_on_a_lock, 1)
    assert time.monotonic() - start < 30.0
    assert "could not be stopped" in str(info.value) and "lock.acquire()" in str(info.value)
    assert getattr(torch.save, "_lib_sim_patch", False), "the thread still runs the rank's code: its guards stay"
    lock.release()                             # let the thread go, so the fixture finds none left
    for t in _sim_threads():
        t.join(timeout=5.0)
    lib.sim.run(lambda dist: None, 1)
    assert not getattr(torch.save, "_lib_sim_patch", False), "once it has ended, the next run puts torch back"


def test_two_hundred_failing_checks_leave_no_thread():
    from lib.checker.puzzle import Case, Puzzle

    def raises(dist, x):
        raise ValueError("wrong")

    def deadlocks(dist, x):
        dist.recv(x, (dist.get_rank() + 1) % dist.get_world_size())

    def mismatches(dist, x):
        if dist.get_rank() == 0:
            dist.all_reduce(x)
        else:
            dist.barrier()

    def stub(dist, x):
        raise NotImplementedError

    puzzle = Puzzle("sum", "00_test", lambda rng, n: Case(n, (torch.ones(3),), [torch.full((3,), float(n))] * n, "x"),
                    world_sizes=(2, 4))
    before = threading.active_count()
    for i in range(200):
        outcome = puzzle.evaluate([raises, deadlocks, mismatches, stub][i % 4])
        assert not outcome.ok
    assert threading.active_count() == before


# ---- injected faults: a rank that dies, and peers that carry on without it ---------------------------------
def _all_reduce_until_a_peer_dies(dist):
    x, done = torch.ones(4), 0
    try:
        while done < 5:
            dist.all_reduce(x)
            done += 1
    except RuntimeError as e:                  # torch.distributed's errors are RuntimeErrors too
        survivors = dist.new_group([r for r in range(dist.get_world_size()) if r != e.rank])
        dist.all_reduce(x, group=survivors)
        return done, e.rank, str(e), x
    return done, None, "", x


def test_a_faulty_rank_stops_at_its_kth_call_and_its_peers_catch_the_error_naming_it():
    result = lib.sim.run(_all_reduce_until_a_peer_dies, 4, faults={2: 3})
    assert result.results[2] is None
    for rank in (0, 1, 3):
        step, dead, message, x = result.results[rank]
        assert (step, dead) == (2, 2)                    # two all-reduces done, the third needed rank 2
        assert "rank 2, which died at its communication call #3" in message
        assert torch.equal(x, torch.full((4,), 3.0 * 16))  # 4 × 4 = 16 before; the survivors' group sums 3 copies
    assert result.stats[2].calls == {"all_reduce": 2}


def test_a_peer_already_waiting_on_the_rank_that_dies_is_woken_with_the_error():
    def prog(dist):
        if dist.get_rank() == 0:
            try:
                dist.recv(torch.zeros(2), src=1)
            except lib.sim.RankDied as e:
                return e.rank
        else:
            dist.send(torch.ones(2), dst=0)
    assert lib.sim.run(prog, 2, faults={1: 1}).results == [1, None]


def test_an_uncaught_peer_death_fails_the_run_naming_both_ranks():
    def prog(dist):
        for _ in range(3):
            dist.barrier()
    with pytest.raises(RankFailed) as caught:
        lib.sim.run(prog, 3, faults={1: 2})
    assert "RankDied" in str(caught.value) and "needs rank 1, which died" in str(caught.value)


def test_a_send_to_a_dead_rank_raises_at_once_and_faults_are_checked():
    def prog(dist):
        try:
            dist.barrier()                       # rank 1 dies here; rank 0, already waiting, is woken
        except lib.sim.RankDied:
            pass
        try:
            dist.send(torch.ones(1), dst=1)
        except lib.sim.RankDied as e:
            return str(e)
    result = lib.sim.run(prog, 2, faults={1: 1})
    assert result.results[0].startswith("rank 0's send(dst=1) needs rank 1, which died")
    with pytest.raises(InvalidCall):
        lib.sim.run(prog, 2, faults={2: 1})
    with pytest.raises(InvalidCall):
        lib.sim.run(prog, 2, faults={0: 0})


# ---- a deadlock names the peer that is wrong, not only who waits on whom -------------------------------------
def _ring_receiving_from(direction: int, send_to: int = None):
    def prog(dist, x):
        r, n = dist.get_rank(), dist.get_world_size()
        buf = torch.empty_like(x)
        work = dist.isend(x, (r + send_to) % n) if send_to is not None else None
        dist.recv(buf, (r + direction) % n)
        if work is not None:
            work.wait()
        return buf
    return prog


def test_a_deadlock_names_a_sender_and_receiver_that_disagree_on_the_neighbour():
    message = str(_fails(_ring_receiving_from(+1, send_to=+1), 3, Deadlock, torch.ones(2)))
    assert "rank 0 waits for a message from rank 1, but rank 1 sends to rank 2" in message, message


def test_a_deadlock_where_nobody_sends_says_so():
    message = str(_fails(_ring_receiving_from(-1), 3, Deadlock, torch.ones(2)))
    assert "every rank waits to receive and none has sent" in message, message


def test_a_deadlock_of_two_ranks_receiving_from_each_other_says_one_must_send_first():
    def prog(dist, x):
        buf = torch.empty_like(x)
        dist.recv(buf, 1 - dist.get_rank())
        dist.send(x, 1 - dist.get_rank())
        return buf
    message = str(_fails(prog, 2, Deadlock, torch.ones(2)))
    assert "ranks 0 and 1 each wait to receive from the other" in message, message


def test_a_group_seen_as_the_world_refuses_a_call_it_lacks_in_the_learners_terms():
    """A mesh axis's dist (lib.group_as_world) asked for a call of torch.distributed it does not carry says which
    dist it is and what it has, not "'GroupAsWorld' object has no attribute"; a name torch lacks too gets the
    simulator's own refusal."""
    from lib.group_as_world import GroupAsWorld

    def prog(dist, name):
        mine = [r for r in ((0, 1), (2, 3)) if dist.get_rank() in r][0]
        groups = {ranks: dist.new_group(list(ranks)) for ranks in ((0, 1), (2, 3))}
        axis = GroupAsWorld(dist, groups[mine], mine, siblings=[(0, 1), (2, 3)])
        assert axis.is_initialized()
        getattr(axis, name)

    with pytest.raises(RankFailed) as caught:
        lib.sim.run(prog, 4, "all_gather_object")
    message = str(caught.value)
    assert "dist.all_gather_object is not offered by the dist of a group seen as the world" in message, message
    assert "GroupAsWorld" not in message, message
    with pytest.raises(RankFailed, match="torch.distributed has no attribute 'all_gather_objects'"):
        lib.sim.run(prog, 4, "all_gather_objects")


def _all_to_all_with_splits(dist, mistake):
    """Rank s sends 3s + r + 1 rows to rank r (the two directions differ), with its split lists as `mistake` has
    them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    sends = [3 * rank + r + 1 for r in range(world)]
    receives = [3 * s + rank + 1 for s in range(world)]
    inp = torch.zeros(sum(sends), 2)
    out = torch.empty(sum(receives), 2)
    if mistake == "swapped":
        dist.all_to_all_single(out, inp, sends, receives)
    elif mistake == "output sized like the input":              # the way back's buffer sized as the way there's
        dist.all_to_all_single(torch.empty(sum(sends), 2), inp, receives, sends)
    elif mistake == "receives for sends":                       # the receive counts passed as the send counts too
        dist.all_to_all_single(out, inp, receives, receives)
    else:                                                       # its own rows left out of what it sends
        sent = [0 if r == rank else n for r, n in enumerate(sends)]
        dist.all_to_all_single(torch.empty(sum(sends), 2), inp, sends, sent)
    return out


def test_all_to_all_single_split_lists_swapped_are_named_and_a_wrong_input_list_is_not_called_a_swap():
    """The two lists in each other's places: each adds up to the other tensor's rows, and the rank's own entry is
    the same in both. An input list that leaves the rank's own rows out, beside an output list that happens to add
    up to the input's rows, is not a swap."""
    with pytest.raises(InvalidCall, match="the two are swapped"):
        lib.sim.run(_all_to_all_with_splits, 3, "swapped")
    with pytest.raises(InvalidCall) as caught:
        lib.sim.run(_all_to_all_with_splits, 3, "own rows left out")
    assert "the two are swapped" not in str(caught.value), str(caught.value)
    assert "input_split_sizes=[0, 2, 3]" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("mistake, words", [
    ("output sized like the input", "and the output has the input's 6 rows: a buffer sized for the other "
                                    "direction's exchange"),
    ("receives for sends", "They add up to the output's 12 rows: the other direction's splits"),
    ("own rows left out", "They add up to 5: size the input from them, or pass the sizes of its rows."),
])
def test_split_sizes_that_do_not_fit_their_tensor_are_said_from_what_the_call_holds(mistake, words):
    """'the other direction's' only where the call's other tensor bears it out."""
    with pytest.raises(InvalidCall) as caught:
        lib.sim.run(_all_to_all_with_splits, 3, mistake)
    message = str(caught.value)
    assert words in message, message
    assert message.count("other direction") <= 1, message


def _reversed_sends(dist):
    """Rank 0 sends [1, 2] rows and receives [1, 2] (alike by chance, and right); rank 1 should send [2, 3] and
    receive [2, 3], and sends its rows in reversed order of ranks, [3, 2]."""
    rank = dist.get_rank()
    sends, receives = ([1, 2], [1, 2]) if rank == 0 else ([3, 2], [2, 3])
    out = torch.empty(sum(receives), 1)
    dist.all_to_all_single(out, torch.zeros(sum(sends), 1), receives, sends)
    return out


def test_a_receiver_whose_splits_match_its_sends_by_chance_is_not_told_it_guessed():
    """'its output_split_sizes are its own input_split_sizes' is the mistake only where every rank sized what it
    receives from what it sends; here rank 1's sends are wrong, and rank 0's lists are alike and right."""
    with pytest.raises(CollectiveMismatch) as caught:
        lib.sim.run(_reversed_sends, 2)
    message = str(caught.value)
    assert "rank 1 sends 3 rows to rank 0, but rank 0 expects 2" in message, message
    assert "are its own input_split_sizes" not in message, message
