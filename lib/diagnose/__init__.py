"""Say what kind of wrong a wrong result is, from the case's own structure, so that a mistake nobody catalogued is
still named.

A check that found a wrong value asks `diagnose` for the words. In order:
1. a known mistake of the puzzle, run on the same case, whose result the learner's equals (the catalogue: a floor);
2. a prediction off by one of its reference's named terms, or a multiple of one (Case.formulas, lib.checker.terms);
3. gradients or entries that never arrived (None where a tensor belongs);
4. where a NaN or inf came from (a replay under a tracer: lib.diagnose.origins);
5. what each wrong tensor shows: memory never written, a rank's share left out, the input returned, another rank's
   or another leaf's values, right values in the wrong places (lib.diagnose.layouts), a factor that is one of the
   case's quantities or a product of two (lib.diagnose.factors);
6. in a training run, the first step that leaves the reference, its update, and what the ranks handed the
   optimizer (lib.diagnose.moments);
and failing all of these, which ranks, tensors and slices differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from lib.checker.compare import first_difference
from lib.checker.plain import as_plain
from lib.diagnose import factors, layouts, moments, origins, values
from lib.diagnose.leaves import arguments, differing, f64, given, holes, leaves, lined_up_from_the_end, listing, mine, \
    name, on_rank, span
from lib.sim import run

__all__ = ["Mistake", "case_reading", "diagnose", "diagnosis", "hands_gradient", "unwritten_memory"]
case_reading = moments.case_reading
hands_gradient = moments.hands_gradient


@dataclass(frozen=True)
class Mistake:
    """A known wrong answer of one puzzle: `fn` makes the mistake (same signature as the puzzle's function)
    and `message` names it for a learner whose result equals fn's on every rank of the case.

    With alone=True each rank runs `fn` on its own, as a world of one rank: the answer without communication."""

    fn: Callable
    message: str
    alone: bool = False


def diagnosis(case: Any, got: Sequence[Any], *, mistakes: Sequence[Mistake], wrap: Callable[[Callable], Callable],
              rtol: float, atol: float, outputs: Optional[dict[str, str]], fn: Optional[Callable] = None,
              others: Sequence[Any] = (), names: Sequence[str] = (), run: Any = None) -> str:
    """Stage 2b of a check, why the results differ: the case's own reading (Case.explain, given the `run` that made
    them where the case reads its trace), or memory read before anything wrote it, or the engine's readings
    (`diagnose`); "" if nothing fits. Each replay runs once."""
    with origins.remembering():
        explained = moments.case_reading(
            case, got, run, lambda wanted=lambda _: True: ((other, _results(fn, other)) for other in others
                                                           if fn is not None and wanted(other)))
        # A reading of values that torch.empty's leftovers made (a stale block, NaN) would name a cause that changes
        # from run to run: memory read before anything wrote it is said instead.
        found = explained and unwritten_memory(case.expected, got, case, fn, rtol, atol, outputs)
        if not found:
            found = diagnose(case.expected, got, case.args, mistakes=tuple(mistakes) + tuple(case.mistakes), wrap=wrap,
                             factors=case.factors, rtol=rtol, atol=atol, case=case, fn=fn, outputs=outputs,
                             others=others, names=names, explained=bool(explained))
            found = "\n".join(filter(None, (explained, found)))
    return found or ""


def diagnose(expected: Sequence[Any], got: Sequence[Any], args: tuple, *, mistakes: Sequence[Mistake] = (),
             wrap: Callable[[Callable], Callable] = lambda f: f, factors: Optional[dict[str, float]] = None,
             rtol: float = 1e-5, atol: float = 1e-6, case: Any = None, fn: Optional[Callable] = None,
             outputs: Optional[dict[str, str]] = None, others: Sequence[Any] = (),
             names: Sequence[str] = (), explained: bool = False) -> str:
    """Lines for a learner whose per-rank results `got` differ from `expected`; "" if nothing fits.

    `explained`: the case's own reading (Case.explain) has named the mistake from the puzzle's structure; then
    only a catalogued mistake is added, never the engine's general readings, which would say it again in other
    words or guess another cause beside it.

    `factors` names the numbers a constant ratio may equal ({"k, the number of micro-batches": 4}); N, the world
    size, is always among them. `case` (lib.checker.puzzle.Case) and `fn` (the rank's function as the check ran it) let
    the diagnosis replay the learner's function: for a NaN's origin, a training run's first wrong step; on the
    check's `others` cases, for a factor two quantities equal on this case leave open. `names` are the learner's
    own names for the arguments (after dist), to say which input a result lacks."""
    with origins.remembering():            # the replays each wrong leaf asks for run once per diagnosis
        world = len(expected)
        expected, got = _as_vectors(expected, got)
        contradicted = []
        for mistake in mistakes:
            theirs = _mistaken_results(mistake, args, world, wrap, expected)
            if theirs is not None and all(_same(t, g, rtol, atol) for t, g in zip(theirs, got)):
                if _contradicted(mistake, case, expected, fn, others, wrap, rtol, atol):
                    contradicted.append(mistake)
                    continue
                return f"Diagnosis: your result is exactly what {mistake.message}"
        if explained:
            return ""
        named = {"N, the world size": float(world), **(factors or {})}
        found = _formulas(case, got, fn, others) or _holes(expected, got, outputs) or _shapes(expected, got, named,
                                                                                              outputs)
        if found:
            return f"Diagnosis: {found}"
        if contradicted:
            return f"Diagnosis: your result is exactly what {contradicted[0].message}"
        wrong = [(r, key, e, g) for r in range(world) for key, e, g in differing(expected[r], got[r], rtol, atol)]
        if not wrong:
            return ""
        mine_expected = [dict(leaves(expected[r])) for r in range(world)]
        mine_got = [dict(leaves(got[r])) for r in range(world)]
        inputs = [given(mine(args, r)) for r in range(world)]
        for rank, key, e, g in wrong:
            resolve = _resolver(fn, others, rank, key, atol)
            found = _pattern(rank, key, e, g, mine_expected, mine_got, inputs, named, case, fn, outputs, rtol, atol,
                             resolve, arguments(mine(args, rank), names))
            if found:
                return f"Diagnosis: {found}"
        origin = _origin(wrong, case, fn, world)
        if origin:
            return f"Diagnosis: {origin}"
        if case is not None and fn is not None:
            moment = moments.explain(fn, case, named, rtol, atol, outputs)
            if moment:
                return f"Diagnosis: {moment}"
        found = values.approximation(wrong) or _forward_backward(wrong, mine_expected, outputs)
        if found:
            return f"Diagnosis: {found}"
        where = _where(wrong, world, rtol, atol, outputs)
        return f"Where: {where}" if where else ""


def _as_vectors(expected: Sequence[Any], got: Sequence[Any]) -> tuple[list, list]:
    """A tuple of numbers (coordinates, counts) on each side read as one vector, so that its entries' places can be
    compared; anything else as it is."""
    def numbers(x: Any) -> bool:
        return isinstance(x, (list, tuple)) and len(x) >= 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in x)
    pairs = [(torch.tensor(e, dtype=torch.float64), torch.tensor(g, dtype=torch.float64))
             if numbers(e) and numbers(g) and len(e) == len(g) else (e, g) for e, g in zip(expected, got)]
    return [e for e, _ in pairs], [g for _, g in pairs]


# ---- the learner's result against known mistakes -----------------------------------------------------------
def _mistaken_results(mistake: Mistake, args: tuple, world: int, wrap: Callable,
                      protect: Any) -> Optional[list]:
    """What the mistake returns on each rank of this case; None if it cannot run here."""
    try:
        if mistake.alone:
            return [run(wrap(mistake.fn), 1, *mine(args, r), timeout=10.0).results[0] for r in range(world)]
        return run(wrap(mistake.fn), world, *args, timeout=10.0, protect=protect).results
    except Exception:                     # a mistake that does not apply to this case (shapes, world size)
        return None


def _contradicted(mistake: Mistake, case: Any, expected: Sequence[Any], fn: Optional[Callable], others: Sequence[Any],
                  wrap: Callable, rtol: float, atol: float) -> bool:
    """Whether the learner's answer to another case of the check is not what the mistake gives there. Asked of a
    prediction (one number on every rank), which two mistakes can give alike on one case by a coincidence of its
    numbers (tp = dp: the states not over tp are those of no ZeRO); then a reading that explains every case is said
    first. A mistake of this case alone (Case.mistakes) is not asked of the others."""
    if fn is None or case is None or mistake in getattr(case, "mistakes", ()) or not all(
            _one_number(e) for e in expected):
        return False
    for other in others:
        theirs = _mistaken_results(mistake, other.args, other.world_size, wrap, other.expected)
        learners = _results(fn, other) if theirs is not None else None
        if learners is not None and not all(_same(t, g, rtol, atol) for t, g in zip(theirs, learners)):
            return True
    return False


def _one_number(value: Any) -> bool:
    found = list(leaves(value))
    return len(found) == 1 and found[0][1].numel() == 1


def _same(a: Any, b: Any, rtol: float, atol: float) -> bool:
    """Equal up to the reordering of sums that two programs computing the same thing may differ by."""
    return first_difference(a, b, max(rtol, 1e-4), max(atol, 1e-5)) is None


# ---- structure the case declares ---------------------------------------------------------------------------
def _formulas(case: Any, got: Sequence[Any], fn: Optional[Callable] = None, others: Sequence[Any] = ()
              ) -> Optional[str]:
    """A prediction off by one of its reference's named terms (lib.checker.terms), said with the amount; terms of the
    same
    size on this case told apart by the learner's answers to the check's other cases."""
    from lib.checker.terms import explain, narrowed

    for key, formula in (getattr(case, "formulas", None) or {}).items():
        leaf = dict(leaves(got[0])).get(key)
        if leaf is None or leaf.numel() != 1:
            continue

        def resolve(found: list[str], key=key) -> list[str]:
            answers = []
            for other in others:
                theirs = (getattr(other, "formulas", None) or {}).get(key)
                answer = _answer(fn, other, key) if theirs is not None else None
                if answer is not None:
                    answers.append((theirs, answer))
            return narrowed(found, answers)
        found = explain(formula, float(leaf.item()), resolve=resolve if fn is not None else None)
        if found:
            return found if not key else f"{name(key)}: {found}"
    return None


def _results(fn: Callable, case: Any) -> Optional[list]:
    """The learner's results on another case of the check (each rank's, plain), or None if it fails there."""
    try:
        return as_plain(run(fn, case.world_size, *case.args, timeout=10.0, protect=case.expected).results)
    except Exception:
        return None


def _answer(fn: Callable, case: Any, key: str) -> Optional[float]:
    """The learner's number for leaf `key` on another case (a prediction: one rank), or None if it fails there."""
    results = _results(fn, case)
    if results is None:
        return None
    leaf = dict(leaves(results[0])).get(key)
    return float(leaf.item()) if leaf is not None and leaf.numel() == 1 else None


