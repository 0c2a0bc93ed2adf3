"""Notebook 10's composed check: the learner's pieces, each through its own notebook's check again, then together
on a simulated (dp, pp, tp) mesh against one device, step by step, with the bytes each mesh axis carries.

A failure names the piece and the seam: the piece's own check where it fails alone, else the first step and rank
where the composed run leaves the single-device one, and which part of the step that points at.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Callable, Optional

import torch

import puzzles
from lib.checker.compare import first_difference
from lib.checker.puzzle import CheckFailed, NotSolved, strict_default
from lib.errors import PuzzleError, is_the_stub
from lib.notebook.pieces import Gap, Pieces, learner_pieces
from lib.sim import per_rank, run
from lib.sim.cost import bus_factor
from lib.sim.traffic import OUTSIDE, traffic_by_axis
from lib.units import fmt_bytes
from puzzles import composed as C
from puzzles.course_text import batches, byte_tokens, course_text
from puzzles.trainer import PIECES, hsdp_shards, seam_number, seams_of
from puzzles.trainer_memory import memory_problem
from puzzles.trainer_schedule import schedule_problem

LATER = ("reshard_checkpoint",)   # pieces only a later cell runs (the checkpoint resumed on another mesh)
RTOL, ATOL = 1e-9, 1e-10          # the losses: float64 on both sides; only the order of the sums differs
PARAMS_RTOL, PARAMS_ATOL = 1e-7, 1e-9   # the parameters after Adam, whose 1/√v amplifies those rounding differences


def needed(parts: C.Parts) -> dict[str, str]:
    """The earlier notebooks' pieces this choice of parts runs (HSDP averages the gradients instead of the ring)."""
    return {k: v for k, v in PIECES.items() if (k not in (*C.ZERO_PIECES.values(), *LATER)
                                                or k == C.ZERO_PIECES.get(parts.zero))
            and not (parts.hsdp and k == "ring_all_reduce")}


def _runs_per_step(parts: C.Parts) -> int:
    """Pipelined steps per training step: ZeRO-3 runs the stage again in backward (notebook 03's zero3_train
    recomputes each layer's forward there, and the stage is its one layer)."""
    return 2 if parts.zero == 3 else 1


def _puzzle(name: str):
    notebook = PIECES.get(name, "10_your_trainer")
    return next(p for p in puzzles.of_notebook(notebook).PUZZLES if p.name == name)


def numbers() -> dict[str, int]:
    """Each piece's puzzle number in its notebook."""
    out = {}
    for name, notebook in PIECES.items():
        names = [p.name for p in puzzles.of_notebook(notebook).PUZZLES]
        out[name] = names.index(name) + 1
    return out


def load(folder: Optional[Path] = None, module: Optional[Path] = None) -> Pieces:
    """The learner's pieces from their saved notebooks 02 to 06 (or `module`), with what is missing."""
    return learner_pieces(PIECES, folder=folder, module=module, numbers=numbers())


def _gaps(pieces: Pieces, seams: dict[str, Callable], parts: C.Parts) -> list[str]:
    """What the trainer still needs, each with what to finish first."""
    wanted, named = needed(parts), {g.name for g in pieces.gaps}
    gaps = [str(g) for g in pieces.gaps if g.name in wanted]
    gaps += [str(Gap(name, notebook, numbers()[name], "not loaded (run the cell with T.load() above)"))
             for name, notebook in wanted.items() if name not in pieces.functions and name not in named]
    gaps += [f"{name}: still the stub: solve puzzle {seam_number(name)} above first" for name in seams_of(parts.hsdp)
             if name not in seams or is_the_stub(seams[name])]
    return gaps


def _own_check(name: str, fn: Callable) -> Optional[str]:
    """None when the piece passes its notebook's check again; else the first lines of why not."""
    outcome = _puzzle(name).evaluate(fn)
    if outcome.ok:
        return None
    notebook = PIECES.get(name, "10_your_trainer")
    number = numbers().get(name) or seam_number(name)
    lines = outcome.message.splitlines()
    return (f"✗ {name} (notebook {notebook[:2]}, puzzle {number}) fails its own check, so the trainer would too:\n  "
            + "\n  ".join(lines[:4]) + f"\nRun P.{name}.check({name}) in notebook {notebook[:2]} to see it whole.")


def all_functions(pieces: Pieces, seams: dict[str, Callable]) -> dict[str, Callable]:
    return {**pieces.functions, **seams}


def one_device(parts: C.Parts) -> tuple:
    """One device's run of `parts` on its data: (losses, the trained model, step 1's gradient)."""
    return _one_device(parts, course_text())


