"""An error raised inside torch, said in the lesson's terms: which op failed on what shapes, and what that means for
the case (a rank's shard where the whole tensor belongs, a graph cut before backward, a saved tensor changed in
place by a collective).

The replay's tracer (lib.diagnose.origins) keeps the op each rank called last and its inputs' shapes; the case's
own tensors say what those shapes are: a tensor with 1/N of a parameter's elements is that parameter's shard.
"""

from __future__ import annotations

import linecache
import math
import re
from typing import Callable, Optional, Sequence

import torch

from lib.diagnose import factors
from lib.diagnose.leaves import arguments, given, lined_up_from_the_end, mine
from lib.diagnose.moments import first_raising_step
from lib.diagnose.origins import replay
from lib.errors import RankFailed
from lib.units import ordinal
from lib.whose_code import COURSE, ENGINE, LIBRARIES

# Errors whose cause does not depend on shapes: (words in torch's message, what it means in this course).
_MEANINGS = (
    ("does not require grad and does not have a grad_fn",
     "backward was called on a value cut off from the graph: a .detach(), a torch.no_grad() block, or a tensor that "
     "came through dist (communication carries values, not gradients: an autograd.Function must carry them)"),
    ("One of the differentiated Tensors does not require grad",
     "torch.autograd.grad was asked for the gradient of a tensor that does not require one: an input no gradient "
     "flows to, such as the first stage's micro-batch of the batch (data, not a parameter or a received activation). "
     "Ask only for what requires grad: the stage's parameters, and its input only on a stage that received it "
     "(x.requires_grad_())"),
    ("backward through the graph a second time",
     "backward ran twice through the same graph: each forward's graph is freed by its backward (recompute the "
     "forward, or keep what the second backward needs)"),
    ("modified by an inplace operation",
     "a tensor autograd saved for backward was changed in place afterwards (a collective writes into its tensor: "
     "communicate a clone, or communicate after backward)"),
    ("Expected all tensors to be on the same device",
     "an op mixed tensors on two devices: put every tensor you make on lib.device() (or the inputs' .device)"),
    ("division by zero",
     "a number divided by 0: a sum, a count or a correction that came out 0 (Adam's bias correction 1 - β^t is 0 at "
     "t = 0: steps count from 1)"),
    ("'NoneType' object has no attribute",
     "a value is None where a tensor belongs: a .grad read before backward made it (a tensor hook runs before the "
     "gradient is accumulated into .grad: register_post_accumulate_grad_hook runs after), a .grad another step "
     "already freed, or a function that returned nothing"),
    ("returned an incorrect number of gradients",
     "an autograd.Function's backward returns one gradient per input of its forward, in the forward's order (None "
     "for an input that needs none: split sizes, a group, a flag), where this one returned fewer or more"),
    ("does not match the length of the desired ordering of dimensions",
     "a permute names more or fewer dimensions than the tensor has: it is not laid out as the code reads it (a "
     "buffer made with torch.empty_like(x) has x's shape, not the layout a collective writes into it: make the "
     "buffer in the shape you will read it as, or view it so first)"),
    ("but got NoneType",
     "a None stands where a tensor belongs in what torch was handed: a value never set, as when the loop meant to "
     "set it ran no time (an empty range: range(0, i) is empty at i = 0), or a function that returned nothing"),
    ("'NoneType' object is not subscriptable",
     "a None was indexed where a tensor or a tuple belongs: a value never set, as when the loop meant to set it ran "
     "no time (an empty range, or a condition that skips every pass for one part), or a function that returned "
     "nothing"),
    ("out of bounds",
     "an index outside the tensor it indexes: on a rank that holds a shard, an index meant for the whole tensor "
     "must be shifted by the shard's offset (and the indices the rank does not own masked out)"),
)


