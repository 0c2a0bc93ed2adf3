"""Every puzzle against its reference solution, its stub, and a catalogue of wrong answers."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

import puzzles
from lib.check import CheckFailed, NotSolved

SOLVED = [(p, getattr(importlib.import_module(f"solutions.{p.module}"), p.name)) for p in puzzles.ALL]
IDS = [p.name for p, _ in SOLVED]


def test_every_puzzle_has_a_solution_of_the_same_name():
    assert len(puzzles.ALL) == len({p.name for p in puzzles.ALL}), "puzzle names must be unique"
    for p, fn in SOLVED:
        assert fn.__name__ == p.name


@pytest.mark.parametrize("puzzle,solution", SOLVED, ids=IDS)
def test_solution_passes_in_simulation(puzzle, solution):
    for seed in (0, 1):
        assert puzzle.check(solution, strict=True, seed=seed, show=False)


@pytest.mark.slow
@pytest.mark.parametrize("puzzle,solution", SOLVED, ids=IDS)
def test_solution_passes_on_real_gloo_ranks(puzzle, solution, capsys):
    assert puzzle.real(solution, strict=True)
    n = puzzle.real_world_size
    assert f"✓ real run on {n} process{'es' if n > 1 else ''}" in capsys.readouterr().out


def _stub(dist, *args):
    raise NotImplementedError


@pytest.mark.parametrize("puzzle", puzzles.ALL, ids=[p.name for p in puzzles.ALL])
def test_stub_is_reported_not_solved(puzzle, capsys):
    assert puzzle.check(_stub, strict=False, show=False) is False
    assert "not solved yet" in capsys.readouterr().out
    with pytest.raises(NotSolved):
        puzzle.check(_stub, strict=True, show=False)


@pytest.mark.slow
def test_stub_real_run_is_reported_not_solved(capsys):
    multi_rank = next(p for p in puzzles.ALL if p.real_world_size > 1)
    assert multi_rank.real(_stub, world_size=2, strict=False) is False
    assert "not solved yet" in capsys.readouterr().out


def test_single_device_lesson_refuses_several_processes(capsys):
    single = next(p for p in puzzles.ALL if p.real_world_size == 1)
    assert single.real(_stub, world_size=4, strict=False) is False
    assert "single-device lesson: run it with world_size=1" in capsys.readouterr().out


# ---- the catalogue of wrong answers: each must fail, with the reason in the message ------------
def ddp_never_communicates(dist, model, batches, lr):
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return model


def ddp_forgets_to_average(dist, model, batches, lr):
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return model


def ddp_hook_reduces_the_weights(dist, model, batches, lr, bucket_size):
    """The public-code bug: the post-accumulate hook receives the parameter, not its gradient."""
    world = dist.get_world_size()
    hooks = [p.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.data)) for p in model.parameters()]
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p /= world
                p -= lr * p.grad
    for h in hooks:
        h.remove()
    return model


def ddp_without_overlap(dist, model, batches, lr, bucket_size):
    import solutions.data_parallel as S
    return S.data_parallel_train(dist, model, batches, lr)


def ring_sends_whole_tensor(dist, x):
    """Right answer, wrong cost: every step forwards the whole tensor around the ring."""
    rank, world = dist.get_rank(), dist.get_world_size()
    total, passing, buf = x.clone(), x.clone(), torch.empty_like(x)
    for _ in range(world - 1):
        req = dist.isend(passing, (rank + 1) % world)
        dist.recv(buf, (rank - 1) % world)
        req.wait()
        passing.copy_(buf)
        total += buf
    return total


def reduce_scatter_off_by_one(dist, x):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = x.chunk(world)
    buf = torch.empty_like(chunks[0])
    for step in range(world - 1):
        req = dist.isend(chunks[(rank - step) % world], (rank + 1) % world)
        dist.recv(buf, (rank - 1) % world)
        req.wait()
        chunks[(rank - step - 1) % world].add_(buf)
    return chunks[rank]


def all_gather_everyone_sends_first(dist, chunk):
    rank, world = dist.get_rank(), dist.get_world_size()
    parts = list(torch.empty(world * chunk.numel()).chunk(world))
    parts[rank].copy_(chunk)
    for step in range(world - 1):
        dist.send(parts[(rank - step) % world], (rank + 1) % world)
        dist.recv(parts[(rank - step - 1) % world], (rank - 1) % world)
    return torch.cat(parts)


def all_reduce_everyone_sends_first(dist, x):
    """Blocking sends before receives on every rank: nobody is receiving, at any N."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks, buf = x.chunk(world), torch.empty_like(x.chunk(world)[0])
    for step in range(world - 1):
        dist.send(chunks[(rank - step - 1) % world], (rank + 1) % world)
        dist.recv(buf, (rank - 1) % world)
        chunks[(rank - step - 2) % world].add_(buf)
    return x


