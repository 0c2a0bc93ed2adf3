"""lib.launch on real gloo ranks: results, labelled output, failures, hangs, and no process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from lib.errors import LaunchError, RankFailed
from lib.real.launch import current_backend, launch

launch_module = sys.modules["lib.real.launch"]     # the module (lib.launch is the function)

ROOT = Path(__file__).resolve().parents[1]


def _children() -> list[int]:
    """Processes whose parent is this one, zombies included (an unreaped child is one)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:  # field 4, after "(comm)" and the state
                found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def no_process_left_behind():
    before = set(_children())
    yield
    assert set(_children()) <= before, "launch left child processes behind"


# ---- functions the ranks run (module level: fork needs nothing else, spawn can import them) ---------


def sums_and_reports(dist, scale):
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.arange(3.0) + 10 * rank
    dist.all_reduce(x)
    print(f"hello from rank {rank} of {world}")
    print("a warning on stderr", file=sys.stderr)
    env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return {
        "sum": x * scale,
        "nested": [torch.ones(2, requires_grad=True) * rank, (rank, "text")],  # non-leaf: must come back detached
        "env": env,
        "debug": os.environ.get("TORCH_DISTRIBUTED_DEBUG"),
        "backend": current_backend(),
        "threads": torch.get_num_threads(),
    }


def raises_on_rank_1(dist):
    x = torch.ones(3)
    if dist.get_rank() == 1:
        raise ValueError("rank one is unhappy")
    dist.all_reduce(x)  # the other ranks wait here, then lose their peer
    return x


def killed_on_rank_1(dist):
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def rank_1_never_arrives(dist):
    if dist.get_rank() == 1:
        time.sleep(60)
    dist.all_reduce(torch.ones(3))


def rank_1_skips_the_collective(dist):
    x = torch.ones(3)
    if dist.get_rank() != 1:
        dist.all_reduce(x)
    return x


def shapes_differ(dist):
    dist.all_reduce(torch.ones(3 + dist.get_rank()))


def returns_a_generator(dist):
    return (i for i in range(3))


def sleeps(dist):
    time.sleep(60)


def torchrun_target(dist, scale=1):
    """Called by the torchrun test in fresh processes, which import this file as a module."""
    x = torch.full((2,), float(dist.get_rank() + 1)) * scale
    dist.all_reduce(x)
    return x.tolist()


# ---- tests --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 4])
def test_results_come_back_by_rank_with_labelled_output(world, capsys):
    results = launch(sums_and_reports, world, 2.0)
    expected_sum = (torch.arange(3.0) * world + 10 * sum(range(world))) * 2.0
    out = capsys.readouterr().out
    for rank, result in enumerate(results):
        torch.testing.assert_close(result["sum"], expected_sum)
        assert not result["nested"][0].requires_grad
        assert result["nested"][1] == (rank, "text")
        assert result["env"] == {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                                 "LOCAL_WORLD_SIZE": str(world)}
        assert result["debug"] is None  # DETAIL is opt-in (launch(..., debug=True))
        assert result["backend"] == "gloo"
        assert result["threads"] == 1
        assert f"[rank {rank}] hello from rank {rank} of {world}" in out.splitlines()
        assert f"[rank {rank}] a warning on stderr" in out.splitlines()
    assert current_backend() is None  # the caller itself never joins a process group


def test_lambdas_and_closures_run_under_fork():
    offset = 7
    assert launch(lambda dist: dist.get_rank() + offset, 3) == [7, 8, 9]


@pytest.mark.parametrize("gpus, method", [(0, "fork"), (1, "spawn")])
def test_gloo_ranks_fork_only_where_no_gpu_is_visible(gpus, method, monkeypatch):
    """Where a GPU is visible, autograd's device threads start at the first backward and a forked rank's backward
    fails (a notebook's simulated check runs one before the real cell; seen on an H200): gloo ranks spawn there."""
    monkeypatch.setattr(launch_module, "visible_gpus", lambda: gpus)
    assert launch_module._pick_start_method("gloo", None) == (method if sys.platform.startswith("linux") else "spawn")
    assert launch_module._pick_start_method("nccl", None) == "spawn"


@pytest.mark.slow
def test_spawn_carries_a_closure_to_fresh_interpreters(capsys):
    factor = torch.tensor([1.0, 2.0])

    def local_fn(dist, shift, *, power):  # not importable: only cloudpickle can send it
        x = factor * (dist.get_rank() + shift) ** power
        dist.all_reduce(x)
        print("spawned", dist.get_rank(), os.getpid() != parent)
        return x

    parent = os.getpid()
    results = launch(local_fn, 2, 1, power=2, start_method="spawn")
    torch.testing.assert_close(results[1], factor * (1 + 4))
    out = capsys.readouterr().out
    assert "[rank 0] spawned 0 True" in out and "[rank 1] spawned 1 True" in out