def explain(fn: Callable, case, error: BaseException, names: Sequence[str] = ()) -> Optional[str]:
    """A sentence for the error a rank raised inside torch, or None when there is nothing to add. `names` are the
    learner's own names for the arguments after dist. In a training run that raises only from its second step on,
    what carries from one step to the next is said too."""
    own = getattr(case, "explain_error", None)
    said = (own(error) if own is not None else None) or _meaning(fn, case, error, names)
    if not isinstance(error, RankFailed):
        return said
    step = first_raising_step(fn, case)
    if step is None or step < 2:
        return said
    if "'NoneType' object has no attribute" in str(getattr(error, "exception", None) or error) and _in_a_hook(error):
        return (f"What it means: a gradient hook found its parameter's .grad None at step {step}, where step 1 ran "
                "the same hook: the hook ran twice for one parameter, and the first run's p.grad = None left None to "
                "the second. A hook registered again every step adds one more each step: register the hooks once, "
                "before the loop (or remove them, handle.remove(), at the end of each step).")
    later = (f"Step {step - 1 if step > 2 else 1}{' and the ones before it' if step > 2 else ''} ran without it; the "
             f"error comes at step {step}: what one step leaves for the next is at fault (a hook registered again "
             "every step, something freed at the end of a step and used in the next, an optimizer or a buffer made "
             "anew each step, state not reset).")
    return f"{said} {later}" if said else f"What it means: {later}"


def _meaning(fn: Callable, case, error: BaseException, names: Sequence[str]) -> Optional[str]:
    raised = getattr(error, "exception", None)
    message = str(raised or error)
    if isinstance(raised, KeyError) and not _in_the_checks_own_code(error):
        return (f"What it means: a dict was read at the key {message}, which it does not hold: a key misspelt or one "
                "off, or one the step that stores it has not run yet on this rank (in a schedule, a backward run "
                "before its forward stored what it needs).")
    for words, meaning in _MEANINGS:
        if words in message:
            return f"What it means: {meaning}."
    viewed = _viewed(message, case.world_size) or _unpadded(message, case.world_size) \
        or _mismatched(message, fn, case, getattr(error, "rank", None), names) or _assigned(message, case) \
        or _not_multiplied(message, case, getattr(error, "rank", None), names)
    if viewed:
        return f"What it means: {viewed}"
    waited = _off_axis(error, case) or _waited(error, case) or _world_across_axes(str(error), case)
    if waited:
        return f"What it means: {waited}"
    if _in_the_checks_own_code(error):
        return ("What it means: your function returned, and the check failed to use what it returned (the line "
                "above is the check's, not yours): return what the statement asks for, every item it names, in "
                "its order, each a tensor where a tensor belongs (not None).")
    if not isinstance(error, RankFailed) or not _about_shapes(message):
        return None                  # the simulator's own errors say their case already
    rank = error.rank
    _, tracers, _ = replay(fn, case)
    tracer = tracers.get(rank)
    if tracer is None or tracer.last is None:
        return None
    op, shapes, line = tracer.failed or tracer.last        # the op that raised, where it raised under the tracer
    said = f"What it means: {op} failed on inputs of shapes {', '.join(map(str, shapes))}"
    said += f" at {line}" if line else ""
    # A product that fits only transposed says so by its shapes alone: before an element count, which N can match
    # by chance (x of (s·b, in/N) against a weight of (out, in/N) with out = N·s·b).
    found = _freed(shapes) or _transposed(op, shapes) or _whole_meets_shard(shapes, case.world_size) \
        or _shard(shapes, case, rank)
    return f"{said}. {found}" if found else said + "."


