"""When a training run goes wrong: the first step that leaves the reference, what that step's update is, and what
the ranks handed the optimizer.

A case whose builder takes `steps=` (Case.steps, Case.rebuild) is drawn again on 1, 2, ... steps and the learner's
function replayed on each: the first step whose result differs is the moment. Step 1 wrong means the update itself
is wrong, and its size is compared with the reference's (a factor m or N shows in the update, not in the
parameters); a later step means something carried between steps. Adam hides a gradient's scale (its update is
m/√v), so the gradients the ranks hand the optimizer are recorded too, from torch's optimizers and from any update
function a puzzle hands its learners marked with `hands_gradient`, and compared with the reference's.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Callable, Iterator, Optional

import torch

from lib.checker.compare import first_difference
from lib.checker.plain import as_plain
from lib.diagnose import factors
from lib.diagnose.leaves import close, differing, given, leaves, listing, mine, name, on_rank, plain
from lib.sim import current_rank, run

_RECORDING: Optional[dict] = None       # {rank or None (outside ranks): [[gradients of one optimizer step], ...]}


def hands_gradient(argument: str) -> Callable:
    """Mark a puzzle's update function (adam_update): the gradient it is given is recorded during a replay."""
    def mark(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def update(*args, **kwargs):
            if _RECORDING is not None:
                bound = _bind(fn, args, kwargs)
                if isinstance(bound.get(argument), torch.Tensor):
                    _note([bound[argument]])
            return fn(*args, **kwargs)
        return update
    return mark


def _bind(fn: Callable, args: tuple, kwargs: dict) -> dict:
    import inspect
    return dict(inspect.signature(fn).bind_partial(*args, **kwargs).arguments)


def _note(grads: list[torch.Tensor]) -> None:
    _RECORDING.setdefault(current_rank(), []).append([g.detach().to("cpu", torch.float64).clone() for g in grads])


@contextlib.contextmanager
def recording() -> Iterator[dict]:
    """Record every gradient handed to an optimizer (torch's, or a marked update function) while inside."""
    global _RECORDING

    def pre_step(optimizer, args, kwargs):
        _note([p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None])
    from torch.optim.optimizer import register_optimizer_step_pre_hook     # torch.optim is slow to import: here

    _RECORDING = {}
    handle = register_optimizer_step_pre_hook(pre_step)
    try:
        yield _RECORDING
    finally:
        handle.remove()
        _RECORDING = None


def _run(fn: Callable, case) -> Optional[list]:
    try:
        return as_plain(run(fn, case.world_size, *case.args, timeout=10.0, protect=case.expected,
                            faults=case.faults).results)
    except Exception:
        return None


def first_raising_step(fn: Callable, case) -> Optional[int]:
    """The number of steps from which a training run that raised raises: 1 where its first step does, None where it
    raises on no shorter run either way (a case without steps, or a run that raises only as the check ran it)."""
    if not case.steps or case.rebuild is None or case.steps < 2:
        return None
    for step in range(1, case.steps):
        try:
            run(fn, case.world_size, *(at := case.rebuild(steps=step)).args, timeout=10.0, protect=at.expected,
                faults=at.faults)
        except Exception:
            return step
    return case.steps


def explain(fn: Callable, case, named: dict[str, float], rtol: float, atol: float,
            outputs: Optional[dict] = None) -> Optional[str]:
    """The moment a run leaves the reference, and what its update or its optimizer's input was there."""
    if not case.steps or case.rebuild is None:
        return None
    total = case.steps
    for step in range(1, total + 1):
        with recording() as handed:
            at = case.rebuild(steps=step) if step < total else case.rebuild()
        reference = handed.get(None, [])
        with recording() as handed:
            results = _run(fn, at)
        if results is None:
            return None
        wrong = [r for r, (e, g) in enumerate(zip(at.expected, results)) if first_difference(e, g, rtol, atol)]
        if wrong:
            before = case.rebuild(steps=step - 1).expected if step > 1 else None
            return _said(step, total, at, results, wrong[0], before, reference, handed, named, rtol, atol, outputs)
    return None


def _said(step: int, total: int, case, results: list, rank: int, before: Optional[list], reference: list,
          handed: dict, named: dict, rtol: float, atol: float, outputs: Optional[dict]) -> str:
    # The case's own reading of the run cut there, where what went wrong has not yet been carried into later steps:
    # where it names the mistake, the kinds of mistake a wrong step may be are not listed beside it.
    reading = _reading_at_the_step(case, results) if step < total else None    # at `total` the check asked it already
    if step == 1:
        text = f"The run leaves the reference at its first step (of {total}): the update itself is wrong."
    else:
        right = "step 1 is right" if step == 2 else f"steps 1 to {step - 1} are right"
        text = f"The run first leaves the reference at step {step} of {total} ({right})" + (
            "." if reading else ": what carries from one step to the next is wrong: the optimizer's state (its "
            "moments, the step count), gradients not zeroed between steps, momentum, or a buffer reused.")
    wrong = differing(case.expected[rank], results[rank], rtol, atol)
    if wrong:
        keys = [name(k, outputs).replace("the result", "") or "the result" for k, *_ in wrong]
        total_leaves = sum(1 for _ in _leaf_keys(case.expected[rank]))
        text += f" Wrong at that step: {listing(keys)} ({len(wrong)} of {total_leaves})."
    # Replicas that drift apart first: which parameters, not only by how much. Then the gradients handed to the
    # optimizer: they carry a scale as it is, where an update through Adam (about lr times a sign at its first step)
    # fits almost any factor once a per-feature offset is allowed.
    said = reading or _replicas_apart(case.expected, results, rtol, atol, outputs) or \
        _handed_factor(reference, handed, step, named) or \
        _update_factor(step, case, results, rank, before, named, atol, outputs)
    return f"{text} {said}" if said else text


def case_reading(case, results: list, run=None, others: Callable[..., Iterator] = lambda wanted=None: iter(())
                 ) -> Optional[str]:
    """The case's own reading of a wrong result (Case.explain), or None: a reading that cannot make sense of a result
    it did not foresee (None where a pair belongs, a dtype of its own) says nothing rather than fail the check. A case
    that reads the run too (Case.explain_reads_run) is given it: the SimResult, or None for a replay's results.
    `others(wanted)`: for a reading that asks for them (Case.reads_others), the answer's results on the check's
    other cases that `wanted(case)` keeps, run one at a time as the reading asks: (case, results or None)."""
    if case.explain is None:
        return None
    try:
        if case.explain_reads_run:
            return case.explain(case.expected, results, run)
        if case.reads_others:
            return case.explain(case.expected, results, others)
        return case.explain(case.expected, results)
    except Exception:
        return None


def _reading_at_the_step(case, results: list) -> Optional[str]:
    """The case's own reading of the run cut at its first wrong step, where what went wrong has not yet been carried
    into later steps, which a reading of the whole run may not foresee."""
    found = case_reading(case, results)
    if not found:
        return None
    found = found.removeprefix("Diagnosis: ")
    lead = found[0].lower() if found[1:2].islower() else found[0]        # "Every" becomes "every", "DiLoCo" stays
    return f"At that step, {lead}{found[1:]}"


def _replicas_apart(expected: list, results: list, rtol: float, atol: float, outputs: Optional[dict]) -> Optional[str]:
    """The results the reference keeps equal on every rank (a replica's parameters) that the learner's ranks hold
    differently: what was updated from a rank's own gradient, never averaged with the others'."""
    if len(expected) < 2:
        return None
    want = [dict(leaves(e)) for e in expected]
    have = [dict(leaves(r)) for r in results]

    def same(side: list, key: str) -> Optional[bool]:            # None: not on every rank with one shape
        ts = [s.get(key) for s in side]
        if any(t is None or t.shape != ts[0].shape for t in ts):
            return None
        return all(close(t, ts[0], rtol, atol) for t in ts[1:])
    replicas = [k for k in want[0] if same(want, k)]
    apart = [k for k in replicas if same(have, k) is False]
    params = [k for k in apart if not k.endswith(".grad")] or apart
    if not params:
        return None
    every = len(params) > 1 and len(params) == sum(1 for k in replicas if not k.endswith(".grad"))
    other = next(r for r in range(1, len(have)) if not close(have[r][params[0]], have[0][params[0]], rtol, atol))
    what = "every parameter" if every else listing([name(k, outputs) for k in params])
    their, them = ("their", "them") if len(params) > 1 else ("its", "it")
    return (f"Your ranks' copies of {what} differ (rank 0's and rank {other}'s), where the reference's are the same "
            f"on every rank: a replica must end each step equal everywhere. {their.capitalize()} gradient was not "
            f"averaged across ranks before the update (an all-reduce left out for {them}), or each rank updated only "
            "its own part and never gathered the others'.")


def _leaf_keys(value: Any):
    for key, _ in leaves(value):
        yield key


def _update_factor(step: int, case, results: list, rank: int, before: Optional[list], named: dict, atol: float,
                   outputs: Optional[dict]) -> Optional[str]:
    """The step's update (what it adds to each parameter) against the reference's, named as a factor."""
    start = given(mine(case.args, rank)) if before is None else dict(_by_plain(before[rank]))
    start = {plain(k): v for k, v in start.items()}
    for key, e, g in differing(case.expected[rank], results[rank], 0, atol):
        s = start.get(plain(key))
        if s is None:                 # a result not named as its argument: the one argument of its shape
            pool = start.values() if before is not None else \
                [t for a in mine(case.args, rank) for _, t in leaves(a)]      # every argument, unnamed ones too
            alike = [t for t in pool if t.shape == e.shape]
            s = alike[0] if len(alike) == 1 else None
        if s is None or s.shape != e.shape:
            continue
        de = e.double().cpu() - s.double().cpu()
        dg = g.double().cpu() - s.double().cpu()
        found = factors.explain(on_rank(rank, case.world_size, key, outputs), de, dg, named, atol * 1e-3,
                                what="update")
        if found:
            return f"At step {step}, {found[0].lower()}{found[1:]}"
    return None


def _by_plain(value: Any):
    return ((plain(k), t) for k, t in leaves(value))


def _alike(steps: list) -> bool:
    """Whether every rank handed the optimizer the same gradients (a replica's, after the average)."""
    first = steps[0]
    return all(len(step) == len(first) and all(g.shape == f.shape and torch.allclose(g.double(), f.double(), rtol=1e-6,
                                                                                      atol=1e-12)
                                               for g, f in zip(step, first)) for step in steps[1:])


def _handed_factor(reference: list, handed: dict, step: int, named: dict) -> Optional[str]:
    """The gradients the ranks handed the optimizer in the run up to the first wrong step against the reference's, as
    a factor: Adam hides a scale in its update, the gradients it was given do not. Every call counts (an optimizer
    step per layer, or one for the whole model: the totals compare either way)."""
    ranks = [r for r in sorted(k for k in handed if k is not None) if handed[r]]
    if not reference or not ranks:
        return None
    want = sum(float((g ** 2).sum()) for call in reference for g in call)
    have = sum(float((g ** 2).sum()) for r in ranks for call in handed[r] for g in call)
    size_ref = sum(g.numel() for call in reference for g in call)
    size_rank = sum(g.numel() for call in handed[ranks[0]] for g in call)
    if want == 0 or have == 0:
        return None
    replicated = size_rank >= 0.9 * size_ref
    ours = [handed[r][0] for r in ranks]
    if replicated and not _alike(ours):
        return None                   # ranks whose gradients differ by design (DiLoCo's workers, each on its data)
    c = math.sqrt(have / want / (len(ranks) if replicated else 1))
    if abs(c - 1) < 1e-3:
        return None
    found = factors.said(c, named, one_value=True)         # one ratio of norms: a named factor, or nothing
    if found is None:
        return None
    words, advice = found
    when = "at step 1" if step == 1 else f"in steps 1 to {step}"
    return (f"The gradients your ranks hand the optimizer {when} are {words}: Adam's update (m/√v) hides a "
            f"gradient's scale, so the parameters barely show it. {advice}".rstrip())