def all_reduce_hard_coded(dist, x):
    return x * dist.get_world_size()


def param_server_with_all_reduce(dist, x):
    dist.all_reduce(x)
    return x


def params_counting_tied_twice(config):
    import solutions.memory as S
    return S.count_parameters(config) + (config.vocab * config.hidden if config.tied else 0)


def state_bytes_without_master_copy(config):
    import solutions.memory as S
    return (2 + 2 + 4 + 4) * S.count_parameters(config)


def activation_bytes_without_attention_scores(s, b, h, a):
    return 34 * s * b * h


def checkpoint_that_keeps_everything(model, tokens, targets):
    """Recomputes, but also keeps each block's output attached to the graph: nothing is saved."""
    from torch.utils.checkpoint import checkpoint
    x = model.embed(tokens)
    kept = []
    for block in model.blocks:
        kept.append(block(x))
        x = checkpoint(block, x, use_reentrant=False)
    (model.head_loss(x, targets) + 0 * sum(k.sum() for k in kept)).backward()
    return model


def accumulation_without_dividing(model, tokens, targets, k):
    for micro_tokens, micro_targets in zip(tokens.chunk(k), targets.chunk(k)):
        model.loss(micro_tokens, micro_targets).backward()
    return model


def accumulation_of_the_whole_batch(model, tokens, targets, k):
    model.loss(tokens, targets).backward()
    return model


def offload_that_keeps_adam_on_the_device(model, batches, lr):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for tokens, targets in batches:
        opt.zero_grad()
        model.loss(tokens, targets).backward()
        opt.step()
    return model


def offload_that_moves_the_model(model, batches, lr):
    """Moves the model but not the data: a device mismatch, on a GPU as in the simulator."""
    import lib
    return offload_that_keeps_adam_on_the_device(model.to(lib.host()), batches, lr)


def offload_that_trains_on_the_host(model, batches, lr):
    import lib
    host = lib.host()
    return offload_that_keeps_adam_on_the_device(model.to(host), [(t.to(host), y.to(host)) for t, y in batches], lr)


WRONG = [
    ("count_parameters", params_counting_tied_twice, "expected"),
    ("training_state_bytes", state_bytes_without_master_copy, "expected"),
    ("layer_activation_bytes", activation_bytes_without_attention_scores, "expected"),
    ("checkpointed_step", checkpoint_that_keeps_everything, "peak memory"),
    ("accumulated_step", accumulation_without_dividing, "the result"),
    ("accumulated_step", accumulation_of_the_whole_batch, "peak memory"),
    ("offloaded_adam_train", offload_that_keeps_adam_on_the_device, "peak memory"),
    ("offloaded_adam_train", offload_that_moves_the_model, "one in device memory"),
    ("offloaded_adam_train", offload_that_trains_on_the_host, "FLOPs computed in host memory"),
    ("data_parallel_train", ddp_never_communicates, "rank 0: the result"),
    ("data_parallel_train", ddp_forgets_to_average, "rank 0: the result"),
    ("bucketed_data_parallel_train", ddp_hook_reduces_the_weights, "rank 0: the result"),
    ("bucketed_data_parallel_train", ddp_without_overlap, "simulated time"),
    ("ring_all_reduce", ring_sends_whole_tensor, "over the budget"),
    ("ring_reduce_scatter", reduce_scatter_off_by_one, "expected"),
    ("ring_all_gather", all_gather_everyone_sends_first, "Deadlock"),
    ("ring_all_reduce", all_reduce_everyone_sends_first, "waits in send"),
    ("ring_all_reduce", all_reduce_hard_coded, "expected"),
    ("param_server_all_reduce", param_server_with_all_reduce, "all_reduce"),
]
BY_NAME = {p.name: p for p in puzzles.ALL}


@pytest.mark.parametrize("name,fn,reason", WRONG, ids=[w[1].__name__ for w in WRONG])
def test_wrong_answer_fails_with_reason(name, fn, reason, capsys):
    puzzle = BY_NAME[name]
    assert puzzle.check(fn, strict=False, show=False) is False
    out = capsys.readouterr().out
    assert out.startswith(f"✗ {name} failed on "), out
    assert reason in out, out
    with pytest.raises(CheckFailed):
        puzzle.check(fn, strict=True, show=False)