@functools.lru_cache(maxsize=4)
def _one_device(parts: C.Parts, text: str) -> tuple:
    """Kept per parts and text: a notebook runs the same parts on simulated and on real ranks."""
    return C.reference_run(parts, _batches(parts, text))


def data(parts: C.Parts) -> list:
    """The steps' batches of the course's own text, byte tokens, seeded."""
    return _batches(parts, course_text())


def _batches(parts: C.Parts, text: str) -> list:
    return batches(byte_tokens(text), parts.steps, parts.rows, C.config().seq, parts.seed)


def _learners_frames(message: str, fns: dict[str, Callable]) -> str:
    """A rank's error with the course library's frames (lib/, puzzles/) taken out of its traceback, and the piece
    it came from named: the one whose code the outermost remaining frame runs."""
    course = tuple(str(Path(__file__).resolve().parents[1] / part) for part in ("lib", "puzzles"))
    by_code = {getattr(fn, "__code__", None) and fn.__code__.co_name: name for name, fn in fns.items()}
    kept, skipping, outermost = [], False, None
    for line in message.splitlines():
        frame = re.match(r'\s*File "([^"]+)", line \d+, in (\S+)', line)
        if frame:
            skipping = frame.group(1).startswith(course)
            outermost = outermost or (None if skipping else frame.group(2))
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(line)
    if outermost is None and "Traceback (most recent call last):" in kept:     # the course's own error, said whole
        kept = kept[:kept.index("Traceback (most recent call last):")]
        while kept and not kept[-1].strip():
            kept.pop()
    if outermost in by_code:
        piece = by_code[outermost]
        kept.append(f"The error is in your {piece}, from notebook {PIECES.get(piece, '10_your_trainer')[:2]}.")
    return "\n".join(kept)


def _compare(results: list, losses: list[float], expected: list[dict], grads: list[dict],
             parts: C.Parts) -> Optional[str]:
    """The first step where a rank's loss leaves one device's, or the first parameter that differs."""
    for step, want in enumerate(losses):
        for rank, out in enumerate(results):
            got = out["losses"]
            if got is None:
                continue
            if not math.isclose(got[step], want, rel_tol=RTOL, abs_tol=ATOL):
                update = (f"your {C.ZERO_PIECES[parts.zero]} (03), which runs the update here" if parts.zero else
                          "your hsdp_gradients (10), which averages the gradients over the DP axis here, or your "
                          "clipping" if parts.hsdp else "your DP average (02) or your clipping")
                seam = ("the forward pass: your TP layers (04), your 1F1B (05) or your mesh coordinates (06)"
                        if step == 0 else
                        f"the update, as step 1's loss is right: {update}, or the gradients your TP layers and 1F1B "
                        "leave")
                return (f"step {step + 1}'s loss on {C.where(rank, parts)}: one device's is {want:.10g}, yours "
                        f"{got[step]:.10g}.\nThat points at {seam}.")
    for rank, out in enumerate(results):
        wrong = out["first_grads"] is not None and _scaled_gradient(grads[rank], out["first_grads"], rank, parts)
        if wrong:
            return wrong
    for rank, out in enumerate(results):
        differs = first_difference(expected[rank], out["params"], rtol=PARAMS_RTOL, atol=PARAMS_ATOL,
                                   where="parameter")
        if differs:
            return (f"after {parts.steps} steps, {C.where(rank, parts)}: {differs}\nThe losses agree, so the "
                    "forward passes were right; the last update was not.")
    return None


def _expected_gradients(model, grads: dict, parts: C.Parts) -> list[dict]:
    """Each rank's part of one device's step-1 gradient: its stage's TP shards, and with HSDP its node shard of
    those (shard i = its place in the node)."""
    each = C.expected_shards(model, parts, grads)
    if not parts.hsdp:
        return each
    return [{n: hsdp_shards(g, parts.per_node)[C.coordinates(r, parts)[0] % parts.per_node] for n, g in mine.items()}
            for r, mine in enumerate(each)]


def _norm(tensors: dict) -> float:
    return float(torch.sqrt(sum(t.double().pow(2).sum() for t in tensors.values())))