def _in_a_hook(error: BaseException) -> bool:
    """Whether the error was raised in a function backward called (a tensor hook): the first frame of the learner's
    code below a line that calls .backward(, with only torch's frames between."""
    tb = getattr(getattr(error, "exception", None), "__traceback__", None)
    called_backward = False
    while tb is not None:
        code = tb.tb_frame.f_code
        if called_backward and not code.co_filename.startswith(ENGINE):
            return True
        if not code.co_filename.startswith(ENGINE):
            called_backward = ".backward(" in linecache.getline(code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return False


def _in_the_checks_own_code(error: BaseException) -> bool:
    """Whether a rank's error was raised in the problem set's harness after the learner's function returned: its
    innermost frame outside torch is puzzles/' own, and no frame of the traceback is the learner's (a course function
    the learner called, such as notebook 03's adam_update, raises below the learner's own frame)."""
    exception = getattr(error, "exception", None)
    tb = getattr(exception, "__traceback__", None)
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    if any(not f.startswith(COURSE + LIBRARIES) for f in frames):
        return False                  # the learner's code is on the way to the error
    last_not_torch = next((f for f in reversed(frames) if not f.startswith(ENGINE)), None)
    return last_not_torch is not None and last_not_torch.startswith(COURSE)


def _viewed(message: str, world: int) -> Optional[str]:
    """A view of the wrong number of elements: a padded buffer viewed as its parameter, or a shard as the whole."""
    found = re.search(r"shape '\[([\d, -]*)\]' is invalid for input of size (\d+)", message)
    if not found:
        return None
    dims = [int(d) for d in found.group(1).split(",") if d.strip() and int(d) >= 0]
    want, have = math.prod(dims), int(found.group(2))
    if want and have > want and world > 1 and have == world * math.ceil(want / world):
        return (f"a buffer of {have} elements (N × ⌈{want}/N⌉, padded to split evenly) viewed as {want}: cut the "
                f"padding off first (buf[:{want}].view(...)).")
    if want and have * world == want:
        return (f"{have} elements viewed as {want}: a rank's 1/N shard viewed as the whole tensor; gather the shards "
                "first.")
    return None


def _mismatched(message: str, fn: Callable, case, rank: Optional[int], names: Sequence[str]) -> Optional[str]:
    """Two tensors met elementwise with different sizes along one dimension: where one size is a quantity of the
    case times the other, a whole tensor met one part of it (a micro-batch the whole batch's targets, a rank's shard
    the whole); the input the larger size is that of is named as the learner calls it."""
    found = re.search(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at non-singleton "
                      r"dimension (\d+)", message)
    if not found:
        return None
    a, b, dim = (int(g) for g in found.groups())
    small, big = sorted((a, b))
    said = (f"two tensors met elementwise with {a} and {b} along dimension {dim}: torch broadcasts only sizes that "
            "are equal or 1.")
    lined_up = _unaligned(fn, case, rank)
    if lined_up:
        return f"{said[:-1]}: {lined_up}"
    if small < 2 or big % small:
        return said
    named = {"N, the world size": float(case.world_size), **case.factors}
    found = factors.simplest(factors.matching(big / small, named))
    if not found:
        return said
    symbol = found[0].symbol
    held = dict.fromkeys(called for called, t in arguments(mine(case.args, rank if rank is not None else 0), names)
                         if big in t.shape)
    whole = f"the whole {' or '.join(held)}" if held else "a whole tensor"
    part = ("a rank's 1/N shard: optimizer state or a gradient kept whole where the rank holds 1/N, or a shard "
            "where the whole belongs" if symbol == "N" else "a micro-batch, a chunk")
    return (f"{said[:-1]}; {big} = {symbol} × {small} ({' = '.join(c.said for c in found)}): {whole} met one "
            f"{symbol}-th of it ({part}). Cut the whole one the same way (its .chunk({symbol})[i]), or keep both "
            "whole, so that each part meets its own.")


def _unaligned(fn: Callable, case, rank: Optional[int]) -> Optional[str]:
    """The op that raised, on the replay, met a tensor missing its last dimension: (b, h, s) against (b, h, s, d), which
    torch lines up from the right, so s meets d."""
    if rank is None:
        return None
    _, tracers, _ = replay(fn, case)
    failed = getattr(tracers.get(rank), "failed", None)
    if failed is None:
        return None
    shapes = failed[1]
    for short in shapes:
        for long in shapes:
            if len(short) >= 1 and len(long) == len(short) + 1 and tuple(long[:-1]) == tuple(short):
                return f"a {short} tensor met a {long} one, and " + lined_up_from_the_end(f", {tuple(long[1:])}")
    return None


def _not_multiplied(message: str, case, rank: Optional[int], names: Sequence[str]) -> Optional[str]:
    """A product x @ w whose inner sizes differ by a quantity of the case: the weight is one of the case's tensors
    cut along its input features (a shard cut the wrong way), or whole while x's features were joined k times (a
    gather along the hidden dimension where the pieces belong along the tokens)."""
    found = re.search(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)", message)
    if not found:
        return None
    _, features, takes, out = (int(g) for g in found.groups())
    said = f"x has {features} features where the weight takes {takes}"
    small, big = sorted((features, takes))
    named = {"N, the world size": float(case.world_size), **case.factors}
    quantity = factors.simplest(factors.matching(big / small, named)) if small and big % small == 0 else []
    if not quantity and 0 < features < takes:        # cut unevenly: .chunk(k) makes its first pieces ⌈takes/k⌉
        quantity = [c for c in factors.simplest([c for c in factors.candidates(named) if float(c.value).is_integer()])
                    if math.ceil(takes / c.value) == features][:1]
    if not quantity:
        return None
    k = big // small if big % small == 0 else int(quantity[0].value)
    symbol = quantity[0].symbol if len(quantity) == 1 else str(k)
    said += (f" ({big} = {k} × {small}; {k} = {' = '.join(c.said for c in quantity)})" if big % small == 0 else
             f" ({small} = ⌈{big}/{k}⌉, the first of {k} pieces; {k} = {quantity[0].said})")
    held = arguments(mine(case.args, rank if rank is not None else 0), names)
    if features < takes:
        return _cut_along_features(said, held, features, takes, out, k, symbol)
    # The weight as the learner held it: (out, in) as F.linear takes it, or (in, out) multiplied as stored (unless
    # it fits only transposed: then _transposed says so). Its input features are dim 1 or dim 0.
    layouts = [((out, takes), 1)] + ([((takes, out), 0)] if out != features else [])
    for called, t in held:
        if t.dim() != 2:
            continue
        for weight, d_in in layouts:
            if tuple(t.shape) == weight:
                return (f"{said}: {called} is whole, so x's features were joined {symbol} times: x was gathered or "
                        "concatenated along its last dimension (dim -1, the hidden dimension), where its pieces "
                        "belong joined along the tokens (dim 0 or 1), each token whole.")
            cut = list(t.shape)
            cut[d_in] //= k
            if t.shape[d_in] == features and tuple(cut) == weight:
                return (f"{said}: the weight is {takes} of the {features} input features of {called} "
                        f"{tuple(t.shape)}, cut along dim {d_in} into {symbol} parts. A shard that takes 1/{symbol} "
                        "of x's features needs x cut the same way; to keep x whole, cut the weight along its output "
                        "features instead, as column-parallel does.")
    return None


def _cut_along_features(said: str, held: list, features: int, takes: int, out: int, k: int, symbol: str
                        ) -> Optional[str]:
    """x with 1/k of the features the weight takes: a weight cut along its output features where its input
    features belong cut (its shard kept every input feature), or an input the learner was handed with all `takes`
    features cut along its last dimension (the features, where micro-batches and sequence shards cut rows)."""
    for called, t in held:
        if t.dim() == 2 and tuple(t.shape) == (out * k, takes):
            return (f"{said}: the weight has all {takes} input features of {called} {tuple(t.shape)} and 1/{symbol} "
                    f"of its {out * k} output features: it was cut along dim 0 (its rows) where this layer cuts it "
                    f"along dim 1 (its input features), to match x's {features}: .chunk({symbol}, dim=1), as "
                    "row-parallel does.")
    for called, t in held:
        if t.dim() >= 2 and t.shape[-1] == takes and tuple(t.shape) not in ((out, takes), (takes, out)):
            return (f"{said}: {called} {tuple(t.shape)} already has the {takes} features the weight takes, and x has "
                    f"1/{symbol} of them: it was cut along its last dimension (the features) into {symbol} parts. "
                    "Keep each row's features whole: micro-batches and sequence shards cut the rows (dim 0, "
                    ".chunk(m, dim=0)), and a shard you were handed is already this rank's part.")
    return None


def _off_axis(error: BaseException, case) -> Optional[str]:
    """A deadlocked receive on a device mesh from a peer that is not along an axis the case's point-to-point
    messages travel on (rank + 1 is the next rank of the innermost axis, a TP peer, not the next pipeline stage)."""
    from lib.sim.mesh import coordinates

    axes, waits = getattr(case, "axes", None), getattr(error, "waits", ())
    carriers = sorted({b.axis for b in getattr(case, "axis_budgets", ()) if {"send", "recv"} & set(b.ops)})
    if axes is None or not waits or not carriers:
        return None
    for rank, peer, *_ in sorted(waits, key=lambda w: abs(w[1] - w[0]) != 1):     # rank ± 1 first: the usual slip
        mine, theirs = coordinates(rank, axes.shape), coordinates(peer, axes.shape)
        differ = [name for name, a, b in zip(axes.names, mine, theirs) if a != b]
        if len(differ) == 1 and differ[0] in carriers:
            continue
        where = f"its {differ[0].upper()} peer" if len(differ) == 1 else "in none of its mesh groups"
        groups = " or ".join(f"its {a.upper()} group {list(axes.group(rank, a))}" for a in carriers)
        said = (f"rank {rank} waits for a message from rank {peer}, {where}: the wrong peer. Point-to-point "
                f"messages travel within {groups} here (rank {rank}'s coordinates: "
                f"{', '.join(f'{n}={c}' for n, c in zip(axes.names, mine))}).")
        if abs(peer - rank) == 1:
            said += (f" Rank ± 1 is the next rank along the innermost axis ({axes.names[-1].upper()}), not the next "
                     "stage: take the neighbours from the group's ranks (dist.get_process_group_ranks).")
        return said
    return None


def _world_across_axes(message: str, case) -> Optional[str]:
    """A collective on WORLD whose ranks brought tensors of different shapes, on a device mesh: the mesh axes the two
    ranks differ along say why (another pipeline stage holds other layers, another TP rank another shard), and the
    axes whose budgets carry that op say which group it belongs on."""
    from lib.sim.mesh import coordinates

    found = re.search(r"collective #\d+ on WORLD: rank (\d+) called (\w+)\(\(([\d, ]*)\).*, but rank (\d+) called",
                      message)
    axes = getattr(case, "axes", None)
    if not found or axes is None:
        return None
    a, op, b = int(found.group(1)), found.group(2), int(found.group(4))
    numel = math.prod(int(d) for d in found.group(3).split(",") if d.strip())
    differ = [n for n, x, y in zip(axes.names, coordinates(a, axes.shape), coordinates(b, axes.shape)) if x != y]
    carriers = [bud.axis for bud in getattr(case, "axis_budgets", ()) if op in bud.ops and bud.axis not in differ]
    if not differ or not carriers:
        return None
    # A tensor the size of one of the rank's parameters, or of all of them, is a gradient: its group is the one whose
    # ranks hold the same parameters, the data-parallel axis where the mesh has one.
    params = [t.numel() for key, t in given(mine(case.args, a)).items() if key and t.is_floating_point()]
    if "dp" in carriers and (numel in params or numel == sum(params)):
        carriers, what = ["dp"], "gradients (the size of this rank's parameters) "
    else:
        what = ""
    said = " and ".join(n.upper() for n in differ)
    return (f"the {op} {'of ' + what if what else ''}ran on WORLD, every rank of the mesh, where ranks {a} and {b} "
            f"differ in their {said} "
            f"coordinate{'s' if len(differ) > 1 else ''}: they hold different tensors (another stage's layers, "
            f"another shard), so their shapes cannot meet. An {op} belongs on the group of the ranks that hold the "
            f"same tensor: {' or '.join(f'the {c.upper()} group' for c in carriers)} here "
            f"(group=mesh['{carriers[0]}'].get_group()), never WORLD.")


def _waited(error: BaseException, case) -> Optional[str]:
    """A deadlock read in the case's words for its messages: which message each rank waits for, how many of them its
    peer has sent, and, where two ranks wait on each other, which message each owes the other."""
    waits = getattr(error, "waits", ())
    if not waits or case.messages is None:
        return None
    said = _never_sent(waits, case.messages, getattr(error, "unreceived", frozenset()))
    if said:
        return said
    by_rank = {w[0]: w for w in waits}
    said, paired = [], set()
    for rank, peer, nth, _, _ in waits:
        theirs = by_rank.get(peer)
        if theirs is not None and theirs[1] == rank and rank < peer:
            mine, yours = case.messages(peer, rank, nth), case.messages(rank, peer, theirs[2])
            short = len(mine) + len(yours) < 80            # said again where it reads at a glance
            said.append(f"rank {rank} waits for the {mine} from rank {peer} before it has sent rank {peer} the "
                        f"{yours} which rank {peer} waits for before it sends "
                        + (f"the {mine}" if short else "it") + ": each waits for the other. One of them must send "
                        + (f"before it waits: rank {rank} the {yours}, or rank {peer} the {mine}." if short else
                           "before it waits."))
            paired |= {rank, peer}
    for rank, peer, nth, they_sent, _ in waits:
        if rank not in paired:
            said.append(f"rank {rank} waits for the {case.messages(peer, rank, nth)} from rank {peer}, which has sent "
                        f"it {they_sent}.")
    return " ".join(said)


def _never_sent(waits: tuple, messages, unreceived: frozenset) -> Optional[str]:
    """A rank waiting for a message its peer's part of the schedule never sends that way (more than `messages.count`
    says): it waits on the wrong peer where another rank's message to it lies unreceived (or the schedule sends none
    that way), else it receives once more than the schedule sends."""
    count = getattr(messages, "count", None)
    if count is None:
        return None
    for rank, peer, nth, _, _ in waits:
        k = count(peer, rank)
        if nth <= k:
            continue
        what = f"only {k} message{'s' if k != 1 else ''}" if k else "no message"
        said = (f"rank {rank} waits for a {ordinal(nth)} message from rank {peer}, where the schedule sends {what} "
                f"from rank {peer} to rank {rank}")
        others = sorted(src for src, dst in unreceived if dst == rank and src != peer)
        if k and not others:
            return (f"{said}, and rank {rank} had received them all: it receives once more than its peer sends (a "
                    "recv the schedule has no message for, or a loop that runs once too often on this rank).")
        also = f" (rank {others[0]} has a message for it that is not received)" if others else ""
        return (f"{said}: it waits on the wrong peer{also}. "
                + getattr(messages, "from_where", "Receive each message from the rank that sends it.").rstrip(".")
                + ".")
    return None


def _assigned(message: str, case) -> Optional[str]:
    """A .grad assigned with the wrong shape: where its size is one of the case's quantities (the rows of a batch),
    the gradient was summed over the wrong dimension."""
    found = re.search(r"assign a gradient of size '\[([\d, ]*)\]' to a tensor of size '\[([\d, ]*)\]'", message)
    if not found:
        return None
    got, want = ([int(d) for d in g.split(",") if d.strip()] for g in found.groups())
    said = f"a gradient of shape {tuple(got)} was assigned to a parameter of shape {tuple(want)}"
    quantity = next((name for name, v in case.factors.items() if len(got) == 1 and v == got[0] and v not in want),
                    None)
    if quantity is None:
        return said + ": a parameter's gradient has the parameter's shape."
    return (f"{said}: its {got[0]} elements are {quantity}, so it was summed over the wrong dimension, keeping the "
            "batch and dropping the features. A 1-D parameter's gradient (a bias, a norm's scale) sums over the "
            "rows (sum over dim 0), one value per feature.")


def _unpadded(message: str, world: int) -> Optional[str]:
    """A collective's input that does not split into N equal parts."""
    found = re.search(r"with input \((\d+),?\) \S+ and output \((\d+),?\)", message)
    if not found or world < 2:
        return None
    n = int(found.group(1))
    if n % world == 0:
        return None
    return (f"the input's {n} elements are not a multiple of N = {world}: pad it to N × ⌈{n}/N⌉ = "
            f"{world * math.ceil(n / world)} first (F.pad), and cut the padding off the gathered result.")


def _freed(shapes: list[tuple[int, ...]]) -> Optional[str]:
    if any(0 in shape for shape in shapes):
        return ("An input has no elements: a tensor freed after use (its storage resized to 0, as ZeRO-3 frees a "
                "layer's parameters) and used again before it was gathered back.")
    return None


def _whole_meets_shard(shapes: list[tuple[int, ...]], world: int) -> Optional[str]:
    sizes = [math.prod(s) for s in shapes if s]
    for a in sizes:
        for b in sizes:
            if world > 1 and b and a == world * b:
                return (f"One input has N × the other's elements ({a} and {b}, N = {world}): a whole tensor meets a "
                        "rank's shard (optimizer state or a gradient kept whole where the rank holds 1/N).")
    return None


def _transposed(op: str, shapes: list[tuple[int, ...]]) -> Optional[str]:
    """A product whose second matrix fits only transposed: a weight used as stored, (out, in), where x @ w.T or
    F.linear(x, w) belongs."""
    mats = [s for s in shapes if len(s) >= 2]
    if op not in ("mm", "addmm", "bmm", "baddbmm", "matmul") or len(mats) < 2:
        return None
    a, b = mats[-2], mats[-1]
    if a[-1] != b[-2] and a[-1] == b[-1]:
        return (f"The second matrix, {b}, fits only transposed: a weight is stored as (out_features, in_features), "
                "so multiply by its transpose (x @ w.T, or F.linear(x, w)).")
    if a[-1] != b[-2] and a[-2] == b[-2]:
        return (f"The first matrix, {a}, fits only transposed: its {a[-2]} rows meet the second's {b[-2]} rows, "
                "so the product wants its transpose (a.transpose(-2, -1) @ b), as a gradient with respect to the "
                "right-hand side of a product does (for y = x @ w, dw = xᵀ @ dy).")
    return None


def _about_shapes(message: str) -> bool:
    words = ("must be a matrix", "shapes cannot be multiplied", "size mismatch", "must match the size",
             "is invalid for input of size", "Dimension out of range", "mat1 and mat2", "must have the same shape",
             "Expected size", "expected input", "should be the same")
    return any(w in message for w in words)


def _shard(shapes: list[tuple[int, ...]], case, rank: int) -> Optional[str]:
    """Which input is a 1/N part of one of the case's tensors (a parameter's shard where the whole belongs)."""
    world = case.world_size
    degrees = {f"N = {world}": world, **{name.split(",")[0].strip() + f" = {v:g}": v
                                         for name, v in case.factors.items() if float(v).is_integer() and v > 1}}
    if world < 2:
        return None
    whole = {key or "the input": t for key, t in given(mine(case.args, rank)).items() if t.dim() >= 1}
    for shape in shapes:
        if len(shape) != 1:
            continue                 # a flat shard, as ZeRO keeps them: a 2-D piece is as likely an activation
        n = int(torch.Size(shape).numel())
        for key, t in whole.items():
            degree = next((d for d, v in degrees.items() if n and n < t.numel() and n == math.ceil(t.numel() / v)),
                          None)
            if degree:
                return (f"An input of shape {shape} has 1/{degree.split(' = ')[1]} of {key}'s {t.numel()} elements "
                        f"({degree}): a rank's "
                        f"shard reached an op that needs the whole {tuple(t.shape)} tensor. Gather it first "
                        "(all-gather the shards into the full tensor, as ZeRO-3 and FSDP do before each layer's "
                        "forward and backward), and use the gathered one.")
    return None