def _holes(expected: Sequence[Any], got: Sequence[Any], outputs: Optional[dict]) -> Optional[str]:
    """None where a tensor belongs: gradients backward never reached, entries never filled."""
    for rank, (e, g) in enumerate(zip(expected, got)):
        missing = list(holes(e, g))
        if not missing:
            continue
        everything = sum(1 for key, _ in leaves(e) if key.endswith(".grad")) or len(list(leaves(e)))
        names = [name(k, outputs) for k in missing]
        who = f"On rank {rank}, " if len(expected) > 1 else ""
        grads = all(k.endswith(".grad") for k in missing)
        if grads:
            return (f"{who}{len(missing)} of {everything} gradients are None ({listing(names)}): backward never "
                    "reached those parameters. Something cut them off from the loss: a .detach(), a torch.no_grad() "
                    "block, or a value rebuilt from .data or a copy (a checkpointed segment must keep its inputs "
                    "attached to the graph).")
        return f"{who}{listing(names)} {'is' if len(names) == 1 else 'are'} None where a tensor belongs."
    return None


def _shapes(expected: Sequence[Any], got: Sequence[Any], named: dict[str, float],
            outputs: Optional[dict]) -> Optional[str]:
    """A result of the wrong size, said by what its size is: a shard where the whole belongs, or the whole where a
    shard does (1/N or N times the elements), or the right elements in another shape."""
    world = len(expected)
    for rank, (e, g) in enumerate(zip(expected, got)):
        have = dict(leaves(g))
        for key, want in leaves(e):
            mine_ = have.get(key)
            if mine_ is None or mine_.shape == want.shape or not want.numel():
                continue
            where = on_rank(rank, world, key, outputs)
            shapes = f"{tuple(mine_.shape)} where {tuple(want.shape)} belongs"
            if not mine_.numel():
                return f"{where} is empty ({shapes}): nothing was put in it."
            if _broadcast_without_last_dim(mine_.shape, want.shape):
                short = tuple(want.shape[:-1])
                return (f"{where} has the shape a {short} tensor makes when it meets a {tuple(want.shape)} one "
                        f"({shapes}): " + lined_up_from_the_end())
            ratio = mine_.numel() / want.numel()
            if ratio == 1:
                return (f"{where} has the right number of elements in another shape ({shapes}): transposed, or "
                        "reshaped along the wrong dimensions?")
            up = ratio > 1
            found = factors.simplest(factors.matching(ratio if up else 1 / ratio, named))
            if not found:
                continue
            what = " = ".join(c.said for c in found)
            if up:
                return (f"{where} has {ratio:g}× the elements it should ({shapes}; {what}): the whole where a rank's "
                        "part belongs (each rank keeps only its own part: a reduce-scatter, not an all-reduce?).")
            return (f"{where} has 1/{1 / ratio:g} of the elements it should ({shapes}; {what}): a rank's part where "
                    "the whole tensor belongs (the gather that puts the parts together is missing?).")
    return None