def _scaled_gradient(expected: dict, got: dict, rank: int, parts: C.Parts) -> Optional[str]:
    """Step 1's averaged gradient against one device's: Adam divides a gradient's scale away, so a gradient k times
    too large barely moves the losses, and is caught here, before the optimizer."""
    differs = first_difference(expected, got, rtol=1e-7, atol=1e-12, where="gradient")
    if differs is None:
        return None
    average = ("what your hsdp_gradients (10) averages over: every rank of every node, reduce-scattered inside the "
               "node, then the shard all-reduced across nodes" if parts.hsdp else
               "what your DP average (02) divides the sum by")
    return (f"step 1's gradient, averaged over DP{' (your shard of it)' if parts.hsdp else ''}, on "
            f"{C.where(rank, parts)}: {differs}\nYours is {_norm(got) / _norm(expected):.4g} × one device's in norm. "
            "Adam divides the scale of a gradient away, so the losses barely show it: look at what your 1F1B (05) "
            f"divides the loss by and {average}.")


def _dp_budget(parts: C.Parts, shard: torch.nn.Module, last: bool) -> tuple[float, str]:
    """What a rank may send on the DP axis over the run, and the formula."""
    params = list(shard.parameters())
    runs = _runs_per_step(parts)
    if parts.zero:
        padded = sum(math.ceil(p.numel() / parts.dp) * parts.dp for p in params) * 8
        gathers = 2 if parts.zero == 3 else 1
        what = f"ZeRO-{parts.zero}'s reduce-scatter and {gathers} all-gather(s) of the padded weights"
        per_step = (1 + gathers) * bus_factor("all_gather", parts.dp) * padded
        once = bus_factor("all_gather", parts.dp) * padded if parts.zero == 3 else 0    # the weights it returns
    else:
        n = sum(p.numel() for p in params)
        padded = (n + -n % parts.dp) * 8
        what = "the ring all-reduce of one flat bucket of gradients"
        per_step, once = bus_factor("all_reduce", parts.dp) * padded, 0
    per_step += bus_factor("all_reduce", parts.dp) * 16 * runs if last else 0      # mean_loss's two numbers
    return (parts.steps * per_step + once,
            f"{parts.steps} steps × {what} ({fmt_bytes(padded)}), (dp-1)/dp of each"
            + (", and one all-gather of the weights returned" if once else ""))


