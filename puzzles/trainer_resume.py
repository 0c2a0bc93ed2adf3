"""Notebook 10's checkpoint: the trainer saved on one mesh, each DP rank writing its slice of the flat state (weights
and Adam's moments) as notebook 09's checkpoints are laid out, then resumed on a mesh of another DP degree, each new
DP rank's slice read by the learner's reshard_checkpoint from 09; the run must go on as one device's does.

Only the DP degree may change: notebook 09's files are slices of one flat vector, which a change of TP or PP would
cut along other lines.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from lib.analytic.cross_site import shard_bounds
from lib.notebook.pieces import Pieces
from lib.sim import per_rank, run
from puzzles import composed as C


def checkpoint_files(results: list[dict], parts: C.Parts, step: int) -> dict[tuple[int, int], list[dict]]:
    """Per (stage, TP rank): the files its DP ranks write, rank d the d-th of dp slices of the flat state."""
    files: dict[tuple[int, int], list[dict]] = {}
    for rank, out in enumerate(results):
        d, p, t = C.coordinates(rank, parts)
        flat = [torch.cat([x.reshape(-1) for x in xs]) for xs in
                (out["params"].values(), [m for m, _ in out["moments"]], [v for _, v in out["moments"]])]
        lo, hi = shard_bounds(flat[0].numel(), parts.dp, d)
        files.setdefault((p, t), []).append({"param": flat[0][lo:hi].clone(), "exp_avg": flat[1][lo:hi].clone(),
                                             "exp_avg_sq": flat[2][lo:hi].clone(), "offset": lo, "step": step})
    return files


class Misplaced(Exception):
    """A new rank's slice that is not the shard notebook 09's layout gives it."""


def _unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    sizes = [x.numel() for x in like]
    return [part.view_as(x).clone() for part, x in zip(flat.split(sizes), like)]


def resumed(reshard: Callable, files: list[dict], dp: int, shard) -> tuple[dict, dict]:
    """One (stage, TP rank)'s state on `dp` new DP ranks: each new rank's slice by the learner's reshard_checkpoint,
    gathered whole again (the trainer's ZeRO-0 keeps the whole state on every DP rank). Returns (parameters, resume)."""
    total = sum(f["param"].numel() for f in files)
    whole = [files[0]["param"].new_empty(total) for _ in range(3)]
    for d in range(dp):                 # gathered as an all-gather would: new rank d's slice at its place
        out = reshard(files, dp, d)
        if not (isinstance(out, (tuple, list)) and len(out) == 4
                and all(isinstance(t, torch.Tensor) for t in out[:3])):
            got = f"{len(out)} values" if isinstance(out, (tuple, list)) else type(out).__name__
            raise Misplaced(f"your reshard_checkpoint (notebook 09) returned {got} for new DP rank {d} of {dp}, where "
                            f"its answer is four: (param, exp_avg, exp_avg_sq, step), the three slices as tensors.")
        *state, step = out
        lo, hi = shard_bounds(total, dp, d)
        for name, got, into in zip(("param", "exp_avg", "exp_avg_sq"), state, whole):
            if got.numel() != hi - lo:
                raise Misplaced(f"your reshard_checkpoint (notebook 09) gave new DP rank {d} of {dp} {got.numel()} "
                                f"values of {name}, where its shard is elements [{lo}, {hi}) of {total}: "
                                f"ceil(total / world) each, the last shorter (shard_bounds).")
            into[lo:hi] = got
    param, m, v = whole
    names, like = zip(*shard.named_parameters())
    params = dict(zip(names, _unflatten(param, list(like))))
    moments = list(zip(_unflatten(m, list(like)), _unflatten(v, list(like))))
    return params, {"step": step, "moments": moments}


def _resume_problem(pieces: Pieces, seams: dict[str, Callable], saved: C.Parts, resume_dp: int,
                    after: int) -> Optional[str]:
    """Train `after` steps on `saved`'s mesh, save, resume on `resume_dp` DP ranks (the same pp and tp, micro-batches
    of more or fewer sequences so that a step keeps its rows) and train the rest: None when every rank's parameters
    end as one device's, else why not."""
    from puzzles.trainer_check import PARAMS_ATOL, PARAMS_RTOL, all_functions, data, one_device
    from lib.checker.compare import first_difference

    fns = all_functions(pieces, seams)
    steps, (_, model, _) = data(saved), one_device(saved)
    first = run(C.train, saved.world, fns, per_rank(C.shards(saved)), steps[:after], saved).results
    before = C.expected_shards(one_device(C.quick(saved, steps=after))[1], saved)
    if any(first_difference(want, out["params"], rtol=PARAMS_RTOL, atol=PARAMS_ATOL) for want, out in
           zip(before, first)):
        return f"the {after} steps before the save already leave one device's run: pass the check above first."
    files = checkpoint_files(first, saved, after)
    again = C.quick(saved, dp=resume_dp, micro_batch=saved.dp * saved.micro_batch // resume_dp)
    try:
        states = [resumed(fns["reshard_checkpoint"], files[C.coordinates(r, again)[1:]], resume_dp, shard)
                  for r, shard in enumerate(C.shards(again))]
    except Misplaced as e:
        return str(e)
    except Exception as e:          # the learner's function, run here on plain tensors: said, never raised
        return (f"your reshard_checkpoint (notebook 09) raised {type(e).__name__}: {e}\nRun P.reshard_checkpoint."
                "check(reshard_checkpoint) in notebook 09 to see it on the puzzle's own files.")
    shards = [C.with_parameters(shard, params) for shard, (params, _) in zip(C.shards(again), states)]
    second = run(C.train, again.world, fns, per_rank(shards), steps[after:], again,
                 per_rank([state for _, state in states])).results
    expected = C.expected_shards(model, again)
    for rank, out in enumerate(second):
        differs = first_difference(expected[rank], out["params"], rtol=PARAMS_RTOL, atol=PARAMS_ATOL,
                                   where="parameter")
        if differs:
            return (f"saved after step {after} on {saved.dp} DP ranks and resumed on {resume_dp}, rank {rank} of the "
                    f"new mesh ends with {differs}\nThe run before the save equalled one device's, so the state your "
                    "reshard_checkpoint (notebook 09) handed the new ranks is not the one saved.")
    return None


def check_checkpoint(pieces: Pieces, seams: dict[str, Callable], saved: C.Parts, resume_dp: int, after: int, *,
                     strict: Optional[bool] = None) -> bool:
    """The checkpoint cell: says what to finish first, or runs the save and the resume and prints the verdict (and
    raises in strict mode, as a puzzle's check does)."""
    from lib.checker.puzzle import CheckFailed, NotSolved, strict_default
    from puzzles.trainer_check import not_ready

    strict = strict_default() if strict is None else strict
    if saved.zero or saved.dp * saved.micro_batch % resume_dp:
        raise ValueError(f"the checkpoint cell resumes a ZeRO-0 run whose {saved.dp} × {saved.micro_batch} sequences "
                         f"per micro-batch split over {resume_dp} DP ranks: got zero={saved.zero}")
    if not_ready(pieces, seams, saved, strict) or not_ready_to_reshard(pieces):
        if strict:
            raise NotSolved("reshard_checkpoint is missing")
        return False
    problem = _resume_problem(pieces, seams, saved, resume_dp, after)
    print(f"✗ {problem}" if problem else
          f"✓ Saved after step {after} by {saved.dp} DP ranks, resumed on {resume_dp} by your reshard_checkpoint: "
          f"after {saved.steps} steps every rank's parameters equal one device's (within the check's tolerance).")
    if problem and strict:
        raise CheckFailed(problem)
    return problem is None


def not_ready_to_reshard(pieces: Pieces) -> bool:
    """Says what to finish first when the learner's reshard_checkpoint is missing."""
    gaps = [str(g) for g in pieces.gaps if g.name == "reshard_checkpoint"]
    if "reshard_checkpoint" not in pieces.functions and not gaps:
        gaps = ["reshard_checkpoint: not loaded (run the cell with T.load() above): finish notebook 09 first"]
    if gaps:
        print("○ The checkpoint needs this first:\n  " + "\n  ".join(gaps))
    return bool(gaps)