def _broadcast_without_last_dim(got: torch.Size, want: torch.Size) -> bool:
    """Whether `got` is what a tensor of `want` less its last dimension, broadcast against one of `want`, gives."""
    if len(want) < 2:
        return False
    try:
        return tuple(torch.broadcast_shapes(want[:-1], want)) == tuple(got)
    except RuntimeError:
        return False


# ---- the values themselves ---------------------------------------------------------------------------------
def _origin(wrong: list, case: Any, fn: Optional[Callable], world: int) -> Optional[str]:
    """Where NaN or inf came from, when the learner's result holds one where the reference's is finite."""
    for rank, key, e, g in wrong:
        if g.is_floating_point() and bool((~torch.isfinite(f64(g)) & torch.isfinite(f64(e))).any()):
            if case is None or fn is None:
                return None
            bad = ~torch.isfinite(f64(g)) & torch.isfinite(f64(e))
            said = origins.non_finite_origin(fn, case, rank)
            where = on_rank(rank, world, key)
            kind = "NaN" if bool(f64(g)[bad].isnan().any()) else "inf"
            head = f"{where} holds {kind} ({int(bad.sum())} values, {span(bad)})."
            return f"{head} {said}" if said else None
    return None


def unwritten_memory(expected: Sequence[Any], got: Sequence[Any], case: Any, fn: Optional[Callable], rtol: float,
                     atol: float, outputs: Optional[dict[str, str]] = None) -> Optional[str]:
    """The diagnosis where a wrong result was computed from memory nothing wrote (torch.empty's leftovers), or None.
    Asked before the case's own reading is said: leftovers are whatever the allocator hands out (a block freed a
    step before, NaN, huge numbers), so a reading of their values would name a cause that changes from run to run."""
    if case is None or fn is None:
        return None
    with origins.remembering():             # two replays in all, whatever the number of wrong leaves
        expected, got = _as_vectors(expected, got)
        wanted = [dict(leaves(x)) for x in expected]
        for rank in range(len(expected)):
            for key, e, g in differing(expected[rank], got[rank], rtol, atol):
                bad = ~torch.isclose(f64(g), f64(e), rtol=rtol, atol=atol, equal_nan=True)
                read = _read_unwritten(rank, key, e, g, bad, wanted, case, fn, rtol, atol, outputs)
                if read:
                    return f"Diagnosis: {read}"
    return None