def _hsdp_budgets(parts: C.Parts, shard: torch.nn.Module) -> dict[str, tuple[float, str]]:
    """HSDP's two halves of the DP axis, per step: inside the node your hsdp_gradients' reduce-scatter of the
    padded gradients and the trainer's all-gather of the updated weights ((s-1)/s of them each); across nodes the
    all-reduce of the shard alone (2(n-1)/n of 1/s of them)."""
    s, n = parts.per_node, parts.hsdp_nodes
    piece = sum(-(-p.shape[0] // s) * p[0].numel() for p in shard.parameters()) * 8      # a padded shard, float64
    return {"shard": (parts.steps * 2 * bus_factor("all_gather", s) * s * piece,
                      f"{parts.steps} steps × (a reduce-scatter of the padded gradients and an all-gather of the "
                      f"updated weights inside the node, s={s} shards of {fmt_bytes(piece)}), (s-1)/s of each"),
            "replicate": (parts.steps * bus_factor("all_reduce", n) * piece,
                          f"{parts.steps} steps × an all-reduce across n={n} nodes of this rank's shard "
                          f"({fmt_bytes(piece)}, 1/s of the padded gradients), 2(n-1)/n of it")}


def _hsdp_small_sums(parts: C.Parts, rank: int) -> dict[str, tuple[float, str]]:
    """With HSDP, the step's two small all-reduces by the axis their group is (OUTSIDE where it is none):
    mean_loss's two numbers over the whole DP axis (the last stage) and the clipping's one over the node's ranks,
    once a step each. A DP axis of one rank a node (s = 1) is the replicate axis; a node without TP and PP is the
    shard axis, and a node of one DP rank is the other model-parallel axis where one of them has size 1."""
    mesh, (_, stage, _) = C.mesh_of(parts), C.coordinates(rank, parts)
    size = parts.per_node * parts.pp * parts.tp
    node = tuple(range(rank - rank % size, rank - rank % size + size))
    dp = tuple(r for r in range(parts.world) if C.coordinates(r, parts)[1:] == C.coordinates(rank, parts)[1:])
    sums: dict[str, tuple[float, str]] = {}
    loss, clipping = "mean_loss's all-reduce of two numbers over the DP axis", "the clipping's one number over the node"
    for ranks, nbytes, what, runs in ((dp, 16, loss, stage == parts.pp - 1), (node, 8, clipping, parts.clips)):
        if not runs:
            continue
        axis = next((a for a in mesh.names if mesh.group(rank, a) == ranks), OUTSIDE)
        limit, why = sums.get(axis, (0.0, ""))
        sums[axis] = (limit + parts.steps * bus_factor("all_reduce", len(ranks)) * nbytes,
                      "; ".join(filter(None, (why, f"{parts.steps} steps × {what}"))))
    return sums


def _activation_bytes(parts: C.Parts) -> int:
    """One micro-batch's activations, (b, s, h) in float64."""
    cfg = C.config()
    return parts.micro_batch * cfg.seq * cfg.hidden * 8


def _clipping_bytes(parts: C.Parts, axis_is_the_replica: bool) -> float:
    """The clipping's one all-reduce of a float64 per step, on the axis whose groups are the model replicas (where
    the other model-parallel axis has size 1; else it travels outside the mesh's axes)."""
    replica = parts.clips and axis_is_the_replica and not parts.hsdp     # HSDP's clipping spans a node: outside
    return parts.steps * bus_factor("all_reduce", parts.pp * parts.tp) * 8 if replica else 0


def _tp_budget(parts: C.Parts, shard: torch.nn.Module) -> tuple[float, str]:
    """f's and g's all-reduces: two forward, two backward per block and micro-batch."""
    runs = _runs_per_step(parts)
    calls = parts.steps * runs * parts.micro_batches * len(shard.blocks) * 4
    size = _activation_bytes(parts)
    return (calls * bus_factor("all_reduce", parts.tp) * size + _clipping_bytes(parts, parts.pp == 1),
            f"{calls} all-reduces of {fmt_bytes(size)} (two g forward, two f backward per block and micro-batch"
            + (", each step run twice by ZeRO-3" if runs > 1 else "") + "), 2(tp-1)/tp of each")


def _pp_budget(parts: C.Parts, stage: int) -> tuple[float, str]:
    """Each micro-batch's activation sent forward, its gradient sent back, once."""
    sends = (stage < parts.pp - 1) + (stage > 0)
    size, runs = _activation_bytes(parts), _runs_per_step(parts)
    return (parts.steps * runs * parts.micro_batches * sends * size + _clipping_bytes(parts, parts.tp == 1),
            f"{parts.steps} steps{' × 2 runs (ZeRO-3)' if runs > 1 else ''} × {parts.micro_batches} micro-batches × "
            f"{sends} message(s) of {fmt_bytes(size)}")


def _axis_report(result, shards: list, parts: C.Parts) -> tuple[Optional[str], str]:
    """(a broken budget, or None; the bytes each axis carried, rank 0's)."""
    axes = C.mesh_of(parts)
    traffic = traffic_by_axis(result.trace, axes)
    pieces = {"dp": C.ZERO_PIECES.get(parts.zero, "ring_all_reduce"), "shard": "hsdp_gradients", OUTSIDE:
              "hsdp_gradients (whose collectives belong on the shard group or the replicate group)",
              "replicate": "hsdp_gradients", "tp": "column_parallel_linear and row_parallel_linear (f and g)",
              "pp": "one_f_one_b"}
    for rank, by_axis in enumerate(traffic):
        stage = C.coordinates(rank, parts)[1]
        dp = (_hsdp_budgets(parts, shards[rank]) if parts.hsdp else
              {"dp": _dp_budget(parts, shards[rank], stage == parts.pp - 1)})
        budgets = {**dp, "tp": _tp_budget(parts, shards[rank]), "pp": _pp_budget(parts, stage),
                   **({OUTSIDE: (0, "")} if parts.hsdp else {})}
        for axis, (limit, why) in (_hsdp_small_sums(parts, rank) if parts.hsdp else {}).items():
            budgets[axis] = (budgets[axis][0] + limit, "; ".join(filter(None, (budgets[axis][1], why))))
        for axis, (limit, why) in budgets.items():
            if by_axis[axis].sent > limit * (1 + 1e-9):
                said = (f"the {'inside-node' if axis == 'shard' else 'across-node'} half of the DP axis "
                        f"({axis.upper()})" if parts.hsdp and axis in ("shard", "replicate") else
                        "groups that are no axis of the mesh (the whole DP axis, a node)" if axis == OUTSIDE else
                        f"the {axis.upper()} axis")
                return (f"{C.where(rank, parts)} sent {fmt_bytes(by_axis[axis].sent)} on {said}, over its budget of "
                        f"{fmt_bytes(limit)}: {why}. Your {pieces[axis]} send(s) more than the lesson's share.", "")
    rank0 = traffic[0]
    line = ", ".join(f"{axis.upper()} {fmt_bytes(rank0[axis].sent)}" for axis in axes.names)
    line += (f", outside the axes (the loss over DP, the node's clipping sum) {fmt_bytes(rank0[OUTSIDE].sent)}"
             if parts.hsdp else f", the replica's clipping sum {fmt_bytes(rank0[OUTSIDE].sent)}")
    return None, f"  sent by rank 0 over the run, each axis within its budget: {line}"


_listed: list[list[str]] = [[]]       # the gaps printed last: each later cell names them once, not again in full


def not_ready(pieces: Pieces, seams: dict[str, Callable], parts: C.Parts, strict: bool) -> bool:
    """Says what to finish first, where anything is missing (and raises NotSolved in strict mode)."""
    gaps = _gaps(pieces, seams, parts)
    if gaps:
        text = "○ The trainer needs these first:\n  " + "\n  ".join(gaps)
        print(text if gaps != _listed[0] else f"○ The trainer still waits for the {len(gaps)} piece"
              f"{'s' * (len(gaps) > 1)} listed above, the first: {gaps[0]}")
        _listed[0] = gaps
        if strict:
            raise NotSolved(text)
    return bool(gaps)


def check_trainer(pieces: Pieces, seams: dict[str, Callable], parts: C.Parts, *, own_checks: bool = True,
                  show: bool = True, strict: Optional[bool] = None) -> bool:
    """The composed check: True when the learner's trainer equals one device's step by step. Prints why not (and
    raises in strict mode, as a puzzle's check does)."""
    strict = strict_default() if strict is None else strict
    if not_ready(pieces, seams, parts, strict):
        return False
    problem = _composed_problem(pieces, seams, parts, own_checks, show)
    if problem and strict:
        raise CheckFailed(problem)
    return problem is None


def _composed_problem(pieces: Pieces, seams: dict[str, Callable], parts: C.Parts, own_checks: bool,
                      show: bool) -> Optional[str]:
    """None when the composed run passes (its success printed); else the failure, printed."""
    problem = _first_problem(pieces, seams, parts, own_checks, show)
    if problem:
        print(problem)
    return problem


def _first_problem(pieces: Pieces, seams: dict[str, Callable], parts: C.Parts, own_checks: bool,
                   show: bool) -> Optional[str]:
    fns = all_functions(pieces, seams)
    if own_checks:
        for name in [*needed(parts), *seams_of(parts.hsdp)]:
            failed = _own_check(name, fns[name])
            if failed:
                return failed
    steps = data(parts)
    losses, model, grads = one_device(parts)
    shards = C.shards(parts)
    try:
        result = run(C.train, parts.world, fns, per_rank(shards), steps, parts)
    except PuzzleError as e:
        return f"✗ The composed trainer stopped on {parts.world} simulated ranks:\n{_learners_frames(str(e), fns)}"
    wrong = _compare(result.results, losses, C.expected_shards(model, parts), _expected_gradients(model, grads, parts),
                     parts)
    if wrong:
        return f"✗ Your trainer leaves one device's run: {wrong}"
    broken, axes = _axis_report(result, shards, parts)
    if broken:
        return f"✗ {broken}"
    broken, pipeline = schedule_problem([s.p2p_log for s in result.stats], parts, fns.get("plan_memory"))
    if broken:
        return f"✗ {broken}"
    broken, memory = memory_problem(result, parts, shards, fns.get("plan_memory"))
    if broken:
        return f"✗ {broken}"
    dp_axis = (f"HSDP as its DP axis ({parts.hsdp_nodes} nodes × {parts.per_node})" if parts.hsdp else
               f"ZeRO-{parts.zero}")
    print(f"✓ Your trainer equals one device for {parts.steps} steps on a (dp, pp, tp) = ({parts.dp}, {parts.pp}, "
          f"{parts.tp}) mesh, {dp_axis}: loss {losses[0]:.4f} → {losses[-1]:.4f}, each step's "
          f"loss within {RTOL:g} and every rank's parameters within {PARAMS_RTOL:g} (relative).\n{axes}"
          + (f"\n{pipeline}" if pipeline else "") + (f"\n{memory}" if memory else ""))
    if show:
        _show(result, parts)
    return None


def _show(result, parts: C.Parts) -> None:
    from IPython.display import display

    from lib.sim.traffic import axis_labeller
    from lib.viz.timeline import draw_timeline

    display(draw_timeline(result.trace, parts.world, title="your trainer, one rank per row (simulated time)",
                          kind_of=axis_labeller(C.mesh_of(parts))))
