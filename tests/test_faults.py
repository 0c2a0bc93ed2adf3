"""A fault injected in the simulator and the same fault emulated on real processes (lib.real.faults): one program
that survives it gives the same results in both worlds."""

import pytest
import torch

import lib.sim
from lib.real.faults import run_with_fault
from lib.real.launch import launch
from tests.test_sim_runtime import _all_reduce_until_a_peer_dies


@pytest.mark.slow
def test_the_emulated_fault_on_gloo_gives_what_the_simulator_gives():
    simulated = lib.sim.run(_all_reduce_until_a_peer_dies, 3, faults={1: 2}).results
    real = launch(run_with_fault, 3, _all_reduce_until_a_peer_dies, 1, 2)
    assert real[1] is None and simulated[1] is None
    for rank in (0, 2):
        (done, dead, message, x), (sim_done, sim_dead, sim_message, sim_x) = real[rank], simulated[rank]
        assert (done, dead) == (sim_done, sim_dead) == (1, 1)
        assert torch.equal(x, sim_x) and torch.equal(x, torch.full((4,), 6.0))
        for said in (message, sim_message):
            assert said.startswith(f"rank {rank}'s all_reduce") and "needs rank 1, which died at its communication " \
                "call #2" in said


# ---- survive_failure: any right answer to the statement passes (gradients come as training goes) -------------
def survive_prefetching(dist, files, grads, every, lr):
    """A right answer unlike the reference: the next step's gradient asked before the checkpoint, the checkpoint
    kept as one (3, total) tensor and resharded by slicing it, one flat all-gather per checkpoint."""
    from lib.analytic.cross_site import shard_bounds
    from puzzles.zero import adam_update

    total, rank = sum(f["param"].numel() for f in files), dist.get_rank()
    members, group = list(range(dist.get_world_size())), None
    saved = torch.stack([torch.cat([f[k] for f in files]) for k in ("param", "exp_avg", "exp_avg_sq")])  # (3, total)
    saved_step = files[0]["step"]
    while True:
        n = len(members)
        lo, hi = shard_bounds(total, n, members.index(rank))
        param, m, v = (saved[i, lo:hi].clone() for i in range(3))
        step = saved_step
        try:
            grad = grads(step) if step < len(grads) else None
            while grad is not None:
                adam_update(param, grad, m, v, step + 1, lr)
                step += 1
                grad = grads(step) if step < len(grads) else None
                if step % every == 0:
                    size = -(-total // n)
                    mine = torch.zeros(3 * size, dtype=param.dtype)
                    for i, t in enumerate((param, m, v)):
                        mine[i * size:i * size + t.numel()] = t
                    parts = [torch.empty_like(mine) for _ in range(n)]
                    dist.all_gather(parts, mine, group=group)
                    bounds = [shard_bounds(total, n, r) for r in range(n)]
                    saved = torch.stack([torch.cat([p[i * size:i * size + b - a] for p, (a, b) in zip(parts, bounds)])
                                         for i in range(3)])
                    saved_step = step
            return param, m, v
        except RuntimeError as e:
            members.remove(e.rank)
            group = dist.new_group(members)


def survive_by_recursion(dist, files, grads, every, lr, members=None, group=None):
    """Another: a failure starts the whole function again on the survivors from the last checkpoint's files, and
    each step's gradient is asked twice (asking again for the step in hand is allowed)."""
    from lib.analytic.cross_site import shard_bounds
    from puzzles.zero import adam_update
    from solutions.beyond import reshard_checkpoint

    members = list(range(dist.get_world_size())) if members is None else members
    n, me = len(members), members.index(dist.get_rank())
    total = sum(f["param"].numel() for f in files)
    *state, start = reshard_checkpoint(files, n, me)
    param, m, v = (t.clone() for t in state)
    lo, hi = shard_bounds(total, n, me)
    saved = files
    try:
        for step in range(start, len(grads)):
            assert grads(step).numel() == hi - lo
            adam_update(param, grads(step), m, v, step + 1, lr)
            if (step + 1) % every == 0:
                mine = torch.zeros(3, -(-total // n), dtype=param.dtype)
                mine[:, :hi - lo] = torch.stack([param, m, v])
                parts = [torch.empty_like(mine) for _ in range(n)]
                dist.all_gather(parts, mine, group=group)
                saved = [{"offset": a, "step": step + 1, "param": p[0, :b - a], "exp_avg": p[1, :b - a],
                          "exp_avg_sq": p[2, :b - a]} for p, (a, b) in zip(parts, (shard_bounds(total, n, r)
                                                                                  for r in range(n)))]
        return param, m, v
    except RuntimeError as e:
        survivors = [r for r in members if r != e.rank]
        return survive_by_recursion(dist, saved, grads, every, lr, survivors, dist.new_group(survivors))


@pytest.mark.parametrize("answer", [survive_prefetching, survive_by_recursion])
def test_right_answers_unlike_the_reference_survive_on_every_seed(answer):
    import puzzles.beyond as P

    for seed in range(6):
        outcome = P.survive_failure.evaluate(answer, seed=seed)
        assert outcome.status == "passed", (seed, outcome.message)


def test_the_gradients_come_in_order_and_again_only_from_the_last_checkpoint():
    """grads(step) outside a run: in order; the step in hand again; after a failure back to the step of the
    checkpoint before the last one reached (the last may have been cut short), never further."""
    from lib.checker.feed import FeedRefused, StepFeed

    feed = StepFeed([torch.full((2,), float(t)) for t in range(10)], first=1, every=3)
    assert len(feed) == 10 and feed(1)[0] == 1 and feed(1)[0] == 1 and feed(2)[0] == 2
    with pytest.raises(FeedRefused, match="after step 2: a step's value comes when training reaches it"):
        feed(4)
    for t in range(3, 9):
        feed(t)                                  # steps done: 9, so the checkpoints at 6 and at 9 (maybe cut short)
    assert feed.earliest() == 6 and feed(6)[0] == 6 and feed(7)[0] == 7
    with pytest.raises(FeedRefused, match=r"asked for step 5 again, having reached step 8.*\(step 6\)"):
        feed(5)
    with pytest.raises(FeedRefused, match="there are steps 1 to 9"):
        feed(10)


def _copies_of_the_feed(dist, feed):
    """Copies taken at the start (deep, shallow, moved to the device) to replay the first steps from later."""
    import copy

    import lib
    from lib.real.backends import to_device
    copies = [copy.deepcopy(feed), copy.copy(feed), to_device(feed, lib.device())]
    for t in range(1, 9):
        feed(t)
    return [c(1) for c in copies]


def test_a_copy_of_the_feed_goes_on_from_where_the_feed_is():
    from lib.checker.feed import FeedRefused, StepFeed

    feed = StepFeed([torch.full((2,), float(t)) for t in range(10)], first=1, every=3)
    with pytest.raises(FeedRefused, match="asked for step 1 again, having reached step 8"):
        lib.sim.run(_copies_of_the_feed, 2, feed)
    assert feed(1)[0] == 1                       # the run's original is untouched: each rank had its own copy


def _reaching_behind_dist(dist):
    """A learner's function that reaches for the real module behind its dist, then for its __dict__."""
    said = []
    for name in ("_dist", "__dict__"):
        try:
            getattr(dist, name)
        except AttributeError as e:
            said.append(str(e))
    return said, dist.get_rank()


@pytest.mark.slow
def test_the_real_dist_behind_the_emulated_fault_is_out_of_reach():
    said = launch(run_with_fault, 2, _reaching_behind_dist, 1, 5)
    for rank, (messages, reported) in enumerate(said):
        assert reported == rank and len(messages) == 2, messages
        assert all("not the function's to reach" in m and "Hint: use dist's public calls" in m for m in messages)
        assert "'_dist'" in messages[0]


# ---- a feed that hands each rank its shard, in the layout of the ranks it knows to be alive ----------------------
def _shards_before_and_after_the_failure(dist, feed):
    """Steps 1 and 2 forward; the failure caught at the second all_reduce; step 2 asked again after it."""
    got = [feed(1)]
    dist.all_reduce(torch.zeros(1))
    got.append(feed(2))
    try:
        dist.all_reduce(torch.zeros(1))
    except RuntimeError:
        got.append(feed(2))
    return got


@pytest.mark.parametrize("world", [2, 3])
def test_each_rank_gets_its_shard_in_the_layout_of_the_ranks_alive(world):
    """Until a rank is told of the failure, its shard among all ranks; after, among the survivors: what it kept
    before cannot stand in for what it needs after."""
    from lib.analytic.cross_site import shard_bounds
    from lib.checker.feed import StepFeed
    from puzzles.beyond import ShardOfTheLiving

    values = [torch.arange(10.0) + 100 * t for t in range(4)]
    dead = world - 2
    feeds = lib.sim.per_rank([StepFeed(values, 1, every=2, cut=ShardOfTheLiving(world, dead, r))
                              for r in range(world)])
    results = lib.sim.run(_shards_before_and_after_the_failure, world, feeds, faults={dead: 2}).results
    survivors = [r for r in range(world) if r != dead]
    for rank in survivors:
        before, again, after = results[rank]
        lo, hi = shard_bounds(10, world, rank)
        assert torch.equal(before, values[1][lo:hi]) and torch.equal(again, values[2][lo:hi])
        lo, hi = shard_bounds(10, world - 1, survivors.index(rank))
        assert torch.equal(after, values[2][lo:hi])
        assert after._base is None                  # a copy: no way back to the whole gradient


def _pickling_the_feed(dist, feed):
    import pickle
    return pickle.dumps(feed)


def test_the_feed_pickles_for_real_processes_but_not_inside_a_simulated_rank():
    """__reduce__ returns every value and the position: a real run's parent pickles the feed for its processes,
    but a rank's code unpacking its feed would read every step's value ahead."""
    import pickle

    from lib.checker.feed import StepFeed
    from lib.sim import OutOfView
    from puzzles.beyond import ShardOfTheLiving

    feed = StepFeed([torch.full((4,), float(t)) for t in range(5)], 1, every=2, cut=ShardOfTheLiving(2, 1, 0))
    copy = pickle.loads(pickle.dumps(feed))
    assert torch.equal(copy(1), torch.full((2,), 1.0)) and len(copy) == 5
    with pytest.raises(OutOfView, match=r"reached feed.__reduce_ex__"):
        lib.sim.run(_pickling_the_feed, 2, feed)
