"""Cheats on notebook 09's puzzles, each with the words its rejection must contain."""


import torch

import puzzles.beyond as P
import solutions.beyond as S
from lib.analytic.cross_site import shard_bounds
from lib.sim import PerRank
from puzzles.zero import adam_update
from tests.cheats.common import everywhere


def reshard_reading_every_file(files, world, rank):
    """Every file concatenated whole, then this rank's slice cut out: the overlap of [lo, hi) with each file is
    never worked out. Passed every seed until the simulator measured the bytes a rank reads of its arguments."""
    total = sum(f["param"].numel() for f in files)
    lo, hi = shard_bounds(total, world, rank)
    return (*(torch.cat([f[k] for f in files])[lo:hi].clone() for k in ("param", "exp_avg", "exp_avg_sq")),
            files[0]["step"])


def survive_checkpointing_every_step(dist, files, grads, every, lr):
    """Right after any failure, since it never loses a step: it checkpoints at every step, whatever `every` says,
    moving the whole training state each time."""
    return S.survive_failure(dist, files, grads, 1, lr)


def replaying_from_the_first_files(dist, files, grads, every, lr, checkpoint, keep=False):
    """Survivors that never reload a checkpoint: after a failure they replay every step from the files they were
    given, asking `grads` for those steps again, or, with `keep`, reading the gradient shards they kept as they came
    (in their new shard, the elements they were handed; zeros for the rest, which they never had). At each
    checkpoint's step, the first time it comes, checkpoint(dist, (param, m, v), n, group) runs: whatever the cheat
    sends there."""
    members, group, taken, kept = list(range(dist.get_world_size())), None, 0, {}
    total = sum(f["param"].numel() for f in files)
    while True:
        n, me = len(members), members.index(dist.get_rank())
        *state, step = S.reshard_checkpoint(files, n, me)
        param, m, v = (t.clone() for t in state)
        lo, hi = shard_bounds(total, n, me)
        try:
            while step < len(grads):
                if step in kept:
                    (a, b), had = kept[step]
                    grad = torch.zeros(hi - lo, dtype=had.dtype)
                    start, end = max(a, lo), max(min(b, hi), max(a, lo))        # the elements it was handed
                    grad[start - lo:end - lo] = had[start - a:end - a]
                else:
                    grad = grads(step)
                    if keep:
                        kept[step] = (lo, hi), grad
                adam_update(param, grad, m, v, step + 1, lr)
                step += 1
                if step % every == 0 and step > taken:
                    checkpoint(dist, (param, m, v), n, group)
                    taken = step
            return param, m, v
        except RuntimeError as e:
            members.remove(e.rank)
            group = dist.new_group(members)


def _heartbeat(dist, state, n, group):
    dist.all_gather([torch.zeros(1, dtype=state[0].dtype) for _ in range(n)], torch.zeros(1, dtype=state[0].dtype),
                    group=group)


def survive_replaying_from_the_first_files(dist, files, grads, every, lr):
    """No checkpoint: a one-number heartbeat all-gathered at each checkpoint's step finds the failure, and the
    survivors replay every step from the first files, on the gradients they kept: no state ever travels. Passed
    every seed before the checkpoints' bytes had a floor, and while grads handed every rank whole gradients; now each
    rank is handed only its shard, so that what it kept lacks the failed rank's part of its new shard."""
    return replaying_from_the_first_files(dist, files, grads, every, lr, _heartbeat, keep=True)