def _read_unwritten(rank: int, key: str, e: torch.Tensor, g: torch.Tensor, bad: torch.Tensor, expected: list[dict],
                    case: Any, fn: Optional[Callable], rtol: float, atol: float,
                    outputs: Optional[dict]) -> Optional[str]:
    """That leaf's wrong values, where a replay shows them computed from torch.empty's leftovers, in words."""
    if case is None or fn is None or not g.is_floating_point():
        return None
    world = len(expected)
    where = on_rank(rank, world, key, outputs)
    read = origins.tainted(fn, case, rank, key, g)          # two replays: memory read before it was written
    if read is None or read.shape != bad.shape or not bool((read & bad).any()):
        return None
    empty = origins.unwritten(fn, case, rank, key)
    if empty is not None and empty.shape == bad.shape and bool((empty & bad).any()):
        moved = layouts.explain(rank, key, where, expected, g, world, getattr(case, "parts", None) or {},
                                rtol, atol, unwritten=empty & bad)
        return values.uninitialised(where, g, empty & bad) + (f" And {moved[0].lower()}{moved[1:]}" if moved else "")
    return (f"{where} was computed, {span(read & bad)}, from memory nothing wrote: torch.empty's leftovers read "
            "before anything was written into them (an irecv's buffer used before its wait(), a buffer filled after "
            "it was read).")