def test_a_raising_rank_reports_its_own_traceback():
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        launch(raises_on_rank_1, 4)
    assert time.monotonic() - start < 40  # the waiting ranks were stopped, not left to the 60 s timeout
    error = info.value
    assert error.rank == 1  # the root cause, not a rank that lost its peer
    assert "ValueError: rank one is unhappy" in str(error)
    assert "raises_on_rank_1" in error.traceback and 'raise ValueError("rank one is unhappy")' in error.traceback
    assert "lib/real/launch.py" not in error.traceback and "_run_rank" not in error.traceback
    # Said once: the message first, then the learner's frames without the exception's line again.
    text = str(error)
    assert text.startswith("rank 1 raised ValueError: rank one is unhappy\n\nTraceback (most recent call last):")
    assert text.count("rank one is unhappy") == 2 and text.rstrip().endswith('raise ValueError("rank one is unhappy")')


def test_a_killed_rank_names_the_signal():
    with pytest.raises(RankFailed) as info:
        launch(killed_on_rank_1, 2)
    assert info.value.rank == 1
    assert "SIGKILL" in str(info.value)


@pytest.mark.slow
def test_a_hang_ends_at_the_timeout_and_says_where_each_rank_was():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(rank_1_never_arrives, 3, timeout=3)
    assert time.monotonic() - start < 3 + 30   # ended by the timeout, not by the 60 s sleep
    message = str(info.value)
    assert "timed out after 3 s" in message and "ranks 0, 1, 2 had not finished" in message
    assert "rank 1 was at test_launch.py" in message and "time.sleep(60)" in message
    assert "rank 0 was at test_launch.py" in message and "dist.all_reduce" in message
    assert "same collectives in the same order" in message


def test_a_rank_that_skips_a_collective_is_named():
    with pytest.raises(RankFailed) as info:
        launch(rank_1_skips_the_collective, 2, timeout=10)
    assert info.value.rank == 0
    assert "rank 1 had already returned" in str(info.value)


def test_mismatched_collectives_are_explained_in_debug_mode():
    with pytest.raises(RankFailed) as info:
        launch(shapes_differ, 2, debug=True)
    assert "mismatched collectives" in str(info.value)
    assert "shape [3]" in str(info.value) and "shape [4]" in str(info.value)
    # The one-line explanation replaces torch's fingerprints, and torch's frames go: the learner's call remains.
    assert "CollectiveFingerPrint" not in str(info.value) and "distributed_c10d" not in str(info.value)
    assert "dist.all_reduce(torch.ones(3 + dist.get_rank()))" in str(info.value)


def asymmetric_point_to_point(dist):
    """A parameter server's traffic: rank 0 exchanges with everyone, the others with rank 0 only."""
    x = torch.ones(3)
    if dist.get_rank() == 0:
        for peer in range(1, dist.get_world_size()):
            dist.recv(x, peer)
    else:
        dist.send(x, 0)
    dist.all_reduce(x)
    return x.tolist()


def test_asymmetric_point_to_point_then_a_collective_works_by_default():
    """DETAIL debugging would reject this correct program, which is why it is opt-in."""
    assert launch(asymmetric_point_to_point, 3) == [[3.0] * 3] * 3


def test_an_unpicklable_result_says_what_it_was():
    with pytest.raises(RankFailed) as info:
        launch(returns_a_generator, 2)
    assert "could not be sent back" in str(info.value) and "generator" in str(info.value)


def test_two_launches_at_once_from_two_threads():
    results: dict[int, list] = {}

    def run(k: int) -> None:
        results[k] = launch(torchrun_target, 2, k)

    threads = [threading.Thread(target=run, args=(k,)) for k in (1, 10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {1: [[3.0, 3.0]] * 2, 10: [[30.0, 30.0]] * 2}
    assert launch(torchrun_target, 2) == [[3.0, 3.0]] * 2  # and again, in a row


@pytest.mark.slow
def test_keyboard_interrupt_stops_and_reaps_every_rank():
    # A shell that starts pytest in the background ignores SIGINT; Jupyter's kernel never does.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))  # the notebook's stop button
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(sleeps, 2)
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 40      # interrupted, not waited out


@pytest.mark.parametrize("world", [0, -1, 2.5, True, "2"])
def test_bad_world_size(world):
    with pytest.raises(LaunchError, match="world_size"):
        launch(sleeps, world)


@pytest.mark.skipif(torch.cuda.device_count() >= 4, reason="this machine has the GPUs")
def test_nccl_without_gpus_says_what_to_do():
    with pytest.raises(LaunchError, match=r"NCCL cannot run 4 ranks here: this machine has (no GPU|\d GPUs?).*"
                                          r"world_size=4 runs on gloo: pass backend='gloo'"):
        launch(sleeps, 4, backend="nccl")


@pytest.mark.slow
def test_torchrun_runs_the_same_function():
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "lib.real.torchrun", "test_launch:torchrun_target", "2"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "[rank 0] [6.0, 6.0]" in done.stdout and "[rank 1] [6.0, 6.0]" in done.stdout


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: launch(42, 2), "needs a function"),
        (lambda: launch(sleeps, 2, backend="mpi"), "unknown backend 'mpi'"),
        (lambda: launch(sleeps, 2, start_method="forkserver"), "unknown start_method"),
        (lambda: launch(sleeps, 2, timeout=0), "timeout is in seconds"),
    ],
)
def test_bad_arguments(call, words):
    with pytest.raises(LaunchError, match=words):
        call()