def real_checkpoints(files):
    """A checkpoint function for replaying_from_the_first_files that all-gathers the whole state, as the algorithm
    does, and never keeps it."""
    size = sum(f["param"].numel() for f in files)

    def checkpoint(dist, state, n, group):
        mine = torch.zeros(3, -(-size // n), dtype=state[0].dtype)
        for row, t in zip(mine, state):
            row[:t.numel()] = t
        dist.all_gather([torch.empty_like(mine) for _ in range(n)], mine, group=group)
    return checkpoint


def survive_checkpointing_but_replaying_the_first_files(dist, files, grads, every, lr):
    """Real checkpoints, never reloaded: after the failure the survivors replay every step from the first files,
    asking grads for them again, and skip the all-gathers of checkpoints already taken. Its bytes meet the
    checkpoints' floor and its FLOPs are below the reference's; it passed every seed while every rank was handed
    every step's gradient up front. grads(step) refuses a step behind the last checkpoint."""
    return replaying_from_the_first_files(dist, files, grads, every, lr, real_checkpoints(files))


def survive_keeping_every_gradient(dist, files, grads, every, lr):
    """Real checkpoints, never reloaded: every rank keeps each gradient grads hands it, and after the failure the
    survivors replay every step from the first files on those. Its bytes meet the checkpoints' floor, and no memory
    budget a right answer always meets could tell what it keeps apart; it passed every seed while grads handed every
    rank whole gradients. Now a rank is handed its shard only, in the layout of the ranks alive."""
    return replaying_from_the_first_files(dist, files, grads, every, lr, real_checkpoints(files), keep=True)


def survive_carrying_gradients_with_the_checkpoints(dist, files, grads, every, lr):
    """Each checkpoint all-gathers, with the state, the gradient shards of the steps since the last one, so that
    every rank holds whole gradients (to replay from the first files, as the keeping cheats try). Stands for that
    plan by its traffic: the reference's run with every checkpoint carrying `every` more rows."""
    return S.survive_failure(_Padded(dist, every), files, grads, every, lr)


class _Padded:
    """dist whose all_gather carries `rows` more rows than it is given (the extra rows zeros)."""

    def __init__(self, dist, rows):
        self._d, self._rows = dist, rows

    def __getattr__(self, name):
        return getattr(self._d, name)

    def all_gather(self, parts, mine, group=None):
        pad = torch.zeros(self._rows, *mine.shape[1:], dtype=mine.dtype, device=mine.device)
        bigger = [torch.empty(mine.shape[0] + self._rows, *mine.shape[1:], dtype=mine.dtype, device=mine.device)
                  for _ in parts]
        self._d.all_gather(bigger, torch.cat([mine, pad]), group=group)
        for p, b in zip(parts, bigger):
            p.copy_(b[:mine.shape[0]])


def survive_unpickling_grads(dist, files, grads, every, lr):
    """Every step's gradient read out of what grads hands pickle (its values and its position), to replay from the
    first files."""
    whole = grads.__reduce__()[1][0]
    return replaying_from_the_first_files(dist, files, lambda step: whole[step], every, lr, real_checkpoints(files))


def survive_reading_every_gradient_behind_grads(dist, files, grads, every, lr):
    """Every step's gradient read out of grads' own list, to replay from the first files."""
    whole = grads._values
    return replaying_from_the_first_files(dist, files, lambda step: whole[step], every, lr, real_checkpoints(files))


def _every_ranks_argument(position: int) -> list:
    """Every rank's value of an argument, read from the simulator's own frame below the function (the originals each
    rank's copy is made from), reached from a caught exception's frame (sys._getframe is refused to a rank, and so is
    tb_frame now: lib.guard.audit)."""
    try:
        raise LookupError
    except LookupError as e:
        frame = e.__traceback__.tb_frame
    while frame is not None:
        args = frame.f_locals.get("args")
        if isinstance(args, (list, tuple)) and len(args) > position and isinstance(args[position], PerRank):
            return args[position].values
        frame = frame.f_back
    raise LookupError("no simulator frame below this function")


def diloco_every_worker_trained_here(dist, model, batches, inner_steps, inner_lr, outer_lr, momentum):
    """Every worker's batches read out of the simulator's frame, every worker trained on this rank (the reference
    itself), and one all-reduce of the right size per round for the bytes. Compute is nothing next to the wide-area
    link: it passed every seed before DiLoCo's FLOPs had a ceiling. Now the traceback's frame is refused (were the
    originals reached another way, .tolist() of them is a read of the run's own tensors; the FLOPs ceiling stays)."""
    shards = [[(torch.tensor(x.tolist(), dtype=x.dtype), torch.tensor(y.tolist(), dtype=y.dtype)) for x, y in rank]
              for rank in _every_ranks_argument(1)]
    trained = P.diloco_reference(model, shards, inner_steps, inner_lr, outer_lr, momentum)
    for _ in range(len(batches) // inner_steps):
        dist.all_reduce(torch.zeros(sum(p.numel() for p in model.parameters()), dtype=torch.float64))
    return trained


def compressed_by_gathering_every_vector(dist, grad, residual, bits):
    """Every rank's whole quantised vector all-gathered (int8), each rank computing every owner's mean itself: no
    reduce-scatter. As many bytes as the algorithm at N = 2, N-1 times the payload beyond."""
    world = dist.get_world_size()
    corrected = grad + residual
    pieces = [P.quantize(c, bits) for c in corrected.chunk(world)]
    sent = torch.cat([P.dequantize(q, s) for q, s in pieces])
    values, scales = torch.cat([q for q, _ in pieces]), torch.cat([s for _, s in pieces])
    all_values, all_scales = [torch.empty_like(values) for _ in range(world)], [torch.empty_like(scales)
                                                                              for _ in range(world)]
    dist.all_gather(all_values, values)
    dist.all_gather(all_scales, scales)
    sizes = [c.numel() for c in corrected.chunk(world)]
    total = sum(torch.cat([P.dequantize(q, s[j:j + 1]) for j, q in enumerate(v.split(sizes))]).double()
                for v, s in zip(all_values, all_scales)) / world
    return torch.cat([P.dequantize(*P.quantize(c, bits)) for c in total.chunk(world)]), corrected - sent


def compressed_computed_for_every_rank_here(dist, grad, residual, bits):
    """Every rank's grad and residual read out of the simulator's frame, the whole reference computed on this rank,
    and collectives of the algorithm's exact sizes carrying zeros for the bytes. Passed every seed before the
    FLOPs had a ceiling; now refused at the traceback's frame (the .tolist() refusal and the ceiling stay)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    grads, residuals = ([torch.tensor(t.tolist(), dtype=t.dtype) for t in _every_ranks_argument(i)] for i in (0, 1))
    mean, new = P.compressed_reference(grads, residuals, bits)[rank]
    chunk = -(-grad.numel() // world)
    for size, dtype in ((chunk, torch.int8), (1, torch.float32)):
        dist.all_to_all_single(torch.empty(world, size, dtype=dtype), torch.zeros(world, size, dtype=dtype))
        dist.all_gather([torch.empty(size, dtype=dtype) for _ in range(world)], torch.zeros(size, dtype=dtype))
    return mean, new


CHEATS = everywhere(P) + [
    ("reshard_checkpoint", reshard_reading_every_file,
     "read only the part of each file that overlaps your shard"),
    ("survive_failure", survive_checkpointing_every_step, "not more often"),
    ("survive_failure", survive_replaying_from_the_first_files, "did not hold before the failure"),
    ("survive_failure", survive_keeping_every_gradient, "did not hold before the failure"),
    ("survive_failure", survive_checkpointing_but_replaying_the_first_files,
     "again, having reached step"),
    ("survive_failure", survive_reading_every_gradient_behind_grads, "reached feed._values"),
    ("survive_failure", survive_unpickling_grads, "reached feed.__reduce__"),
    ("survive_failure", survive_carrying_gradients_with_the_checkpoints, ("sent", "training state only")),
    ("compressed_all_reduce", compressed_by_gathering_every_vector, ("sent", "FLOPs counted")),
    ("diloco_train", diloco_every_worker_trained_here, "tb_frame (the frame of a traceback)"),
    ("compressed_all_reduce", compressed_computed_for_every_rank_here, "tb_frame (the frame of a traceback)"),
]


def reshard_assuming_equal_files(files, world, rank):
    """Every file taken to be as long as the first: the total is its length times the files, and file i starts at
    i times it. Right whenever the saved layout divides evenly, which some seeds' cases all did."""
    size = files[0]["param"].numel()
    lo, hi = shard_bounds(size * len(files), world, rank)
    loaded = []
    for key in ("param", "exp_avg", "exp_avg_sq"):
        pieces = [f[key][max(lo - i * size, 0):max(hi - i * size, 0)] for i, f in enumerate(files)]
        loaded.append(torch.cat(pieces))
    return (*loaded, files[0]["step"])


CHEATS += [("reshard_checkpoint", reshard_assuming_equal_files, "files of unequal lengths")]