def _pattern(rank: int, key: str, e: torch.Tensor, g: torch.Tensor, expected: list[dict], got: list[dict],
             inputs: list[dict], named: dict[str, float], case: Any, fn: Optional[Callable],
             outputs: Optional[dict], rtol: float, atol: float,
             resolve: Optional[factors.Resolve] = None, handed: Sequence = ()) -> Optional[str]:
    """The first thing this one differing tensor shows, in words; None if nothing."""
    world = len(expected)
    where = on_rank(rank, world, key, outputs)
    bad = ~torch.isclose(f64(g), f64(e), rtol=rtol, atol=atol, equal_nan=True)
    read = _read_unwritten(rank, key, e, g, bad, expected, case, fn, rtol, atol, outputs)
    if read:
        return read
    return (values.never_written(where, e, g, bad)
            or values.returned_as_given(where, rank, key, e, g, inputs, rtol, atol)
            or values.share_missing(where, rank, key, e, g, inputs, rtol, atol)
            or values.contributions(where, key, e, g, inputs, rtol, atol)
            or _chunk_contributions(where, key, e, g, inputs, world, rtol, atol)
            or values.input_offset(where, e, g, list(handed), world, rtol, atol)
            or values.parts_of_a_sum(key, name(key, outputs).removeprefix("the "), expected, got, rtol, atol)
            or values.another_ranks(where, rank, key, g, expected, rtol, atol)
            or layouts.explain(rank, key, where, expected, g, world, getattr(case, "parts", None) or {}, rtol, atol)
            or values.another_leaf(where, key, g, expected[rank], rtol, atol, outputs)
            or factors.explain(where, f64(e), f64(g), named, atol, resolve=resolve))


