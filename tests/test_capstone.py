"""Notebook 10: the learner's pieces read from their saved notebooks, and the trainer composed of them checked against
one device, naming the piece that is wrong."""

from __future__ import annotations

import json

import pytest
import torch

import solutions.beyond
import solutions.data_parallel
import solutions.pipeline
import solutions.tensor_parallel
import solutions.three_d
import solutions.trainer
import solutions.zero
import tests.cheats.trainer
import tests.wrong.beyond
import tests.wrong.data_parallel
import tests.wrong.pipeline
import tests.wrong.tensor_parallel
import tests.wrong.three_d
import tests.wrong.trainer
import tests.wrong.zero
from lib.notebook.cells import STUB
from lib.checker.puzzle import NotSolved
from lib.notebook.pieces import Pieces, learner_pieces
from puzzles import composed as C
from puzzles import trainer_check as T
from puzzles.trainer import PIECES

SOLVED = {name: getattr(module, name) for module in (solutions.data_parallel, solutions.zero,
                                                       solutions.tensor_parallel, solutions.pipeline,
                                                       solutions.three_d, solutions.beyond)
          for name in PIECES if hasattr(module, name)}
SEAMS = {"clip_grad_norm": solutions.trainer.clip_grad_norm, "mean_loss": solutions.trainer.mean_loss}
WRONG = [w for m in (tests.wrong.data_parallel, tests.wrong.zero, tests.wrong.tensor_parallel, tests.wrong.pipeline,
                     tests.wrong.three_d) for w in m.WRONG if w[0] in PIECES]


def _cell(source: str, tag: str, puzzle: str | None = None) -> dict:
    meta = {"tags": [tag], **({"course": {"puzzle": puzzle}} if puzzle else {})}
    return {"cell_type": "code", "metadata": meta, "source": source, "outputs": [], "execution_count": None}