def _chunk_contributions(where: str, key: str, e: torch.Tensor, g: torch.Tensor, inputs: list[dict], world: int,
                         rtol: float, atol: float) -> Optional[str]:
    """The shares a wrong chunk holds, where only some of the result's N chunks are wrong (a ring's all-gather
    phase that adds what it should copy, one step skipped)."""
    if world < 2 or e.dim() == 0 or e.shape[0] % world or not e.is_floating_point():
        return None
    for i, (ec, gc) in enumerate(zip(e.chunk(world), g.chunk(world))):
        if not values.close(ec, gc, rtol, atol):
            chunked = [{key: x.chunk(world)[i]} if x is not None and x.shape == e.shape else {}
                       for x in (inp.get(key) for inp in inputs)]
            found = values.contributions(f"chunk {i} of {where}", key, ec, gc, chunked, rtol, atol)
            if found:
                return found
    return None


def _resolver(fn: Optional[Callable], others: Sequence[Any], rank: int, key: str,
              atol: float) -> Optional[factors.Resolve]:
    """Narrow a factor's candidates, equal on the failing case, by the learner's ratio on the check's other cases
    (where N, m, v... differ): the learner's function run there too."""
    if fn is None or not others:
        return None

    def resolve(found: list, up: bool) -> list:
        for other in others:
            if len(found) < 2:
                break
            try:
                results = as_plain(run(fn, other.world_size, *other.args, timeout=10.0, protect=other.expected,
                                    faults=other.faults).results)
            except Exception:
                continue
            r = min(rank, other.world_size - 1)
            e, g = dict(leaves(other.expected[r])).get(key), dict(leaves(results[r])).get(key)
            if e is None or g is None or e.shape != g.shape:
                continue
            c = factors.constant_ratio(f64(e), f64(g), atol)
            if c is not None and c > 0:
                named = {"N, the world size": float(other.world_size), **other.factors}
                found = factors.consistent(found, c, named, up) or found
        return found
    return resolve


def _forward_backward(wrong: list, expected: list[dict], outputs: Optional[dict]) -> Optional[str]:
    """Which half of a layer is wrong, where the result holds its output and its gradients: the output right and a
    gradient wrong is a backward mistake, and the other way round."""
    def is_grad(key: str) -> bool:
        return "grad" in key
    keys = list(expected[0])
    bad = {key for _, key, *_ in wrong}
    outs, grads = [k for k in keys if not is_grad(k)], [k for k in keys if is_grad(k)]
    if not outs or not grads or any("." in k for k in outs):
        return None                  # a module's parameters are state, not a forward's output
    if bad <= set(grads) and not bad & set(outs):
        names = listing([name(k, outputs) for k in grads if k in bad])
        return (f"the forward is right ({listing([name(k, outputs) for k in outs])} match) and the backward is not: "
                f"{names} differ. Look at what the backward computes or communicates (an autograd.Function's "
                "backward, the f or g operator's collective).")
    return None


# ---- where, when no pattern fits ---------------------------------------------------------------------------
def _where(wrong: list, world: int, rtol: float, atol: float, outputs: Optional[dict]) -> str:
    """Which ranks, tensors and slices differ; "" when the first difference already said it all (one number)."""
    if len(wrong) == 1 and wrong[0][2].numel() == 1:
        return ""
    ranks = sorted({r for r, *_ in wrong})
    who = ("every rank" if len(ranks) == world
           else "rank" + ("s " if len(ranks) > 1 else " ") + ", ".join(map(str, ranks)))
    first_rank = ranks[0]
    parts = []
    for r, key, e, g in wrong:
        if r != first_rank:
            continue
        bad = ~torch.isclose(f64(g), f64(e), rtol=rtol, atol=atol, equal_nan=True)
        parts.append(f"{name(key, outputs)} ({int(bad.sum())} of {bad.numel()} values, {span(bad)})")
    shown = "; ".join(parts[:6]) + (f"; and {len(parts) - 6} more" if len(parts) > 6 else "")
    return f"wrong on {who}. On rank {first_rank}: {shown}." if world > 1 else f"{shown}."