def _save(folder, notebook: str, cells: list[dict]) -> None:
    (folder / f"{notebook}.ipynb").write_text(json.dumps({"cells": [_cell("import torch", "setup"), *cells],
                                                          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def test_pieces_name_what_to_finish_first(tmp_path):
    _save(tmp_path, "02_data_parallel", [_cell("def ring_all_reduce(dist, x):\n    dist.all_reduce(x)\n    return x",
                                               "puzzle", "ring_all_reduce")])
    _save(tmp_path, "05_pipeline", [_cell(f"def one_f_one_b(dist, stage, batch, targets, m):\n    {STUB}", "puzzle",
                                          "one_f_one_b")])
    _save(tmp_path, "06_3d_parallelism", [_cell("def mesh_coordinates(dist, shape):\n    return (", "puzzle",
                                                "mesh_coordinates")])
    pieces = T.load(folder=tmp_path)
    gaps = {g.name: str(g) for g in pieces.gaps}
    assert pieces.origin == {"ring_all_reduce": "02_data_parallel.ipynb"}
    assert gaps["one_f_one_b"] == "one_f_one_b: still the stub: finish notebook 05, puzzle 3 (05_pipeline) first"
    assert "its cell raises SyntaxError: '(' was never closed" in gaps["mesh_coordinates"]
    assert "no saved copy of notebook 03" in gaps["zero1_train"]
    assert "○ one_f_one_b: still the stub" in pieces.report()


def test_a_module_file_of_the_learners_own_comes_first_and_solutions_is_refused(tmp_path):
    mine = tmp_path / "my_pieces.py"
    mine.write_text("def ring_all_reduce(dist, x):\n    return x\n")
    pieces = learner_pieces({"ring_all_reduce": "02_data_parallel"}, folder=tmp_path, module=mine)
    assert pieces.complete and pieces.origin["ring_all_reduce"] == str(mine)
    with pytest.raises(ValueError, match="solutions/"):
        learner_pieces({"ring_all_reduce": "02_data_parallel"}, module=tmp_path / "solutions" / "data_parallel.py")


def test_the_trainer_says_what_is_missing_and_does_not_run(capsys):
    assert T.check_trainer(Pieces(), {}, C.Parts(), strict=False, show=False) is False
    out = capsys.readouterr().out
    assert "ring_all_reduce: not loaded" in out and "clip_grad_norm: still the stub: solve puzzle 1 above first" in out
    assert "✓" not in out and "✗" not in out


@pytest.mark.parametrize("zero,mesh", [(0, (2, 2, 2)), (1, (2, 2, 2)), (2, (2, 2, 2)), (3, (2, 2, 2)), (0, (4, 2, 1)),
                                       (0, (2, 1, 4)), (3, (4, 2, 1)), (2, (2, 1, 4))])
def test_reference_pieces_train_as_one_device(zero, mesh, capsys):
    """On the notebook's mesh at every ZeRO stage, and on meshes where a model replica is one axis's group (the
    clipping's sum then travels on that axis, within its budget)."""
    pieces = Pieces(functions=dict(SOLVED))
    dp, pp, tp = mesh
    parts = C.Parts(dp=dp, pp=pp, tp=tp, zero=zero)
    assert T.check_trainer(pieces, SEAMS, parts, own_checks=mesh == (2, 2, 2), strict=False, show=False), \
        capsys.readouterr().out
    assert "✓ Your trainer equals one device for 3 steps" in capsys.readouterr().out


@pytest.mark.parametrize("name,fn", [(w[0], w[1]) for w in WRONG], ids=[w[1].__name__ for w in WRONG])
def test_a_wrong_piece_is_named(name, fn, capsys):
    parts = C.Parts(zero=next((k for k, piece in C.ZERO_PIECES.items() if piece == name), 0))
    pieces = Pieces(functions={**SOLVED, name: fn})
    assert T.check_trainer(pieces, SEAMS, parts, strict=False, show=False) is False
    assert f"✗ {name} (notebook {PIECES[name][:2]}" in capsys.readouterr().out


@pytest.mark.parametrize("name,fn", [("ring_all_reduce", tests.wrong.data_parallel.all_reduce_hard_coded),
                                     ("clip_grad_norm", tests.wrong.trainer.clip_without_all_reduce),
                                     ("one_f_one_b", tests.wrong.pipeline.gpipe_forgets_one_over_m)],
                         ids=["ring", "clip", "pipeline"])
def test_the_composed_run_alone_catches_a_wrong_piece_at_its_seam(name, fn, capsys):
    """Without the pieces' own checks, the composed run still fails where a piece's values are wrong."""
    pieces = Pieces(functions={**SOLVED, name: fn} if name in PIECES else dict(SOLVED))
    seams = {**SEAMS, name: fn} if name in SEAMS else SEAMS
    assert T.check_trainer(pieces, seams, C.Parts(), own_checks=False, strict=False, show=False) is False
    assert "✗" in capsys.readouterr().out


def _coordinates_failing_on_the_last_rank(dist, shape):
    if dist.get_rank() == dist.get_world_size() - 1:
        raise ValueError("no coordinates for the last rank")
    return solutions.three_d.mesh_coordinates(dist, shape)


def test_an_error_inside_a_piece_names_the_piece_without_the_courses_frames(capsys):
    pieces = Pieces(functions={**SOLVED, "mesh_coordinates": _coordinates_failing_on_the_last_rank})
    assert T.check_trainer(pieces, SEAMS, C.Parts(), own_checks=False, strict=False, show=False) is False
    out = capsys.readouterr().out
    assert "no coordinates for the last rank" in out and "The error is in your mesh_coordinates" in out
    assert "composed.py" not in out


def _mlp_with_an_extra_all_reduce(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    spare = x.detach().clone()
    dist.all_reduce(spare)                           # right values, one all-reduce of the activations too many
    return solutions.tensor_parallel.megatron_mlp(dist, x, fc1_w, fc1_b, fc2_w, fc2_b)


def test_a_piece_that_sends_more_than_its_axis_allows_is_named(capsys):
    pieces = Pieces(functions={**SOLVED, "megatron_mlp": _mlp_with_an_extra_all_reduce})
    assert T.check_trainer(pieces, SEAMS, C.Parts(), own_checks=False, strict=False, show=False) is False
    out = capsys.readouterr().out
    assert "on the TP axis, over its budget" in out and "column_parallel_linear and row_parallel_linear" in out


def test_a_run_resumed_from_its_moments_equals_one_run():
    """What the real cell's launches do, five steps at a time: two steps, then the third from where they stopped."""
    from lib.sim import per_rank, run

    parts, fns = C.Parts(), {**SOLVED, **SEAMS}
    steps = T.data(parts)
    whole = run(C.train, parts.world, fns, per_rank(C.shards(parts)), steps, parts).results
    first = run(C.train, parts.world, fns, per_rank(C.shards(parts)), steps[:2], parts).results
    resumed = run(C.train, parts.world, fns, per_rank([C.with_parameters(s, r["params"])
                                                       for s, r in zip(C.shards(parts), first)]),
                  steps[2:], parts, per_rank([{"step": 2, "moments": r["moments"]} for r in first])).results
    for one, two in zip(whole, resumed):
        assert all(torch.equal(one["params"][n], two["params"][n]) for n in one["params"])


def _warm_up_of_p_on_every_stage(dist, stage, batch, targets, m):
    """A 1F1B whose warm-up forgets the stage: p-1 forwards on every rank (right on stage 0 only)."""
    return tests.wrong.pipeline._one_f_one_b(dist, stage, batch, targets, m, lambda p, r: p - 1)


@pytest.mark.parametrize("fn,words", [
    (tests.wrong.pipeline.one_f_one_b_is_gpipe, ["stage 0 holds 4 micro-batches", "your plan_memory (notebook 06) "
                                                 "counts 2", "runs 4 forward(s) before its first backward"]),
    (tests.wrong.pipeline.gpipe_one_micro_batch_at_a_time, ["a bubble of 1 of the ideal time, where 1F1B's is 0.25",
                                                            "runs 1 forward(s)", "too few"]),
    (_warm_up_of_p_on_every_stage, ["stage 1 holds 2 micro-batches", "1F1B holds p - r = 1", "too many"]),
], ids=["gpipe", "one-at-a-time", "warm-up-of-p"])
def test_a_schedule_over_its_bubble_or_memory_names_your_one_f_one_b(fn, words, capsys):
    """Right losses, a schedule that breaks the budgets: the order each stage ran, against 1F1B's and plan_memory's."""
    pieces = Pieces(functions={**SOLVED, "one_f_one_b": fn})
    parts = C.Parts(micro_batches=4)
    assert T.check_trainer(pieces, SEAMS, parts, own_checks=False, strict=False, show=False) is False
    out = capsys.readouterr().out
    assert "✗ the pipeline of ranks 0, 2, step 1" in out and "Your one_f_one_b (notebook 05)" in out, out
    assert all(w in out for w in words), out


@pytest.mark.parametrize("pp,m", [(2, 2), (2, 4), (2, 3)])
def test_the_micro_batches_plan_memory_keeps_in_flight_are_read_from_its_answer(pp, m):
    from puzzles.trainer_schedule import planned_in_flight

    parts = C.Parts(dp=2, pp=pp, micro_batches=m)
    assert planned_in_flight(solutions.three_d.plan_memory, parts) == pytest.approx(min(pp, m))
    assert planned_in_flight(tests.wrong.three_d.memory_of_every_micro_batch, parts) == pytest.approx(m)


def _zero2_keeping_full_gradients(dist, model, batches, lr):
    """ZeRO-2 that also keeps each parameter's full gradient (referenced by parameter until the next step's replaces
    it): right values, the gradients whole between steps where ZeRO-2 keeps a shard."""
    kept = {}
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: kept.__setitem__(id(p), p.grad))
    return solutions.zero.zero2_train(dist, model, batches, lr)


def _zero3_keeping_adam_whole(dist, model, batches, lr):
    """ZeRO-3 that also keeps Adam's three states for every parameter whole (zeros, never used): the states a rank
    would hold without sharding them."""
    whole = [torch.zeros(3, p.numel(), dtype=p.dtype, device=p.device) for p in model.parameters()]
    trained = solutions.zero.zero3_train(dist, model, batches, lr)
    return trained if whole else None


@pytest.mark.parametrize("name,fn,parts,words", [
    ("zero2_train", _zero2_keeping_full_gradients, C.Parts(zero=2),
     ["rank 0 (dp 0, stage 0, tp 0) kept", "1 × the stage's float64 gradients", "the stage's gradients whole",
      "your zero2_train (notebook 03) keeps full-size gradients alive", "p.grad = None"]),
    ("zero2_train", _zero2_keeping_full_gradients, C.Parts(dp=2, pp=1, tp=4, zero=2),
     ["the stage's gradients whole", "your zero2_train (notebook 03)"]),
    ("zero3_train", _zero3_keeping_adam_whole, C.Parts(zero=3),
     ["Adam states (master weights, momentum, variance) whole", "your zero3_train (notebook 03)"]),
    ("one_f_one_b", tests.wrong.pipeline.one_f_one_b_stashes_everything, C.Parts(micro_batches=4),
     ["held", "micro-batches' worth", "your plan_memory (notebook 06) keeps 2 in flight",
      "Your one_f_one_b (notebook 05) runs 1F1B's order"]),
    ("one_f_one_b", tests.wrong.pipeline.one_f_one_b_stashes_everything, C.Parts(zero=2, micro_batches=4),
     ["Your one_f_one_b (notebook 05)"]),
], ids=["zero2-full-gradients", "zero2-full-gradients-pp1", "zero3-adam-whole", "1f1b-stash", "1f1b-stash-zero2"])
def test_memory_over_the_learners_plan_is_named_as_its_piece(name, fn, parts, words, capsys):
    """Right values and right traffic, more memory than the learner's plan_memory counts: the ZeRO stage's states
    between steps, or the schedule's activations at a forward's return, each named as the piece that holds them."""
    pieces = Pieces(functions={**SOLVED, name: fn})
    assert T.check_trainer(pieces, SEAMS, parts, own_checks=False, strict=False, show=False) is False
    out = capsys.readouterr().out
    assert out.startswith("✗ ") and all(w in out for w in words), out


def _zero2_updating_the_last_parameter_first(dist, model, batches, lr):
    """The reference ZeRO-2 over the parameters in reverse (the order backward's hooks fire): its last gathered
    buffer, alive until the next step, is the stage's first parameter's, not its last's."""
    order = list(reversed(list(model.parameters())))
    model.parameters = lambda recurse=True: iter(order)
    return solutions.zero.zero2_train(dist, model, batches, lr)


def test_a_right_zero2_ending_its_loop_on_another_parameter_is_within_the_plan(capsys):
    """A loop's last temporaries are those of the parameter it ended on, read from the run (its last all-gather
    over DP): the stage's embedding here, 0.54 × the stage's gradients, where the reference ends on a bias."""
    pieces = Pieces(functions={**SOLVED, "zero2_train": _zero2_updating_the_last_parameter_first})
    assert T.check_trainer(pieces, SEAMS, C.Parts(zero=2), own_checks=False, strict=False, show=False), \
        capsys.readouterr().out


def test_memory_is_compared_with_the_learners_own_plan(capsys):
    """The budget is the learner's plan_memory's: its model states (its answer less the activations, which grow
    with b), each state at float64's size for the rank's parameters; and its micro-batches in flight: a plan that
    counts every micro-batch lets a stash kept to the end through the memory check."""
    from lib.planner import memory_breakdown
    from puzzles.trainer_memory import kept_budget, plan_for, plan_model, planned_states

    parts = C.Parts(zero=2)
    course = memory_breakdown(plan_model(), plan_for(parts))
    assert planned_states(solutions.three_d.plan_memory, parts) == pytest.approx(
        sum(v for k, v in course.items() if k != "activations"))
    _, by_state = kept_budget(solutions.three_d.plan_memory, parts, 1000)
    assert by_state == pytest.approx({"gradients": 8 * 1000 / 2, "optimizer": 24 * 1000 / 2})   # weights: ZeRO-3's
    pieces = Pieces(functions={**SOLVED, "one_f_one_b": tests.wrong.pipeline.one_f_one_b_stashes_everything,
                               "plan_memory": tests.wrong.three_d.memory_of_every_micro_batch})
    assert T.check_trainer(pieces, SEAMS, C.Parts(micro_batches=4), own_checks=False, strict=False, show=False)
    assert "of the 4 your plan_memory keeps in flight" in capsys.readouterr().out


def _zero2_new_moments_every_step(dist, model, batches, lr):
    """ZeRO-2 run one batch at a time, so Adam's moments and step count start again at every step."""
    for batch in batches:
        trained = solutions.zero.zero2_train(dist, model, [batch], lr)
    return trained


def test_a_zero_stage_that_updates_wrongly_is_named_as_the_update(capsys):
    """A ZeRO-2 whose Adam starts again every step: the composed run alone names the update it runs."""
    pieces = Pieces(functions={**SOLVED, "zero2_train": _zero2_new_moments_every_step})
    assert T.check_trainer(pieces, SEAMS, C.Parts(zero=2), own_checks=False, strict=False, show=False) is False
    out = capsys.readouterr().out
    assert "step 3's loss" in out and "your zero2_train (03), which runs the update here" in out, out
    assert "clipping" not in out


def test_the_zero_stage_chosen_is_the_one_asked_for():
    """ZeRO-3 needs zero3_train and not the others; ZeRO-0 needs none of them."""
    without = Pieces(functions={k: f for k, f in SOLVED.items() if k != "zero3_train"})
    gaps = T._gaps(without, SEAMS, C.Parts(zero=3))
    assert gaps == ["zero3_train: not loaded (run the cell with T.load() above): finish notebook 03, puzzle 3 "
                    "(03_zero) first"]
    assert T._gaps(without, SEAMS, C.Parts(zero=0)) == []


def test_the_cells_after_the_first_name_the_same_gaps_in_one_line(capsys):
    """Seven cells wait for the same pieces: the list is printed in full once, then named in a line."""
    without = Pieces(functions={k: f for k, f in SOLVED.items() if k not in ("one_f_one_b", "plan_memory")})
    T._listed[0] = []                      # as in a fresh kernel
    for _ in range(2):
        assert T.not_ready(without, SEAMS, C.Parts(), strict=False)
    first, again = capsys.readouterr().out.strip().split("\n○ ")
    assert first.startswith("○ The trainer needs these first:") and first.count("\n  ") == 2, first
    assert again.startswith("The trainer still waits for the 2 pieces listed above, the first: one_f_one_b"), again
    with pytest.raises(NotSolved, match="needs these first:\n  one_f_one_b"):     # strict mode: the whole list
        T.not_ready(without, SEAMS, C.Parts(), strict=True)


# Saved by 2 DP ranks after step 2, resumed on 3: stage 1's 20,960 values do not split evenly in 3, where a shard's
# bounds tell.
SAVED = C.Parts(dp=2, pp=2, tp=1, micro_batch=3, steps=4)


def test_a_checkpoint_saved_on_one_mesh_resumes_on_another_as_one_device(capsys):
    from puzzles.trainer_resume import check_checkpoint

    assert check_checkpoint(Pieces(functions=dict(SOLVED)), SEAMS, SAVED, resume_dp=3, after=2, strict=False), \
        capsys.readouterr().out
    assert "✓ Saved after step 2 by 2 DP ranks, resumed on 3" in capsys.readouterr().out


def _reshard_restarting_the_step_count(files, world, rank):
    """The right shards, but step 0: Adam's bias correction starts again after the resume."""
    *state, _ = solutions.beyond.reshard_checkpoint(files, world, rank)
    return (*state, 0)


def _reshard_without_the_step(files, world, rank):
    """The three slices, the step left out."""
    return solutions.beyond.reshard_checkpoint(files, world, rank)[:3]


def _reshard_returning_nothing(files, world, rank):
    """Loads its slices and forgets to return them."""
    solutions.beyond.reshard_checkpoint(files, world, rank)


RESHARD_WRONG = [w for w in tests.wrong.beyond.WRONG if w[0] == "reshard_checkpoint"] + [
    ("reshard_checkpoint", _reshard_restarting_the_step_count), ("reshard_checkpoint", _reshard_without_the_step),
    ("reshard_checkpoint", _reshard_returning_nothing)]


@pytest.mark.parametrize("fn", [w[1] for w in RESHARD_WRONG], ids=[w[1].__name__ for w in RESHARD_WRONG])
def test_a_wrong_reshard_checkpoint_is_named(fn, capsys):
    from puzzles.trainer_resume import check_checkpoint

    pieces = Pieces(functions={**SOLVED, "reshard_checkpoint": fn})
    assert check_checkpoint(pieces, SEAMS, SAVED, resume_dp=3, after=2, strict=False) is False
    out = capsys.readouterr().out
    assert out.startswith("✗ ") and "your reshard_checkpoint (notebook 09)" in out, out
    assert "Traceback" not in out
    if fn in (_reshard_without_the_step, _reshard_returning_nothing):      # said as returned, not as raised
        assert "returned 3 values" in out or "returned NoneType" in out, out


def test_the_checkpoint_says_to_finish_notebook_09_first(capsys):
    from puzzles.trainer_resume import check_checkpoint

    without = Pieces(functions={k: f for k, f in SOLVED.items() if k != "reshard_checkpoint"})
    assert check_checkpoint(without, SEAMS, SAVED, resume_dp=3, after=2, strict=False) is False
    assert "○ The checkpoint needs this first:\n  reshard_checkpoint: not loaded" in capsys.readouterr().out
    assert T._gaps(without, SEAMS, C.Parts()) == []        # the trainer's own check does not need it


# ---- HSDP as the DP axis ------------------------------------------------------------------------------------------
HSDP = C.Parts(dp=4, hsdp_nodes=2, pp=1, tp=2)          # 2 nodes × 2 DP ranks, TP 2: the notebook's 8 ranks
HSDP_SEAMS = {**SEAMS, "hsdp_gradients": solutions.trainer.hsdp_gradients}


@pytest.mark.parametrize("parts,own", [(HSDP, True), (C.Parts(dp=4, hsdp_nodes=2, pp=2, tp=1), False),
                                       (C.Parts(dp=4, hsdp_nodes=2, pp=1, tp=2, max_norm=None), False),
                                       (C.Parts(dp=4, hsdp_nodes=2, pp=1, tp=1), False),
                                       (C.Parts(dp=2, hsdp_nodes=2, pp=2, tp=1), False)],
                         ids=["2x2-tp2", "2x2-pp2", "unclipped", "node-is-the-shard-axis", "dp-is-the-replicate-axis"])
def test_hsdp_as_the_dp_axis_trains_as_one_device(parts, own, capsys):
    """The learner's hsdp_gradients averages the gradients (its shard), Adam updates the shard, the node gathers the
    weights back: one device's losses and parameters, each half of the DP axis within its bytes. Where the node's
    ranks are the shard axis (no TP, no PP) or the DP axis is the replicate one (one DP rank a node), the clipping's
    and the loss's sums travel on that axis, within its budget."""
    assert T.check_trainer(Pieces(functions=dict(SOLVED)), HSDP_SEAMS, parts, own_checks=own, strict=False,
                           show=False), capsys.readouterr().out
    out = capsys.readouterr().out
    said = f"HSDP as its DP axis ({parts.hsdp_nodes} nodes × {parts.per_node})"
    assert said in out and "REPLICATE" in out and "SHARD" in out, out


def test_hsdp_as_the_dp_axis_runs_on_real_processes_as_on_simulated_ones():
    """The same HSDP trainer on 8 gloo processes: each rank's hsdp_gradients gets its DP group as its world and
    device_mesh lays that group's ranks out (lib.group_as_world); two launches of two steps, the second resuming
    each rank's shard of the master weights and its moments, give one device's losses and the simulated ranks'
    parameters."""
    from puzzles import trainer_runs as R

    parts = C.quick(HSDP, steps=4, lr=1e-2)
    real = R.real_training(Pieces(functions=dict(SOLVED)), HSDP_SEAMS, parts, every=2, show=False)
    simulated = R.simulated_training(Pieces(functions=dict(SOLVED)), HSDP_SEAMS, parts)
    assert real is not None and len(real["yours"]) == 4
    assert real["yours"] == pytest.approx(real["one_device"], rel=1e-9, abs=1e-10)
    for mine, theirs in zip(real["params"], simulated["params"]):
        assert all(torch.allclose(mine[n], theirs[n], rtol=1e-7, atol=1e-9) for n in mine)


@pytest.mark.parametrize("name,parts", [("zero1_train", C.quick(C.Parts(), zero=1)), ("ring_all_reduce", C.Parts()),
                                        ("hsdp_gradients", HSDP)])
def test_a_right_piece_unlike_the_reference_trains_as_one_device(name, parts, capsys):
    """The right answers of tests/test_other_right_answers, composed: torch's Adam over a ZeRO-1 shard, a ring cut by
    tensor_split, an HSDP whose groups are made by hand with reduce_scatter's list form (the axis's dist has every
    collective torch has)."""
    import tests.test_other_right_answers as R

    answer = next(a for p, a in R.RIGHT if p.name == name)
    fns, seams = dict(SOLVED), dict(HSDP_SEAMS if parts.hsdp else SEAMS)
    (seams if name in seams else fns)[name] = answer
    assert T.check_trainer(Pieces(functions=fns), seams, parts, strict=False, show=False), capsys.readouterr().out


def _hsdp_reduce_scattering_over_the_world(dist, grads, nodes):
    """One reduce-scatter over every DP rank (the whole DP axis, not the node), no all-reduce: each gradient's rows
    cut dp ways."""
    world, i = dist.get_world_size(), dist.get_rank()
    out = []
    for g in grads:
        c = -(-g.shape[0] // world)
        flat = torch.nn.functional.pad(g, (*(0, 0) * (g.dim() - 1), 0, c * world - g.shape[0])).contiguous()
        piece = torch.empty_like(flat[:c])
        dist.reduce_scatter_single(piece, flat, op=dist.ReduceOp.AVG)
        out.append(piece[:max(0, min(c, g.shape[0] - i * c))])
    return out


HSDP_WRONG = [(w[1], w[2]) for w in tests.wrong.trainer.WRONG if w[0] == "hsdp_gradients"] + [
    (tests.cheats.trainer.hsdp_all_reducing_inside_the_node, "inside-node half of the DP axis (SHARD)"),
    (_hsdp_reduce_scattering_over_the_world, "dp = 4 ways: over the whole DP axis")]


@pytest.mark.parametrize("fn,words", HSDP_WRONG, ids=[w[0].__name__ for w in HSDP_WRONG])
def test_a_wrong_hsdp_gradients_composed_is_named_as_the_hsdp_piece(fn, words, capsys):
    """Without its own check: the composed run alone (values, step 1's gradient shard, bytes on each half of the DP
    axis, the shards' shapes) names hsdp_gradients."""
    seams = {**HSDP_SEAMS, "hsdp_gradients": fn}
    assert T.check_trainer(Pieces(functions=dict(SOLVED)), seams, HSDP, own_checks=False, strict=False,
                           show=False) is False
    out = capsys.readouterr().out
    assert out.startswith("✗ ") and "hsdp_gradients" in out and "Traceback" not in out, out
    if fn in (tests.cheats.trainer.hsdp_all_reducing_inside_the_node, _hsdp_reduce_scattering_over_the_world):
        assert words in out, out


def test_a_wrong_hsdp_gradients_fails_its_own_check_first(capsys):
    seams = {**HSDP_SEAMS, "hsdp_gradients": _hsdp_reduce_scattering_over_the_world}
    assert T.check_trainer(Pieces(functions=dict(SOLVED)), seams, HSDP, strict=False, show=False) is False
    assert "✗ hsdp_gradients (notebook 10, puzzle 3) fails its own check" in capsys.readouterr().out


def test_hsdp_needs_hsdp_gradients_instead_of_the_ring_and_is_validated_when_chosen():
    without_ring = Pieces(functions={k: f for k, f in SOLVED.items() if k != "ring_all_reduce"})
    assert T._gaps(without_ring, HSDP_SEAMS, HSDP) == []
    assert T._gaps(without_ring, SEAMS, HSDP) == ["hsdp_gradients: still the stub: solve puzzle 3 above first"]
    for bad in ({"dp": 4, "hsdp_nodes": 3}, {"dp": 4, "hsdp_nodes": 1}, {"dp": 4, "hsdp_nodes": 2, "zero": 2}):
        with pytest.raises(ValueError, match=r"Parts\(dp=4, hsdp_nodes="):
            C.Parts(**bad)


def test_the_room_for_a_loops_leftovers_is_one_parameter_at_most_the_stages_largest():
    from puzzles.trainer_memory import LEFTOVER, leftover_room

    padded = [800.0, 64.0, 320.0, 32.0]          # bytes of each padded parameter, the stage's last one 32
    assert leftover_room(padded, 0.0) == LEFTOVER * 32          # no all-gather or reduce-scatter read: the last one
    assert leftover_room(padded, 320.0) == LEFTOVER * 320       # the loop ended on another parameter
    assert leftover_room(padded, 1216.0) == LEFTOVER * 800      # one flat buffer of all: the largest, not the stage
